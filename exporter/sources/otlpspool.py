"""The received records' spool: each source's lines in a log file of its own, durable before the answer.

    otlp.lines() --append()--> ROOT/pods/<ns>_<pod>_<uid>/<container>/<restart>.log  (+ .ids beside it)
                               ROOT/files/<name>.log                                  (+ .ids)
    the daemon follows those files like any other: tail -> reader -> detect, positions in state.json

Exactly once over a shipper that delivers at least once: append() writes a batch's new lines to the source's
log and fsyncs it, then appends their identities and a commit mark (`=<log size>`) to the .ids file beside it
and fsyncs that; only then does the HTTP edge answer 2xx. A line whose identity is already in the source's
memory (the last DEDUPE_WINDOW identities, kept in the .ids file) is a retried copy and is not written again.
A crash between the two writes leaves log bytes with no commit mark: recover() cuts the log back to the last
mark (the shipper got no 2xx and sends them again). The caller holds the daemon's source lock around append(),
so no state save can record a read position inside bytes that recovery may cut.

Bounded disk: a source's log is rotated as the kubelet rotates (`<n>.log` renamed `<n>.log.<time>`, the tailer
drains it and follows the new file) once it outgrows a quarter of the per-source cap and the last durable state
save (consumed()) names it, so the reader has opened it and finds it by inode after the rename. A rotated
segment is deleted once a durable save names the live file again: the reader drained the segment, and a restart
resumes in the live file. A source that got nothing for the retention and was read to its end is removed. When
the caps would be passed only by unread lines, append() raises SpoolFullError (503 with Retry-After): the shipper
keeps the records and retries; nothing unread is ever dropped.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

POD_DIR = "pods"  # the kubelet-layout tree: pods/<ns>_<pod>_<uid>/<container>/<restart>.log
FILE_DIR = "files"  # sources named by a file path or a service: files/<name>.log
DEDUPE_WINDOW = 65536  # identities kept per source: a retry resends a batch of the last few minutes, not older
IDS_SUFFIX = ".ids"
_COMMIT = b"="
_ID_ROW = 33  # bytes of one identity in the .ids file (32 hex digits and a newline)
_SEGMENT = re.compile(r"\d{8}-\d{6}(?:\.\d+)?")  # a rotated segment's suffix: <n>.log.<YYYYmmdd-HHMMSS>[.k]


@dataclass(frozen=True, slots=True)
class Line:
    """One record's body as the bytes of a log line (newline-terminated), and its identity for dedupe."""

    data: bytes
    identity: bytes  # 16 bytes (otlp.lines()): a retried copy of the same record has the same


class SpoolError(Exception):
    """The spool could not make a batch durable (disk full, read-only, I/O error): answer 503, retry later."""


class SpoolFullError(SpoolError):
    """The batch would pass a cap with lines the reader has not consumed yet: answer 503, retry later."""


@dataclass(frozen=True, slots=True)
class Limits:
    """The spool's bounds: bytes on disk per source and in all (0: unbounded), and how long an idle source that
    was read to its end is kept (0: for ever)."""

    source_bytes: int = 0
    total_bytes: int = 0
    retention: float = 0.0

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


class _Memory:
    """One source's recent identities (insertion-ordered, bounded), its log's committed size and its disk use."""

    __slots__ = ("disk", "ids", "ids_bytes", "last", "lines", "size", "window")

    def __init__(self, window: int) -> None:
        self.ids: OrderedDict[bytes, None] = OrderedDict()
        self.window = window
        self.size = 0
        self.lines = 0  # identity lines in the .ids file (compacted when it outgrows the window)
        self.ids_bytes = 0  # the .ids file's size
        self.disk = 0  # bytes of the live log, its rotated segments and its .ids file
        self.last = 0.0  # wall time of the last write (the log's mtime after a restart)

    def add(self, identity: bytes) -> None:
        self.ids[identity] = None
        if len(self.ids) > self.window:
            self.ids.popitem(last=False)


class Spool:
    """The spool under one root directory; append() is safe from many request threads."""

    def __init__(self, root: str, limits: Limits | None = None, *, wall: Callable[[], float] = time.time) -> None:
        self.root = root
        self.limits = limits or Limits()
        self._wall = wall
        self._lock = threading.Lock()
        self._memory: dict[str, _Memory] = {}
        # What the last durable state save says of each spooled log: its path -> (dev, ino, offset).
        self._saved: dict[str, tuple[int, int, int]] = {}
        self.recovered_bytes = 0  # uncommitted bytes cut at recovery (a crash between a batch's two writes)
        self.rotations = 0  # live logs rotated into a segment
        self.dropped_segments = 0  # consumed segments deleted
        self.removed_sources = 0  # idle sources read to their end and removed
        self.full = 0  # batches refused because a cap would be passed by unread lines
        # A state save would let the spool rotate or drop a segment (a log not named by one yet, a batch refused).
        self.wants_save = False

    def disk_bytes(self) -> int:
        """Bytes the spool's sources take on disk (logs, rotated segments, .ids files)."""
        with self._lock:
            return sum(m.disk for m in self._memory.values())

    def path(self, rel: str) -> str:
        """The absolute path of a spooled source."""
        return os.path.join(self.root, rel)

    def recover(self) -> None:
        """Load every source's memory and cut any log back to its last commit (call before the loop reads)."""
        with self._lock:
            for dirpath, _dirs, names in os.walk(self.root):
                for name in sorted(names):
                    if name.endswith(".log"):
                        rel = os.path.relpath(os.path.join(dirpath, name), self.root)
                        self._load(rel)

    def append(self, batch: Mapping[str, Sequence[Line]]) -> tuple[int, int, list[str]]:
        """Make a batch durable: (lines written, duplicates skipped, spool paths whose file is new).

        Raises SpoolError when a write or fsync fails; the sources written before it are committed and their
        lines remembered, so the shipper's retry writes only the rest.
        """
        written = duplicates = 0
        new: list[str] = []
        with self._lock:
            plan: list[tuple[str, _Memory, list[Line]]] = []
            for rel, lines in batch.items():
                memory = self._memory.get(rel)
                if memory is None:
                    memory = self._load(rel)
                fresh: list[Line] = []
                taken: set[bytes] = set()
                for line in lines:
                    if line.identity in memory.ids or line.identity in taken:
                        duplicates += 1
                    else:
                        taken.add(line.identity)
                        fresh.append(line)
                if fresh:
                    plan.append((rel, memory, fresh))
            self._make_room(plan)
            for rel, memory, fresh in plan:
                if self._commit(rel, memory, fresh):
                    new.append(self.path(rel))
                written += len(fresh)
        return written, duplicates, new

    def _make_room(self, plan: list[tuple[str, _Memory, list[Line]]]) -> None:
        """Rotate the logs that may be, then refuse (SpoolFullError) a batch that would pass a cap; nothing written."""
        limits = self.limits
        if not (limits.source_bytes or limits.total_bytes):
            return
        adding = 0
        for rel, memory, fresh in plan:
            if limits.segment_bytes and memory.size >= limits.segment_bytes:
                self._rotate(rel, memory)
            need = _batch_bytes(fresh, memory.size)
            adding += need
            if limits.source_bytes and memory.disk + need > limits.source_bytes:
                self.full += 1
                self.wants_save = True
                raise SpoolFullError(
                    f"{rel} holds {memory.disk} bytes not read yet or not saved as read; {need} more would pass "
                    f"the cap of {limits.source_bytes} per source (--otlp-spool-source-mib)"
                )
        total = sum(m.disk for m in self._memory.values())
        if limits.total_bytes and total + adding > limits.total_bytes:
            self.full += 1
            self.wants_save = True
            raise SpoolFullError(
                f"the spool holds {total} bytes; {adding} more would pass its cap of {limits.total_bytes} "
                "(--otlp-spool-total-mib)"
            )

    def _rotate(self, rel: str, memory: _Memory) -> None:
        """Rename a live log that the last durable save names into a segment (the tailer drains it), drop the
        segments that save shows consumed; a log the reader has not opened yet is left as it is."""
        path = self.path(rel)
        try:
            st = os.stat(path)
        except OSError:
            return
        saved = self._saved.get(path)
        if saved is None or saved[:2] != (st.st_dev, st.st_ino):
            self.wants_save = True  # not opened by the reader yet, as far as a durable save says: ask for one
            return  # a rename now could go unseen
        self._drop_segments(rel, memory)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(self._wall()))
        target, k = f"{path}.{stamp}", 0
        while os.path.exists(target):
            k += 1
            target = f"{path}.{stamp}.{k}"
        try:
            os.rename(path, target)
        except OSError as exc:
            raise SpoolError(f"cannot rotate {path}: {exc}") from exc
        memory.size = 0  # a crash before the mark below: recovery finds the log shorter than its mark (_load)
        self.rotations += 1
        self.wants_save = True  # the reader moves on to the new log; the save after that drops this segment
        mark = _COMMIT + b"0\n"
        try:
            # The new log exists at once: the tailer drains the segment, opens it, and the next save names it,
            # which lets the segment go even when no record comes until then.
            _append_synced(path, b"")
            self._sync_dirs(os.path.dirname(path))
            _append_synced(path + IDS_SUFFIX, mark)
        except OSError as exc:
            raise SpoolError(f"cannot rotate {path}: {exc}") from exc
        memory.lines += 1
        memory.ids_bytes += len(mark)
        memory.disk += len(mark)

    def _segments(self, rel: str) -> list[str]:
        """The rotated segments of a source's log (absolute paths)."""
        path = self.path(rel)
        directory, base = os.path.split(path)
        try:
            names = os.listdir(directory)
        except OSError:
            return []
        prefix = base + "."
        return sorted(
            os.path.join(directory, n) for n in names if n.startswith(prefix) and _SEGMENT.fullmatch(n[len(prefix) :])
        )

    def _drop_segments(self, rel: str, memory: _Memory) -> None:
        """Delete a source's rotated segments: the caller checked that a durable save names its live log."""
        for segment in self._segments(rel):
            try:
                size = os.path.getsize(segment)
                os.unlink(segment)
            except OSError:
                continue
            memory.disk -= size
            self.dropped_segments += 1

    def consumed(self, files: Mapping[str, Any]) -> None:
        """A state save is durable (its `files` entries): drop the segments it shows drained, and remove the
        sources idle for the retention that it shows read to their end."""
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
                path = self.path(rel)
                known = saved.get(path)
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                if known is None or known[:2] != (st.st_dev, st.st_ino):
                    continue
                self._drop_segments(rel, memory)
                retention = self.limits.retention
                if retention and known[2] >= st.st_size and now - memory.last >= retention:
                    self._remove(rel)

    def _remove(self, rel: str) -> None:
        """Delete an idle source's log, segments and .ids file, and its directories once empty."""
        path = self.path(rel)
        for name in (*self._segments(rel), path, path + IDS_SUFFIX):
            with contextlib.suppress(OSError):
                os.unlink(name)
        del self._memory[rel]
        self.removed_sources += 1
        directory = os.path.dirname(path)
        root = os.path.abspath(self.root)
        while os.path.abspath(directory) != root and os.path.abspath(directory).startswith(root):
            try:
                os.rmdir(directory)
            except OSError:
                break
            directory = os.path.dirname(directory)

    def _commit(self, rel: str, memory: _Memory, fresh: list[Line]) -> bool:
        """Write and commit a source's new lines; whether its log file is new (first, or after a rotation)."""
        path = self.path(rel)
        data = b"".join(line.data for line in fresh)
        try:
            new = not os.path.exists(path)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            _append_synced(path, data)
            if new:  # the file's name (and the directories made for it) must be durable too
                self._sync_dirs(os.path.dirname(path))
            size = memory.size + len(data)
            ids = b"".join(line.identity.hex().encode() + b"\n" for line in fresh)
            ids += _COMMIT + str(size).encode() + b"\n"
            _append_synced(path + IDS_SUFFIX, ids)
        except OSError as exc:
            with contextlib.suppress(OSError):
                _cut(path, memory.size)  # never leave uncommitted bytes for the tailer to read
            raise SpoolError(f"cannot write {path}: {exc}") from exc
        memory.size = size
        memory.lines += len(fresh) + 1
        memory.ids_bytes += len(ids)
        memory.disk += len(data) + len(ids)
        memory.last = self._wall()
        for line in fresh:
            memory.add(line.identity)
        if memory.lines > 4 * memory.window:
            self._compact(path + IDS_SUFFIX, memory)
        return new

    def _sync_dirs(self, directory: str) -> None:
        """fsync a new file's directory and each parent up to the spool root (where a filesystem allows it)."""
        root = os.path.dirname(os.path.abspath(self.root))
        directory = os.path.abspath(directory)
        while directory.startswith(root) and directory != root:
            try:
                fd = os.open(directory, os.O_RDONLY)
            except OSError:
                return
            try:
                os.fsync(fd)
            except OSError:
                pass  # some filesystems refuse a directory fsync
            finally:
                os.close(fd)
            directory = os.path.dirname(directory)

    def _load(self, rel: str) -> _Memory:
        """A source's memory from its .ids file; a log past the last commit is cut back to it."""
        memory = _Memory(self.limits.window)
        path = self.path(rel)
        try:
            with open(path + IDS_SUFFIX, "rb") as fh:
                raw = fh.read()
        except FileNotFoundError:
            raw = b""
        except OSError as exc:
            raise SpoolError(f"cannot read {path}{IDS_SUFFIX}: {exc}") from exc
        pending: list[bytes] = []
        committed_end = 0  # bytes of the .ids file up to its last commit mark
        offset = 0
        for row in raw.splitlines(keepends=True):
            offset += len(row)
            if not row.endswith(b"\n"):
                break  # torn by a crash mid-write
            if row.startswith(_COMMIT):
                try:
                    memory.size = int(row[1:])
                except ValueError:
                    break
                for identity in pending:
                    memory.add(identity)
                memory.lines += len(pending) + 1
                pending = []
                committed_end = offset
            else:
                try:
                    pending.append(bytes.fromhex(row.decode().strip()))
                except ValueError:
                    break
        try:
            if committed_end < len(raw):
                _cut(path + IDS_SUFFIX, committed_end)
            live = os.path.getsize(path) if os.path.exists(path) else 0
            if live > memory.size:
                self.recovered_bytes += live - memory.size
                _cut(path, memory.size)
            elif live < memory.size:
                # Rotated after its last mark (a crash between the rename and the "=0" mark): the log is new.
                mark = _COMMIT + str(live).encode() + b"\n"
                _append_synced(path + IDS_SUFFIX, mark)
                memory.size, committed_end = live, committed_end + len(mark)
                memory.lines += 1
            memory.last = os.path.getmtime(path) if os.path.exists(path) else self._wall()
        except OSError as exc:
            raise SpoolError(f"cannot recover {path}: {exc}") from exc
        memory.ids_bytes = committed_end
        memory.disk = memory.size + committed_end + sum(_size(s) for s in self._segments(rel))
        self._memory[rel] = memory
        return memory

    def _compact(self, ids_path: str, memory: _Memory) -> None:
        """Rewrite a long .ids file as the window it keeps and one commit mark (atomically)."""
        temp = ids_path + ".tmp"
        body = b"".join(i.hex().encode() + b"\n" for i in memory.ids) + _COMMIT + str(memory.size).encode() + b"\n"
        try:
            with open(temp, "wb") as fh:
                fh.write(body)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(temp, ids_path)
        except OSError:
            return  # the long file is still whole; compaction waits for the next batch
        memory.lines = len(memory.ids) + 1
        memory.disk += len(body) - memory.ids_bytes
        memory.ids_bytes = len(body)


def _batch_bytes(fresh: Sequence[Line], size: int) -> int:
    """The bytes a batch adds to its source on disk: its lines, their identities and the commit mark."""
    data = sum(len(line.data) for line in fresh)
    return data + len(fresh) * _ID_ROW + len(_COMMIT) + len(str(size + data)) + 1


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _append_synced(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _cut(path: str, size: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)
