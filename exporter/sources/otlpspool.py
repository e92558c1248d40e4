"""The received records' spool: each source's lines in a log file of its own, durable before the answer.

    otlp.lines() --append()--> ROOT/pods/<ns>_<pod>_<uid>/<container>/<restart>.log  (+ .ids beside it)
                               ROOT/files/<name>.log                                  (+ .ids)
    the daemon follows those files like any other: tail -> reader -> detect, positions in state.json

Exactly once over a shipper that delivers at least once: append() writes a batch's new lines to the source's
log at its committed end and fsyncs it, then writes their identities and a commit mark (`=<log size> <count>`)
at the .ids file's committed end and fsyncs that; only then does the HTTP edge answer 2xx. A line whose identity
is already in the source's memory (the last DEDUPE_WINDOW identities, kept in the .ids file) is a retried copy
and is not written again.

A write or fsync that fails cuts both files back to their committed ends, the .ids file first (a log longer than
its last mark is uncommitted, never the other way round), and the next batch of the source starts by cutting
back whatever a cut that failed too left there: a torn row is never followed by a committed one. A crash between
the writes leaves bytes past the last mark: recover() cuts the log back to it and drops the identities that no
complete mark commits (the shipper got no 2xx and sends them again). A mark commits exactly the `count` rows
before it, so a row of a failed batch is never taken for a committed one. The caller holds the daemon's source
lock around append(), so no state save can record a read position inside bytes that recovery may cut.

Bounded disk, counted as the filesystem counts it (st_blocks, what an emptyDir's sizeLimit measures), and
bounded sources: a source's log is rotated as the kubelet rotates (`<n>.log` renamed `<n>.log.<time>`, the tailer
drains it and follows the new file) once it outgrows a quarter of the per-source cap and the last durable state
save (consumed()) names it. A rotated segment is deleted once a durable save names the live file again (at once
when the save showed it read to its end). A source that got nothing for the retention and was read to its end is
removed. The total cap counts every block; when the disk would pass it, what a durable save shows read is freed
first (a log read to its end is deleted at once, its identities kept; one read in part is rotated, its segment
going at the next save), so only unread lines, or read ones waiting for a save (seconds), make append() raise
SpoolFullError (503 with Retry-After), as does a new source past the cap on sources. Nothing unread or
acknowledged is ever dropped. The spool keeps each source's files in memory (its segments included), so no
request and no start lists a shared directory once per source.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SPOOL_DIR = "otlp"  # under the state directory
POD_DIR = "pods"  # the kubelet-layout tree: pods/<ns>_<pod>_<uid>/<container>/<restart>.log
FILE_DIR = "files"  # sources named by a file path or a service: files/<name>.log
NO_UID = "nouid"  # the uid part of a pod directory whose records named no k8s.pod.uid
DEDUPE_WINDOW = 65536  # identities kept per source: a retry resends a batch of the last few minutes, not older
# Identities held in memory across all sources (16 full windows, about 92 MiB): past it the windows of the sources
# that received least recently leave memory and are read back from their .ids files when they next receive.
IDENTITY_BUDGET = 16 * DEDUPE_WINDOW
IDS_SUFFIX = ".ids"
RECLAIM_BYTES = 4 * 4096  # a log read less than this far is not worth a rotation for room
BLOCK = 4096  # a new block's size, for a batch's estimate (ext4, xfs, tmpfs); what is taken is read back
_ID_ROW = 33  # bytes of one identity in the .ids file (32 hex digits and a newline)
_ID = re.compile(rb"[0-9a-f]{32}\n")
_IDS = re.compile(rb"(?:[0-9a-f]{32}\n)*")  # rows between two marks, none torn
_KEY = 16  # bytes of an identity
_MARK = re.compile(rb"=(\d+)(?: (\d+))?\n")  # "=<log size> <identities it commits>" (the count: since 0.1.0)
_ROTATED = re.compile(r"(.+\.log)\.\d{8}-\d{6}(?:\.\d+)?")  # a rotated segment: <n>.log.<YYYYmmdd-HHMMSS>[.k]
_TEMP = IDS_SUFFIX + ".tmp"  # a compaction's new .ids file before its rename
# A directory fsync some filesystems refuse: its name is as durable as that filesystem makes it.
_NO_DIR_SYNC = (errno.EINVAL, errno.ENOTSUP, errno.EBADF, errno.EACCES)

log = logging.getLogger(__name__)


def spool_root(state_dir: str) -> str:
    """Where the spool lives in a state directory (a discovery root of the source set)."""
    return os.path.join(state_dir, SPOOL_DIR)


@dataclass(frozen=True, slots=True)
class Line:
    """One record's body as the bytes of a log line (newline-terminated), and its identity for dedupe."""

    data: bytes
    identity: bytes  # 16 bytes (otlp.lines()): a retried copy of the same record has the same


class SpoolError(Exception):
    """The spool could not make a batch durable (disk full, read-only, I/O error): answer 503, retry later."""


class SpoolFullError(SpoolError):
    """The batch would pass a cap with lines the reader has not consumed yet: answer 503, retry later."""


class SpoolSourcesError(SpoolFullError):
    """The batch names new sources past the cap on sources: answer 503, retry once idle sources are removed."""


@dataclass(frozen=True, slots=True)
class Limits:
    """The spool's bounds: disk per source and in all (bytes of blocks; 0: unbounded), sources (0: unbounded),
    how long an idle source that was read to its end is kept (0: for ever), and the identities held in memory
    across sources (0: every source's window)."""

    source_bytes: int = 0
    total_bytes: int = 0
    retention: float = 0.0
    sources: int = 0
    identities: int = IDENTITY_BUDGET

    @property
    def segment_bytes(self) -> int:
        """A source's live log is rotated past this size (0: never)."""
        return self.source_bytes // 4

    @property
    def window(self) -> int:
        """Identities remembered per source: DEDUPE_WINDOW, or fewer so that they take a 16th of the cap."""
        if not self.source_bytes:
            return DEDUPE_WINDOW
        return max(1, min(DEDUPE_WINDOW, self.source_bytes // (16 * _ID_ROW)))


@dataclass
class SpoolStats:
    """What the spool did, for /metrics (counters) and its gauges' inputs."""

    recovered_bytes: int = 0  # uncommitted log bytes cut at a start (a crash between a batch's writes)
    write_errors: int = 0  # batches a write or fsync failed for (503; cut back to their commit)
    rotations: int = 0  # live logs rotated into a segment
    dropped_segments: int = 0  # segments deleted once read
    reclaimed_logs: int = 0  # live logs read to their end deleted to make room under the total cap
    removed_sources: int = 0  # idle sources read to their end removed
    refused_source: int = 0  # batches refused: a source's cap
    refused_total: int = 0  # batches refused: the total cap (unread lines)
    refused_sources: int = 0  # batches refused: new sources past the cap on sources
    window_loads: int = 0  # dedupe windows read back from their .ids files (out of memory for the budget)


@dataclass(frozen=True)
class SpoolUse:
    """The spool's use now: sources, files and directories (inodes), bytes of blocks, unread bytes, file bytes, and
    the record identities its dedupe windows hold in memory."""

    sources: int
    inodes: int
    disk_bytes: int
    unread_bytes: int
    file_bytes: int
    identities: int


class _Window:
    """A source's last `size` committed identities: their bytes in one ring (oldest first from `head`) and, for
    lookup, the last 8 bytes of each as an int in a set (about 84 bytes an identity, against 137 for the bytes in
    an OrderedDict before). A new record is taken for a duplicate when its 64 bits match one of the window's by
    chance: at most 65,536 / 2**64 = 3.6e-15 a record (identities are BLAKE2b digests)."""

    __slots__ = ("head", "keys", "ring", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.ring = bytearray()
        self.head = 0
        self.keys: set[int] = set()

    def __contains__(self, identity: bytes) -> bool:
        return _key(identity) in self.keys

    def __len__(self) -> int:
        return len(self.keys)

    def __iter__(self) -> Iterator[bytes]:
        ring, head = bytes(self.ring), self.head
        for i in (*range(head, len(ring), _KEY), *range(0, head, _KEY)):
            yield ring[i : i + _KEY]

    def extend(self, blob: bytes) -> None:
        """Add identities given as one run of 16-byte keys, oldest first: as add() one by one, in bulk when none
        is in the window or twice in the run (a batch's fresh lines, a window read back)."""
        new = set(_keys(blob))
        if len(new) * _KEY != len(blob) or not new.isdisjoint(self.keys):
            for i in range(0, len(blob), _KEY):
                self.add(blob[i : i + _KEY])
            return
        if len(blob) > self.size * _KEY:  # only the last `size` stay
            blob = blob[len(blob) - self.size * _KEY :]
            new = set(_keys(blob))
        room = min(len(blob), self.size * _KEY - len(self.ring))
        if self.keys:
            self.ring += blob[:room]
            self.keys |= new
        else:  # an empty window: taken whole, no table grown step by step
            self.ring, self.keys = bytearray(blob[:room]), new
        blob = blob[room:]
        while blob:  # the window is full: each new identity takes the place of the oldest
            head = self.head
            take = min(len(blob), len(self.ring) - head)
            self.keys.difference_update(_keys(bytes(self.ring[head : head + take])))
            self.ring[head : head + take] = blob[:take]
            self.head = (head + take) % len(self.ring)
            blob = blob[take:]

    def add(self, identity: bytes) -> None:
        key = _key(identity)
        if key in self.keys:
            return
        self.keys.add(key)
        if len(self.ring) < self.size * _KEY:
            self.ring += identity
            return
        head = self.head
        self.keys.discard(_key(self.ring[head : head + _KEY]))
        self.ring[head : head + _KEY] = identity
        self.head = (head + _KEY) % len(self.ring)


def _keys(blob: bytes) -> memoryview:
    """The lookup ints of a run of 16-byte identities (as _key() reads each)."""
    return memoryview(blob).cast("Q")[1::2]


def _key(identity: bytes | bytearray) -> int:
    """The int a window looks an identity up by: its last 8 bytes in the machine's order (a memoryview's "Q")."""
    return int.from_bytes(identity[_KEY - 8 : _KEY], sys.byteorder)


class _Memory:
    """One source's recent identities (its window: None while it is out of memory, its .ids file holds them), its
    files' committed sizes and blocks, and what the last durable save shows read of it."""

    __slots__ = ("file", "ids", "ids_blocks", "ids_bytes", "last", "lines", "log_blocks", "new", "read",
                 "segments", "size", "window")  # fmt: skip

    def __init__(self, window: int) -> None:
        self.ids: _Window | None = _Window(window)
        self.window = window
        self.size = 0  # the live log's committed bytes
        self.ids_bytes = 0  # the .ids file's committed bytes
        self.lines = 0  # rows in the .ids file (compacted when it outgrows the window)
        self.log_blocks = 0  # bytes of blocks the live log takes
        self.ids_blocks = 0
        self.file: tuple[int, int] | None = None  # the live log's (dev, ino) once its name is durable
        self.segments: dict[str, tuple[int, int]] = {}  # rotated segment -> (bytes, bytes of blocks)
        self.read = 0  # bytes of the live log the last durable save shows read
        self.last = 0.0  # wall time of the last write (the log's mtime after a restart)
        self.new = False  # the batch being written makes its log file (first, or after a rotation)

    @property
    def disk(self) -> int:
        """Bytes of blocks the source's files take."""
        return self.log_blocks + self.ids_blocks + sum(b for _, b in self.segments.values())

    @property
    def unread(self) -> int:
        """Bytes the reader has not consumed (as far as a durable save says): segments count whole."""
        return self.size - min(self.read, self.size) + sum(n for n, _ in self.segments.values())

    @property
    def inodes(self) -> int:
        return (self.file is not None) + (self.ids_bytes > 0) + len(self.segments)


@dataclass(frozen=True, slots=True)
class _Staged:
    """A source's lines written to its log and fsynced, waiting for their commit in the .ids file."""

    rel: str
    memory: _Memory
    fresh: list[Line]
    size: int  # the log's size with them
    log_blocks: int
    file: tuple[int, int]


class Spool:
    """The spool under one root directory; append() is safe from many request threads."""

    def __init__(self, root: str, limits: Limits | None = None, *, wall: Callable[[], float] = time.time) -> None:
        self.root = root
        self.limits = limits or Limits()
        self._wall = wall
        self._lock = threading.Lock()
        self._memory: dict[str, _Memory] = {}
        # The sources whose window is in memory, least recently received first, and the identities they hold.
        self._hot: OrderedDict[str, None] = OrderedDict()
        self._held = 0
        self._dirs: dict[str, int] = {}  # the spool's directories -> bytes of blocks they take
        # What the last durable state save says of each spooled log: its path -> (dev, ino, offset).
        self._saved: dict[str, tuple[int, int, int]] = {}
        self.stats = SpoolStats()
        # A state save would let the spool rotate or drop a segment (a log not named by one yet, a batch refused).
        self.wants_save = False

    @property
    def full(self) -> int:
        """Batches refused because a cap would be passed by unread lines."""
        return self.stats.refused_source + self.stats.refused_total

    def use(self) -> SpoolUse:
        """Sources, inodes, blocks, unread bytes and file bytes now (one pass over the sources' memory).

        Never waits for the lock: a scrape must not wait for a batch's fsyncs. Each list is copied whole under
        the interpreter lock; a source changed meanwhile shows its state before or after, as a gauge may."""
        memories = list(self._memory.values())
        dirs = list(self._dirs.values())
        segments = [list(m.segments.values()) for m in memories]
        return SpoolUse(
            sources=len(memories),
            inodes=sum(m.inodes for m in memories) + len(dirs),
            disk_bytes=sum(m.log_blocks + m.ids_blocks for m in memories)
            + sum(b for s in segments for _, b in s)
            + sum(dirs),
            unread_bytes=sum(m.size - min(m.read, m.size) for m in memories) + sum(n for s in segments for n, _ in s),
            file_bytes=sum(m.size + m.ids_bytes for m in memories) + sum(n for s in segments for n, _ in s),
            identities=self._held,
        )

    def disk_bytes(self) -> int:
        """Bytes the spool's files take (logs, rotated segments, .ids files), as their sizes say."""
        return self.use().file_bytes

    def path(self, rel: str) -> str:
        """The absolute path of a spooled source."""
        return os.path.join(self.root, rel)

    # --- start --------------------------------------------------------------------------------

    def recover(self) -> None:
        """Load every source's memory and cut any log back to its last commit (call before the loop reads).

        One walk of the tree: each directory is listed once, whatever the number of sources in it.
        """
        sources: set[str] = set()
        segments: dict[str, dict[str, tuple[int, int]]] = {}
        with self._lock:
            for dirpath, dirs, names in os.walk(self.root):
                dirs.sort()
                self._dirs[os.path.abspath(dirpath)] = _blocks_of(dirpath)
                for name in names:
                    full = os.path.join(dirpath, name)
                    rel = os.path.relpath(full, self.root)
                    rotated = _ROTATED.fullmatch(name)
                    if name.endswith(".log"):
                        sources.add(rel)
                    elif name.endswith(".log" + IDS_SUFFIX):
                        sources.add(rel[: -len(IDS_SUFFIX)])
                    elif name.endswith(_TEMP):
                        with contextlib.suppress(OSError):
                            os.unlink(full)  # a compaction cut short: the .ids file it would replace is whole
                    elif rotated is not None:
                        owner = os.path.relpath(os.path.join(dirpath, rotated.group(1)), self.root)
                        st = _stat(full)
                        if st is not None:
                            segments.setdefault(owner, {})[full] = (st.st_size, st.st_blocks * 512)
            # Oldest first, so that what the budget keeps in memory is what received last.
            for rel in sorted(sources | set(segments), key=lambda rel: (self._mtime(rel), rel)):
                memory = self._load(rel, segments.get(rel, {}))
                self._memory[rel] = memory
                self._hold(rel, memory)
                self._fit()

    def _mtime(self, rel: str) -> float:
        st = _stat(self.path(rel) + IDS_SUFFIX) or _stat(self.path(rel))
        return st.st_mtime if st is not None else 0.0

    def _hold(self, rel: str, memory: _Memory) -> None:
        """Note a source's window in memory as received last (its identities counted against the budget)."""
        if rel not in self._hot and memory.ids is not None:
            self._held += len(memory.ids)
        self._hot[rel] = None
        self._hot.move_to_end(rel)

    def _fit(self, keep: str = "") -> None:
        """Take windows out of memory, least recently received first, until the budget holds them (`keep`'s
        stays). Their .ids files hold them: _window() reads a window back exactly as recovery would."""
        budget = self.limits.identities
        while budget and self._held > budget:
            rel = next(iter(self._hot))
            if rel == keep:
                if len(self._hot) == 1:
                    return
                self._hot.move_to_end(rel)
                continue
            self._drop_window(rel)

    def _drop_window(self, rel: str) -> None:
        self._hot.pop(rel, None)
        memory = self._memory.get(rel)
        if memory is not None and memory.ids is not None:
            self._held -= len(memory.ids)
            memory.ids = None

    def _window(self, rel: str, memory: _Memory) -> _Window:
        """A source's window, read back from its .ids file's committed bytes when it is out of memory."""
        window = memory.ids
        if window is None:
            path = self.path(rel) + IDS_SUFFIX
            try:
                with open(path, "rb") as fh:
                    raw = fh.read(memory.ids_bytes)
            except OSError as exc:
                raise SpoolError(f"cannot read {path}: {exc}") from exc
            if len(raw) < memory.ids_bytes:
                raise SpoolError(f"cannot read {path}: {len(raw)} bytes, {memory.ids_bytes} committed")
            window = _Window(memory.window)
            scratch = _Memory(memory.window)
            scratch.ids = window
            _replay(raw, scratch)
            memory.ids = window
            self.stats.window_loads += 1
        if rel in self._memory:  # a new source is held once a commit makes it the spool's
            self._hold(rel, memory)
        return window

    def _load(self, rel: str, segments: dict[str, tuple[int, int]]) -> _Memory:
        """A source's memory from its .ids file; a log past the last commit is cut back to it, and rows no
        complete mark commits are cut from the .ids file."""
        memory = _Memory(self.limits.window)
        memory.segments = dict(segments)
        path = self.path(rel)
        try:
            with open(path + IDS_SUFFIX, "rb") as fh:
                raw = fh.read()
        except FileNotFoundError:
            raw = b""
        except OSError as exc:
            raise SpoolError(f"cannot read {path}{IDS_SUFFIX}: {exc}") from exc
        committed_end = _replay(raw, memory)
        try:
            if committed_end < len(raw):
                log.warning("otlp spool: %s%s: %d bytes past the last commit cut (a batch never acknowledged)",
                            path, IDS_SUFFIX, len(raw) - committed_end)  # fmt: skip
                _cut(path + IDS_SUFFIX, committed_end)
            st = _stat(path)
            live = st.st_size if st is not None else 0
            if live > memory.size:
                self.stats.recovered_bytes += live - memory.size
                log.warning("otlp spool: %s: %d bytes past the last commit cut (a batch never acknowledged; the "
                            "shipper sends it again)", path, live - memory.size)  # fmt: skip
                _cut(path, memory.size)
            elif live < memory.size:
                # Rotated or deleted after its last mark (a crash between the rename and the new log's mark, or a
                # log read to its end deleted for room): the log is new.
                mark = b"=%d 0\n" % live
                _write_at(path + IDS_SUFFIX, committed_end, mark)
                memory.size, committed_end = live, committed_end + len(mark)
                memory.lines += 1
            memory.last = st.st_mtime if st is not None else self._wall()
            st = _stat(path)
            if st is not None and (st.st_size or committed_end):  # an empty log no batch committed: not named yet
                memory.file, memory.log_blocks = (st.st_dev, st.st_ino), st.st_blocks * 512
            ids = _stat(path + IDS_SUFFIX)
            memory.ids_blocks = ids.st_blocks * 512 if ids is not None else 0
        except OSError as exc:
            raise SpoolError(f"cannot recover {path}: {exc}") from exc
        memory.ids_bytes = committed_end
        return memory

    # --- a batch ------------------------------------------------------------------------------

    def append(self, batch: Mapping[str, Sequence[Line]]) -> tuple[int, int, list[str]]:
        """Make a batch durable: (lines written, duplicates skipped, spool paths whose file is new).

        Raises SpoolError when a write or fsync fails; the sources written before it are committed and their
        lines remembered, so the shipper's retry writes only the rest. SpoolFullError (nothing written) when a
        cap would be passed.
        """
        written = duplicates = 0
        new: list[str] = []
        with self._lock:
            plan: list[tuple[str, _Memory, list[Line]]] = []
            for rel, lines in batch.items():
                memory = self._memory.get(rel)
                if memory is None:
                    memory = self._load(rel, {})  # a source the spool does not hold: nothing of it on disk
                keys = self._window(rel, memory).keys
                self._fit(rel)  # windows read back for this batch are held one at a time
                fresh: list[Line] = []
                taken: set[bytes] = set()
                for line in lines:
                    if _key(line.identity) in keys or line.identity in taken:
                        duplicates += 1
                    else:
                        taken.add(line.identity)
                        fresh.append(line)
                if fresh:
                    plan.append((rel, memory, fresh))
            try:
                self._make_room(plan)
                new = self._write(plan)
            finally:
                self._fit()
            written = sum(len(fresh) for _, _, fresh in plan)
        return written, duplicates, new

    def _make_room(self, plan: list[tuple[str, _Memory, list[Line]]]) -> None:
        """Rotate the logs that may be, free read logs when the disk needs it, then refuse (SpoolFullError) a
        batch that would pass a cap with unread lines or new sources; nothing written."""
        limits = self.limits
        if limits.sources:
            unknown = sum(1 for rel, _, _ in plan if rel not in self._memory)
            if unknown and len(self._memory) + unknown > limits.sources:
                self.stats.refused_sources += 1
                raise SpoolSourcesError(
                    f"the spool holds {len(self._memory)} sources; {unknown} new ones would pass its cap of "
                    f"{limits.sources} (--otlp-spool-max-sources); a source is removed once it got nothing for "
                    "--otlp-spool-retention and was read to its end"
                )
        if not (limits.source_bytes or limits.total_bytes):
            return
        adding = 0
        made: set[str] = set()  # directories the batch makes (a block each)
        for rel, memory, fresh in plan:
            if limits.segment_bytes and memory.size >= limits.segment_bytes:
                self._rotate(rel, memory)
            need = _batch_blocks(fresh, memory)
            if memory.file is None:
                need += BLOCK * self._new_dirs(os.path.dirname(self.path(rel)), made)
            adding += need
            if limits.source_bytes and memory.disk + need > limits.source_bytes:
                self.stats.refused_source += 1
                self.wants_save = True
                raise SpoolFullError(
                    f"{rel} takes {memory.disk} bytes of disk not read yet or not saved as read; {need} more would "
                    f"pass the cap of {limits.source_bytes} per source (--otlp-spool-source-mib)"
                )
        if not limits.total_bytes:
            return
        disk = sum(m.disk for m in self._memory.values()) + sum(self._dirs.values())
        if disk + adding > limits.total_bytes:
            disk -= self._reclaim(disk + adding - limits.total_bytes, {rel for rel, _, _ in plan})
        if disk + adding > limits.total_bytes:
            self.stats.refused_total += 1
            self.wants_save = True  # a save lets read segments go
            unread = sum(m.unread for m in self._memory.values())
            raise SpoolFullError(
                f"the spool takes {disk} bytes of disk, {unread} of them lines not read yet or not saved as read; "
                f"{adding} more would pass its cap of {limits.total_bytes} (--otlp-spool-total-mib)"
            )

    def _new_dirs(self, directory: str, made: set[str]) -> int:
        """How many directories a new file there needs made, not counting those in `made` (which it joins)."""
        top = os.path.abspath(self.root)
        directory = os.path.abspath(directory)
        n = 0
        while directory.startswith(top) and directory not in self._dirs and directory not in made:
            made.add(directory)
            n += 1
            if directory == top:
                break
            directory = os.path.dirname(directory)
        return n

    def _reclaim(self, want: int, batch: set[str]) -> int:
        """Free what a durable save shows read, until `want` bytes are free: a live log read to its end is deleted
        at once (its identities stay: a retry of its lines is still a duplicate); one read in part is rotated, and
        its segment goes at the next save. The bytes freed now."""
        freed = 0
        for rel, memory in self._memory.items():
            if freed >= want:
                break
            if rel in batch or not memory.read or memory.segments:
                continue
            path = self.path(rel)
            saved = self._saved.get(path)
            if saved is None or saved[:2] != memory.file:
                continue
            if memory.read < memory.size:
                if memory.read >= RECLAIM_BYTES:
                    self._rotate(rel, memory)
                continue
            try:
                os.unlink(path)
            except OSError as exc:
                log.warning("otlp spool: cannot delete the read log %s for room: %s", path, exc)
                continue
            freed += memory.log_blocks
            memory.size = memory.read = memory.log_blocks = 0
            memory.file = None  # the next batch makes a new log: the tailer follows it as a recreated file
            self.stats.reclaimed_logs += 1
            log.info("otlp spool: deleted %s, read to its end, for room under the total cap", path)
        return freed

    def _rotate(self, rel: str, memory: _Memory) -> None:
        """Rename a live log that the last durable save names into a segment (the tailer drains it), drop the
        segments that save shows consumed; a log the reader has not opened yet is left as it is."""
        path = self.path(rel)
        saved = self._saved.get(path)
        if saved is None or memory.file is None or saved[:2] != memory.file:
            self.wants_save = True  # not opened by the reader yet, as far as a durable save says: ask for one
            return  # a rename now could go unseen
        self._drop_segments(memory)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(self._wall()))
        target, k = f"{path}.{stamp}", 0
        while target in memory.segments or os.path.exists(target):
            k += 1
            target = f"{path}.{stamp}.{k}"
        try:
            os.rename(path, target)
        except OSError as exc:
            raise SpoolError(f"cannot rotate {path}: {exc}") from exc
        memory.segments[target] = (memory.size, memory.log_blocks)
        drained = saved[2] >= memory.size  # the save shows it read to its end: nothing in it is left to read
        # A crash before the mark below: recovery finds the log shorter than its mark (_load).
        memory.size = memory.read = memory.log_blocks = 0
        memory.file = None
        self.stats.rotations += 1
        self.wants_save = True  # the reader moves on to the new log; the save after that drops this segment
        log.info("otlp spool: rotated %s (%s)", path, "read to its end" if drained else "draining")
        if drained:
            self._drop_segments(memory)
        mark = b"=0 0\n"
        try:
            # The new log exists at once: the tailer drains the segment, opens it, and the next save names it,
            # which lets the segment go even when no record comes until then.
            memory.log_blocks, memory.file = _write_at(path, 0, b"")
            self._sync_dirs(os.path.dirname(path))
            memory.ids_blocks, _ = _write_at(path + IDS_SUFFIX, memory.ids_bytes, mark)
        except OSError as exc:
            raise SpoolError(f"cannot rotate {path}: {exc}") from exc
        memory.lines += 1
        memory.ids_bytes += len(mark)

    def _drop_segments(self, memory: _Memory) -> None:
        """Delete a source's rotated segments: the caller checked that a durable save names its live log."""
        for segment in list(memory.segments):
            try:
                os.unlink(segment)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("otlp spool: cannot delete the read segment %s: %s", segment, exc)
                continue
            del memory.segments[segment]
            self.stats.dropped_segments += 1

    def consumed(self, files: Mapping[str, Any]) -> None:
        """A state save is durable (its `files` entries): drop the segments it shows drained, and remove the
        sources idle for the retention that it shows read to their end. No file is looked at but those."""
        saved: dict[str, tuple[int, int, int]] = {}
        prefix = os.path.join(self.root, "")
        for path, entry in files.items():
            if not path.startswith(prefix):
                continue
            try:
                pos = entry["position"]
                saved[path] = (int(pos["dev"]), int(pos["ino"]), int(pos["offset"]))
            except (KeyError, TypeError, ValueError):
                continue
        now = self._wall()
        with self._lock:
            self._saved = saved
            for rel, memory in list(self._memory.items()):
                known = saved.get(self.path(rel))
                if known is None or memory.file is None or known[:2] != memory.file:
                    memory.read = 0
                    continue
                memory.read = known[2]
                if memory.segments:
                    self._drop_segments(memory)
                retention = self.limits.retention
                if retention and known[2] >= memory.size and now - memory.last >= retention:
                    self._remove(rel, memory)

    def _remove(self, rel: str, memory: _Memory) -> None:
        """Delete an idle source's log, segments and .ids file, and its directories once empty."""
        path = self.path(rel)
        for name in (*memory.segments, path, path + IDS_SUFFIX):
            with contextlib.suppress(OSError):
                os.unlink(name)
        self._drop_window(rel)
        del self._memory[rel]
        self.stats.removed_sources += 1
        log.info("otlp spool: removed %s: idle for the retention and read to its end", path)
        directory = os.path.dirname(path)
        root = os.path.abspath(self.root)
        while os.path.abspath(directory) != root and os.path.abspath(directory).startswith(root):
            try:
                os.rmdir(directory)
            except OSError:
                break
            self._dirs.pop(os.path.abspath(directory), None)
            directory = os.path.dirname(directory)

    def _write(self, plan: list[tuple[str, _Memory, list[Line]]]) -> list[str]:
        """Write a batch: every source's lines to its log (fsynced), the new files' directories (fsynced once
        each), then each source's commit to its .ids file; the paths of the new logs. A failure before a source's
        commit cuts it back, with every source not committed yet, and raises SpoolError."""
        staged: list[_Staged] = []
        pending = list(plan)
        try:
            for rel, memory, fresh in plan:
                self._memory.setdefault(rel, memory)
                staged.append(self._stage(rel, memory, fresh))
            self._sync_new(staged)
            while staged:
                self._commit(staged[0])
                staged.pop(0)
                pending.pop(0)
        except OSError as exc:
            self.stats.write_errors += 1
            for rel, memory, _ in pending:
                self._undo(self.path(rel), memory)
                if memory.file is None and not memory.ids_bytes and not memory.segments:
                    self._drop_window(rel)
                    self._memory.pop(rel, None)  # a new source nothing was committed for: not the spool's yet
            path = getattr(exc, "filename", None) or self.root
            log.warning("otlp spool: cannot write %s, the batch is refused (503) and cut back: %s", path, exc)
            raise SpoolError(f"cannot write {path}: {exc}") from exc
        return [self.path(rel) for rel, memory, _ in plan if memory.new]

    def _stage(self, rel: str, memory: _Memory, fresh: list[Line]) -> _Staged:
        """A source's new lines written at its log's committed end and fsynced (not committed yet)."""
        path = self.path(rel)
        data = b"".join(line.data for line in fresh)
        memory.new = memory.file is None
        if memory.new:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            log_blocks, file = _write_at(path, memory.size, data)
        except OSError as exc:
            exc.filename = exc.filename or path
            raise
        return _Staged(rel, memory, fresh, memory.size + len(data), log_blocks, file)

    def _sync_new(self, staged: list[_Staged]) -> None:
        """Make the names of the batch's new logs durable: each directory up to the spool root fsynced once."""
        top = os.path.dirname(os.path.abspath(self.root))
        dirs: set[str] = set()
        for s in staged:
            if s.memory.new:
                directory = os.path.abspath(os.path.dirname(self.path(s.rel)))
                while directory.startswith(top) and directory != top and directory not in dirs:
                    dirs.add(directory)
                    directory = os.path.dirname(directory)
        for directory in sorted(dirs, key=len, reverse=True):  # a new directory before its parent
            self._sync_dir(directory)

    def _commit(self, s: _Staged) -> None:
        """Commit a staged source: its identities and mark to its .ids file (fsynced), then its memory."""
        memory, path = s.memory, self.path(s.rel)
        ids = b"".join(line.identity.hex().encode() + b"\n" for line in s.fresh)
        ids += b"=%d %d\n" % (s.size, len(s.fresh))
        try:
            ids_blocks, _ = _write_at(path + IDS_SUFFIX, memory.ids_bytes, ids)
        except OSError as exc:
            exc.filename = exc.filename or path + IDS_SUFFIX
            raise
        memory.size = s.size
        memory.file, memory.log_blocks, memory.ids_blocks = s.file, s.log_blocks, ids_blocks
        memory.lines += len(s.fresh) + 1
        memory.ids_bytes += len(ids)
        memory.last = self._wall()
        if memory.ids is None and memory.lines > 4 * memory.window:
            self._window(s.rel, memory)  # read back with this commit's identities: the compaction needs them
        elif memory.ids is not None:  # out of memory: its .ids file holds this commit's identities
            self._hold(s.rel, memory)
            before = len(memory.ids)
            memory.ids.extend(b"".join(line.identity for line in s.fresh))
            self._held += len(memory.ids) - before
        if memory.lines > 4 * memory.window:
            self._compact(path + IDS_SUFFIX, memory)

    def _undo(self, path: str, memory: _Memory) -> None:
        """Cut a failed batch back: the .ids file to its last commit, then the log. When the first cut fails, the
        log keeps the bytes its .ids may commit; the source's next batch cuts both before it writes."""
        try:
            _cut(path + IDS_SUFFIX, memory.ids_bytes)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("otlp spool: cannot cut %s%s back to its commit: %s", path, IDS_SUFFIX, exc)
            return
        try:
            _cut(path, memory.size)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("otlp spool: cannot cut %s back to its commit: %s", path, exc)

    def _sync_dirs(self, directory: str) -> None:
        """fsync a new file's directory and each parent up to the spool root."""
        top = os.path.dirname(os.path.abspath(self.root))
        directory = os.path.abspath(directory)
        while directory.startswith(top) and directory != top:
            self._sync_dir(directory)
            directory = os.path.dirname(directory)

    def _sync_dir(self, directory: str) -> None:
        """fsync a directory (where its filesystem allows it) and note the blocks it takes."""
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        except OSError as exc:
            if exc.errno not in _NO_DIR_SYNC:
                raise
        finally:
            with contextlib.suppress(OSError):
                self._dirs[directory] = os.fstat(fd).st_blocks * 512
            os.close(fd)

    def _compact(self, ids_path: str, memory: _Memory) -> None:
        """Rewrite a long .ids file as the window it keeps and one commit mark (atomically)."""
        temp = ids_path[: -len(IDS_SUFFIX)] + _TEMP
        ids = memory.ids if memory.ids is not None else ()
        body = b"".join(i.hex().encode() + b"\n" for i in ids) + b"=%d %d\n" % (memory.size, len(ids))
        try:
            blocks, _ = _write_at(temp, 0, body)
            os.replace(temp, ids_path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            return  # the long file is still whole; compaction waits for the next batch
        memory.lines = len(ids) + 1
        memory.ids_bytes, memory.ids_blocks = len(body), blocks


def _replay(raw: bytes, memory: _Memory) -> int:
    """Load the committed identities (the last of them, as many as the window keeps) and the log's committed size
    of a .ids file's bytes; the offset of the end of its last commit. A mark commits the `count` identity rows
    right before it (all of them since the last mark for a mark without a count); a row that is neither (torn)
    uncommits what came before it. Rows between two marks are read at once when none is torn."""
    committed: list[bytes] = []  # each mark's identities, 16 bytes each
    committed_end = 0
    for mark in _marks(raw):
        segment = raw[committed_end : mark.start()]
        if _IDS.fullmatch(segment):
            pending = bytes.fromhex(segment.decode())
        else:
            rows: list[bytes] = []
            for row in segment.splitlines(keepends=True):
                if _ID.fullmatch(row):
                    rows.append(row)
                else:
                    rows = []  # a torn row: the rows before it were never committed
            pending = bytes.fromhex(b"".join(rows).decode())
        count = len(pending) // _KEY if mark.group(2) is None else min(int(mark.group(2)), len(pending) // _KEY)
        if count:
            committed.append(pending[len(pending) - count * _KEY :])
        memory.size = int(mark.group(1))
        memory.lines += count + 1
        committed_end = mark.end()
    window = memory.ids if memory.ids is not None else _Window(memory.window)
    keep, tail = window.size * _KEY, []
    for chunk in reversed(committed):
        if keep <= 0:
            break
        tail.append(chunk[-keep:])
        keep -= len(tail[-1])
    window.extend(b"".join(reversed(tail)))
    memory.ids = window
    return committed_end


def _marks(raw: bytes) -> Iterator[re.Match[bytes]]:
    """The mark rows of a .ids file's bytes: a row (after a newline or a carriage return, as splitlines cuts them)
    that is a whole mark. Found by their `=`, which no identity row has."""
    at = raw.find(b"=")
    while at >= 0:
        mark = _MARK.match(raw, at) if at == 0 or raw[at - 1] in b"\r\n" else None
        if mark is not None:
            yield mark
        at = raw.find(b"=", at + 1)


def _batch_blocks(fresh: Sequence[Line], memory: _Memory) -> int:
    """The bytes of blocks a batch adds to its source at most: its lines, their identities and the mark."""
    data = sum(len(line.data) for line in fresh)
    ids = len(fresh) * _ID_ROW + len(b"=%d %d\n" % (memory.size + data, len(fresh)))
    return max(0, _round(memory.size + data) - memory.log_blocks) + max(
        0, _round(memory.ids_bytes + ids) - memory.ids_blocks
    )


def _round(n: int) -> int:
    return -(-n // BLOCK) * BLOCK


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


def _blocks_of(path: str) -> int:
    st = _stat(path)
    return st.st_blocks * 512 if st is not None else 0


def _write_at(path: str, offset: int, data: bytes) -> tuple[int, tuple[int, int]]:
    """Write data at offset (what a failed batch left past it is cut first) and fsync; the file's bytes of
    blocks and (dev, ino) then."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o640)
    try:
        if os.fstat(fd).st_size > offset:
            os.ftruncate(fd, offset)
        os.lseek(fd, offset, os.SEEK_SET)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
        st = os.fstat(fd)
        return st.st_blocks * 512, (st.st_dev, st.st_ino)
    finally:
        os.close(fd)


def _cut(path: str, size: int) -> None:
    """Cut a file back to size (its fsync is the next commit's: the reader's view is the page cache's)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        if os.fstat(fd).st_size > size:
            os.ftruncate(fd, size)
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
