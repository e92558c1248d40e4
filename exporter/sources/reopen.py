"""Going back to a file generation the tailer does not hold open: a parked file, a saved position, a rotated copy.

    FileTailer (tail.py) --parked / restored--> Reopen._unpark / _resume --rotated away?--> find_rotated, drain

A parked file is reopened by path when it changed; a position restored from the state file is resumed in place
when the path still holds that generation; otherwise the generation is looked for beside the path (renamed,
copied by copytruncate, compressed) by inode or by the fingerprint of its first bytes, and drained from there.
"""

from __future__ import annotations

import errno
import os
import stat
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .fileid import (
    DELETED,
    RECREATED,
    ROTATED,
    TRUNCATED,
    TailChunk,
    TailItem,
    TailPosition,
    TailReset,
    TailStats,
    bytes_before,
    fingerprint,
    head_bytes,
    open_binary,
)
from .handles import HandleBudget

# How far back start_at_end looks for a line start, so the first line it delivers is whole.
_BACKSCAN_BYTES = 64 * 1024
_COMPRESSED_SUFFIX = ".gz"  # only to rank siblings (plain first); compression itself is told by content


class Reopen:
    """FileTailer's half that reopens: parked files, restored positions and rotated siblings."""

    # Kept by FileTailer (tail.py); declared here for the methods below.
    path: str
    stats: TailStats
    _read_size: int
    _wall_clock: Callable[[], float]
    _fd: int | None
    _dev: int
    _ino: int
    _offset: int
    _commit: int
    _fp: str
    _fp_len: int
    _seen: tuple[int, int]
    _parked: Parked | None
    _restore: TailPosition | None
    _ended: TailPosition | None
    _start_at_end: bool
    _budget: HandleBudget | None
    _deleted_at: float | None

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

    def _follow(self) -> Iterator[TailItem]:
        raise NotImplementedError

    def _read_to_eof(self) -> Iterator[TailItem]:
        raise NotImplementedError

    def _close_fd(self) -> None:
        raise NotImplementedError

    def _error(self, op: str, exc: BaseException) -> None:
        raise NotImplementedError

    def _rewind(self) -> None:
        raise NotImplementedError

    def _take_fingerprint(self) -> None:
        raise NotImplementedError

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


def matches(path: str, pos: TailPosition) -> bool:
    """Whether the file at path holds the saved generation (plain or .gz): its first bytes, and its bytes just
    before the saved offset when the position has that mark (a new file may begin with the same banner)."""
    head = head_bytes(path, pos.fingerprint_len)
    if head is None or fingerprint(head) != pos.fingerprint:
        return False
    if not pos.mark_len:
        return True
    before = bytes_before(path, pos.offset, pos.mark_len)
    return before is not None and fingerprint(before) == pos.mark


def find_rotated(path: str, pos: TailPosition) -> str | None:
    """A sibling (n.log.<ts>, app.log.1, *.gz) holding the saved generation, or None."""
    directory, base = os.path.split(path)
    try:
        names = os.listdir(directory or ".")
    except OSError:
        return None
    ranked = []
    for name in names:
        if name == base or not name.startswith(base):
            continue
        sibling = os.path.join(directory, name)
        try:
            st = os.stat(sibling)
        except OSError:
            continue
        same = (st.st_dev, st.st_ino) == (pos.dev, pos.ino)
        # An empty fingerprint matches anything, so then only the inode can say it is ours.
        if stat.S_ISREG(st.st_mode) and (same or pos.fingerprint_len > 0):
            # A rename keeps the inode, so it ranks first; plain beats .gz of the same generation.
            ranked.append((not same, name.endswith(_COMPRESSED_SUFFIX), -st.st_mtime_ns, sibling))
    for *_, sibling in sorted(ranked):
        if matches(sibling, pos):
            return sibling
    return None


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
