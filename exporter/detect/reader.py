"""Bytes -> RawLine | Gap: line splitting with a literal prefilter. First box after a source.

An OOM needs a handful of rare literals to be anywhere near it ("ut of memory", "Traceback", ...). The reader
searches each chunk for them in one pass (finder.py) and only splits the lines around a hit into RawLines: the
hit line (and, if asked, `before` lines ahead of it), then every line for as long as the stages after it have
something in flight (`busy`: a record open, a CRI partial record waiting for its F). A line that is not a hit
can only change that state when there is some, so the reader needs no model of records or log formats: the stage
that owns the state says when it needs no more lines. While it is busy, the reader still asks about each line
that is not a hit (`needs`): a line the stages answer no for (another stream's, whose records are all closed) is
only counted, never decoded. Every other line is only counted, as a Gap. `scan` and `serve` share this path,
so a file read in one piece, in 1-byte pieces, or with the prefilter off gives the same events (property-tested).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import regex

from ..detect.model import Gap, RawLine

# make_finder is looked up here at call time: tests swap it for one finder.
from .finder import make_finder, minimal_literals

# No look-back by default: a record starts at its anchor line whatever came before it, and a CRI partial record
# ahead of an anchor is a hit of its own (the pipeline searches for " stdout P"). Four look-back lines cost 30 %
# of a scan's CPU on a log with a retraction line every 1,250 lines, for the same events (tests/test_scan_lookback.py).
DEFAULT_BEFORE = 0
MAX_LINE = 256 * 1024
# Lines in a row the stages need none of while they are busy: past this many, the reader cuts in with a Gap, which
# closes what is open. The assembler closes a record whose stream went quiet long before (STALE_LINES); this bounds
# what no stage bounds (a CRI partial record whose full record never comes), so a scan never splits every line.
MAX_UNNEEDED_RUN = 100_000

_NOT_NUL = regex.compile(rb"[^\x00]")


class LineReader:
    """Feed it byte chunks of one source in order; it yields RawLines near anchors and Gaps between."""

    def __init__(
        self,
        literals: Sequence[str],
        *,
        openers: Sequence[str] = (),
        escaped: Callable[[tuple[str, ...]], tuple[str, ...]] | None = None,
        finder: str = "auto",
        prefilter: bool = True,
        before: int | None = None,
        max_line: int = MAX_LINE,
        busy: Callable[[], bool] | None = None,
        needs: Callable[[bytes], bool] | None = None,
    ) -> None:
        """literals and openers: what the prefilter searches for (a line holding one is a hit and always passes);
        escaped: the other forms a line's framing writes them in, searched too.

        busy: whether the stages after the reader have something in flight (then every line is split and offered);
        needs: asked of such a line that no literal hit, whether those stages need it (no: it is only counted)."""
        searched = (*literals, *openers)
        if escaped is not None:
            searched = (*searched, *escaped(tuple(searched)))
        self._finder = make_finder(minimal_literals(searched), prefer=finder)
        self._prefilter = prefilter
        self._before = DEFAULT_BEFORE if before is None else before
        self._max_line = max_line
        self._busy = busy
        self._needs = needs
        self.quiet_lines = 0  # lines offered while busy that the stages did not need
        self._unneeded_run = 0
        self._partial = bytearray()
        self._truncating = False  # discarding the tail of an over-long line until its newline
        self._window = 0  # lines to pass whatever the stages say: the look-back lines and the hit line
        self._held: list[RawLine] = []  # the last few skipped lines, for a later hit's look-back
        self._earlier_generations = 0
        self._pos = 0  # file offset of the next byte fed
        self._last_byte = b"\n"  # the last byte fed (a NUL run behind text breaks the line)
        self._partial_start = 0  # file offset where the partial line began
        self._base = 0  # file offset of buf[0] in the region being walked
        self.next_lineno = 1
        self.oversized_lines = 0

    @property
    def position(self) -> int:
        """The file offset of the next byte to be fed."""
        return self._pos

    def idle(self) -> bool:
        """Nothing in flight: no partial line, no line still to pass, and as many held lines as a fresh reader fed
        the same last lines would hold."""
        return self._window == 0 and not self._partial and not self._truncating and len(self._held) == self._before

    @property
    def lines_read(self) -> int:
        """Complete lines consumed so far, over every file generation."""
        return self._earlier_generations + self.next_lineno - 1

    def feed(self, data: bytes) -> Iterator[RawLine | Gap]:
        """Consume the next bytes of the source."""
        if not data:
            return
        data_start = self._pos
        self._pos += len(data)
        if b"\x00" in data:
            data = self._break_nul_runs(data)
        self._last_byte = data[-1:]
        cut = data.rfind(b"\n")
        if cut < 0:
            self._extend_partial(data, data_start)
            return
        start = 0
        if self._partial or self._truncating:
            first_nl = data.find(b"\n")
            self._extend_partial(data[:first_nl], data_start)
            joined = bytes(self._partial) + b"\n"
            self._partial.clear()
            self._truncating = False
            self._base = self._partial_start
            yield from self._walk(joined, 0, len(joined))
            start = first_nl + 1
        if start <= cut:
            self._base = data_start
            yield from self._walk(data, start, cut + 1)
        self._extend_partial(data[cut + 1 :], data_start + cut + 1)

    def finish(self) -> Iterator[RawLine | Gap]:
        """End of this file generation: a last line without a newline is still a line."""
        if self._partial or self._truncating:
            joined = bytes(self._partial) + b"\n"
            self._partial.clear()
            self._truncating = False
            self._base = self._partial_start
            yield from self._walk(joined, 0, len(joined))
        if self._held:
            yield Gap(len(self._held))
            self._held = []
        self._window = 0
        self._unneeded_run = 0

    def reset(self, offset: int = 0, lineno: int = 1) -> Iterator[RawLine | Gap]:
        """A new file generation follows (rotation, truncation, a restart resuming mid-file): flush, and
        count lines and bytes from where the new bytes start."""
        yield from self.finish()
        self._earlier_generations += self.next_lineno - 1
        self.next_lineno = lineno
        self._earlier_generations -= lineno - 1
        self._pos = offset
        self._last_byte = b"\n"  # a generation starts at a line start

    def resume_point(self) -> tuple[int, int]:
        """(offset, lineno) of the oldest byte the reader still holds: a restart must re-read from there."""
        if self._held:
            return self._held[0].offset, self._held[0].lineno
        if self._partial or self._truncating:
            return self._partial_start, self.next_lineno
        return self._pos, self.next_lineno

    def _break_nul_runs(self, data: bytes) -> bytes:
        """A NUL run behind text ends that line: its first NUL becomes a newline (same length, same offsets).

        Copytruncate under a writer without O_APPEND leaves NULs up to the writer's offset and then its next
        line with no newline between; the run's leading NULs are then dropped from the line that follows
        (_line, _extend_partial), so that line reads as it was written, however the bytes are chunked.
        """
        # Run by run, not byte by byte: a 1 GiB hole is one find() and one search for its end (the regex
        # module's negated class scans about 1 GB/s; a lookbehind tried at every NUL ran at 5-18 MB/s).
        out: bytearray | None = None
        start = data.find(b"\x00")
        while start >= 0:
            before = data[start - 1 : start] if start else self._last_byte
            if before not in (b"\n", b"\x00"):
                if out is None:
                    out = bytearray(data)
                out[start] = 0x0A
            end = _NOT_NUL.search(data, start)
            if end is None:
                break
            start = data.find(b"\x00", end.start())
        return data if out is None else bytes(out)

    def _extend_partial(self, data: bytes, start: int) -> None:
        if not self._partial and not self._truncating and data[:1] == b"\x00":
            text = _NOT_NUL.search(data)
            skip = len(data) if text is None else text.start()
            start += skip
            data = data[skip:]
        if not self._partial and not self._truncating and data:
            self._partial_start = start
        if self._truncating or not data:
            return
        room = self._max_line - len(self._partial)
        if len(data) > room:
            self._partial += data[: max(room, 0)]
            self._truncating = True
            self.oversized_lines += 1
        else:
            self._partial += data

    def _line(self, buf: bytes, pos: int, end: int) -> RawLine:
        if buf[pos : pos + 1] == b"\x00":  # the NUL run of a copytruncate hole ahead of the line's text
            m = _NOT_NUL.search(buf, pos, end)
            pos = end if m is None else m.start()
        if end - pos > self._max_line:
            self.oversized_lines += 1
            end = pos + self._max_line
        line = RawLine(self.next_lineno, buf[pos:end], self._base + pos)
        self.next_lineno += 1
        return line

    def _walk(self, buf: bytes, lo: int, hi: int) -> Iterator[RawLine | Gap]:
        """Split buf[lo:hi] (newline-terminated) into the lines the stages after the reader need, and gaps."""
        if not self._prefilter:
            pos = lo
            while pos < hi:
                end = buf.find(b"\n", pos, hi)
                yield self._line(buf, pos, end)
                pos = end + 1
            return
        hits = self._finder.offsets(buf, lo, hi)
        busy, needs = self._busy, self._needs
        pos, h = lo, 0
        while pos < hi:
            if self._window > 0:  # a look-back line or the hit line
                self._window -= 1
                end = buf.find(b"\n", pos, hi)
                self._unneeded_run = 0
                yield self._line(buf, pos, end)
                pos = end + 1
                continue
            if busy is not None and busy():
                start, end = pos, buf.find(b"\n", pos, hi)
                line = self._line(buf, start, end)
                pos = end + 1
                while h < len(hits) and hits[h] < start:
                    h += 1
                if (h < len(hits) and hits[h] < end) or needs is None or needs(line.data):
                    self._unneeded_run = 0
                    yield line
                    continue
                self.quiet_lines += 1
                self._unneeded_run += 1
                if self._unneeded_run >= MAX_UNNEEDED_RUN:
                    self._unneeded_run = 0
                    yield Gap(0)
                continue
            self._unneeded_run = 0
            while h < len(hits) and hits[h] < pos:
                h += 1
            if h == len(hits):
                yield from self._skip_to_end(buf, pos, hi)
                return
            items, pos = self._skip_to_hit(buf, pos, hits[h])
            yield from items

    def _back(self, buf: bytes, floor: int, start: int, count: int) -> tuple[int, int]:
        """Walk back up to count line starts from start, not below floor; return (offset, lines walked)."""
        walked = 0
        while walked < count and start > floor:
            r = buf.rfind(b"\n", floor, start - 1)
            start = floor if r < 0 else r + 1
            walked += 1
        return start, walked

    def _skip_to_hit(self, buf: bytes, pos: int, hit: int) -> tuple[list[RawLine | Gap], int]:
        """Skip to a few lines before the line holding the hit; return what to yield and where to go on."""
        r = buf.rfind(b"\n", pos, hit)
        hit_start = pos if r < 0 else r + 1
        start, walked = self._back(buf, pos, hit_start, self._before)
        keep_held = self._before - walked if start == pos else 0
        held = self._held[max(0, len(self._held) - keep_held) :] if keep_held else []
        skipped = buf.count(b"\n", pos, start)
        gap = len(self._held) - len(held) + skipped
        self._held = []
        self.next_lineno += skipped
        items: list[RawLine | Gap] = [Gap(gap)] if gap else []
        items.extend(held)
        # Pass through the look-back lines and the hit line; the hit line re-arms the window.
        self._window = walked + 1
        return items, start

    def _skip_to_end(self, buf: bytes, pos: int, hi: int) -> Iterator[RawLine | Gap]:
        """No hit left in this region: count it as a gap, but hold its last lines for a later look-back."""
        start, _ = self._back(buf, pos, hi, self._before)
        skipped = buf.count(b"\n", pos, start)
        self.next_lineno += skipped
        new_held: list[RawLine] = []
        p = start
        while p < hi:
            e = buf.find(b"\n", p, hi)
            new_held.append(self._line(buf, p, e))
            p = e + 1
        old = self._held
        keep_old = max(0, self._before - len(new_held)) if skipped == 0 else 0
        kept_old = old[max(0, len(old) - keep_old) :] if keep_old else []
        gap = len(old) - len(kept_old) + skipped
        if gap:
            yield Gap(gap)
        self._held = kept_old + new_held
