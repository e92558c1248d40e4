"""LogLine | Gap -> Record: join SGLang's multi-line messages and tracebacks. Pure.

SGLang logs a multi-line message with its prefix on the first line only (facts 4); the detail lines,
traceback frames and the repeated exception text come bare. A bare line belongs to the latest prefixed
line of its stream (a CRI or docker stream, a compose service: another service's lines never touch it),
and a frame with nothing open starts a traceback without header (a file cut mid-traceback, facts 10.10).
With a custom format that prefixes every line, a prefixed line that looks like a continuation joins the
open record of its own ranks. Radix-tree dump lines (printed to stdout, thousands per rank, at any
moment) are dropped first, so they never close or split a record (facts 3).

Only records that can hold an event come out: a block whose first line carries a catalog anchor, and
every traceback (the matcher decides whether its exception or its frames name an OOM).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import regex

from ..detect.model import Gap, LogLine, Prefix, Record
from ..detect.prefix import PrefixParser, starts_own

MAX_RECORD_LINES = 400  # a record that grows past this is closed (a runaway traceback, not an OOM)
# A record whose stream wrote none of the source's last this many lines is closed: its program went quiet (a traceback
# whose process died) while others write on. Line-counted, so every reading of the input closes it at the same line;
# without it, one such record would keep every later line of the other streams in front of the decoder. 256: the
# other-stream lines the reader held inside a record before it (its MAX_FOREIGN_LINES); at 1,000, a scan of a CRI log
# with a PyTorch OOM traceback every 1,500 lines of another stream took 60 % more CPU.
STALE_LINES = 256

# Lines a record skips (a radix-cache dump's node lines, its token totals): they neither end nor join it. In one
# table: the start of each such line as a regex.
NOISE_LINES: tuple[str, ...] = (
    r" +\d+ \[[\d, ]*\] r=\d+",
    r" +\d+ \d+ fr=",
    r" *\[\d+\] \d+ fr=",
    r" *\[\d+\] \d+ full_lock=",
    r"#tokens: \d+",
    r"#full_tokens: \d+, #(?:swa_tokens|mamba_num): \d+",
)
_NOISE = regex.compile("^(?:" + "|".join(NOISE_LINES) + ")")
# The lines that open a traceback, in one table: (the whole line as a regex, a literal every such line holds).
# A header alone opens a record here, so the reader must find it: the pipeline hands it TRACEBACK_OPENERS
# ("Exception in ModelRpcClient:" / "... ControllerSingle:", facts 10.5).
TRACEBACK_HEADERS: tuple[tuple[str, str], ...] = (
    (r"Traceback \(most recent call last\):\s*$", "Traceback (most recent call last)"),
    (r"hit an exception:?\s*$", "hit an exception"),
    (r"^Exception in [\w ]+:\s*$", "Exception in "),
)
TRACEBACK_OPENERS = tuple(lit for _, lit in TRACEBACK_HEADERS)
_HEADER = regex.compile("|".join(rx for rx, _ in TRACEBACK_HEADERS))
_FRAME = regex.compile(r'^\s+File "(?P<path>[^"]*)", line \d+, in (?P<func>[\w<>.]+)')
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
# A chained exception goes on in the same record: its link line, then its own "Traceback ..." header.
_CHAIN_LINES = ("Traceback", *_CHAINED)
# The lines a logged block continues with (facts 2, 10), in one table: (start of the line as a regex, whether the
# line can be a block's last).
DETAIL_LINES: tuple[tuple[str, bool], ...] = (
    (r"Try to allocate", False),
    (r"Available", True),
    (r"Avaliable", True),  # sic: 0.3.x-0.4.5
    (r"SWA available", True),
    (r"(?:Full|SWA) LRU list", True),
    (r"Possible solutions", False),
    (r"\d\. ", False),
    (r"Open an issue", True),
    (r"(?:KV cache|Memory) pool leak detected!", True),  # 0.1.x: the warning's numbers come first
    (r"[\w.()\[\] ]*?[\w)\]] ?= ?-?\d", True),  # name=value pairs (0.4.5 paged, leak checks)
)
# The busy-time checker's INFO lines ("[Mem Check (BUSY)] [full] total=...", every iteration at level > 1; facts
# 11.1) look like a leak check's pool lines but are their own records: never a detail line of another record.
_NOT_DETAIL = r"(?!\[Mem Check)"


def _detail_regex(last_only: bool) -> regex.Pattern[str]:
    alternatives = "|".join(rx for rx, last in DETAIL_LINES if last or not last_only)
    # Possessive: a line of blanks must not be split between \s and the name=value class (quadratic otherwise).
    return regex.compile(r"^\s*+" + _NOT_DETAIL + "(?:" + alternatives + ")")


_DETAIL = _detail_regex(False)
_LAST_DETAIL = _detail_regex(True)  # a block whose latest line is one of these may be complete
_EXCEPTION_SHAPED = regex.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)\b")


@dataclass(slots=True)
class _Open:
    """A record being assembled."""

    kind: str  # block | traceback
    lineno: int
    offset: int
    prefix: Prefix | None
    stream: str
    runtime_time: str | None
    lines: list[str] = field(default_factory=list)
    frames: list[tuple[str, str]] = field(default_factory=list)
    state: str = "body"  # block: body; traceback: frames | exception | after_blank
    exceptions: list[list[str]] = field(default_factory=list)
    headless: bool = False  # a traceback that began at a frame (the file was cut): frames and source lines only
    echoed: bool = False  # a traceback whose header stood after another program's words on an unprefixed line

    def size(self) -> int:
        return len(self.lines) + len(self.frames) + sum(len(e) for e in self.exceptions)


class Assembler:
    """Stateful per source: feed lines and gaps in order, collect Records."""

    def __init__(
        self, anchors: Sequence[str], prefixes: PrefixParser | None = None, frame_literals: Sequence[str] = ()
    ) -> None:
        self._anchor_re = _any_of(tuple(anchors))
        # A frame starts a headless traceback only when it holds one of these (SGLang's own code): the reader
        # passes every such line, so the record starts at the same line with or without the prefilter.
        self._frame_literals = tuple(frame_literals)
        self._prefixes = prefixes or PrefixParser()
        self._open: dict[tuple[str, str], _Open] = {}
        self._last_key: dict[str, tuple[str, str]] = {}
        self._seen: dict[str, int] = {}  # each stream's latest line number
        self._lineno = 0  # the source line being read (expire() comes before each): a joined CRI line's is its last
        self._expires = 0  # no open record is stale before this line (a lower bound, recomputed when passed)
        self.noise_lines = 0

    def feed(self, item: LogLine | Gap) -> Iterator[Record]:
        """Consume one line (or a run of skipped lines) and yield the records it closed."""
        if isinstance(item, Gap):
            yield from self.close_all()
            return
        self._seen[item.stream] = max(item.lineno, self._lineno)
        text = item.text
        if text and text[0] in " #[" and _NOISE.match(text):
            self.noise_lines += 1
            return
        prefix, message = self._prefixes.parse(text)
        if prefix is not None:
            yield from self._prefixed(item, prefix, message)
        else:
            yield from self._bare(item, message)

    def close_all(self) -> Iterator[Record]:
        """Close every open record (end of input, a gap, or an idle source)."""
        for rec in sorted(self._open.values(), key=lambda r: r.lineno):
            out = _finish(rec)
            if out is not None:
                yield out
        self._open.clear()
        self._last_key.clear()
        self._seen.clear()

    def idle(self) -> bool:
        """No record open."""
        return not self._open

    def expire(self, lineno: int) -> list[Record]:
        """Line `lineno` of the source comes next (any stream's): close the records whose stream wrote none of the
        STALE_LINES lines before it, and return them."""
        self._lineno = lineno
        if lineno <= self._expires or not self._open:
            return []
        seen = self._seen
        stale = [(rec.lineno, key) for key, rec in self._open.items() if seen.get(rec.stream, 0) + STALE_LINES < lineno]
        closed = [record for _, key in sorted(stale) for record in self._close(key)]
        self._expires = min((seen.get(r.stream, 0) for r in self._open.values()), default=lineno) + STALE_LINES
        return closed

    def quiet(self, stream: str) -> bool:
        """No record of this stream is open: a line of it that no literal hit can only be dropped (it cannot
        start a record, and there is none for it to join or to close)."""
        for key in self._open:  # noqa: SIM110 - a loop, not all(): asked of each other-stream line while one is open
            if key[0] == stream:
                return False
        return True

    def resume_point(self) -> tuple[int, int] | None:
        """(offset, lineno) of the oldest record still open, if any."""
        return min(((r.offset, r.lineno) for r in self._open.values()), default=None)

    def tracing(self) -> frozenset[str]:
        """The ranks whose traceback is being assembled ("" for one without a rank prefix)."""
        return frozenset(r.prefix.ranks if r.prefix else "" for r in self._open.values() if r.kind == "traceback")

    def complete(self) -> bool:
        """Every open record looks whole: a traceback past its exception text and a blank line, a block whose
        latest line is one that can end it (its numbers). The next line would only close them, so a short
        quiet spell may close them too; a record cut mid-write (frames, no exception yet) waits longer."""
        for rec in self._open.values():
            if rec.kind == "traceback":
                if rec.state != "after_blank":
                    return False
            elif len(rec.lines) < 2 or _LAST_DETAIL.match(rec.lines[-1]) is None:
                return False
        return True

    def _prefixed(self, line: LogLine, prefix: Prefix, message: str) -> Iterator[Record]:
        key = (line.stream, prefix.ranks)
        rec = self._open.get(key)
        if rec is not None and message and _continues(rec, message, prefixed=True):
            self._append(rec, message)
            self._last_key[line.stream] = key
            yield from self._maybe_cap(key)
            return
        # A new logged message: the previous write on this stream is over, and so is this rank's.
        yield from self._close(key)
        last = self._last_key.get(line.stream)
        if last is not None and last != key:
            yield from self._close(last)
        self._last_key[line.stream] = key
        self._start(key, line, prefix, message)

    def _bare(self, line: LogLine, message: str) -> Iterator[Record]:
        last = self._last_key.get(line.stream)
        rec = self._open.get(last) if last is not None else None
        if rec is not None and last is not None:
            if _continues(rec, message, prefixed=False):
                self._append(rec, message)
                yield from self._maybe_cap(last)
                return
            yield from self._close(last)
        key = (line.stream, "")
        if _HEADER.search(message) or self._has_anchor(message) or self._starts_headless(message):
            yield from self._close(key)
            self._last_key[line.stream] = key
            self._start(key, line, None, message)

    def _start(self, key: tuple[str, str], line: LogLine, prefix: Prefix | None, message: str) -> None:
        self._expires = min(self._expires, line.lineno + STALE_LINES)
        header = _HEADER.search(message)
        if header is not None:
            # A forwarder that prints a recombined record raw ("Body: Str([...] Scheduler hit an exception: Traceback
            # (most recent call last):", then the frames and the exception text as they were) echoes a whole
            # traceback: its header does not start the line. The record still takes the lines that follow, so none
            # of them starts a record of its own.
            self._open[key] = _Open(
                "traceback",
                line.lineno,
                line.offset,
                prefix,
                line.stream,
                line.runtime_time,
                lines=[message],
                state="frames",
                echoed=prefix is None and not starts_own(message, header.start()),
            )
        elif self._has_anchor(message):
            self._open[key] = _Open(
                "block", line.lineno, line.offset, prefix, line.stream, line.runtime_time, lines=[message]
            )
        elif self._starts_headless(message) and (m := _FRAME.match(message)) is not None:
            # A frame with no traceback open: the file begins mid-traceback (rotation or a size cap cut it
            # between records, facts 10.10). Its frames can still name the failure (R5). It ends at the
            # first line that is neither a frame nor indented; an exception line there is a record of its own,
            # joined to this one by the deduper (R2).
            rec = _Open("traceback", line.lineno, line.offset, prefix, line.stream, line.runtime_time, state="frames")
            rec.headless = True
            rec.frames.append((m.group("path"), m.group("func")))
            self._open[key] = rec

    def _append(self, rec: _Open, message: str) -> None:
        if rec.kind == "block":
            rec.lines.append(message)
            return
        if rec.state == "frames":
            m = _FRAME.match(message)
            if m is not None:
                rec.frames.append((m.group("path"), m.group("func")))
            elif message and message[0] not in " \t" and not message.startswith(_CHAIN_LINES):
                rec.exceptions.append([message])
                rec.state = "exception"
        elif rec.state == "exception":
            if message.strip():
                rec.exceptions[-1].append(message)
            else:
                rec.state = "after_blank"
        elif rec.state == "after_blank" and message.startswith(_CHAINED):
            rec.state = "frames"

    def _maybe_cap(self, key: tuple[str, str]) -> Iterator[Record]:
        rec = self._open.get(key)
        if rec is not None and rec.size() > MAX_RECORD_LINES:
            yield from self._close(key)

    def _close(self, key: tuple[str, str]) -> Iterator[Record]:
        rec = self._open.pop(key, None)
        if rec is not None:
            out = _finish(rec)
            if out is not None:
                yield out

    def _starts_headless(self, message: str) -> bool:
        return any(lit in message for lit in self._frame_literals) and _FRAME.match(message) is not None

    def _has_anchor(self, message: str) -> bool:
        return self._anchor_re is not None and self._anchor_re.search(message) is not None


@functools.lru_cache(maxsize=16)
def _any_of(literals: tuple[str, ...]) -> re.Pattern[str] | None:
    """One search for any of the literals (one C call, not one `in` per literal); None for none."""
    return re.compile("|".join(map(re.escape, literals))) if literals else None


def _continues(rec: _Open, message: str, *, prefixed: bool) -> bool:
    """Does this line belong to the open record? Prefixed lines must look like continuations."""
    blank = not message.strip()
    if rec.kind == "block":
        return not blank and _DETAIL.match(message) is not None
    if rec.headless:
        return message[:1] in (" ", "\t") and not blank
    if rec.state == "frames":
        if prefixed:
            return (
                message[:1] in (" ", "\t")
                or message.startswith(_CHAIN_LINES)
                or _EXCEPTION_SHAPED.match(message) is not None
                or blank
            )
        return True
    if rec.state == "exception":
        if blank:
            return True
        if message[:1] in (" ", "\t") and _FRAME.match(message):
            return False
        return not prefixed or _DETAIL.match(message) is not None
    # after_blank: only more blank lines or a chained-exception line keep the traceback open
    return blank or message.startswith(_CHAINED)


def _finish(rec: _Open) -> Record | None:
    prefix = rec.prefix
    time = prefix.time if prefix else None
    ranks = prefix.ranks if prefix else ""
    # A header alone (no frames, no exception) is a one-line block for the matcher: a header line that
    # quotes the OOM text ("... hit an exception: <text>") still names it.
    if rec.kind == "block" or (not rec.exceptions and not rec.frames):
        return Record(
            "block",
            rec.lineno,
            time,
            ranks,
            rec.stream,
            tuple(rec.lines),
            runtime_time=rec.runtime_time,
            offset=rec.offset,
            prefixed=prefix is not None,
            echoed=rec.echoed,
            header=rec.lines[0] if rec.kind == "traceback" and rec.lines else "",
        )
    exc_lines: list[str] = []
    for exc in rec.exceptions:
        exc_lines.extend(exc)
        exc_lines.append("")
    return Record(
        "traceback",
        rec.lineno,
        time,
        ranks,
        rec.stream,
        tuple(exc_lines[:-1]) if exc_lines else (),
        frames=tuple(rec.frames),
        runtime_time=rec.runtime_time,
        truncated=not rec.exceptions,
        offset=rec.offset,
        prefixed=prefix is not None,
        echoed=rec.echoed,
        header=rec.lines[0] if rec.lines else "",
    )
