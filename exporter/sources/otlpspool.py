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
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

POD_DIR = "pods"  # the kubelet-layout tree: pods/<ns>_<pod>_<uid>/<container>/<restart>.log
FILE_DIR = "files"  # sources named by a file path or a service: files/<name>.log
DEDUPE_WINDOW = 65536  # identities kept per source: a retry resends a batch of the last few minutes, not older
IDS_SUFFIX = ".ids"
_COMMIT = b"="


@dataclass(frozen=True, slots=True)
class Line:
    """One record's body as the bytes of a log line (newline-terminated), and its identity for dedupe."""

    data: bytes
    identity: bytes  # 16 bytes (otlp.lines()): a retried copy of the same record has the same


class SpoolError(Exception):
    """The spool could not make a batch durable (disk full, read-only, I/O error): answer 503, retry later."""


class _Memory:
    """One source's recent identities (insertion-ordered, bounded) and its log's committed size."""

    __slots__ = ("ids", "lines", "size")

    def __init__(self) -> None:
        self.ids: OrderedDict[bytes, None] = OrderedDict()
        self.size = 0
        self.lines = 0  # identity lines in the .ids file (compacted when it outgrows the window)

    def add(self, identity: bytes) -> None:
        self.ids[identity] = None
        if len(self.ids) > DEDUPE_WINDOW:
            self.ids.popitem(last=False)


class Spool:
    """The spool under one root directory; append() is safe from many request threads."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._memory: dict[str, _Memory] = {}
        self.recovered_bytes = 0  # uncommitted bytes cut at recovery (a crash between a batch's two writes)

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
        """Make a batch durable: (lines written, duplicates skipped, spool paths that are new).

        Raises SpoolError when a write or fsync fails; the sources written before it are committed and their
        lines remembered, so the shipper's retry writes only the rest.
        """
        written = duplicates = 0
        new: list[str] = []
        with self._lock:
            for rel, lines in batch.items():
                memory = self._memory.get(rel)
                if memory is None:
                    if not os.path.exists(self.path(rel)):
                        new.append(self.path(rel))
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
                    self._commit(rel, memory, fresh)
                    written += len(fresh)
        return written, duplicates, new

    def _commit(self, rel: str, memory: _Memory, fresh: list[Line]) -> None:
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
            _append_synced(path + IDS_SUFFIX, ids + _COMMIT + str(size).encode() + b"\n")
        except OSError as exc:
            with contextlib.suppress(OSError):
                _cut(path, memory.size)  # never leave uncommitted bytes for the tailer to read
            raise SpoolError(f"cannot write {path}: {exc}") from exc
        memory.size = size
        memory.lines += len(fresh) + 1
        for line in fresh:
            memory.add(line.identity)
        if memory.lines > 4 * DEDUPE_WINDOW:
            self._compact(path + IDS_SUFFIX, memory)

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
        memory = _Memory()
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
            if os.path.exists(path) and os.path.getsize(path) > memory.size:
                self.recovered_bytes += os.path.getsize(path) - memory.size
                _cut(path, memory.size)
        except OSError as exc:
            raise SpoolError(f"cannot recover {path}: {exc}") from exc
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
