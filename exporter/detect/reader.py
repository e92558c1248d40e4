"""Bytes -> RawLine | Gap: line splitting with a literal prefilter. First box after a source.

An OOM needs a handful of rare literals to be anywhere near it ("ut of memory", "Traceback", ...). The reader
searches each chunk for them in one pass (finder.py) and only splits the lines around a hit into RawLines: the
hit line and a few lines behind it (and, if asked, `before` lines ahead of it). Lines that continue a record
(a frame, a detail line) keep the window open without being searched for, so a traceback of any depth passes
through whole. Each wrapper stream (a compose service, a CRI or docker stream) has its own window: a line of
another stream than the record's neither extends nor uses it up, so a web UI's lines mixed into a block or a
traceback never cut it short, nor do the lines a record skips (a radix-cache dump's). A CRI line in the window
that no literal hit is only counted when its stream has nothing open downstream (the pipeline answers `quiet`):
it could neither start a record nor join or close one, and the hundreds of a web server's stdout lines held
inside another program's stderr traceback cost no decoding. Every other line is only counted, as a Gap. `scan`
and `serve` share this path, so a file read in one piece, in 1-byte pieces, or with the prefilter off gives the
same events (property-tested).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence

import regex

from ..detect.model import Gap, RawLine
from .decode import cri_full_stream, wrapper_stream

# make_finder is looked up here at call time: tests swap it for one finder.
from .finder import literal_set, make_finder

DEFAULT_AFTER = 32  # after a traceback opens: its header lines; each frame line then extends the window
DEFAULT_AFTER_SHORT = 4  # after an anchor or detail line: the next detail line, or the closing blank line
# No look-back by default: a record starts at its anchor line whatever came before it, and a CRI partial record
# ahead of an anchor is a hit of its own (the pipeline searches for " stdout P"). Four look-back lines cost 30 %
# of a scan's CPU on a log with a retraction line every 1,250 lines, for the same events (tests/test_scan_lookback.py).
DEFAULT_BEFORE = 0
MAX_SPAN_LINES = 100_000  # an unclosed span (a cut file) stops holding the window open after this many lines
MAX_LINE = 256 * 1024
MAX_FOREIGN_LINES = 256  # other-stream lines held inside an open window before they count against it again

_NOT_NUL = regex.compile(rb"[^\x00]")


class LineReader:
    """Feed it byte chunks of one source in order; it yields RawLines near anchors and Gaps between."""

    def __init__(
        self,
        literals: Sequence[str],
        *,
        openers: Sequence[str] = (),
        extenders: Sequence[str] = (),
        spans: Sequence[tuple[str, str]] = (),
        finder: str = "auto",
        prefilter: bool = True,
        after: int = DEFAULT_AFTER,
        after_short: int = DEFAULT_AFTER_SHORT,
        before: int | None = None,
        max_line: int = MAX_LINE,
        quiet: Callable[[str], bool] | None = None,
        fillers: tuple[re.Pattern[bytes], regex.Pattern[bytes]] | None = None,
    ) -> None:
        """fillers: (a quick necessary test, the test): a line in the window they both find (anywhere) neither
        extends nor uses it up, as a line of another stream does (the assembler's noise lines, which a record
        skips)."""
        literals_ = literal_set(tuple(literals), tuple(openers), tuple(extenders), tuple(spans))
        self._openers, self._extenders, searched, self._opener_re, self._extender_re, self._openers_hit = literals_
        # A span (a CRI partial record up to its stream's F record) keeps the window open until it closes,
        # however many other-stream lines come in between: the F may hold the rest of an anchor.
        self._spans = tuple((o.encode(), c.encode()) for o, c in spans)
        self._open_spans: set[int] = set()
        self._span_lines = 0
        self._finder = make_finder(searched, prefer=finder)
        self._prefilter = prefilter
        self._after = after
        self._after_short = after_short
        self._before = DEFAULT_BEFORE if before is None else before
        self._max_line = max_line
        # Asked of a line in the window that no literal hit: is its stream's record state empty downstream (no
        # record open, no partial line)? Then the line can change nothing there and is only counted.
        self._quiet = quiet
        self._fillers = fillers
        self.quiet_lines = 0
        self._partial = bytearray()
        self._truncating = False  # discarding the tail of an over-long line until its newline
        self._window = 0  # lines still to pass through after the last hit of a bare line (or a look-back, a span)
        # Each wrapper stream's own window, armed by its lines: two streams' records open at once (an OOM on
        # stderr while stdout logs its own) each get their lines, whatever the other writes in between.
        self._streams: dict[bytes, int] = {}
        self._foreign = 0  # lines of no armed stream held since a stream was last armed
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
        """Nothing in flight: no partial line, no open window or span, and as many held lines as a fresh
        reader fed the same last lines would hold."""
        return (
            self._window == 0
            and not self._streams
            and not self._open_spans
            and self._span_lines == 0
            and not self._partial
            and not self._truncating
            and len(self._held) == self._before
        )

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
        self._streams.clear()
        self._foreign = 0

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

    def _window_after(self, line: bytes, is_hit: bool) -> int:
        """Lines to pass through after this one: long after a traceback opens, short after an anchor."""
        if is_hit:
            return self._after if self._opener_re.search(line) else self._after_short
        return self._after_short if self._extender_re.search(line) else 0

    def _advance_window(self, line: bytes, is_hit: bool) -> None:
        """One line of the window went by. A line of a stream no wrapped line armed, or a bare line while
        wrapped ones are armed, leaves every window as it was; a line of an armed stream uses up its own."""
        streams = self._streams
        if not streams:
            if self._filler(line, is_hit):
                return
            after = self._window_after(line, is_hit)
            self._window = max(self._window - 1, after)
            if after:  # only a line that arms the window needs its stream (and a plain line has none: cheap)
                tag = wrapper_stream(line)
                if tag is not None:  # the bare window goes on too: a bare record may still be open
                    streams[tag] = after
                self._foreign = 0
            return
        tag = wrapper_stream(line)
        left = streams.get(tag) if tag is not None else None
        if left is None and not is_hit and self._foreign < MAX_FOREIGN_LINES:
            # A bare line in a window armed by a wrapped one is not the record's stream either: in compose
            # output it is compose's own ("sglang-1 exited with code 137"), which prefixes every service line.
            self._foreign += 1
            return
        if self._filler(line, is_hit):
            return
        after = self._window_after(line, is_hit)
        if left is None and not is_hit:  # past the bound of lines held: they use up every window again
            for other in list(streams):
                if streams[other] > 1:
                    streams[other] -= 1
                else:
                    del streams[other]
        # The bare window (a bare line's record, a look-back, an open span's one more line) goes by with every
        # line counted.
        self._window = max(self._window - 1, after if tag is None else 0)
        if tag is not None and (left is not None or after):
            kept = max((left or 0) - 1, after)
            if kept:
                streams[tag] = kept
            else:
                del streams[tag]
        if after:
            self._foreign = 0

    def _filler(self, line: bytes, is_hit: bool) -> bool:
        """A line the window holds without using it up (counted with the other streams' lines, to the same bound)."""
        fillers = self._fillers
        if is_hit or fillers is None or self._foreign >= MAX_FOREIGN_LINES or fillers[0].search(line) is None:
            return False
        if fillers[1].search(line) is None:
            return False
        self._foreign += 1
        return True

    def _span_holds(self, line: bytes) -> bool:
        """Track open spans; True while one is open (and not past its bound)."""
        for i, (opener, closer) in enumerate(self._spans):
            if opener in line:
                self._open_spans.add(i)
            elif closer in line:
                self._open_spans.discard(i)
        if not self._open_spans:
            self._span_lines = 0
            return False
        self._span_lines += 1
        if self._span_lines > MAX_SPAN_LINES:
            self._open_spans.clear()
            self._span_lines = 0
            return False
        return True

    def _walk(self, buf: bytes, lo: int, hi: int) -> Iterator[RawLine | Gap]:
        """Split buf[lo:hi] (newline-terminated) into lines near hits, and gaps."""
        if not self._prefilter:
            self._window = hi - lo + 1
            hits: list[int] = []
        else:
            hits = self._finder.offsets(buf, lo, hi)
        pos, h = lo, 0
        while pos < hi:
            while h < len(hits) and hits[h] < pos:
                h += 1
            if self._window > 0 or self._streams:
                end = buf.find(b"\n", pos, hi)
                line = self._line(buf, pos, end)
                pos = end + 1
                if self._prefilter:
                    is_hit = h < len(hits) and hits[h] < end
                    self._advance_window(line.data, is_hit)
                    spans = self._spans and (is_hit or self._open_spans or not self._openers_hit)
                    if spans and self._span_holds(line.data):
                        self._window = max(self._window, 1)
                    if not is_hit and self._quiet is not None:
                        stream = cri_full_stream(line.data)
                        if stream is not None and self._quiet(stream):
                            self.quiet_lines += 1
                            continue
                yield line
                continue
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
