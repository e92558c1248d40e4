"""One input through its own pipeline, in this process: open it (gunzipping by content), feed it chunk by
chunk, and measure it for the progress line. run.py calls it for each input of a serial scan, and parallel.py's
workers for each whole file they are given.
"""

from __future__ import annotations

import gzip
import os
import sys
from collections.abc import Callable, Iterable
from typing import IO, TYPE_CHECKING, BinaryIO

from ..catalog import Catalog
from ..detect.match import Matcher
from ..detect.model import OomEvent
from ..detect.pipeline import Pipeline, PipelineStats
from ..sources.fileid import GZIP_MAGIC, open_binary

if TYPE_CHECKING:
    from ..progress import Progress

CHUNK = 4 * 1024 * 1024


class InputError(Exception):
    """An input that cannot be read; the CLI turns it into exit status 2."""


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
