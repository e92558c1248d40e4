"""One source's pipeline: bytes -> LineReader -> Decoder -> Assembler -> Matcher -> Deduper -> sink.

`scan` feeds whole files and calls finish(); `serve` feeds what the tailer read, calls tick() on a clock
and reset() on rotation. Nothing here does I/O: bytes come in, OomEvents go out through the sink.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from ..catalog import Catalog
from ..detect.assemble import TRACEBACK_OPENERS, Assembler
from ..detect.decode import CRI_PARTIAL_LITERALS, Decoder, escaped_literals, stream_of
from ..detect.dedupe import Deduper
from ..detect.evidence import Evidence, EvidenceScanner, Held
from ..detect.match import Matcher
from ..detect.model import Gap, OomEvent, RawLine, Record, Report, ServerLog
from ..detect.prefix import PrefixParser
from ..detect.reader import LineReader
from ..detect.serverlog import EMPTY, ServerScanner, export_log, import_log

# A file that begins mid-traceback (rotation cut it) has no header and no exception line, only frames that may
# end in an allocator (R5). Every frame line is a hit, so the reader passes all of them (a path in a custom log
# format is no frame); a frame of SGLang's own code (OWN_CODE) may then start a headless traceback.
FRAME_LITERALS = ('.py", line ',)
OWN_CODE = ("sglang/srt/",)


@dataclass(slots=True)
class PipelineStats:
    """What one source's pipeline has seen: fuel for self-metrics and the scan summary."""

    lines_read: int = 0
    records: int = 0
    reports: int = 0
    events: int = 0
    oversized_lines: int = 0
    noise_lines: int = 0
    json_errors: int = 0
    # Reports withheld as another program's: an evidence-needing kind without SGLang evidence (detect/evidence.py), or
    # an echo of SGLang's text inside another program's record (detect/match.py), counted here even without the gate.
    foreign_events: int = 0


class Pipeline:
    """The pure pipeline for one source (a file, stdin, or a pod's container log)."""

    def __init__(
        self,
        catalog: Catalog,
        matcher: Matcher,
        *,
        source: str,
        location: str,
        sink: Callable[[OomEvent], None],
        prefilter: bool = True,
        finder: str = "auto",
        extra_prefixes: Sequence[str] = (),
        wait_seconds: float = 2.5,
        evidence: Evidence | None = None,
        gate: bool = True,
        deduper: Deduper | None = None,
        hold_lines: int | None = None,
        hold_seconds: float | None = None,
    ) -> None:
        """deduper, when given, receives the reports instead of the pipeline's own Deduper (a parallel scan's
        worker collects them undeduplicated for its parent); the pipeline then counts no events itself.

        hold_lines and hold_seconds bound how long a report that needs SGLang evidence and has none yet waits
        for it (detect/evidence.py, Held): None, no bound (`scan`: evidence anywhere in the input qualifies)."""
        anchors = matcher.anchors if matcher.catalog is catalog else catalog.anchors()
        self._reader = LineReader(
            (*anchors, *FRAME_LITERALS, *CRI_PARTIAL_LITERALS),
            openers=TRACEBACK_OPENERS,
            escaped=escaped_literals,
            finder=finder,
            prefilter=prefilter,
            busy=self._busy,
            needs=self._needs,
        )
        self._decoder = Decoder()
        prefixes = PrefixParser(extra_prefixes)
        self._assembler = Assembler(anchors, prefixes, OWN_CODE)
        self._matcher = matcher
        # Is the source SGLang? Looked for in the bytes until it is (detect/evidence.py). Without the gate (a
        # parallel scan's worker), reports pass whatever their kind, and the parent applies the same rule.
        self.evidence = Evidence() if evidence is None else evidence
        self._scanner = EvidenceScanner(self.evidence, finder, prefixes)
        # What the log says about the server (start-up lines, the last usage line): each report gets it as of its
        # first line (detect/serverlog.py), the same bytes beside the reader.
        self._server = ServerScanner(finder)
        self._needs_evidence = catalog.evidence_kinds()
        self._gate = gate
        # Reports of an evidence-needing kind seen before any evidence: counted if it comes within the bounds.
        self._held = Held(hold_lines, hold_seconds)
        self._gen = 0  # generation sequence number: with a byte offset, the position evidence is compared at
        self._foreign = 0
        self._evidence_line: tuple[int, int] | None = None  # (generation, line) of the first evidence this pipeline saw
        self._events = 0
        self._records = 0
        self._reports = 0

        def count(event: OomEvent) -> None:
            self._events += 1
            sink(event)

        self._deduper = (
            Deduper(source, location, count, resolve=matcher.resolve, wait_seconds=wait_seconds)
            if deduper is None
            else deduper
        )
        self._now = 0.0

    def feed(self, data: bytes, now: float = 0.0) -> None:
        """Consume the next bytes of the source."""
        self._now = now
        self._server.feed(data, self._reader.position)
        scanner = self._scanner
        if not scanner.done:
            reader = self._reader
            start, lineno = reader.position, reader.next_lineno
            scanner.feed(data, start)
            if scanner.done:  # the first evidence is in these bytes (or was marked from outside meanwhile)
                self._identified_in(data, start, lineno)
        self._lines(self._reader.feed(data))
        self._server.keep_from(self._in_flight())

    def server_log(self, before: int | None = None) -> ServerLog:
        """What the log of the current generation said about the server before this offset (default: all read)."""
        return self._server.at(1 << 62 if before is None else before)

    def inherit_server_log(self, log: ServerLog) -> None:
        """The lines before this pipeline's first byte said this (the state file, an earlier range of a file)."""
        self._server.inherit(log)

    def _in_flight(self) -> int:
        """The offset of the oldest line a later report can start at."""
        parts = (self._reader.resume_point(), self._decoder.resume_point(), self._assembler.resume_point())
        return min(p[0] for p in parts if p is not None)

    def is_quiet(self) -> bool:
        """Nothing in flight in any stage: a fresh pipeline fed the last lines before here would be in this very
        state (where a parallel scan may join two ranges of a file)."""
        return self._reader.idle() and self._decoder.idle() and self._assembler.idle()

    def evidence_marks(self) -> tuple[int | None, list[int]]:
        """The offsets of the current generation's first strong evidence line and first weak ones."""
        return self._scanner.strong_at, list(self._scanner.weak_lines)

    def start_generation(self, generation: str, offset: int = 0, lineno: int = 1) -> None:
        """The bytes that follow start a file generation (first open, rotation, truncation, a restart
        resuming at offset): finish what the previous one left, then count from offset and lineno."""
        self._finish_scanner()
        self._server.finish()
        self._lines(self._reader.reset(offset, lineno))
        self._records_from(self._assembler.close_all())
        self._server.start(offset)
        self._settle_held(final=True)  # a held report waits for evidence in its own generation only
        self._decoder.reset()
        self._deduper.flush(None)
        self._deduper.start(generation)
        self._gen += 1
        self._scanner.start(self._gen)

    def resume_point(self) -> tuple[int, int]:
        """(offset, lineno) from which a restart must re-read to rebuild everything still in flight."""
        points = [self._reader.resume_point()]
        parts = (self._decoder.resume_point(), self._assembler.resume_point(), self._deduper.resume_point(),
                 self._held.resume_point())  # fmt: skip
        for part in parts:
            if part is not None:
                points.append(part)
        return min(points)

    def pending(self) -> int:
        """Events waiting for a traceback or for other ranks."""
        return self._deduper.pending()

    def holding(self) -> int:
        """Reports waiting for SGLang evidence (not events yet: most are another program's and never count)."""
        return len(self._held)

    def export_state(self) -> dict[str, object]:
        """The deduper's memory of emitted events, and what the log said about the server before the resume point
        (a restart re-reads from there: the lines after it are read again), for the state file."""
        state: dict[str, object] = dict(self._deduper.export_state())
        log = self._server.at(self.resume_point()[0])
        if log != EMPTY:
            state["server_log"] = export_log(log)
        return state

    def restore_state(self, raw: dict[str, object]) -> None:
        """Inverse of export_state(); ValueError when malformed."""
        log = import_log(raw["server_log"]) if "server_log" in raw else None
        self._deduper.restore_state({k: v for k, v in raw.items() if k != "server_log"})
        if log is not None:
            self._server.inherit(log)

    def close_open(self, now: float = 0.0) -> None:
        """The source went quiet: close records still open (a traceback that will never finish)."""
        self._now = now
        self._records_from(self._assembler.close_all())

    def tick(self, now: float) -> None:
        """Emit the events that are decidable now (rank window closed, wait over, or left far behind), and
        forget what a restart can no longer re-read."""
        self._now = now
        if self._held:
            self._settle_held(final=False)
        self._deduper.flush(now, self._reader.next_lineno, self._assembler.tracing())
        self._deduper.forget_before(self.resume_point()[0])

    def quiet_seconds(self, idle: float) -> float:
        """How long the source must stay quiet before its open records are closed: the rank window when each
        looks whole (so a block and its traceback count within it), else idle (a record cut mid-write)."""
        return self._deduper.settle_seconds if self._assembler.complete() else idle

    def finish(self) -> None:
        """End of input: everything pending becomes an event now."""
        self._finish_scanner()
        self._server.finish()
        self._lines(self._reader.finish())
        self._records_from(self._assembler.close_all())
        self._settle_held(final=True)
        self._deduper.flush(None)

    def stats(self) -> PipelineStats:
        """Counters so far."""
        return PipelineStats(
            lines_read=self._reader.lines_read,
            records=self._records,
            reports=self._reports,
            events=self._events,
            oversized_lines=self._reader.oversized_lines,
            noise_lines=self._assembler.noise_lines,
            json_errors=self._decoder.json_errors,
            foreign_events=self._foreign,
        )

    def _busy(self) -> bool:
        """The reader's question before a line that no literal hit: is a record open or a CRI partial record
        waiting? If not, such a line can change nothing here (only a hit starts a record), and the reader skips it.
        The reader's items are consumed one by one, so the answer is about the lines before it."""
        return not (self._decoder.idle() and self._assembler.idle())

    def _needs(self, data: bytes) -> bool:
        """The reader's question, while busy, about a line that no literal hit: does a stage need it? Not when its
        stream (as the decoder will read it) has nothing open: it can then neither start a record nor join or
        close one. First the records gone stale by this line are closed, as they are before a line fed (_lines)."""
        stale = self._assembler.expire(self._reader.next_lineno - 1)
        if stale:
            self._records_from(stale)
        stream = stream_of(data)
        return stream is None or not (self._decoder.quiet(stream) and self._assembler.quiet(stream))

    def _lines(self, items: Iterable[RawLine | Gap]) -> None:
        decoder, assembler = self._decoder, self._assembler
        for item in items:
            if isinstance(item, Gap):
                decoder.reset()
                self._records_from(assembler.feed(item))
                continue
            stale = assembler.expire(item.lineno)
            if stale:
                self._records_from(stale)
            line = decoder.decode(item)
            if line is not None:
                self._records_from(assembler.feed(line))

    def _records_from(self, records: Iterable[Record]) -> None:
        for record in records:
            self._records += 1
            report = self._matcher.classify(record)
            if report is not None:
                report = replace(report, server=self._server.at(record.offset))
                self._reports += 1
                if report.echo:  # SGLang's text inside another program's record: foreign, whoever the source is
                    self._foreign += 1
                    continue
                if self._gate and not self._admit(report):
                    continue
                self._deduper.add(report, self._now)

    def _admit(self, report: Report) -> bool:
        """SGLang's own text identifies the source; an evidence-needing kind counts with evidence before it, or
        with evidence after it within the hold's bounds (it is held until then)."""
        at = (self._gen, report.record.offset)
        if report.kind not in self._needs_evidence and not report.needs_evidence:
            if self.evidence.at is None:
                self._evidence_line = (self._gen, report.record.lineno)
            self.evidence.mark(at)
            if self._held:
                self._settle_held(final=False)  # what waited for evidence comes first, in log order
            return True
        if self.evidence.admits(report.record, at):
            return True
        if self.evidence.at is None:
            self._held.add(report, at, self._now)
            return False
        if self._held.reaches(report, self._gen, self._evidence_line):
            return True  # the evidence came after it, within the bound (read in the same bytes)
        self._withhold()
        return False

    def _withhold(self) -> None:
        self._foreign += 1
        self.evidence.withheld += 1

    def _settle_held(self, *, final: bool) -> None:
        """Count the held reports that evidence qualifies, withhold those past their bound (all of them when
        final: the end of the input or of the generation), keep the rest waiting."""
        lineno = self._reader.next_lineno
        for report, admitted in self._held.settle(self.evidence, self._evidence_line, lineno, self._now, final=final):
            if admitted:
                self._deduper.add(report, self._now)
            else:
                self._withhold()

    def _identified_in(self, data: bytes, start: int, lineno: int) -> None:
        """The source was identified while these bytes (at `start`, line `lineno` there) were scanned: note the
        line of the first evidence, then count what waited for it."""
        at = self.evidence.at
        if at is not None and at[0] == self._gen and at[1] >= 0:
            off = at[1] - start
            self._evidence_line = (self._gen, lineno + (data.count(b"\n", 0, off) if off > 0 else 0))
        if self._held:
            self._settle_held(final=False)

    def _finish_scanner(self) -> None:
        """The generation's last line (no newline) is judged as a line; its line number is the reader's next."""
        scanner = self._scanner
        if scanner.done:
            return
        scanner.finish()
        if scanner.done:
            self._identified_in(b"", self._reader.position, self._reader.next_lineno)
