"""`scan`'s progress line on a terminal: bytes done of the total, rate, files, events so far and time left.

Beside the pipeline, not in it: scan/run.py and scan/parallel.py tell it how far they are, and it redraws one line on
stderr (a carriage return, no escape codes) at most every `interval` seconds. cli.py decides whether there
is one at all (a terminal, or --progress). A few lines of our own rather than tqdm or rich: either adds
17-44 ms of CPU to scan's start-up (bench/bench_progress.py, docs/scan-progress.md), a dependency to the image,
and neither sums the byte counters of pool worker processes, which scan/parallel.py needs anyway.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TextIO

_UNITS = ((1e9, "GB"), (1e6, "MB"), (1e3, "kB"))
RATE_AFTER = 0.5  # seconds: before, a rate (and the time left from it) says more about start-up than the scan


def _size(n: float) -> str:
    for scale, unit in _UNITS:
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def _duration(seconds: float) -> str:
    s = int(seconds + 0.5)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s // 60 % 60:02d}m"


def _width(out: TextIO) -> int:
    try:
        columns = os.get_terminal_size(out.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 80
    return columns or 80  # a terminal that never said its size (a bare pty) reports 0


class Progress:
    """One redrawn status line; `update` is cheap enough to call per 4 MiB chunk."""

    def __init__(
        self,
        out: TextIO,
        total: int | None = None,
        files: int = 1,
        *,
        interval: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.out = out
        self.total = total  # None: a size is unknown (stdin), so no percentage and no time left
        self.files = files
        self.interval = interval
        self._clock = clock
        self._start = clock()
        self._next = self._start  # the first update draws at once
        self._shown = 0  # length of the line on screen, to blank what a shorter one leaves
        self.done = 0
        self.events = 0
        self.files_done = 0
        self.draws = 0
        # The parallel scan knows a file's events only once its parts are joined: it says so on the line.
        self.events_when_joined = False

    def begin(self, total: int | None, files: int) -> None:
        """What the scan will read (known once its inputs are checked); the rate counts from here."""
        self.total, self.files = total, files
        self.done = self.events = self.files_done = 0
        self._start = self._clock()
        self._next = self._start + self.interval
        self._draw(self.line(self._start))  # at once: a pool of workers or a slow disk may take a while

    def update(self, done: int, events: int, files_done: int) -> None:
        """Where the scan is (absolute values); redraws when the interval has passed."""
        self.done, self.events, self.files_done = done, events, files_done
        now = self._clock()
        if now >= self._next:
            self._next = now + self.interval
            self._draw(self.line(now))

    def finish(self, events: int | None = None) -> None:
        """The final line (what was read, how fast, the events found), then a newline, so the report starts on
        its own line. events: the scan's own count, which includes those its pipelines let go at the end."""
        now = self._clock()
        elapsed = max(now - self._start, 1e-9)
        self.files_done = self.files
        if events is not None:
            self.events = events
        if self.total is not None:
            self.done = self.total
        text = (
            f"scan: {_size(self.done)} in {elapsed:.1f}s, {_size(self.done / elapsed)}/s, "
            f"{self.files} {'file' if self.files == 1 else 'files'}, {self._events(final=True)}"
        )
        self._draw(text)
        self.out.write("\n")
        self.out.flush()

    def line(self, now: float) -> str:
        """The progress text at `now`; no rate or time left in the first RATE_AFTER seconds (too few bytes)."""
        elapsed = now - self._start
        rate = self.done / elapsed if elapsed >= RATE_AFTER else 0.0
        if self.total:
            done = min(self.done, self.total)  # a cut file's joins read a little past their range
            parts = [f"{_size(done)} of {_size(self.total)} ({100 * done // self.total}%)"]
        else:
            parts = [_size(self.done)]
        parts.append(f"{_size(rate)}/s" if rate else "-/s")
        parts.append(f"file {min(self.files_done + 1, self.files)}/{self.files}")
        parts.append(self._events())
        if self.total and rate:
            parts.append(f"{_duration(max(self.total - self.done, 0) / rate)} left")
        return "scan: " + ", ".join(parts)

    def _events(self, final: bool = False) -> str:
        text = f"{self.events} {'event' if self.events == 1 else 'events'}"
        return text if final or not self.events_when_joined else f"{text} in done files"

    def _draw(self, text: str) -> None:
        text = text[: max(_width(self.out) - 1, 10)]
        self.out.write("\r" + text.ljust(self._shown))
        self.out.flush()
        self._shown = len(text)
        self.draws += 1
