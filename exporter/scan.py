"""`scan`: run the pipeline over whole files (or stdin) and report. The offline sink of the pipeline.

Also the golden-test harness: tests call scan_paths() and compare its JSON with the expected files.
"""

from __future__ import annotations

import gzip
import logging
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, BinaryIO

from .catalog.loader import Catalog
from .daemon.sink import Context, EventSink, event_json
from .detect.match import Matcher
from .detect.model import OomEvent
from .detect.pipeline import Pipeline, PipelineStats
from .sources.fileid import GZIP_MAGIC, open_binary

if TYPE_CHECKING:
    from .progress import Progress

log = logging.getLogger(__name__)

CHUNK = 4 * 1024 * 1024
# Below this many bytes in all, --jobs N scans in this process: starting and feeding a pool of workers costs
# about 0.06 s of CPU, the time one process takes for about 10 MB, so a pool only pays off above twice that.
MIN_PARALLEL_BYTES = 16 * 1024 * 1024


class InputError(Exception):
    """An input that cannot be read; the CLI turns it into exit status 2."""


@dataclass(slots=True)
class ScanResult:
    """Events of every input, in input order and line order, plus what was read."""

    catalog: Catalog
    events: list[OomEvent] = field(default_factory=list)
    stats: list[tuple[str, PipelineStats]] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)  # inputs whose scan failed: (path, why)

    def counts(self) -> dict[str, int]:
        """Events per kind, every catalog kind present."""
        counts = dict.fromkeys(self.catalog.ids, 0)
        for e in self.events:
            counts[e.kind] = counts.get(e.kind, 0) + 1
        return counts

    def fatal_count(self) -> int:
        """How many events were fatal."""
        return sum(1 for e in self.events if e.fatal)

    def retractions(self) -> list[OomEvent]:
        """Events of the catalog's retraction kind."""
        return [e for e in self.events if e.kind == self.catalog.retraction_kind]

    def to_json(self) -> dict[str, Any]:
        """The documented `scan --format json` object."""
        retract = self.retractions()
        errors = {"errors": [{"path": p, "error": why} for p, why in self.errors]} if self.errors else {}
        return {
            **errors,
            "counts": self.counts(),
            "retractions": {
                "events": len(retract),
                "retracted_requests": sum(int(e.numbers.get("retracted_requests", 0)) for e in retract),
            },
            "fatal_events": self.fatal_count(),
            "events": [event_json(e, self.catalog) for e in self.events],
            "inputs": [
                {
                    "path": path,
                    "lines_read": s.lines_read,
                    "events": s.events,
                    "oversized_lines": s.oversized_lines,
                    "json_errors": s.json_errors,
                    "foreign_events": s.foreign_events,
                }
                for path, s in self.stats
            ],
        }


def open_input(path: str) -> tuple[str, BinaryIO]:
    """Open a path (or "-" for stdin) for binary reading, gunzipping by content; InputError if not."""
    if path == "-":
        return "-", sys.stdin.buffer
    try:
        return path, open_binary(path)  # type: ignore[return-value]
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from exc


def scan_stream(
    catalog: Catalog,
    matcher: Matcher,
    name: str,
    stream: IO[bytes],
    *,
    prefilter: bool = True,
    extra_prefixes: Iterable[str] = (),
    chunk: int = CHUNK,
    finder: str = "auto",
    on_chunk: Callable[[int, int], None] | None = None,
) -> tuple[list[OomEvent], PipelineStats]:
    """Run one input through its own pipeline to the end.

    on_chunk, when given, hears (bytes of the input read so far, events so far) after every chunk; for a gzip
    file, uncompressed bytes, to compare with input_size().
    """
    events: list[OomEvent] = []
    location = "-" if name == "-" else name
    pipe = Pipeline(
        catalog,
        matcher,
        source=name,
        location=location,
        sink=events.append,
        prefilter=prefilter,
        finder=finder,
        extra_prefixes=tuple(extra_prefixes),
    )
    done = 0
    try:
        while True:
            data = stream.read(chunk)
            if not data:
                break
            pipe.feed(data)
            if on_chunk is not None:
                done += len(data)
                on_chunk(done, len(events))
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        # A truncated .gz or a read error mid-file: keep what was read, and say so.
        raise InputError(f"error reading {name}: {exc}") from exc
    finally:
        pipe.finish()
    events.sort(key=lambda e: int(e.location.rsplit(":", 1)[1]))
    return events, pipe.stats()


def check_readable(path: str) -> None:
    """InputError unless path (not stdin) opens for reading: one unbuffered open, nothing read."""
    try:
        open(path, "rb", buffering=0).close()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from exc


def load_server_args(path: str) -> dict[str, Any]:
    """The JSON that SGLang's /server_info (or /get_server_info) returns, saved to a file."""
    from .sources.http import ScrapeError
    from .sources.sglang_metrics import parse_server_info

    try:
        with open(path, "rb") as fh:
            body = fh.read()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        return dict(parse_server_info(body).args)
    except ScrapeError as exc:
        raise InputError(f"{path}: not server-info JSON: {exc}") from exc


def scan_paths(
    catalog: Catalog,
    paths: Iterable[str],
    *,
    prefilter: bool = True,
    extra_prefixes: Iterable[str] = (),
    server_args: Mapping[str, Any] | None = None,
    jobs: int = 1,
    finder: str = "auto",
    chunk: int = CHUNK,
    range_size: int | None = None,
    start_method: str | None = None,
    min_parallel_bytes: int = MIN_PARALLEL_BYTES,
    progress: Progress | None = None,
) -> ScanResult:
    """Scan every path in order; InputError on the first unreadable one.

    jobs > 1 scans in that many worker processes (files in parallel, big plain files cut into ranges) with
    the same result, once the files hold at least min_parallel_bytes (or range_size is given); range_size,
    start_method and min_parallel_bytes only exist for tests (scanpar.py says why they are safe). progress,
    when given, is told how far the scan is (bytes, events, files), from the worker processes too.
    """
    matcher = Matcher(catalog)
    sink = EventSink(catalog)
    context = Context(args=server_args)
    result = ScanResult(catalog)
    paths = list(paths)
    if jobs > 1 and any(p != "-" for p in paths):
        size = 0
        for path in paths:
            if path != "-":
                check_readable(path)  # unreadable inputs fail before any worker starts
                size += os.stat(path).st_size
        if range_size is None and size < min_parallel_bytes:
            jobs = 1
    else:
        jobs = 1  # stdin alone is read in this process
    if progress is not None:
        progress.begin(None if "-" in paths else sum(input_size(p) for p in paths), len(paths))
    if jobs > 1:
        from .scanpar import MIN_RANGE, ScanOptions, scan_parallel

        options = ScanOptions(prefilter, tuple(extra_prefixes), finder, chunk)
        try:
            done = scan_parallel(catalog, matcher, paths, jobs=jobs, options=options, progress=progress,
                                 range_size=range_size or MIN_RANGE, start_method=start_method)  # fmt: skip
            if done is not None:
                for name, events, stats in done:
                    result.events.extend(sink.enrich(e, context) for e in events)
                    result.stats.append((name, stats))
                return result
        except OSError as exc:
            raise InputError(f"error reading: {exc}") from exc
        except Exception:  # a failure in one input: the serial scan below tells which, and scans the others
            log.debug("parallel scan failed; scanning serially", exc_info=True)
            result = ScanResult(catalog)
    before = [0, 0]  # bytes and events of the inputs already read, for the progress line
    for index, path in enumerate(paths):
        name, fh = open_input(path)
        meter = progress_meter(progress, before, index) if progress is not None else None
        try:
            events, stats = scan_stream(catalog, matcher, name, fh, prefilter=prefilter, on_chunk=meter,
                                        extra_prefixes=extra_prefixes, chunk=chunk, finder=finder)  # fmt: skip
            enriched = [sink.enrich(e, context) for e in events]
        except InputError:
            raise
        except Exception as exc:  # a bug met by one input must not hide what the other inputs hold
            log.debug("scan failed path=%s", name, exc_info=True)
            result.errors.append((name, f"{type(exc).__name__}: {exc}"))
            continue
        finally:
            if name != "-":
                fh.close()
        before[0] = before[0] + input_size(path) if path != "-" else (progress.done if progress is not None else 0)
        before[1] += len(events)
        if progress is not None:
            progress.update(before[0], before[1], index + 1)
        result.events.extend(enriched)
        result.stats.append((name, stats))
    return result


def progress_meter(progress: Progress, before: list[int], index: int) -> Callable[[int, int], None]:
    """The on_chunk of input `index`: its position and events on top of `before` (bytes, events) of the inputs
    before it."""

    def update(pos: int, events: int) -> None:
        progress.update(before[0] + pos, before[1] + events, index)

    return update


def input_size(path: str) -> int:
    """The bytes of log text an input holds, for the progress line's total: a plain file's size, a gzip file's
    uncompressed size from its trailer (ISIZE, the size modulo 4 GiB: raised by 4 GiB steps to at least the
    compressed size); 0 for stdin or when it cannot be told."""
    if path == "-":
        return 0
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < 18 or fh.read(len(GZIP_MAGIC)) != GZIP_MAGIC:
                return size
            fh.seek(-4, os.SEEK_END)
            isize = int.from_bytes(fh.read(4), "little")
    except OSError:
        return 0
    while isize < size:
        isize += 1 << 32
    return isize


def format_text(result: ScanResult) -> str:
    """A readable report: one block per event with its numbers and fix, then the totals."""
    out: list[str] = []
    catalog = result.catalog
    for e in result.events:
        kind = catalog.kind(e.kind)
        n = e.numbers
        ranks = ",".join(e.ranks) or "-"
        head = f"{e.time or '-':<26} {e.kind:<12} {'FATAL' if e.fatal else 'warn ':<5} ranks={ranks:<12} {e.location}"
        out.append(head)
        facts = []
        if e.phase:
            facts.append(f"phase={e.phase}" + (f"/{e.subphase}" if e.subphase else ""))
        for key in (
            "requested_tokens",
            "available_tokens",
            "shortfall_tokens",
            "req_slots_available",
            "req_slots_requested",
            "retracted_requests",
            "new_token_ratio_from",
            "new_token_ratio_to",
            "tried_to_allocate",
            "mem_fraction_static",
            "rid",
        ):
            if n.get(key) is not None:
                facts.append(f"{key}={n[key]}")
        if n.get("shortfall_note"):
            facts.append(f"shortfall_tokens=none ({n['shortfall_note']})")
        if len(e.pools) > 1:
            facts.append("pools=" + " ".join(f"{p.name}:{p.available}" for p in e.pools))
        if e.inferred:
            facts.append("inferred-from-frames")
        out.append(f"    {kind.title}")
        if facts:
            out.append("    " + " ".join(facts))
        out.append(f"    fix: {kind.summary}")
        for s in e.suggestions:
            if s.suggested is not None:
                out.append(
                    f"    suggest: {s.flag} {s.change()}  ({s.rule}" + (f"; when {s.when}" if s.when else "") + ")"
                )
    counts = result.counts()
    out.append("")
    out.append("kind           events")
    for kid, count in counts.items():
        out.append(f"{kid:<14} {count}")
    retract = result.retractions()
    requests = sum(int(e.numbers.get("retracted_requests", 0)) for e in retract)
    lines = sum(s.lines_read for _, s in result.stats)
    out.append(
        f"total: {len(result.events)} events ({result.fatal_count()} fatal), "
        f"{len(retract)} retraction events retracting {requests} requests, {lines} lines read"
    )
    return "\n".join(out) + "\n"
