"""Is this source SGLang? Evidence from what it writes, looked for in the bytes until it is found. Beside the reader.

    bytes --EvidenceScanner (literal prefilter, complete lines only)--> Evidence.mark(position)
    Report of an SGLang-only kind --Evidence.mark(its position)
    Report of a kind with requires_sglang_evidence --admitted?--> counted, or withheld (a foreign event)

The rule (docs/recognition.md): a source is SGLang from the first line that shows one *strong* sign, or from the
third line that shows the weak one.
- strong: `server_args=ServerArgs(` or 0.5.23's `server_args={'` (the start-up banner, either form), a traceback
  frame in `sglang/srt/`, a scheduler usage
  line (`#running-req: `, in every Decode batch / Prefill batch line since 0.1), the capacity line
  (`max_total_num_tokens=`), the parent's SIGQUIT line after a child died (`Received sigquit from a child
  process`, `It usually means one child failed`), or a report of a catalog kind whose text only SGLang writes (the
  KV-pool messages);
- weak: SGLang's log prefix with a rank token, `[<time> ... TP0 ...] ` (a format another program could share, so
  one line is not enough; an SGLang scheduler writes dozens in its first second).
A sign counts only on SGLang's own line: after the container's framing (detect/decode.py), the line starts with a log
prefix, or, without one, SGLang's words start it (prefix.starts_own; a frame for `sglang/srt/`). A log forwarder that
echoes SGLang's lines inside its own records (`Body: Str([...] Decode batch, #running-req: ...)`, a JSON field) does
not become SGLang by them.
A kind the catalog marks `requires_sglang_evidence` (torch's and flashinfer's CUDA OOM: any PyTorch program
writes them) counts only when its own traceback has a `sglang/srt/` frame, when the source was SGLang at or
before the event's first line, or when evidence follows it (Held): in `scan`, anywhere later in the same input;
in `serve`, within HOLD_LINES lines of its first line and `evidence_wait` of reading it. Held reports count once,
in log order, when the evidence comes; past the bound (or at the end of the input or generation) they are a
foreign event. Lines, not arrival times, decide in `scan` and for a backlog: a file read in one piece or byte by
byte, serially or cut into ranges by a parallel scan, admits the same events.
"""

from __future__ import annotations

from collections.abc import Callable

import regex

from .decode import unwrap
from .finder import LineTail, make_finder
from .model import Record, Report
from .prefix import RAY_TAG, PrefixParser, starts_own

STRONG = ("server_args=ServerArgs(", "server_args={'", "sglang/srt/", "#running-req: ", "max_total_num_tokens=",
          # The parent's SIGQUIT handler after a child died (launch phase; running phase): SGLang's own words, often
          # the only ones a pasted crash keeps after the exception (entrypoints/engine.py, tokenizer_manager.py).
          "Received sigquit from a child process", "It usually means one child failed")  # fmt: skip
WEAK = "TP0"
WEAK_LINES = 3  # lines with a rank-tagged SGLang prefix that identify a source
OWN_FRAME = "sglang/srt/"
# SGLang's prefix with a TP0 rank token, starting the line once its framing is off (a Ray actor's tag may come first).
_WEAK_LINE = regex.compile(
    rf"(?:{RAY_TAG})?"
    r"\[(?:\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d(?:\.\d{1,6})?(?: [A-Z][A-Z_]*\d+)* TP0(?: [A-Z][A-Z_]*\d+)*\] "
)
_OWN_FRAME_LINE = regex.compile(r'\s+File "[^"]*' + regex.escape(OWN_FRAME))
MAX_LINE = 256 * 1024  # the reader's bound: a longer line is judged on its first MAX_LINE bytes
BEFORE_ALL = (-1, -1)  # the position of evidence that precedes every byte (inherited, restored, probed)

Position = tuple[int, int]  # (generation sequence number, byte offset in that generation)
# `serve`'s line bound for evidence after an evidence-needing report (Held). A constant, as the deduper's line
# bounds are: it describes how soon SGLang shows itself in its own log after a crash (its next usage line,
# traceback frame or banner), and makes the rule positional (a backlog read at once decides as a live file).
# The time bound is the `evidence_wait` setting (config/settings.py), like `traceback_wait`: it ends the wait of
# a container that went quiet after a foreign OOM, and depends on the operator's system (a crash-looping SGLang's
# next run, whose `n+1.log` marks the container, prints its banner after the restart back-off).
HOLD_LINES = 1000


class Evidence:
    """One source's SGLang identification: where it was first shown, and who to tell."""

    __slots__ = ("at", "by_word", "on_identified", "withheld")

    def __init__(self, *, by_word: bool = False, on_identified: Callable[[], None] | None = None) -> None:
        self.at: Position | None = None
        self.by_word = by_word  # a path the user named: SGLang for its series, not for a generic CUDA OOM
        self.on_identified = on_identified
        self.withheld = 0  # reports of an evidence-needing kind not counted for lack of evidence

    @property
    def identified(self) -> bool:
        """Whether the content showed SGLang (here or in an earlier run of the same container)."""
        return self.at is not None

    @property
    def sglang(self) -> bool:
        """Whether the source counts as SGLang's: by its content or by the user's word."""
        return self.at is not None or self.by_word

    def mark(self, at: Position = BEFORE_ALL) -> None:
        """Evidence at this position; the first mark (or an earlier one) wins."""
        first = self.at is None
        if first or at < self.at:  # type: ignore[operator]
            self.at = at
        if first and self.on_identified is not None:
            self.on_identified()

    def admits(self, record: Record, at: Position) -> bool:
        """Whether an event of an evidence-needing kind at this position counts: own frames, or evidence before it."""
        if any(OWN_FRAME in path for path, _ in record.frames):
            return True
        return self.at is not None and self.at <= at


class Held:
    """Reports of an evidence-needing kind read before their source showed SGLang, waiting for evidence after them.

    lines/seconds bound the wait (None: unbounded, `scan`'s rule). Each report keeps its position and when it was
    held; a restart re-reads from the oldest (resume_point), so a held report is neither lost nor counted twice.
    """

    __slots__ = ("_items", "lines", "seconds")

    def __init__(self, lines: int | None = None, seconds: float | None = None) -> None:
        self.lines = lines
        self.seconds = seconds
        self._items: list[tuple[Report, Position, float]] = []

    def __len__(self) -> int:
        return len(self._items)

    def add(self, report: Report, at: Position, now: float) -> None:
        """Hold this report (read at `now`) until evidence comes or its bound passes."""
        self._items.append((report, at, now))

    def resume_point(self) -> tuple[int, int] | None:
        """(offset, lineno) of the oldest held report's first line: a restart must re-read from there."""
        return min(((r.record.offset, r.record.lineno) for r, _, _ in self._items), default=None)

    def reaches(self, report: Report, gen: int, evidence_line: tuple[int, int] | None) -> bool:
        """Whether evidence first seen on this (generation, line) is within the bound after the report."""
        if self.lines is None:
            return True
        if evidence_line is None:
            return False
        return evidence_line[0] == gen and evidence_line[1] <= report.record.lineno + self.lines

    def settle(
        self,
        evidence: Evidence,
        evidence_line: tuple[int, int] | None,
        next_lineno: int,
        now: float,
        *,
        final: bool,
    ) -> list[tuple[Report, bool]]:
        """The held reports decided now, in log order, each with whether it counts: all of them once evidence
        exists or when final; else those whose bound passed (the reader is past it, or its time is over)."""
        decided: list[tuple[Report, bool]] = []
        kept: list[tuple[Report, Position, float]] = []
        for item in self._items:
            report, at, since = item
            if evidence.at is not None:
                counts = evidence.admits(report.record, at) or self.reaches(report, at[0], evidence_line)
                decided.append((report, counts))
            elif (
                final
                or (self.lines is not None and next_lineno - 1 > report.record.lineno + self.lines)
                or (self.seconds is not None and now - since >= self.seconds)
            ):
                decided.append((report, False))
            else:
                kept.append(item)
        self._items = kept
        return decided


class EvidenceScanner:
    """Looks for the signs in a source's bytes, complete lines only, until one identifies it."""

    def __init__(self, evidence: Evidence, finder: str = "auto", prefixes: PrefixParser | None = None) -> None:
        self.evidence = evidence
        self._prefixes = prefixes or PrefixParser()
        self._finder = make_finder(tuple(s.encode() for s in (*STRONG, WEAK)), prefer=finder)
        self._strong = tuple(s.encode() for s in STRONG)
        self._tail = LineTail(MAX_LINE)
        self.weak_lines: list[int] = []  # offsets of the first WEAK_LINES weak lines of the current generation
        self.strong_at: int | None = None  # offset of the first strong line of the current generation
        self._gen = 0
        self._weak_total = 0

    @property
    def done(self) -> bool:
        """Nothing left to look for."""
        return self.evidence.at is not None

    def start(self, gen: int) -> None:
        """A new file generation: a line cut at the old one's end is judged as it was."""
        self.finish()
        self._gen = gen
        self.weak_lines, self.strong_at = [], None

    def feed(self, data: bytes, offset: int) -> None:
        """The next bytes of the current generation, the first at `offset`."""
        if self.done or not data:
            return
        cut = data.rfind(b"\n")
        if cut < 0:
            self._tail.extend(data, offset)
            return
        start = 0
        if self._tail:
            first = data.find(b"\n")
            self._tail.extend(data[:first], offset)
            at = self._tail.at
            self._line(self._tail.take(), at)
            start = first + 1
        pos = start
        # One stopping search per line that holds a sign (a line that identifies ends it): an SGLang log, where
        # every usage line holds one, costs one search, not one Python call per usage line.
        while pos <= cut:
            hit = self._finder.first(data, pos, cut + 1)
            if hit < 0:
                break
            lo = max(data.rfind(b"\n", pos, hit) + 1, pos)
            end = data.find(b"\n", hit, cut + 1)
            self._line(data[lo : min(end, lo + MAX_LINE)], offset + lo)
            if self.done:
                return
            pos = end + 1
        self._tail.extend(data[cut + 1 :], offset + cut + 1)

    def finish(self) -> None:
        """The generation ended: its last line (without a newline) is a line."""
        at, line = self._tail.at, self._tail.take() if self._tail else None
        if line is not None and not self.done:
            self._line(line, at)

    def _line(self, line: bytes, at: int) -> None:
        if any(s in line for s in self._strong) and self._shows_strong(unwrap(line)):
            if self.strong_at is None:
                self.strong_at = at
            self.evidence.mark((self._gen, at))
        elif WEAK.encode() in line and _WEAK_LINE.match(unwrap(line)) is not None:
            if len(self.weak_lines) < WEAK_LINES:
                self.weak_lines.append(at)
            self._weak_total += 1
            if self._weak_total >= WEAK_LINES:
                self.evidence.mark((self._gen, at))

    def _shows_strong(self, text: str) -> bool:
        """A strong sign on SGLang's own line: anywhere after a log prefix; without one, where SGLang's words start
        the line (a frame, for the frame sign), never inside another program's line that quotes SGLang's."""
        prefix, message = self._prefixes.parse(text)
        for sign in STRONG:
            i = message.find(sign)
            if i < 0:
                continue
            if prefix is not None or starts_own(message, i):
                return True
            if sign == OWN_FRAME and _OWN_FRAME_LINE.match(message) is not None:
                return True
        return False


def probe(data: bytes, finder: str = "auto") -> bool:
    """Whether these bytes (a file's head, read before following it from later on) identify SGLang."""
    evidence = Evidence()
    scanner = EvidenceScanner(evidence, finder)
    scanner.feed(data, 0)
    scanner.finish()
    return evidence.identified
