"""File tailing: the left edge of the pipeline, where log files become ordered bytes.

    file (inode, offset) --FileTailer.poll()--> TailChunk / TailReset --> line reader --> RawLine -> ...

A FileTailer follows one path across file generations (rotation, copytruncate, delete and recreate)
and says so with a TailReset between generations; the consumer owns the partial-line buffer and
line numbers. It never blocks and never raises for I/O: a watch event or a poll tick only means
"call poll() now" (watch.py), and errors are counted in TailStats and retried on the next poll.

It also goes back to a generation it does not hold open: a parked file (its handle given back to the open-file
bound, handles.py) is reopened by path when it changed; a position restored from the state file is resumed in
place when the path still holds that generation; otherwise the generation is looked for beside the path
(fileid.find_rotated: renamed, copied by copytruncate, compressed) and drained from there. These share every
field of the open generation (handle, inode, offsets, fingerprint), so they are one class.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from .fileid import (
    DELETED,
    FINGERPRINT_BYTES,
    RECREATED,
    ROTATED,
    TRUNCATED,
    TailChunk,
    TailItem,
    TailPosition,
    TailReset,
    TailStats,
    find_rotated,
    fingerprint,
    matches,
    open_binary,
)
from .handles import HandleBudget

log = logging.getLogger(__name__)

# A deleted file whose writer still holds it open keeps growing with no name: it is read through our handle
# until it has been quiet this long (no directory event tells us about it, so it is looked at every pass).
DELETED_LINGER_SECONDS = 30.0
# How far back start_at_end looks for a line start, so the first line it delivers is whole.
_BACKSCAN_BYTES = 64 * 1024


class FileTailer:
    """Follow one path across rotations and truncations, yielding its new bytes on each poll()."""

    def __init__(
        self,
        path: str,
        *,
        start_at_end: bool = False,
        position: TailPosition | None = None,
        read_size: int = 1 << 20,
        wall_clock: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
        budget: HandleBudget | None = None,
    ) -> None:
        self.path = path
        self.stats = TailStats()
        self._read_size = max(1, read_size)
        self._wall_clock = wall_clock
        self._clock = clock
        self._deleted_at: float | None = None  # when the held file lost its last name, or last grew after it
        self._budget = budget
        # Parked: the handle was given back to the budget; what the file was and where we were in it.
        self._parked: Parked | None = None
        self._restore = position
        # The last generation held, once it has ended (rotated, deleted) and no new one is open yet: still what
        # the state must say, so that a restart finds the rotated file and keeps this file's epoch and memory.
        self._ended: TailPosition | None = None
        # Existing files on a first start are history, not pages; a file that appears later is read
        # from 0 because a crashing container can write its OOM in its first second.
        self._start_at_end = start_at_end
        self._fd: int | None = None
        self._dev = self._ino = 0
        self._offset = 0  # next byte to read
        self._commit = 0  # just past the last newline delivered; what a restart resumes from
        self._fp = fingerprint(b"")
        self._fp_len = 0
        self._mark: tuple[int, int, int, str, int] | None = None  # (dev, ino, offset, mark, mark_len) last taken
        self._seen = (-1, -1)  # (size, mtime_ns) at the last look; unchanged means nothing to do
        self._error_logged = False
        self._closed = False

    @property
    def position(self) -> TailPosition | None:
        """Resume point for the state file; None before any file was opened (and no restore is pending)."""
        if self._fd is None:
            p = self._parked
            if p is not None:
                return TailPosition(self.path, p.dev, p.ino, p.commit, p.fp, p.fp_len)
            return self._restore or self._ended
        return TailPosition(self.path, self._dev, self._ino, self._commit, self._fp, self._fp_len)

    @property
    def read_offset(self) -> int:
        """How far the generation at hand has been read: past an unended last line, which the consumer holds until
        its newline comes (so it is no backlog, though a restart reads it again from `position`); 0 before any."""
        if self._fd is not None:
            return self._offset
        if self._parked is not None:
            return self._parked.offset
        pos = self._restore or self._ended
        return pos.offset if pos is not None else 0

    def marked(self, pos: TailPosition) -> TailPosition:
        """pos with the mark (fingerprint of the bytes just before its offset) while its generation is at hand.

        One pread per new offset, at save time; an idle or parked file reuses the mark taken at its offset.
        """
        memo = self._mark
        if memo is not None and memo[:3] == (pos.dev, pos.ino, pos.offset):
            return replace(pos, mark=memo[3], mark_len=memo[4])
        if pos.mark_len or pos.offset == 0 or self._fd is None or (pos.dev, pos.ino) != (self._dev, self._ino):
            return pos
        size = min(FINGERPRINT_BYTES, pos.offset)
        try:
            data = os.pread(self._fd, size, pos.offset - size)
        except OSError:
            return pos
        if len(data) != size:
            return pos
        self._mark = (pos.dev, pos.ino, pos.offset, fingerprint(data), size)
        return replace(pos, mark=self._mark[3], mark_len=size)

    def prime(self) -> None:
        """Open the path and take the starting offset without reading, so the state can hold it first."""
        if not self._closed and self._fd is None and self._restore is None:
            self._open_at_start()

    @property
    def lingering(self) -> bool:
        """Whether a deleted file is still being drained through our handle: poll it every pass."""
        return self._deleted_at is not None

    def close(self) -> None:
        """Release the open file; later polls yield nothing."""
        self._closed = True
        self._parked = None
        self._close_fd()

    def park(self) -> bool:
        """Give the handle back, keeping where we are, to reopen by path when the file changes.

        Only while the path still names the file we hold: a deleted or renamed-away generation can only be
        drained through its handle, so it keeps it (False).
        """
        if self._fd is None or self._deleted_at is not None:
            return False
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        if (st.st_dev, st.st_ino) != (self._dev, self._ino):
            return False
        self._parked = Parked(self._dev, self._ino, self._offset, self._commit, self._fp, self._fp_len, self._seen)
        self._close_fd()
        return True

    def poll(self) -> Iterator[TailItem]:
        """Yield everything new since the last poll, in read_size pieces, with resets between generations."""
        if self._closed:
            return
        if self._fd is None and self._parked is not None:
            yield from self._unpark(self._parked)
        elif self._fd is None:
            yield from self._open_path()
        else:
            yield from self._follow()

    # --- opening a path ---------------------------------------------------------------------

    def _open_path(self) -> Iterator[TailItem]:
        if self._restore is not None:
            yield from self._resume(self._restore)
            return
        if self._open_at_start():
            yield from self._read_to_eof()

    def _open_at_start(self) -> bool:
        """Open the path at 0, or at its last line start on a first start; False when it cannot be opened."""
        st = self._open()
        if st is None:
            return False
        if self._start_at_end:
            self._offset = self._commit = self._line_start_before(st.st_size)
            self._take_fingerprint()
        self._start_at_end = False
        return True

    def _open(self) -> os.stat_result | None:
        """Open the path read-only; None when it is missing (not an error), unreadable (counted) or when no
        handle is free under the open-file bound (counted by the budget; retried on a later poll)."""
        if self._budget is not None and not self._budget.acquire(self):
            return None
        try:
            # O_NONBLOCK: a FIFO at a log path must not hang the loop; regular files ignore it.
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except (FileNotFoundError, NotADirectoryError):
            # Missing now: when it appears it is a new file, so it is read from 0.
            self._start_at_end = False
            return None
        except OSError as exc:
            if self._budget is not None and exc.errno in (errno.EMFILE, errno.ENFILE):
                self._budget.refused(self, str(exc))  # the kernel's limit, despite the bound: wait a turn
                return None
            self._error("open", exc)
            return None
        try:
            st = os.fstat(fd)
        except OSError as exc:
            os.close(fd)
            self._error("open", exc)
            return None
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            self._error("open", OSError(f"not a regular file (mode {stat.filemode(st.st_mode)})"))
            return None
        if (st.st_dev, st.st_ino) != (self._dev, self._ino):
            self.stats.generations += 1  # not a parked file coming back
        self._fd, self._dev, self._ino = fd, st.st_dev, st.st_ino
        self._ended = None
        if self._budget is not None:
            self._budget.opened(self)
        self._rewind()
        self._seen = (st.st_size, st.st_mtime_ns)
        return st

    def _line_start_before(self, size: int) -> int:
        """Offset just after the last newline before size, so start_at_end delivers whole lines."""
        if self._fd is None or size == 0:
            return size
        window = min(size, _BACKSCAN_BYTES)
        try:
            tail = os.pread(self._fd, window, size - window)
        except OSError:
            return size
        newline = tail.rfind(b"\n")
        if newline >= 0:
            return size - window + newline + 1
        return 0 if window == size else size

    # --- a parked file ------------------------------------------------------------

    def _unpark(self, p: Parked) -> Iterator[TailItem]:
        """Reopen a parked file where it was left; if the path now names another file, settle the old one."""
        try:
            st: os.stat_result | None = os.stat(self.path)
        except OSError:
            st = None
        if st is not None and (st.st_dev, st.st_ino) == (p.dev, p.ino):
            if st.st_size == p.offset and (st.st_size, st.st_mtime_ns) == p.seen:
                return  # idle: parked files cost one stat, like open ones
            if self._open() is None:
                return  # no handle free: stay parked, try again on the next poll
            if (self._dev, self._ino) == (p.dev, p.ino):
                self._parked = None
                self._offset, self._commit, self._fp, self._fp_len = p.offset, p.commit, p.fp, p.fp_len
                self._seen = (-1, -1)  # look: appends, or a copytruncate while parked
                yield from self._follow()
                return
            self._close_fd()  # replaced between the stat and the open: settle the old one below
        # The generation we parked is no longer at the path: renamed (drain it from a sibling) or deleted.
        self._parked = None
        pos = TailPosition(self.path, p.dev, p.ino, p.offset, p.fp, p.fp_len)
        self._ended = TailPosition(self.path, p.dev, p.ino, p.commit, p.fp, p.fp_len)
        rotated = find_rotated(self.path, pos)
        if rotated is not None:
            yield from self._drain_rotated(rotated, pos)
        self._start_at_end = False
        if st is None and rotated is None:
            yield TailReset(self.path, DELETED)  # deleted while parked: what it got after parking is lost
            return
        yield TailReset(self.path, ROTATED if rotated is not None else RECREATED)
        yield from self._open_path()

    # --- restoring a saved position ---------------------------------------------------------

    def _resume(self, pos: TailPosition) -> Iterator[TailItem]:
        try:
            st: os.stat_result | None = os.stat(self.path)
        except OSError:
            st = None
        same_file = st is not None and (st.st_dev, st.st_ino) == (pos.dev, pos.ino)
        if same_file and st is not None and st.st_size >= pos.offset and matches(self.path, pos):
            if self._open() is None:
                return  # unreadable: keep the saved position and retry on the next poll
            self._restore = None
            self._offset = self._commit = pos.offset
            self._fp, self._fp_len = pos.fingerprint, pos.fingerprint_len
            yield from self._read_to_eof()
            return
        self._restore = None
        self._ended = pos
        self._start_at_end = False
        rotated = find_rotated(self.path, pos)
        if rotated is not None:
            # Rotated (maybe compressed) while we were down: finish that generation from the saved offset.
            yield from self._drain_rotated(rotated, pos)
            # A copy of a file that was then truncated in place: the path keeps the inode, so the bytes that
            # follow need a new epoch (TRUNCATED), or their keys would collide with the copy's.
            same_inode = st is not None and (st.st_dev, st.st_ino) == (pos.dev, pos.ino)
            yield TailReset(self.path, TRUNCATED if same_inode else ROTATED)
        # Same inode with other first bytes (copytruncate while down) needs no reset here: LogSource sees
        # the first chunk start before its restored offset and starts a new epoch.
        yield from self._open_path()

    def _drain_rotated(self, path: str, pos: TailPosition) -> Iterator[TailItem]:
        offset = pos.offset
        try:
            with open_binary(path) as stream:
                stream.seek(offset)  # gzip decompresses up to offset in bounded memory
                while data := stream.read(self._read_size):
                    self.stats.bytes_read += len(data)
                    self.stats.last_read_wall_time = self._wall_clock()
                    # The saved generation's identity, even when it now lives in a .gz of another inode.
                    newline = data.rfind(b"\n")
                    if newline >= 0 and self._fd is None:
                        # Drained up to here: a restart resumes the rotated file here, not at the saved offset.
                        self._ended = TailPosition(self.path, pos.dev, pos.ino, offset + newline + 1, pos.fingerprint,
                                                   pos.fingerprint_len)  # fmt: skip
                    yield TailChunk(self.path, data, offset, pos.dev, pos.ino)
                    offset += len(data)
        except (OSError, EOFError, zlib.error) as exc:
            self._error("read rotated", exc)

    # --- following an open file -------------------------------------------------------------

    def _follow(self) -> Iterator[TailItem]:
        try:
            st: os.stat_result | None = os.stat(self.path)
        except (FileNotFoundError, NotADirectoryError):
            st = None
        except OSError as exc:
            self._error("stat", exc)
            return
        # Same inode: appends, or copytruncate (told by _truncated). Another inode or none: rotation,
        # recreation or deletion, told apart by whether the file we hold still has a name.
        if st is not None and (st.st_dev, st.st_ino) == (self._dev, self._ino):
            if st.st_size == self._offset and (st.st_size, st.st_mtime_ns) == self._seen:
                return  # the idle case: one stat per file per poll
            self._seen = (st.st_size, st.st_mtime_ns)
            if self._truncated(st.st_size):
                # copytruncate: what we had not read yet is in the copy beside the file (app.log.1), if any.
                copy = TailPosition(self.path, self._dev, self._ino, self._offset, self._fp, self._fp_len)
                self._rewind()  # before the yield, like every state change, in case the consumer stops
                rotated = find_rotated(self.path, copy) if copy.fingerprint_len else None
                if rotated is not None:
                    yield from self._drain_rotated(rotated, copy)
                yield TailReset(self.path, TRUNCATED)
            yield from self._read_to_eof()
            return
        # The path is gone or names another file. Finish the generation we hold first: anything
        # written to it before the switch (kubelet renames n.log, then the runtime reopens) is ours.
        before = self._offset
        yield from self._read_to_eof()
        linked = self._linked()
        if st is None and linked:
            return  # renamed away and not yet replaced: keep draining until the new file shows up
        if st is None:
            now = self._clock()
            if self._deleted_at is None:
                self.stats.generations += 1  # lost its name: save now, while what was counted from it is known
            if self._deleted_at is None or self._offset > before:
                self._deleted_at = now
            if now - self._deleted_at < DELETED_LINGER_SECONDS:
                return  # deleted, but a writer may still hold it: keep reading it until it goes quiet
        self._deleted_at = None
        self._close_fd()
        if st is None:
            yield TailReset(self.path, DELETED)
            return
        yield TailReset(self.path, ROTATED if linked else RECREATED)
        yield from self._open_path()

    def _truncated(self, size: int) -> bool:
        """Tell copytruncate by a smaller size, or by changed first bytes when it regrew past our offset."""
        if size < self._offset:
            return True
        if self._fp_len == 0 or self._fd is None:
            return False
        try:
            head = os.pread(self._fd, self._fp_len, 0)
        except OSError:
            return False
        return len(head) < self._fp_len or fingerprint(head) != self._fp

    def _linked(self) -> bool:
        """Whether the open file still has a name somewhere (renamed) rather than being deleted."""
        if self._fd is None:
            return False
        try:
            return os.fstat(self._fd).st_nlink > 0
        except OSError:
            return False

    def _read_to_eof(self) -> Iterator[TailItem]:
        fd = self._fd
        while fd is not None:
            try:
                data = os.pread(fd, self._read_size, self._offset)
            except OSError as exc:
                self._error("read", exc)
                return
            if not data:
                break
            start = self._offset
            self._advance(data)
            yield TailChunk(self.path, data, start, self._dev, self._ino)
            if len(data) < self._read_size:
                break
        self._refresh_fingerprint()

    def _advance(self, data: bytes) -> None:
        # Offsets move before the chunk is yielded, so a consumer that stops iterating never
        # gets the same bytes twice.
        newline = data.rfind(b"\n")
        if newline >= 0:
            self._commit = self._offset + newline + 1
        self._offset += len(data)
        self.stats.bytes_read += len(data)
        self.stats.last_read_wall_time = self._wall_clock()
        self._error_logged = False
        if self._budget is not None:
            self._budget.touch(self)

    def _refresh_fingerprint(self) -> None:
        # The fingerprint covers min(FINGERPRINT_BYTES, size) bytes, so it grows with a young file.
        if self._fp_len < FINGERPRINT_BYTES and self._offset > self._fp_len:
            self._take_fingerprint()

    def _take_fingerprint(self) -> None:
        if self._fd is None:
            return
        try:
            head = os.pread(self._fd, FINGERPRINT_BYTES, 0)
        except OSError as exc:
            self._error("read", exc)
            return
        if self._fp_len == 0 and head:
            self.stats.generations += 1  # identifiable from now on (a copy of it can be told by its first bytes)
        self._fp, self._fp_len = fingerprint(head), len(head)

    def _rewind(self) -> None:
        self._offset = self._commit = 0
        self._fp, self._fp_len = fingerprint(b""), 0

    # --- housekeeping -----------------------------------------------------------------------

    def _close_fd(self) -> None:
        if self._fd is not None:
            self._ended = TailPosition(self.path, self._dev, self._ino, self._commit, self._fp, self._fp_len)
            fd, self._fd = self._fd, None
            if self._budget is not None:
                self._budget.released(self)
            os.close(fd)

    def _error(self, op: str, exc: BaseException) -> None:
        self.stats.read_errors += 1
        # One warning per streak of failures per file; the counter carries the rate.
        level = logging.DEBUG if self._error_logged else logging.WARNING
        log.log(level, "tail error path=%s op=%s error=%s", self.path, op, exc)
        self._error_logged = True


@dataclass(frozen=True, slots=True)
class Parked:
    """A parked file's identity and our place in it."""

    dev: int
    ino: int
    offset: int
    commit: int
    fp: str
    fp_len: int
    seen: tuple[int, int]
