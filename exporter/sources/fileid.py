"""What the tailer hands out and saves about a file generation, and how a log file is opened.

    FileTailer (tail.py) --> TailChunk / TailReset (reason in RESET_REASONS) --> daemon/logsource.py
    TailPosition (identity, offset, fingerprint) <--> the state file

A generation is told by its inode and the fingerprint of its first bytes; compression by content. matches()
says whether a file holds a saved generation, and find_rotated() looks for one beside its path (renamed, copied
by copytruncate, compressed).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FINGERPRINT_BYTES = 1024
# Why a file generation ended (TailReset.reason; the `reason` label of file_resets_total).
ROTATED, TRUNCATED, RECREATED, DELETED = "rotated", "truncated", "recreated", "deleted"
RESET_REASONS = (ROTATED, TRUNCATED, RECREATED, DELETED)


@dataclass(frozen=True, slots=True)
class TailPosition:
    """Where a file was read up to: identity, resume offset, a fingerprint of its first bytes and one of the
    bytes just before offset (the mark).

    offset is just past the last newline delivered, so a resumed tail re-reads a partial last line whole. The
    mark tells an in-place truncation while the daemon was down when the new content begins with the old
    one's first bytes (a start-up banner): the head matches, the bytes before the offset do not. Positions
    saved before the mark existed have mark_len 0, and are checked by their head alone, as before.
    """

    path: str
    dev: int
    ino: int
    offset: int
    fingerprint: str
    fingerprint_len: int
    mark: str = ""
    mark_len: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        out: dict[str, Any] = {
            "path": self.path,
            "dev": self.dev,
            "ino": self.ino,
            "offset": self.offset,
            "fingerprint": self.fingerprint,
            "fingerprint_len": self.fingerprint_len,
        }
        if self.mark_len:
            out["mark"], out["mark_len"] = self.mark, self.mark_len
        return out

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> TailPosition:
        """Build a position from to_dict() output; raise ValueError on anything else."""
        if not isinstance(raw, Mapping):
            raise ValueError(f"position must be an object, got {type(raw).__name__}")
        path, fingerprint = raw.get("path"), raw.get("fingerprint")
        if not isinstance(path, str) or not path:
            raise ValueError("position.path must be a non-empty string")
        if not isinstance(fingerprint, str) or not _is_hex(fingerprint):
            raise ValueError("position.fingerprint must be a hex string")
        ints = {}
        for key in ("dev", "ino", "offset", "fingerprint_len"):
            value = raw.get(key)
            # bool is an int subclass; a true/false here means a hand-edited or foreign file.
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"position.{key} must be a non-negative integer")
            ints[key] = value
        if ints["fingerprint_len"] > FINGERPRINT_BYTES:
            raise ValueError(f"position.fingerprint_len must be at most {FINGERPRINT_BYTES}")
        mark, mark_len = raw.get("mark", ""), raw.get("mark_len", 0)
        if not isinstance(mark, str) or not _is_hex(mark):
            raise ValueError("position.mark must be a hex string")
        if not isinstance(mark_len, int) or isinstance(mark_len, bool) or not 0 <= mark_len <= FINGERPRINT_BYTES:
            raise ValueError(f"position.mark_len must be an integer from 0 to {FINGERPRINT_BYTES}")
        if mark_len > ints["offset"]:
            raise ValueError("position.mark_len must not exceed position.offset")
        return cls(path, ints["dev"], ints["ino"], ints["offset"], fingerprint, ints["fingerprint_len"], mark, mark_len)


@dataclass(frozen=True, slots=True)
class TailChunk:
    """New bytes of the tailed path, in file order; may end inside a line.

    offset is where data starts in its file generation, and (dev, ino) names that generation, so a
    consumer can key what it derives from these bytes (an event's first line) across restarts.
    """

    path: str
    data: bytes
    offset: int = 0
    dev: int = 0
    ino: int = 0


@dataclass(frozen=True, slots=True)
class TailReset:
    """The bytes that follow belong to another file generation: flush the partial line, restart line numbers.

    reason is one of RESET_REASONS.
    """

    path: str
    reason: str


@dataclass(slots=True)
class TailStats:
    """Counters a FileTailer keeps about itself; metrics/ exports them."""

    bytes_read: int = 0
    read_errors: int = 0
    last_read_wall_time: float | None = None
    # New generations opened or first identified (first bytes read): the state keeper saves soon after one,
    # so that a restart knows the generation even if it is rotated away while the daemon is down.
    generations: int = 0


TailItem = TailChunk | TailReset


def fingerprint(data: bytes) -> str:
    """Hex digest used to recognise a file generation by its first bytes."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


GZIP_MAGIC = b"\x1f\x8b"


def open_binary(path: str) -> io.BufferedIOBase:
    """Open a plain or gzip-compressed file for reading; the caller closes it.

    Compression is told by content, not by name: rotated logs are compressed under either kind of name.
    """
    fh = open(path, "rb")  # noqa: SIM115 - returned to the caller, who closes it
    try:
        magic = fh.peek(len(GZIP_MAGIC))[: len(GZIP_MAGIC)]
    except OSError:
        fh.close()
        raise
    if magic != GZIP_MAGIC:
        return fh
    fh.close()
    return gzip.open(path, "rb")


def bytes_before(path: str, offset: int, size: int) -> bytes | None:
    """The size bytes that end at offset in a plain or .gz file, or None when it is shorter or unreadable."""
    try:
        with open_binary(path) as stream:
            stream.seek(offset - size)  # gzip decompresses up to there in bounded memory
            data = stream.read(size)
    except (OSError, EOFError, zlib.error, ValueError):
        return None
    return data if len(data) == size else None


def head_bytes(path: str, size: int) -> bytes | None:
    """First size bytes of a plain or .gz file, or None when it is shorter or unreadable."""
    try:
        with open_binary(path) as stream:
            data = stream.read(size)
    except (OSError, EOFError, zlib.error):
        return None
    return data if len(data) == size else None


_COMPRESSED_SUFFIX = ".gz"  # only to rank siblings (plain first); compression itself is told by content


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


def dir_identity(directory: str) -> tuple[int, int] | None:
    """A directory's (st_dev, st_ino), to notice it deleted and made again under its name; None when missing."""
    try:
        st = os.stat(directory)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)
