"""A followed file's pipeline, built on its first byte: most of 10,000 followed files never log an OOM.

    SourceSet._new_source --LazyPipeline(args)--> LogSource.pipeline --first feed / restore--> Pipeline

A Pipeline holds a line reader, a decoder, an assembler and a deduper, about 3 KB per file; an idle file (empty,
or quiet since it was opened at its end) needs none of them. Until it is built, the questions the loop, the
state keeper and the collector ask every pass have their empty answers, and anything else builds it first.
"""

from __future__ import annotations

from typing import Any

from ..detect.pipeline import Pipeline, PipelineStats


class LazyPipeline(Pipeline):
    """A Pipeline whose parts are made on first use; until then it is empty and answers as an empty one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # the same arguments as Pipeline's
        self._args: tuple[tuple[Any, ...], dict[str, Any]] | None = (args, kwargs)
        self._saved: dict[str, object] = {}  # an empty dedupe memory restored before the first byte

    @property
    def built(self) -> bool:
        """Whether the real parts exist (a byte was fed, or non-empty memory was restored)."""
        return self._args is None

    def _build(self) -> None:
        if self._args is not None:
            args, kwargs = self._args
            self._args = None
            Pipeline.__init__(self, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes not set yet: a method of Pipeline (one added later too) reaching for a part.
        if name.startswith("__") or self.__dict__.get("_args") is None:
            raise AttributeError(name)
        self._build()
        return getattr(self, name)

    def feed(self, data: bytes, now: float = 0.0) -> None:
        """Build, then consume the next bytes."""
        self._build()
        super().feed(data, now)

    def start_generation(self, generation: str, offset: int = 0, lineno: int = 1) -> None:
        """Build, then start a file generation."""
        self._build()
        super().start_generation(generation, offset, lineno)

    def restore_state(self, raw: dict[str, object]) -> None:
        """Keep an empty memory as it is; build for anything else (which is also where it is validated)."""
        if self.built or any(raw.values()):
            self._build()
            super().restore_state(raw)
        else:
            self._saved = dict(raw)

    def export_state(self) -> dict[str, object]:
        """The deduper's memory; an unbuilt pipeline's is what was restored into it (nothing)."""
        return super().export_state() if self.built else dict(self._saved)

    def pending(self) -> int:
        """Events waiting; none before the first byte."""
        return super().pending() if self.built else 0

    def close_open(self, now: float = 0.0) -> None:
        """Close open records; none before the first byte."""
        if self.built:
            super().close_open(now)

    def tick(self, now: float) -> None:
        """Emit what is due; nothing before the first byte."""
        if self.built:
            super().tick(now)

    def finish(self) -> None:
        """End of input; nothing to finish before the first byte."""
        if self.built:
            super().finish()

    def stats(self) -> PipelineStats:
        """Counters so far; zeros before the first byte."""
        return super().stats() if self.built else PipelineStats()
