"""Parallel `scan`: inputs go to worker processes, and a big file is cut into byte ranges joined exactly.

Where it sits: scan.scan_paths(jobs=N) calls scan_parallel(); `--jobs 1` never comes here. Workers run the
same Pipeline as a serial scan, up to the matcher; the reports of a cut file come back to the parent, which
runs the one Deduper over them in file order, so an event whose ranks or traceback straddle a cut is joined
exactly as in a serial scan. gzip files and stdin are never cut (a gzip stream cannot be entered mid-way):
a gzip file is one worker task, stdin is read in the parent.
scanjoin.py says how a cut stays exact.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .catalog.loader import Catalog
from .detect.match import Matcher
from .detect.model import OomEvent
from .detect.pipeline import Pipeline, PipelineStats
from .scanjoin import Collector, Joiner, Joins, Segment, cut_points, drop, scan_range
from .sources.fileid import GZIP_MAGIC

MIN_RANGE = 32 * 1024 * 1024  # a file is cut only into ranges at least this big: below, one task per file


@dataclass(frozen=True, slots=True)
class ScanOptions:
    """What every pipeline of one scan is built with."""

    prefilter: bool = True
    extra_prefixes: tuple[str, ...] = ()
    finder: str = "auto"
    chunk: int = 4 * 1024 * 1024


@dataclass(slots=True)
class _Whole:
    """What one worker found in a whole input (a small or gzip file)."""

    events: list[OomEvent]
    stats: PipelineStats


_WORKER: dict[str, Any] = {}


def _init(catalog: Catalog, options: ScanOptions) -> None:
    """Per worker process: the catalog and matcher once, for every task it runs."""
    _WORKER["catalog"] = catalog
    _WORKER["matcher"] = Matcher(catalog)
    _WORKER["options"] = options
    _WORKER["joins"] = Joins()


def _pipeline(name: str, offset: int) -> tuple[Pipeline, Collector]:
    """A fresh pipeline whose first byte is at `offset` and first line is line 1, collecting its reports."""
    options: ScanOptions = _WORKER["options"]
    pipe = Pipeline(
        _WORKER["catalog"],
        _WORKER["matcher"],
        source=name,
        location=name,
        sink=drop,
        prefilter=options.prefilter,
        finder=options.finder,
        extra_prefixes=options.extra_prefixes,
    )
    collector = Collector()
    pipe._deduper = collector  # reports leave the worker undeduplicated
    if offset:
        pipe.start_generation("", offset, 1)
    return pipe, collector


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


def _range_task(path: str, index: int, cuts: tuple[int, ...]) -> Segment:
    """Scan range `index` of a cut file (scanjoin.py) with this worker's pipelines."""
    new = functools.partial(_pipeline, path)
    return scan_range(path, index, cuts, new, _WORKER["options"].chunk, _WORKER["joins"])


def _run(task: tuple[str, Any]) -> Segment | _Whole:
    kind, arg = task
    return _range_task(*arg) if kind == "range" else _whole_task(arg)


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
