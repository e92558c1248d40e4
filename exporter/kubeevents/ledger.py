"""Kubernetes Events, the memory across restarts: the keys of the OOMs the poster has taken, on disk before
it makes any call, so that an OOM counted again after a restart never gets a second Event.

Why a file of its own: the state file is saved within a second of a count, not at the moment of it, so a
SIGKILL in between makes the restarted daemon count the OOM again (the counter was lost with it). The poster
writes the OOM's key here before its first API call: a restart then recognises the OOM and posts nothing;
a crash before the write means nothing was posted yet, and the recount posts it once. At most once, by design.

    <state_dir>/k8s-events.json: {"version": 1, "keys": [oldest, ..., newest]}   (at most KEYS_KEPT keys)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile

from ..detect.model import OomEvent

log = logging.getLogger(__name__)

FILENAME = "k8s-events.json"
VERSION = 1
KEYS_KEPT = 4096  # far more OOMs than can be re-read after a restart (the dedupe keeps 1024 per file)


def event_key(event: OomEvent) -> str:
    """An OOM's identity across restarts: where it starts (file:line, byte offset), when, and its kind."""
    raw = f"{event.location}\0{event.offset}\0{event.time}\0{event.kind}"
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


class Ledger:
    """Keys taken, oldest first; save() writes them atomically (temp file, fsync, rename)."""

    def __init__(self, directory: str | None) -> None:
        self.path = os.path.join(directory, FILENAME) if directory else None
        self._keys: dict[str, None] = {}
        self.errors = 0
        if self.path is not None:
            self._load(self.path)

    def __contains__(self, key: str) -> bool:
        return key in self._keys

    def take(self, key: str) -> bool:
        """Remember key on disk; False when the file could not be written (counted; the Event still goes)."""
        self._keys[key] = None
        while len(self._keys) > KEYS_KEPT:
            del self._keys[next(iter(self._keys))]
        if self.path is None:
            return True
        try:
            self._save(self.path)
        except OSError as exc:
            self.errors += 1
            log.warning("k8s events: cannot save %s: %s (a restart may post this OOM's Event again)", self.path, exc)
            return False
        return True

    def _load(self, path: str) -> None:
        try:
            with open(path, "rb") as fh:
                doc = json.loads(fh.read().decode("utf-8"))
            keys = doc["keys"] if isinstance(doc, dict) and doc.get("version") == VERSION else None
            if not isinstance(keys, list):
                raise ValueError("no keys list of this version")
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, UnicodeDecodeError, RecursionError) as exc:
            # RecursionError: nested deeper than the parser's limit; no ledger of ours is, and every start would stop.
            self.errors += 1
            log.warning("k8s events: ignoring %s: %s", path, exc)
            return
        taken = [k for k in keys[-KEYS_KEPT:] if isinstance(k, str)]  # a key is event_key()'s hex string
        if len(taken) != len(keys[-KEYS_KEPT:]):
            self.errors += 1
            log.warning(
                "k8s events: %s: %d keys that are no string set aside", path, len(keys[-KEYS_KEPT:]) - len(taken)
            )
        self._keys = dict.fromkeys(taken)

    def _save(self, path: str) -> None:
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        body = json.dumps({"version": VERSION, "keys": list(self._keys)}, separators=(",", ":")).encode()
        fd, temp = tempfile.mkstemp(prefix=f".{FILENAME}.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(body)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
