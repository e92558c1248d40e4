"""`scan`: run the pipeline over whole files (or stdin) and report. The offline sink of the pipeline.

scan_paths() scans serially (serial.py) or, with --jobs N and enough bytes, in worker processes
(parallel.py, which cuts big files at quiet points, join.py); either way the events go through the same
EventSink as the daemon's and come back as a ScanResult (report.py). Also the golden-test harness: tests call
scan_paths() and compare its JSON with the expected files.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..catalog import Catalog
from ..detect.match import Matcher
from ..events.sink import Context, EventSink
from .report import ScanResult
from .serial import CHUNK, InputError, check_readable, input_size, open_input, progress_meter, scan_stream

if TYPE_CHECKING:
    from ..progress import Progress

log = logging.getLogger(__name__)

# Below this many bytes in all, --jobs N scans in this process: starting and feeding a pool of workers costs
# about 0.06 s of CPU, the time one process takes for about 10 MB, so a pool only pays off above twice that.
MIN_PARALLEL_BYTES = 16 * 1024 * 1024


def load_server_args(path: str) -> dict[str, Any]:
    """The JSON that SGLang's /server_info (or /get_server_info) returns, saved to a file."""
    from ..sources.http import LABELS, HttpError
    from ..sources.sglang_metrics import parse_server_info

    try:
        with open(path, "rb") as fh:
            body = fh.read()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        return dict(parse_server_info(body).args)
    except HttpError as exc:
        raise InputError(f"{path}: not server-info JSON: {LABELS[exc.reason].server_info}: {exc.detail}") from exc


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
    start_method and min_parallel_bytes only exist for tests (parallel.py says why they are safe). progress,
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
        from .parallel import MIN_RANGE, ScanOptions, scan_parallel

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
