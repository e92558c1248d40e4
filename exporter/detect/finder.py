"""The literal prefilter: where any of a set of rare literals occurs in a chunk. Used by the reader (reader.py).

Hyperscan finds every literal in one vectorised pass where a wheel exists; elsewhere one bytes.find pass per
literal gives the same offsets. Finders are built once per literal set and shared by every reader of a run.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from typing import Any, Protocol, cast


class Finder(Protocol):
    """Finds where any of a fixed set of literals occurs in part of a buffer."""

    name: str

    def offsets(self, buf: bytes, lo: int, hi: int) -> list[int]:
        """Sorted offsets inside buf[lo:hi] of every occurrence (any offset inside the match will do)."""
        ...

    def first(self, buf: bytes, lo: int, hi: int) -> int:
        """An offset inside the occurrence that ends first in buf[lo:hi] (-1: none): a search that stops there."""
        ...


class BytesFinder:
    """One bytes.find pass per literal: portable, about 0.15 s per literal per 300 MB here."""

    name = "bytes.find"

    def __init__(self, literals: Sequence[bytes]) -> None:
        self._literals = tuple(literals)

    def offsets(self, buf: bytes, lo: int, hi: int) -> list[int]:
        """Every occurrence of every literal, sorted."""
        found: list[int] = []
        for lit in self._literals:
            i = buf.find(lit, lo, hi)
            while i >= 0:
                found.append(i)
                i = buf.find(lit, i + 1, hi)
        found.sort()
        return found

    def first(self, buf: bytes, lo: int, hi: int) -> int:
        """The earliest occurrence's start, -1 when there is none (each literal's search stops at its first)."""
        best = -1
        for lit in self._literals:
            i = buf.find(lit, lo, hi if best < 0 else min(hi, best + len(lit)))
            if i >= 0 and (best < 0 or i < best):
                best = i
        return best


class HyperscanFinder:
    """All literals in one vectorised pass (Intel Hyperscan): GB/s whatever their number."""

    name = "hyperscan"

    def __init__(self, literals: Sequence[bytes]) -> None:
        import hyperscan  # optional: installed where a wheel exists (x86_64 Linux)

        self._db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        self._db.compile(
            expressions=[b"".join(b"\\x%02x" % b for b in lit) for lit in literals],
            ids=list(range(len(literals))),
            elements=len(literals),
            flags=[0] * len(literals),
        )

    def offsets(self, buf: bytes, lo: int, hi: int) -> list[int]:
        """Every match's last byte, sorted."""
        found: list[int] = []
        base = lo - 1

        def on_match(_id: int, _start: int, end: int, _flags: int, _ctx: Any) -> None:
            found.append(base + end)

        # A memoryview slice: hyperscan reads the buffer in place, so a 4 MiB chunk is never copied.
        data = buf if lo == 0 and hi == len(buf) else cast(bytes, memoryview(buf)[lo:hi])
        self._db.scan(data, match_event_handler=on_match)
        found.sort()
        return found

    def first(self, buf: bytes, lo: int, hi: int) -> int:
        """The last byte of the match that ends first (-1: none); the scan stops at it, whatever follows."""
        import hyperscan

        found: list[int] = []

        def on_match(_id: int, _start: int, end: int, _flags: int, _ctx: Any) -> bool:
            found.append(lo + end - 1)
            return True  # stop: one Python call per search, not one per line that holds a literal

        data = buf if lo == 0 and hi == len(buf) else cast(bytes, memoryview(buf)[lo:hi])
        with contextlib.suppress(hyperscan.ScanTerminated):  # raised when on_match stopped the scan
            self._db.scan(data, match_event_handler=on_match)
        return found[0] if found else -1


def minimal_literals(literals: Sequence[str]) -> tuple[bytes, ...]:
    """Drop literals that contain another one: a line holding the longer holds the shorter."""
    return _minimal_literals(tuple(literals))


@functools.lru_cache(maxsize=64)
def _minimal_literals(literals: tuple[str, ...]) -> tuple[bytes, ...]:
    # Cached: every pipeline of a run asks for the same sets (a scan of 1,000 files built them 3,000 times).
    unique = sorted({lit.encode() for lit in literals if lit}, key=len)
    kept: list[bytes] = []
    for lit in unique:
        if not any(k in lit for k in kept):
            kept.append(lit)
    return tuple(kept)


def make_finder(literals: Sequence[bytes], *, prefer: str = "auto") -> Finder:
    """Hyperscan where it is installed, bytes.find everywhere else: the same lines either way.

    Finders are shared by every reader with the same literals (a daemon with 1,000 files compiles one
    database, not 1,000). Sharing is safe because every reader runs on the one pipeline thread.
    """
    key = (tuple(literals), prefer)
    finder = _FINDERS.get(key)
    if finder is None:
        finder = _FINDERS[key] = _build_finder(literals, prefer)
    return finder


_FINDERS: dict[tuple[tuple[bytes, ...], str], Finder] = {}


def _build_finder(literals: Sequence[bytes], prefer: str) -> Finder:
    if prefer in ("auto", "hyperscan"):
        try:
            return HyperscanFinder(literals)
        except ImportError:
            if prefer == "hyperscan":
                raise
    return BytesFinder(literals)


class LineTail:
    """A scanner's unfinished last line, kept (its first max_line bytes) until the next bytes finish it."""

    __slots__ = ("at", "data", "max_line", "truncated")

    def __init__(self, max_line: int) -> None:
        self.data = bytearray()
        self.at = 0  # the offset of its first byte
        self.truncated = False  # longer than max_line: the rest was dropped
        self.max_line = max_line

    def __bool__(self) -> bool:
        return bool(self.data) or self.truncated

    def extend(self, data: bytes, offset: int) -> None:
        """More of the line; `offset` is where these bytes start."""
        if not self:
            self.at = offset
        room = self.max_line - len(self.data)
        if len(data) > room:
            self.data += data[: max(room, 0)]
            self.truncated = True
        else:
            self.data += data

    def take(self) -> bytes:
        """The line so far, forgotten here."""
        line = bytes(self.data)
        self.data.clear()
        self.truncated = False
        return line
