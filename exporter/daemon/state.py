"""Saved state: the daemon's memory across restarts, beside the pipeline rather than in it.

    StateKeeper --save(positions, counters, dedupe)--> StateStore: state.json --load()--> StateKeeper

StateKeeper decides what goes in and when (the loop asks it every pass); StateStore only writes the file
atomically and reads it back defensively. Fallback, by design: a missing state file means "first run".
A corrupt, unreadable or wrong-version file is logged as a WARNING, moved aside to
state.json.corrupt-<unix time> for a human to inspect, and also treated as a first run, so existing files
are read from their end. Losing a restart's worth of history is better than crash-looping or recounting
every old OOM as a new page.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..events.store import EventStore
from ..metrics.events import EventCounts
from .sourceset import SourceSet

log = logging.getLogger(__name__)

# An event counted is on disk within about this long, not only at the next periodic save: its file may be deleted
# (and the daemon killed) at any moment, and then nothing could count it again.
EVENT_SAVE_DELAY = 0.5
EAGER_DEFER_MAX = 1.0  # an eager save waits this long at most for the events in flight to be counted
STATE_VERSION = 1  # of the file's envelope and of the data inside it: one number, bumped for either
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
        self.reject(reason)
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

    def reject(self, reason: str) -> None:
        """Move an unusable state file aside and warn; the caller starts as on a first run."""
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

    def keep_copy(self, reason: str) -> None:
        """Keep a copy of a state file whose malformed entries were set aside (the next save drops them), as
        state.json.corrupt-<unix time>, and warn."""
        aside = f"{self.path}.corrupt-{int(self._clock())}"
        try:
            shutil.copyfile(self.path, aside)
        except OSError as exc:
            log.warning("state file path=%s: %s (could not keep a copy: %s)", self.path, reason, exc)
            return
        log.warning("state file path=%s: %s; the file as it was is kept as %s", self.path, reason, aside)

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
        # NaN and Infinity are not JSON, and no counter can hold them: refused like any other corruption.
        doc = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        return None, f"not valid JSON: {exc}"
    except RecursionError:
        # Nested deeper than the parser's recursion limit (100,000 brackets): no state file of ours is; a crash
        # here would stop every start.
        return None, "nested too deeply to be a state file"
    if not _finite(doc):
        return None, "a number is out of range (1e400 reads as Infinity)"
    if not isinstance(doc, dict):
        return None, f"top level is {type(doc).__name__}, not an object"
    version = doc.get("version")
    if version != STATE_VERSION or isinstance(version, bool):
        return None, f"version is {version!r}, this build reads {STATE_VERSION}"
    data = doc.get("data")
    if not isinstance(data, dict):
        return None, "'data' is missing or not an object"
    return data, ""


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number a counter can hold")


def _finite(value: object) -> bool:
    """Whether every float in a parsed JSON document is finite (iteratively: a deep document cannot recurse)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return False
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


class StateKeeper:
    """What the daemon saves (positions, counters, dedupe memory) and when; errors are counted, not raised."""

    def __init__(
        self,
        store: StateStore | None,
        counts: EventCounts,
        sources: SourceSet,
        *,
        interval: float,
        clock: Callable[[], float] = time.monotonic,
        events: EventStore | None = None,
    ) -> None:
        self._store = store
        self._counts = counts
        self._events = events  # the recent events: saved under "recent" with each kind's last event
        self._sources = sources
        self.interval = interval
        self._clock = clock
        self._last_save = clock()
        self._saved_mark: tuple[float, float] | None = None  # (bytes read, events) at the last save
        self._saved_generations = 0
        self._failing = False  # the last save failed: logged once per streak, retried at the interval only
        self._save_cost = 0.0  # how long the last save took (on the keeper's clock)
        self._due_since: float | None = None  # when an eager save became due (it may wait for events in flight)
        self.saves = 0
        self.errors = 0
        # Called with the saved `files` entries once a save is durable (the OTLP spool drops what they show read).
        self.on_saved: Callable[[Mapping[str, Any]], None] | None = None
        self._requested = False  # another thread asked for a save soon (request_save)

    def load(self) -> None:
        """Continue from the state file, if there is a usable one; a bad one is a warning, not a crash."""
        if self._store is None:
            return
        try:
            data = self._store.load()
        except OSError as exc:
            self._error(f"cannot read the state file: {exc}")
            return
        if data is None:
            self.errors += self._store.rejected
            return
        try:
            files = data.get("files", {})
            if not isinstance(files, dict):
                raise ValueError(f"'files' is {type(files).__name__}, not an object")
            if "counters" not in data:
                raise ValueError("'counters' is missing")
            # Checked before anything is applied: restore_state raises before it changes a counter.
            set_aside = self._counts.restore_state(data["counters"])
            self._sources.resume_from(files)
        except (ValueError, KeyError, TypeError) as exc:
            # Documented fallback, as for a corrupt file: moved aside, and a first run (files read from their end).
            self.errors += 1
            self._store.reject(f"wrong types: {exc}")
            self._sources.forget_saved()
            return
        set_aside += self._load_recent(data.get("recent"))
        if set_aside:
            # Each malformed entry cost itself (warned where it was found); the file as it was is kept for a human.
            self.errors += set_aside
            self._store.keep_copy(f"{set_aside} malformed entries set aside")

    def _load_recent(self, recent: object) -> int:
        """The recent events and last-event times ("recent"; older state files have none); a bad one costs itself.

        The number of entries set aside (the malformed ones, and events of a kind this build does not know)."""
        if recent is None or self._events is None:
            return 0
        try:
            if not isinstance(recent, dict):
                raise ValueError(f"'recent' is {type(recent).__name__}, not an object")
            bad = self._counts.restore_last(recent.get("last", []))
            restored, bad_events = self._events.restore_state(recent.get("events", []), self._counts.kinds)
            log.info("state: %d recent events restored", restored)
        except ValueError as exc:
            log.warning("state: recent events not restored (the counters and positions are): %s", exc)
            return 1
        return bad + bad_events

    def save_if_due(self) -> None:
        """The periodic save: every interval, and only when something was read or counted since the last.

        An idle node with 1,000 files should not fsync a state file every few seconds.
        """
        now = self._clock()
        since = now - self._last_save
        if since >= self.interval:
            self.save(force=False)
            return
        if self._store is None or self._failing or since < self._save_cost:
            # An eager save waits at least as long as the last one took: with a large state on a busy machine,
            # the loop then spends at most about half its time saving, and the rest reading.
            return
        # A rotation, truncation, deletion or new file was seen: save now. A restart knows only the generations
        # in the state file; one born after the last save and rotated away while down was never read again, and
        # what was counted from a deleted one cannot be counted again. The same soon after an event is counted.
        due = (
            self._requested
            or self._sources.generations() != self._saved_generations
            or (
                since >= EVENT_SAVE_DELAY
                and self._saved_mark is not None
                and self._counts.total() != self._saved_mark[1]
            )
        )
        if not due:
            return
        self._due_since = now if self._due_since is None else self._due_since
        if now - self._due_since < EAGER_DEFER_MAX and self._sources.busy():
            return  # an event about to be counted (its rank window closing) goes into this save, and comes first
        self.save()

    def request_save(self) -> None:
        """Save at the loop's next look, as after a rotation (the OTLP spool waits for one to free disk)."""
        self._requested = True

    def save(self, *, force: bool = True) -> None:
        """Write positions, counters and dedupe memory atomically; a failure is counted and logged."""
        if self._store is None:
            return
        self._requested = False
        mark = (float(self._sources.bytes_read()), self._counts.total())
        generations = self._sources.generations()
        if not force and mark == self._saved_mark:
            self._last_save = self._clock()
            return
        began = self._clock()
        with self._sources.locked():
            # A generation that ended with events still waiting (rotated away, truncated) has nothing more to
            # wait for: counted now, they go into this save. Saved as waiting, a SIGKILL would lose them, since
            # the position that re-reads them belongs to a generation the state no longer names.
            self._sources.settle_ended()
            files = self._sources.positions()
            data: dict[str, Any] = {"counters": self._counts.export_state(), "files": files}
        if self._events is not None:
            data["recent"] = {"events": self._events.export_state(), "last": self._counts.export_last()}
        try:
            self._store.save(data)
            self.saves += 1
            self._saved_mark = mark
            self._saved_generations = generations
            if self._failing:
                log.info("state: saved again in %s", self._store.directory)
            self._failing = False
        except (OSError, TypeError, ValueError) as exc:
            self._error(f"cannot save the state file: {exc}")
            self._failing = True
        else:
            if self.on_saved is not None:
                self.on_saved(files)
        self._last_save = self._clock()
        self._save_cost = self._last_save - began
        self._due_since = None

    def _error(self, message: str) -> None:
        # Counted every time; logged once per streak of failures (a broken state dir fails every few seconds).
        self.errors += 1
        log.log(logging.DEBUG if self._failing else logging.WARNING, "state: %s", message)
