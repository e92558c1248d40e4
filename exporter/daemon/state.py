"""Saved state: the daemon's memory across restarts, beside the pipeline rather than in it.

    app --save(positions, counters, dedupe window)--> state.json --load()--> app (at startup)

app.py decides what goes in and when; this module only writes it atomically and reads it back
defensively. Fallback, by design: a missing state file means "first run". A corrupt, unreadable or
wrong-version file is logged as a WARNING, moved aside to state.json.corrupt-<unix time> for a human
to inspect, and also treated as a first run, so existing files are read from their end. Losing a
restart's worth of history is better than crash-looping or recounting every old OOM as a new page.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..sources.tail import TailPosition

log = logging.getLogger(__name__)

STATE_VERSION = 1
STATE_FILENAME = "state.json"
_TEMP_PREFIX = f".{STATE_FILENAME}."
_TEMP_SUFFIX = ".tmp"


class StateStore:
    """One JSON state file in a directory, written atomically and read without ever raising."""

    def __init__(self, directory: str | os.PathLike[str], *, clock: Callable[[], float] = time.time) -> None:
        self.directory = os.fspath(directory)
        self.path = os.path.join(self.directory, STATE_FILENAME)
        self._clock = clock
        self.rejected = 0  # state files found unusable and moved aside

    def load(self) -> dict[str, Any] | None:
        """Return the saved data, or None for a first run (missing, corrupt, unreadable, other version)."""
        self._remove_stale_temps()
        try:
            with open(self.path, "rb") as handle:
                raw = handle.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            reason = f"unreadable: {exc}"
        else:
            data, reason = _parse(raw)
            if data is not None:
                return data
        self._reject(reason)
        return None

    def save(self, data: Mapping[str, Any]) -> None:
        """Write data atomically (temp, fsync, rename, dir fsync); raise OSError for the caller to count."""
        body = json.dumps(
            {"version": STATE_VERSION, "saved_at": self._clock(), "data": data},
            sort_keys=True,
            separators=(",", ":"),
        ).encode("utf-8")
        os.makedirs(self.directory, exist_ok=True)
        # Same directory as the target, so os.replace is a rename within one filesystem: readers and a
        # crash see either the old file or the new one, never a half-written one.
        fd, temp = tempfile.mkstemp(prefix=_TEMP_PREFIX, suffix=_TEMP_SUFFIX, dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(body)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        self._fsync_directory()

    def _fsync_directory(self) -> None:
        # The rename is durable only once the directory entry is; some filesystems refuse, which is fine.
        try:
            dir_fd = os.open(self.directory, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(dir_fd)
        except OSError:
            log.debug("state dir fsync not supported dir=%s", self.directory)
        finally:
            os.close(dir_fd)

    def _reject(self, reason: str) -> None:
        self.rejected += 1
        aside = f"{self.path}.corrupt-{int(self._clock())}"
        try:
            os.replace(self.path, aside)
        except OSError as exc:
            log.warning(
                "state file ignored path=%s reason=%s (could not move it aside: %s); "
                "starting as on a first run: existing files are read from their end",
                self.path,
                reason,
                exc,
            )
            return
        log.warning(
            "state file ignored path=%s reason=%s moved_to=%s; "
            "starting as on a first run: existing files are read from their end",
            self.path,
            reason,
            aside,
        )

    def _remove_stale_temps(self) -> None:
        # A crash between mkstemp and os.replace leaves a temp file that nobody will ever read.
        try:
            names = os.listdir(self.directory)
        except OSError:
            return
        for name in names:
            if name.startswith(_TEMP_PREFIX) and name.endswith(_TEMP_SUFFIX):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.directory, name))


def _parse(raw: bytes) -> tuple[dict[str, Any] | None, str]:
    """The data of a state file's bytes, or None and the reason it is unusable."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return None, f"not valid JSON: {exc}"
    if not isinstance(doc, dict):
        return None, f"top level is {type(doc).__name__}, not an object"
    version = doc.get("version")
    if version != STATE_VERSION or isinstance(version, bool):
        return None, f"version is {version!r}, this build reads {STATE_VERSION}"
    data = doc.get("data")
    if not isinstance(data, dict):
        return None, "'data' is missing or not an object"
    return data, ""


def encode_positions(positions: Iterable[TailPosition]) -> list[dict[str, Any]]:
    """Positions as JSON-ready dicts, for the "positions" entry of the state data."""
    return [pos.to_dict() for pos in positions]


def decode_positions(raw: object) -> dict[str, TailPosition]:
    """Positions by path from encode_positions() output; bad entries are logged and skipped."""
    if not isinstance(raw, list):
        if raw is not None:
            log.warning("state positions ignored: expected a list, got %s", type(raw).__name__)
        return {}
    positions: dict[str, TailPosition] = {}
    for index, entry in enumerate(raw):
        try:
            pos = TailPosition.from_dict(entry)
        except ValueError as exc:
            log.warning("state position ignored index=%d reason=%s", index, exc)
            continue
        positions[pos.path] = pos
    return positions
