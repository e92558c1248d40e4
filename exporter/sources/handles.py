"""How many log files may be open at once: a bound under the open-file limit, shared by every FileTailer.

    SourceSet --one HandleBudget--> FileTailer._open() asks acquire(); the least recently active tailer parks

One descriptor per followed file made a node with more log files than RLIMIT_NOFILE deaf: /metrics,
/healthz and the state file all need descriptors too. Tailers open on demand instead; when the bound is
reached, the tailer that read least recently gives its handle back (it "parks": keeps its offset and reopens
by path when its file changes). A file that cannot be parked (deleted but still draining, renamed away)
keeps its handle; then a new open waits and is counted as a limit hit.
"""

from __future__ import annotations

import logging
import resource
from collections import OrderedDict
from typing import Protocol

log = logging.getLogger(__name__)

# Descriptors kept free for everything else: the HTTP edge's connections (64 at most), the listening
# socket, the file watcher, the state file's save, a rotated sibling being drained, logging.
_RESERVE = 64
_MAX_BOUND = 65536
_MIN_BOUND = 8


class Parkable(Protocol):
    """A tailer that can give its handle back and reopen by path later."""

    def park(self) -> bool: ...


def raise_open_file_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (the kernel caps infinity); returns (soft, hard) after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        for target in (hard, 1 << 20, 1 << 16):
            if target != resource.RLIM_INFINITY and target <= soft:
                break
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            except (ValueError, OSError):
                continue
            break
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def handle_bound(soft: int | None = None) -> int:
    """Log files that may be open at once under the soft open-file limit: all but a reserve."""
    if soft is None:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return _MAX_BOUND
    return max(_MIN_BOUND, min(_MAX_BOUND, soft - max(_RESERVE, soft // 4)))


class HandleBudget:
    """Keeps the open log files at or under a bound, least recently active first to give its handle back."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._open: OrderedDict[int, Parkable] = OrderedDict()  # by id(), least recently active first
        self.parks = 0  # handles given back to make room
        self.limit_hits = 0  # opens refused by the bound (nothing could park) or by the kernel (EMFILE)
        self._waiting: set[int] = set()  # tailers whose last open was refused
        self._logged = False

    @property
    def waiting(self) -> int:
        """Tailers whose last open was refused: files not being read until a handle is free."""
        return len(self._waiting)

    @property
    def open_files(self) -> int:
        """Log files open now."""
        return len(self._open)

    def acquire(self, tailer: Parkable) -> bool:
        """Make room for one more open file; False when nothing could park (the caller retries later)."""
        if id(tailer) in self._open:
            return True
        if len(self._open) < self.limit:
            return True  # the common case, without copying the table: 10,000 opens at a start
        for key, other in list(self._open.items()):
            if len(self._open) < self.limit:
                break
            if other.park():  # park() calls released(), which removes it
                self.parks += 1
            else:
                self._open.move_to_end(key)  # cannot park now: try the next least recent one
        if len(self._open) < self.limit:
            return True
        self.refused(tailer)
        return False

    def refused(self, tailer: Parkable, reason: str = "") -> None:
        """An open refused by the bound or by the kernel's limit: counted, logged once per streak."""
        self.limit_hits += 1
        self._waiting.add(id(tailer))
        if not self._logged:
            self._logged = True
            log.warning("open-file bound reached (%d log files open, bound %d)%s; files wait their turn",
                        len(self._open), self.limit, f": {reason}" if reason else "")  # fmt: skip

    def opened(self, tailer: Parkable) -> None:
        """A tailer opened its file."""
        self._open[id(tailer)] = tailer
        self._waiting.discard(id(tailer))
        if not self._waiting:
            self._logged = False

    def touch(self, tailer: Parkable) -> None:
        """A tailer read bytes: it is the most recently active."""
        key = id(tailer)
        if key in self._open:
            self._open.move_to_end(key)

    def released(self, tailer: Parkable) -> None:
        """A tailer closed its file."""
        self._open.pop(id(tailer), None)
        self._waiting.discard(id(tailer))
