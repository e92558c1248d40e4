"""A followed file's pipeline, built on its first byte: most of 10,000 followed files never log an OOM.

    SourceSet._new_source --LazyPipeline(make)--> LogSource.pipeline --first feed / restore--> Pipeline

A Pipeline holds a line reader, a decoder, an assembler and a deduper, about 3 KB per file; an idle file (empty,
or quiet since it was opened at its end) needs none of them. LazyPipeline holds the way to make one and, once
a byte comes, the Pipeline itself. It offers exactly what a followed file's callers ask of a pipeline (the loop,
LogSource, the state keeper, the collector's statistics), each spelled out, so mypy checks every call: until it
is built, the questions asked every pass have their empty answers, and the others build it first.
"""

from __future__ import annotations

from collections.abc import Callable

from ..detect.pipeline import Pipeline, PipelineStats


class LazyPipeline:
    """A Pipeline made on first use; until then it is empty and answers as an empty one."""

    __slots__ = ("_make", "_pipeline", "_saved")

    def __init__(self, make: Callable[[], Pipeline]) -> None:
        """make: builds the Pipeline (a functools.partial of it, with the file's arguments)."""
        self._make = make
        self._pipeline: Pipeline | None = None
        self._saved: dict[str, object] = {}  # an empty dedupe memory restored before the first byte

    @property
    def built(self) -> bool:
        """Whether the real pipeline exists (a byte was fed, or non-empty memory was restored)."""
        return self._pipeline is not None

    def _built(self) -> Pipeline:
        if self._pipeline is None:
            self._pipeline = self._make()
        return self._pipeline

    # What builds it: bytes, a generation, memory to restore, and the two questions only a built one is asked.

    def feed(self, data: bytes, now: float = 0.0) -> None:
        """Build, then consume the next bytes."""
        self._built().feed(data, now)

    def start_generation(self, generation: str, offset: int = 0, lineno: int = 1) -> None:
        """Build, then start a file generation."""
        self._built().start_generation(generation, offset, lineno)

    def restore_state(self, raw: dict[str, object]) -> None:
        """Keep an empty memory as it is; build for anything else (which is also where it is validated)."""
        if self._pipeline is not None or any(raw.values()):
            self._built().restore_state(raw)
        else:
            self._saved = dict(raw)

    def resume_point(self) -> tuple[int, int]:
        """(offset, lineno) a restart must re-read from (asked once a generation started, so built by then)."""
        return self._built().resume_point()

    def quiet_seconds(self, idle: float) -> float:
        """How long to wait before closing open records (asked after a feed, so built by then)."""
        return self._built().quiet_seconds(idle)

    # What every pass asks: an unbuilt pipeline's answers are the empty ones.

    def export_state(self) -> dict[str, object]:
        """The deduper's memory; an unbuilt pipeline's is what was restored into it (nothing)."""
        return self._pipeline.export_state() if self._pipeline is not None else dict(self._saved)

    def pending(self) -> int:
        """Events waiting; none before the first byte."""
        return self._pipeline.pending() if self._pipeline is not None else 0

    def holding(self) -> int:
        """Reports waiting for SGLang evidence; none before the first byte."""
        return self._pipeline.holding() if self._pipeline is not None else 0

    def close_open(self, now: float = 0.0) -> None:
        """Close open records; none before the first byte."""
        if self._pipeline is not None:
            self._pipeline.close_open(now)

    def tick(self, now: float) -> None:
        """Emit what is due; nothing before the first byte."""
        if self._pipeline is not None:
            self._pipeline.tick(now)

    def finish(self) -> None:
        """End of input; nothing to finish before the first byte."""
        if self._pipeline is not None:
            self._pipeline.finish()

    def stats(self) -> PipelineStats:
        """Counters so far; zeros before the first byte."""
        return self._pipeline.stats() if self._pipeline is not None else PipelineStats()
