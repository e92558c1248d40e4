"""Cutting one big file into byte ranges and joining the ranges' reports exactly. Used by parallel.py.

How a cut stays exact. A cut is exact at a *quiet point*: a line boundary where the pipeline holds nothing
in flight (the reader has no hit or look-back line left to pass and no partial line, its look-back holds the
last lines it keeps, no record is being assembled, no CRI partial record waits) — a pipeline started fresh a few
lines earlier reaches that point in the same state, so everything after it comes out the same. The file is
cut at line boundaries C1 < C2 < ...; `find_join` feeds a fresh pipeline line by line from a cut Ck and
returns the first quiet point Jk it reaches (within range k and JOIN_SEARCH_LINES). It depends only on the
bytes from Ck, so the worker of range k (which starts its output there) and the worker of range k-1 (which
must stop there) compute the same Jk independently. The worker of range k-1 then reads on to Jk and checks
that *its* pipeline, which has seen everything since its own start, is quiet at Jk too. If it is not (an
unclosed CRI span or a traceback running across the cut), or range k has no quiet point, it reads through
range k as well and tries the next cut: the parent then skips the worker of range k. Reads inside a worker
follow the serial scan's CHUNK grid, so lines split across reads (and the over-long-line count) are the
same. Line numbers in a worker count from its cut; the parent shifts them to file line numbers. A worker
remembers the joins it found (`Joins`): pool tasks come in runs of neighbouring ranges, which ask for the same
cuts, so each is found once per worker instead of once per range that reads past it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace

from ..detect.dedupe import Deduper
from ..detect.evidence import WEAK_LINES, Evidence, Held
from ..detect.match import Matcher
from ..detect.model import OomEvent, Report, ServerLog
from ..detect.pipeline import Pipeline, PipelineStats
from ..detect.reader import MAX_LINE
from ..detect.serverlog import EMPTY

JOIN_SEARCH_LINES = 20_000  # how far past a cut a quiet point is looked for before the cut is given up


@dataclass(slots=True)
class Segment:
    """What one worker found in its part of a cut file: reports from `start` up to `end`."""

    index: int
    start: int | None  # the quiet point it started at; None: its range had none (a neighbour reads it)
    end: int = 0
    lines_at_start: int = 0  # lines before `start`, counted from the worker's cut
    lines_at_end: int = 0
    reports: list[Report] = field(default_factory=list)  # line numbers count from the worker's cut
    stats: PipelineStats = field(default_factory=PipelineStats)
    # SGLang evidence its pipeline's scanner saw (file offsets): the parent decides what it admits (evidence.py).
    strong_at: int | None = None
    weak_lines: list[int] = field(default_factory=list)
    # What its lines (from its cut) said about the server (detect/serverlog.py): the parent puts the segments before
    # it first, so a report's server description and last usage line are the serial scan's.
    server: ServerLog = EMPTY


class Collector(Deduper):
    """Keeps a worker's reports in pipeline order instead of joining them: the parent dedupes the file."""

    def __init__(self) -> None:
        super().__init__("", "", drop, resolve=_no_resolve)
        self.reports: list[Report] = []

    def add(self, report: Report, now: float = 0.0) -> None:
        """Keep the report; joining happens in the parent."""
        self.reports.append(report)


def drop(_event: OomEvent) -> None:
    """A sink that keeps nothing: a collecting pipeline never emits events."""
    return None


def _no_resolve(_base: Report, _reports: Sequence[Report]) -> tuple[str, str | None, str | None]:
    raise AssertionError("a collecting worker never emits events")


# A fresh pipeline whose first byte is at the given offset and first line is line 1, collecting its reports.
NewPipeline = Callable[[int], tuple[Pipeline, Collector]]
Join = tuple[int, Pipeline, Collector]  # a quiet point, and the fresh pipeline that reached it


def find_join(path: str, start: int, stop: int, new: NewPipeline) -> Join | None:
    """The first quiet point of a fresh pipeline fed line by line from the cut `start`, before `stop`."""
    pipe, collector = new(start)
    with open(path, "rb") as fh:
        fh.seek(start)
        pos = start
        for _ in range(JOIN_SEARCH_LINES):
            if pos >= stop:
                return None
            line = fh.readline(MAX_LINE + 1)
            # A line that may be over-long is counted differently by different read patterns: no cut near it.
            if not line.endswith(b"\n"):
                return None
            pipe.feed(line)
            pos += len(line)
            if pipe.is_quiet():
                return pos, pipe, collector
    return None


def feed_range(pipe: Pipeline, fd: int, pos: int, end: int, chunk: int) -> None:
    """Feed bytes [pos, end) in reads that end on the serial scan's chunk grid (or at `end`)."""
    while pos < end:
        n = min(end, (pos // chunk + 1) * chunk) - pos
        data = os.pread(fd, n, pos)
        if len(data) != n:
            raise OSError(f"short read at {pos}: the file changed while it was scanned")
        pipe.feed(data)
        pos += n


class Joins:
    """One worker's memo of the joins of the file it is cutting: find_join is a pure function of the bytes
    from a cut, and neighbouring ranges (which pool tasks hand one worker in runs) ask for the same cuts.
    The range before cut k needs only the join's position; range k starts from the join's pipeline, which
    the range before only read, so the last few pipelines are kept too."""

    KEEP = 64  # pipelines kept (a fresh one that reached a quiet point holds little): more than a run reads past

    def __init__(self) -> None:
        self._file: tuple[str, tuple[int, ...]] | None = None
        self._at: dict[int, int | None] = {}  # cut index -> its join's position (None: no quiet point)
        self._pipes: dict[int, Join] = {}

    def at(self, path: str, cuts: tuple[int, ...], k: int, new: NewPipeline) -> int | None:
        """The position of the join at cut k."""
        self._for(path, cuts)
        if k not in self._at:
            self._find(path, cuts, k, new)
        return self._at[k]

    def take(self, path: str, cuts: tuple[int, ...], k: int, new: NewPipeline) -> Join | None:
        """The join at cut k with its pipeline, for the range that starts there to go on feeding."""
        self._for(path, cuts)
        if k in self._at and self._at[k] is None:
            return None
        found = self._pipes.pop(k, None)
        return found if found is not None else self._find(path, cuts, k, new, keep=False)

    def _for(self, path: str, cuts: tuple[int, ...]) -> None:
        if self._file != (path, cuts):
            self._file, self._at, self._pipes = (path, cuts), {}, {}

    def _find(self, path: str, cuts: tuple[int, ...], k: int, new: NewPipeline, keep: bool = True) -> Join | None:
        found = find_join(path, cuts[k], cuts[k + 1], new)
        self._at[k] = None if found is None else found[0]
        if found is not None and keep:
            self._pipes[k] = found
            while len(self._pipes) > self.KEEP:
                del self._pipes[next(iter(self._pipes))]
        return found


def scan_range(
    path: str, index: int, cuts: tuple[int, ...], new: NewPipeline, chunk: int, joins: Joins | None = None
) -> Segment:
    """Scan range `index` of a cut file from its quiet point to the next quiet point its pipeline shares."""
    joins = Joins() if joins is None else joins
    size = cuts[-1]
    if index == 0:
        start = 0
        pipe, collector = new(0)
    else:
        found = joins.take(path, cuts, index, new)
        if found is None:
            return Segment(index, None)
        start, pipe, collector = found
    seg = Segment(index, start, lines_at_start=pipe.stats().lines_read)
    first_stats, first_reports = pipe.stats(), len(collector.reports)
    fd = os.open(path, os.O_RDONLY)
    try:
        pos, k = start, index + 1
        while True:
            if k >= len(cuts) - 1:
                feed_range(pipe, fd, pos, size, chunk)
                pos = size
                break
            join = joins.at(path, cuts, k, new)
            if join is not None:
                feed_range(pipe, fd, pos, join, chunk)
                pos = join
                if pipe.is_quiet():
                    break
            k += 1  # no exact join at cut k: read through range k too
    finally:
        os.close(fd)
    pipe.finish()
    seg.end = pos
    seg.reports = collector.reports[first_reports:]
    seg.stats = _minus(pipe.stats(), first_stats)
    seg.lines_at_end = seg.stats.lines_read + seg.lines_at_start
    seg.strong_at, seg.weak_lines = pipe.evidence_marks()
    seg.server = pipe.server_log()
    return seg


def _minus(a: PipelineStats, b: PipelineStats) -> PipelineStats:
    return PipelineStats(*(getattr(a, f.name) - getattr(b, f.name) for f in fields(PipelineStats)))


def _plus(a: PipelineStats, b: PipelineStats) -> PipelineStats:
    return PipelineStats(*(getattr(a, f.name) + getattr(b, f.name) for f in fields(PipelineStats)))


def cut_points(path: str, size: int, ranges: int) -> tuple[int, ...]:
    """0, then line starts near size*i/ranges, then size: the nominal range boundaries of a file."""
    cuts = [0]
    with open(path, "rb") as fh:
        for i in range(1, ranges):
            fh.seek(size * i // ranges - 1)
            fh.readline()  # to the start of the next line (or stay, when the seek landed on a newline)
            at = fh.tell()
            if cuts[-1] < at < size:
                cuts.append(at)
    cuts.append(size)
    return tuple(cuts)


class Joiner:
    """Chains a cut file's segments at their shared quiet points and dedupes its reports as one source.

    Segments may come in any order; each is used as soon as the chain reaches it, so the parent dedupes
    the first ranges while workers still read the last ones.
    """

    def __init__(self, name: str, size: int, matcher: Matcher) -> None:
        self.events: list[OomEvent] = []
        self.stats = PipelineStats()
        self._name, self._size = name, size
        self._deduper = Deduper(name, name, self.events.append, resolve=matcher.resolve)
        # The serial pipeline's gate, applied here in the same order: workers collect every report ungated.
        self._evidence = Evidence()
        self._needs_evidence = matcher.catalog.evidence_kinds()
        self._weak: list[int] = []
        self._held = Held()  # scan's rule: evidence anywhere later in the file counts them (no bound)
        self._foreign = 0
        self._waiting: dict[int, Segment] = {}
        self._server = EMPTY  # what the lines before the next segment said about the server
        self._next = 0  # where the next segment of the chain must start
        self._base = 0  # file line number of that segment's line 1, minus 1, minus its lines before start

    def add(self, segment: Segment) -> None:
        """Take one worker's segment (a segment without a start is a range its neighbour read)."""
        if segment.start is not None:
            self._waiting[segment.start] = segment
        while self._next < self._size and self._next in self._waiting:
            seg = self._waiting.pop(self._next)
            base = self._base - seg.lines_at_start
            self._take_evidence(seg)
            for r in seg.reports:
                shifted = replace(r, server=self._server.then(r.server or EMPTY))
                if base:
                    shifted = replace(shifted, record=replace(r.record, lineno=r.record.lineno + base))
                if self._admit(shifted):
                    self._deduper.add(shifted)
            self.stats = _plus(self.stats, seg.stats)
            self._server = self._server.then(seg.server)
            self._next = seg.end
            self._base = base + seg.lines_at_end

    def _take_evidence(self, seg: Segment) -> None:
        if seg.strong_at is not None:
            self._evidence.mark((0, seg.strong_at))
        self._weak = sorted(set(self._weak) | set(seg.weak_lines))[:WEAK_LINES]
        if len(self._weak) == WEAK_LINES:
            self._evidence.mark((0, self._weak[-1]))
        self._release()  # evidence in this segment: what waited for it comes before the segment's reports

    def _admit(self, report: Report) -> bool:
        """Pipeline._admit over the joined file (its offsets are file offsets: one generation), with scan's
        unbounded hold: an evidence-needing report without evidence yet waits for evidence anywhere later."""
        at = (0, report.record.offset)
        if report.kind not in self._needs_evidence and not report.needs_evidence:
            self._evidence.mark(at)
            self._release()
            return True
        if self._evidence.admits(report.record, at) or self._evidence.identified:
            return True
        self._held.add(report, at, 0.0)
        return False

    def _release(self, *, final: bool = False) -> None:
        if not self._held or not (final or self._evidence.identified):
            return
        for report, counts in self._held.settle(self._evidence, None, 0, 0.0, final=final):
            if counts:
                self._deduper.add(report)
            else:
                self._foreign += 1

    def finish(self) -> tuple[list[OomEvent], PipelineStats]:
        """The file's events in line order, and its stats, once every segment was added."""
        if self._next < self._size:
            raise RuntimeError(f"{self._name}: no segment starts at the join {self._next}")
        self._release(final=True)  # no evidence in the whole file: foreign
        self._deduper.flush(None)
        self.events.sort(key=lambda e: int(e.location.rsplit(":", 1)[1]))
        self.stats.events = len(self.events)
        # The workers counted the echoes (a record's own property, exact per range); the gate's are added here.
        self.stats.foreign_events += self._foreign
        return self.events, self.stats
