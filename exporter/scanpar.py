"""Parallel `scan`: inputs go to worker processes, and a big file is cut into byte ranges joined exactly.

Where it sits: scan.scan_paths(jobs=N) calls scan_parallel(); `--jobs 1` never comes here. Workers run the
same Pipeline as a serial scan, up to the matcher; the reports of a cut file come back to the parent, which
runs the one Deduper over them in file order, so an event whose ranks or traceback straddle a cut is joined
exactly as in a serial scan. gzip files and stdin are never cut (a gzip stream cannot be entered mid-way):
a gzip file is one worker task, stdin is read in the parent.

How a cut stays exact. A cut is exact at a *quiet point*: a line boundary where the pipeline holds nothing
in flight (the reader's window is shut, no CRI span or partial line is open, its look-back holds the last
four lines, no record is being assembled, no CRI partial record waits) — a pipeline started fresh a few
lines earlier reaches that point in the same state, so everything after it comes out the same. The file is
cut at line boundaries C1 < C2 < ...; `_find_join` feeds a fresh pipeline line by line from a cut Ck and
returns the first quiet point Jk it reaches (within range k and JOIN_SEARCH_LINES). It depends only on the
bytes from Ck, so the worker of range k (which starts its output there) and the worker of range k-1 (which
must stop there) compute the same Jk independently. The worker of range k-1 then reads on to Jk and checks
that *its* pipeline, which has seen everything since its own start, is quiet at Jk too. If it is not (an
unclosed CRI span or a traceback running across the cut), or range k has no quiet point, it reads through
range k as well and tries the next cut: the parent then skips the worker of range k. Reads inside a worker
follow the serial scan's CHUNK grid, so lines split across reads (and the over-long-line count) are the
same. Line numbers in a worker count from its cut; the parent shifts them to file line numbers.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .catalog.loader import Catalog
from .detect.dedupe import Deduper
from .detect.match import Matcher
from .detect.model import OomEvent, Report
from .detect.pipeline import Pipeline, PipelineStats
from .detect.reader import MAX_LINE
from .sources.fileid import GZIP_MAGIC

MIN_RANGE = 32 * 1024 * 1024  # a file is cut only into ranges at least this big: below, one task per file
JOIN_SEARCH_LINES = 20_000  # how far past a cut a quiet point is looked for before the cut is given up


@dataclass(frozen=True, slots=True)
class ScanOptions:
    """What every pipeline of one scan is built with."""

    prefilter: bool = True
    extra_prefixes: tuple[str, ...] = ()
    finder: str = "auto"
    chunk: int = 4 * 1024 * 1024


@dataclass(slots=True)
class _Segment:
    """What one worker found in its part of a cut file: reports from `start` up to `end`."""

    index: int
    start: int | None  # the quiet point it started at; None: its range had none (a neighbour reads it)
    end: int = 0
    lines_at_start: int = 0  # lines before `start`, counted from the worker's cut
    lines_at_end: int = 0
    reports: list[Report] = field(default_factory=list)  # line numbers count from the worker's cut
    stats: PipelineStats = field(default_factory=PipelineStats)


@dataclass(slots=True)
class _Whole:
    """What one worker found in a whole input (a small or gzip file)."""

    events: list[OomEvent]
    stats: PipelineStats


class _Collector(Deduper):
    """Keeps a worker's reports in pipeline order instead of joining them: the parent dedupes the file."""

    def __init__(self) -> None:
        super().__init__("", "", _drop, resolve=_no_resolve)
        self.reports: list[Report] = []

    def add(self, report: Report, now: float = 0.0) -> None:
        """Keep the report; joining happens in the parent."""
        self.reports.append(report)


def _drop(_event: OomEvent) -> None:
    return None


def _no_resolve(_base: Report, _reports: Sequence[Report]) -> tuple[str, str | None, str | None]:
    raise AssertionError("a collecting worker never emits events")


_WORKER: dict[str, Any] = {}


def _init(catalog: Catalog, options: ScanOptions) -> None:
    """Per worker process: the catalog and matcher once, for every task it runs."""
    _WORKER["catalog"] = catalog
    _WORKER["matcher"] = Matcher(catalog)
    _WORKER["options"] = options


def _pipeline(name: str, offset: int) -> tuple[Pipeline, _Collector]:
    """A fresh pipeline whose first byte is at `offset` and first line is line 1, collecting its reports."""
    options: ScanOptions = _WORKER["options"]
    pipe = Pipeline(
        _WORKER["catalog"],
        _WORKER["matcher"],
        source=name,
        location=name,
        sink=_drop,
        prefilter=options.prefilter,
        finder=options.finder,
        extra_prefixes=options.extra_prefixes,
    )
    collector = _Collector()
    pipe._deduper = collector  # reports leave the worker undeduplicated
    if offset:
        pipe.start_generation("", offset, 1)
    return pipe, collector


def quiet(pipe: Pipeline) -> bool:
    """Nothing in flight: a fresh pipeline fed the last lines before here would be in this very state."""
    reader, decoder, assembler = pipe._reader, pipe._decoder, pipe._assembler
    return (
        reader._window == 0
        and not reader._open_spans
        and reader._span_lines == 0
        and not reader._partial
        and not reader._truncating
        and len(reader._held) == reader._before
        and not decoder._partials
        and not assembler._open
    )


def _find_join(path: str, start: int, stop: int) -> tuple[int, Pipeline, _Collector] | None:
    """The first quiet point of a fresh pipeline fed line by line from the cut `start`, before `stop`."""
    pipe, collector = _pipeline(path, start)
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
            if quiet(pipe):
                return pos, pipe, collector
    return None


def _feed(pipe: Pipeline, fd: int, pos: int, end: int, chunk: int) -> None:
    """Feed bytes [pos, end) in reads that end on the serial scan's chunk grid (or at `end`)."""
    while pos < end:
        n = min(end, (pos // chunk + 1) * chunk) - pos
        data = os.pread(fd, n, pos)
        if len(data) != n:
            raise OSError(f"short read at {pos}: the file changed while it was scanned")
        pipe.feed(data)
        pos += n


def _range_task(task: tuple[str, int, tuple[int, ...]]) -> _Segment:
    """Scan range `index` of a cut file from its quiet point to the next quiet point its pipeline shares."""
    path, index, cuts = task
    chunk = _WORKER["options"].chunk
    size = cuts[-1]
    if index == 0:
        start = 0
        pipe, collector = _pipeline(path, 0)
    else:
        found = _find_join(path, cuts[index], cuts[index + 1])
        if found is None:
            return _Segment(index, None)
        start, pipe, collector = found
    seg = _Segment(index, start, lines_at_start=pipe.stats().lines_read)
    first_stats, first_reports = pipe.stats(), len(collector.reports)
    fd = os.open(path, os.O_RDONLY)
    try:
        pos, k = start, index + 1
        while True:
            if k >= len(cuts) - 1:
                _feed(pipe, fd, pos, size, chunk)
                pos = size
                break
            join = _find_join(path, cuts[k], cuts[k + 1])
            if join is not None:
                _feed(pipe, fd, pos, join[0], chunk)
                pos = join[0]
                if quiet(pipe):
                    break
            k += 1  # no exact join at cut k: read through range k too
    finally:
        os.close(fd)
    pipe.finish()
    seg.end = pos
    seg.reports = collector.reports[first_reports:]
    seg.stats = _minus(pipe.stats(), first_stats)
    seg.lines_at_end = seg.stats.lines_read + seg.lines_at_start
    return seg


def _whole_task(path: str) -> _Whole:
    """Scan one whole input with the ordinary serial code."""
    from .scan import open_input, scan_stream

    options: ScanOptions = _WORKER["options"]
    name, fh = open_input(path)
    with fh:
        events, stats = scan_stream(
            _WORKER["catalog"],
            _WORKER["matcher"],
            name,
            fh,
            prefilter=options.prefilter,
            extra_prefixes=options.extra_prefixes,
            finder=options.finder,
            chunk=options.chunk,
        )
    return _Whole(events, stats)


def _run(task: tuple[str, Any]) -> _Segment | _Whole:
    kind, arg = task
    return _range_task(arg) if kind == "range" else _whole_task(arg)


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
        self._waiting: dict[int, _Segment] = {}
        self._next = 0  # where the next segment of the chain must start
        self._base = 0  # file line number of that segment's line 1, minus 1, minus its lines before start

    def add(self, segment: _Segment) -> None:
        """Take one worker's segment (a segment without a start is a range its neighbour read)."""
        if segment.start is not None:
            self._waiting[segment.start] = segment
        while self._next < self._size and self._next in self._waiting:
            seg = self._waiting.pop(self._next)
            base = self._base - seg.lines_at_start
            for r in seg.reports:
                self._deduper.add(replace(r, record=replace(r.record, lineno=r.record.lineno + base)) if base else r)
            self.stats = _plus(self.stats, seg.stats)
            self._next = seg.end
            self._base = base + seg.lines_at_end

    def finish(self) -> tuple[list[OomEvent], PipelineStats]:
        """The file's events in line order, and its stats, once every segment was added."""
        if self._next < self._size:
            raise RuntimeError(f"{self._name}: no segment starts at the join {self._next}")
        self._deduper.flush(None)
        self.events.sort(key=lambda e: int(e.location.rsplit(":", 1)[1]))
        self.stats.events = len(self.events)
        return self.events, self.stats


def join_segments(name: str, segments: Iterable[_Segment], matcher: Matcher) -> tuple[list[OomEvent], PipelineStats]:
    """Chain a cut file's segments and dedupe its reports: the events and stats of a serial scan."""
    segments = list(segments)
    joiner = Joiner(name, max(s.end for s in segments), matcher)
    for seg in segments:
        joiner.add(seg)
    return joiner.finish()


def _is_gzip(path: str) -> bool:
    with open(path, "rb") as fh:
        return fh.read(len(GZIP_MAGIC)) == GZIP_MAGIC


def _context() -> multiprocessing.context.BaseContext:
    # fork starts a worker in milliseconds; only a process with other threads needs the safer spawn.
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def scan_parallel(
    catalog: Catalog,
    matcher: Matcher,
    paths: Iterable[str],
    *,
    jobs: int,
    options: ScanOptions,
    range_size: int = MIN_RANGE,
    start_method: str | None = None,
) -> list[tuple[str, list[OomEvent], PipelineStats]] | None:
    """(name, events, stats) per input, in input order: the same as a serial scan, from `jobs` processes.

    None when there is at most one task (one input too small to cut): the caller scans in its own process.

    Opening errors surface as OSError before any worker starts. stdin ("-") is scanned here, in order.
    """
    from .scan import scan_stream

    plan: list[tuple[str, int]] = []  # (path, number of tasks); 0 tasks: stdin
    tasks: list[tuple[str, Any]] = []
    for path in paths:
        if path == "-":
            plan.append((path, 0))
            continue
        size = os.stat(path).st_size
        ranges = max(1, size // max(range_size, 1)) if options.prefilter else 1
        if range_size >= MIN_RANGE:
            ranges = min(ranges, 4 * jobs)  # a few ranges per worker balance the load; more only cost joins
        if ranges > 1 and not _is_gzip(path):
            cuts = cut_points(path, size, ranges)
            plan.append((path, len(cuts) - 1))
            tasks.extend(("range", (path, i, cuts)) for i in range(len(cuts) - 1))
        else:
            plan.append((path, 1))
            tasks.append(("whole", path))
    if len(tasks) < 2:
        return None  # one input, too small to cut: a worker would only add its start-up
    ctx = multiprocessing.get_context(start_method) if start_method else _context()
    workers = min(jobs, len(tasks))
    out: list[tuple[str, list[OomEvent], PipelineStats] | None] = [None] * len(plan)
    owner: list[tuple[int, Joiner | None]] = []  # per task: its input's place in plan, and the joiner if cut
    for place, (path, n) in enumerate(plan):
        joiner = Joiner(path, os.stat(path).st_size, matcher) if n > 1 else None
        owner.extend((place, joiner) for _ in range(n))
    with ctx.Pool(workers, initializer=_init, initargs=(catalog, options)) as pool:
        # In order, as they finish: the parent dedupes the first ranges of a file while workers read on.
        chunksize = max(1, len(tasks) // (workers * 8))
        for (place, joiner), result in zip(owner, pool.imap(_run, tasks, chunksize), strict=True):
            if isinstance(result, _Whole):
                out[place] = (plan[place][0], result.events, result.stats)
            elif joiner is not None:
                joiner.add(result)
                if result.index == plan[place][1] - 1:
                    out[place] = (plan[place][0], *joiner.finish())
    for place, (path, n) in enumerate(plan):
        if n == 0:
            import sys

            events, stats = scan_stream(catalog, matcher, "-", sys.stdin.buffer, prefilter=options.prefilter,
                                        extra_prefixes=options.extra_prefixes, finder=options.finder,
                                        chunk=options.chunk)  # fmt: skip
            out[place] = (path, events, stats)
    return [o for o in out if o is not None]
