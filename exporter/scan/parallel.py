"""Parallel `scan`: inputs go to worker processes, and a big file is cut into byte ranges joined exactly.

Where it sits: run.scan_paths(jobs=N) calls scan_parallel(); `--jobs 1` never comes here. Workers run the
same Pipeline as a serial scan, up to the matcher; the reports of a cut file come back to the parent, which
runs the one Deduper over them in file order, so an event whose ranks or traceback straddle a cut is joined
exactly as in a serial scan. gzip files and stdin are never cut (a gzip stream cannot be entered mid-way):
a gzip file is one worker task, stdin is read in the parent.
join.py says how a cut stays exact.

Progress (scan's terminal line): every task has a slot in a shared array of bytes read, which the process
running it adds to after every chunk; the parent sums the slots between its own chunks and while it waits.
"""

from __future__ import annotations

import functools
import itertools
import multiprocessing
import os
import threading
from collections.abc import Callable, Iterable, MutableSequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..catalog import Catalog
from ..detect.match import Matcher
from ..detect.model import OomEvent
from ..detect.pipeline import Pipeline, PipelineStats
from ..sources.fileid import GZIP_MAGIC
from .join import Collector, Joiner, Joins, Segment, cut_points, drop, scan_range
from .serial import CHUNK, open_input, progress_meter, scan_stream

if TYPE_CHECKING:
    from ..progress import Progress

MIN_RANGE = 32 * 1024 * 1024  # a file is cut only into ranges at least this big: below, one task per file


@dataclass(frozen=True, slots=True)
class ScanOptions:
    """What every pipeline of one scan is built with."""

    prefilter: bool = True
    extra_prefixes: tuple[str, ...] = ()
    finder: str = "auto"
    chunk: int = CHUNK


@dataclass(slots=True)
class _Whole:
    """What one worker found in a whole input (a small or gzip file)."""

    events: list[OomEvent]
    stats: PipelineStats


class _Metered(Pipeline):
    """A pipeline that reports the bytes it is fed (to the progress slot of the task that feeds it)."""

    def __init__(self, *args: Any, meter: Callable[[int], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._meter = meter

    def feed(self, data: bytes, now: float = 0.0) -> None:
        """Feed, then report the bytes."""
        super().feed(data, now)
        self._meter(len(data))


class _Worker:
    """What one process scanning tasks holds: the catalog and matcher once, for every task it runs, and the
    joins it found (join.Joins); with progress, the shared slots of bytes read per task."""

    def __init__(
        self,
        catalog: Catalog,
        options: ScanOptions,
        matcher: Matcher | None = None,
        slots: MutableSequence[int] | None = None,
        after: Callable[[], None] | None = None,
    ) -> None:
        self.catalog = catalog
        self.matcher = Matcher(catalog) if matcher is None else matcher
        self.options = options
        self.joins = Joins()
        self.slots = slots
        self.slot = 0  # the task running now
        self.after = after  # in the parent: redraw the progress line between its own chunks

    def _add(self, n: int) -> None:
        if self.slots is not None:
            self.slots[self.slot] += n
            if self.after is not None:
                self.after()

    def _set(self, pos: int, _events: int) -> None:
        if self.slots is not None:
            self.slots[self.slot] = pos
            if self.after is not None:
                self.after()

    def pipeline(self, name: str, offset: int) -> tuple[Pipeline, Collector]:
        """A fresh pipeline whose first byte is at `offset` and first line is line 1, collecting its reports."""
        options = self.options
        collector = Collector()
        make: Any = Pipeline if self.slots is None else functools.partial(_Metered, meter=self._add)
        pipe = make(
            self.catalog,
            self.matcher,
            source=name,
            location=name,
            sink=drop,
            prefilter=options.prefilter,
            finder=options.finder,
            extra_prefixes=options.extra_prefixes,
            gate=False,  # the parent's Joiner applies the SGLang-evidence rule in file order
            deduper=collector,  # reports leave the worker undeduplicated
        )
        if offset:
            pipe.start_generation("", offset, 1)
        return pipe, collector

    def run(self, task: tuple[str, Any], slot: int = 0) -> Segment | _Whole:
        """One task: a range of a cut file, or a whole input."""
        kind, arg = task
        self.slot = slot
        return self.range(*arg) if kind == "range" else self.whole(arg)

    def range(self, path: str, index: int, cuts: tuple[int, ...]) -> Segment:
        """Scan range `index` of a cut file (join.py) with this worker's pipelines."""
        new = functools.partial(self.pipeline, path)
        return scan_range(path, index, cuts, new, self.options.chunk, self.joins)

    def whole(self, path: str) -> _Whole:
        """Scan one whole input with the ordinary serial code."""
        options = self.options
        name, fh = open_input(path)
        with fh:
            events, stats = scan_stream(
                self.catalog,
                self.matcher,
                name,
                fh,
                prefilter=options.prefilter,
                extra_prefixes=options.extra_prefixes,
                finder=options.finder,
                chunk=options.chunk,
                on_chunk=self._set if self.slots is not None else None,
            )
        return _Whole(events, stats)


_WORKER: _Worker | None = None  # in a pool's worker process


def _init(catalog: Catalog, options: ScanOptions, slots: MutableSequence[int] | None = None) -> None:
    """Per worker process: its _Worker."""
    global _WORKER
    _WORKER = _Worker(catalog, options, slots=slots)


def _run_many(tasks: list[tuple[int, tuple[str, Any]]]) -> list[Segment | _Whole]:
    """A chunk of (slot, task) in a pool process (chunked here: Pool.imap's own chunks hide its timeout API)."""
    if _WORKER is None:
        raise RuntimeError("a pool task ran before its process's _init")
    return [_WORKER.run(task, slot) for slot, task in tasks]


def _parent_share(sizes: list[int], jobs: int) -> int:
    """Where the calling process's share of the tasks starts: the last tasks, about 1/jobs of the bytes.

    The caller would otherwise only wait for the pool; doing a share itself saves a worker process."""
    share, at = sum(sizes) / jobs, len(sizes)
    while at > 1 and share >= sizes[at - 1] / 2:  # to the nearest task: a fifth range of eight is a 25% overshoot
        at -= 1
        share -= sizes[at]
    return at


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
    progress: Progress | None = None,
) -> list[tuple[str, list[OomEvent], PipelineStats]] | None:
    """(name, events, stats) per input, in input order: the same as a serial scan, from `jobs` processes.

    None when there is at most one task (one input too small to cut): the caller scans in its own process.

    Opening errors surface as OSError before any worker starts. stdin ("-") is scanned here, in order.
    """
    plan: list[tuple[str, int]] = []  # (path, number of tasks); 0 tasks: stdin
    tasks: list[tuple[str, Any]] = []
    sizes: list[int] = []  # the bytes of each task
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
            sizes.extend(b - a for a, b in itertools.pairwise(cuts))
        else:
            plan.append((path, 1))
            tasks.append(("whole", path))
            sizes.append(size)
    if len(tasks) < 2:
        return None  # one input, too small to cut: a worker would only add its start-up
    ctx = multiprocessing.get_context(start_method) if start_method else _context()
    out: list[tuple[str, list[OomEvent], PipelineStats] | None] = [None] * len(plan)
    owner: list[tuple[int, Joiner | None]] = []  # per task: its input's place in plan, and the joiner if cut
    for place, (path, n) in enumerate(plan):
        joiner = Joiner(path, os.stat(path).st_size, matcher) if n > 1 else None
        owner.extend((place, joiner) for _ in range(n))
    # jobs - 1 worker processes take the first tasks; this process takes the last ones while they run.
    mine = _parent_share(sizes, jobs)
    workers = min(jobs - 1, mine)
    merged = 0  # results taken in, in task order: a cut file's chain is joined as its segments come in
    slots = ctx.RawArray("q", len(tasks)) if progress is not None else None  # bytes read per task
    if progress is not None:
        progress.events_when_joined = True
    found = [0, 0]  # events and inputs finished, for the progress line

    def tick() -> None:
        if progress is not None and slots is not None:
            progress.update(sum(slots), found[0], found[1])

    def take(result: Segment | _Whole) -> None:
        nonlocal merged
        place, joiner = owner[merged]
        merged += 1
        if isinstance(result, _Whole):
            out[place] = (plan[place][0], result.events, result.stats)
        elif joiner is not None:
            joiner.add(result)
            if result.index == plan[place][1] - 1:
                out[place] = (plan[place][0], *joiner.finish())
        finished = out[place]
        if finished is not None and (isinstance(result, _Whole) or result.index == plan[place][1] - 1):
            found[0] += len(finished[1])
            found[1] += 1

    with ctx.Pool(workers, initializer=_init, initargs=(catalog, options, slots)) as pool:
        per_chunk = max(1, mine // (workers * 8))
        indexed = list(enumerate(tasks))
        chunks = [indexed[i : min(i + per_chunk, mine)] for i in range(0, mine, per_chunk)]
        theirs = pool.imap(_run_many, chunks)
        local = _Worker(catalog, options, matcher, slots=slots, after=tick)
        ours = []
        for slot in range(mine, len(tasks)):
            ours.append(local.run(tasks[slot], slot))
            while merged < mine:  # between its own tasks, take in what the workers finished (in order)
                try:
                    chunk = theirs.next(timeout=0)
                except multiprocessing.TimeoutError:
                    break
                for result in chunk:
                    take(result)
        while merged < mine:  # then wait for the workers, redrawing the progress line while they run
            try:
                chunk = theirs.next(timeout=progress.interval if progress is not None else None)
            except multiprocessing.TimeoutError:
                tick()
                continue
            except StopIteration:
                break  # fewer results than tasks: the count below says so
            for result in chunk:
                take(result)
            tick()
        for result in ours:
            take(result)
        tick()
    if merged != len(owner):
        raise RuntimeError(f"parallel scan: {merged} results for {len(owner)} tasks")
    for place, (path, n) in enumerate(plan):
        if n == 0:
            import sys

            before = [sum(slots) if slots is not None else 0, found[0]]
            meter = progress_meter(progress, before, found[1]) if progress is not None else None
            events, stats = scan_stream(catalog, matcher, "-", sys.stdin.buffer, prefilter=options.prefilter,
                                        extra_prefixes=options.extra_prefixes, finder=options.finder,
                                        chunk=options.chunk, on_chunk=meter)  # fmt: skip
            out[place] = (path, events, stats)
    return [o for o in out if o is not None]
