"""One followed log file (or stdin): its tailer, its pipeline, and the labels its events carry.

Sits between a source and the pipeline: it turns TailChunks and TailResets into file generations (a
rotation, a copytruncate, a restart resuming mid-file), numbers their lines, closes records when the file
goes quiet, and says what to save so that a restart re-reads exactly what was still in flight.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from typing import Any

from ..detect.evidence import Evidence
from ..detect.pipeline import Pipeline
from ..sources.fileid import TRUNCATED, TailPosition, TailReset
from ..sources.tail import FileTailer
from .lazypipe import LazyPipeline

# A record with no new line for this long is complete (a traceback cut mid-write). One that looks whole (a
# traceback past its exception text, a block past its numbers) is closed after the pipeline's rank window.
IDLE_CLOSE_SECONDS = 1.0
LINE_COUNT_LIMIT = 256 * 1024 * 1024  # count lines before a start-at-end offset up to this many bytes
# Bytes one source may read in one pass of the loop. A 300 MB backlog is read in slices, so scrapes and
# other sources get their turn in between, and /metrics never waits for a whole catch-up.
READ_BUDGET = 32 * 1024 * 1024


@dataclass(slots=True)
class LogSource:
    """One followed file (or stdin): its tailer, its pipeline, and the labels its events carry."""

    path: str
    labels: tuple[str, ...]
    label_map: dict[str, str]
    pipeline: Pipeline | LazyPipeline  # stdin's is built at once, a file's on its first byte
    tailer: FileTailer | None
    generation: str | None = None
    resume_lineno: int | None = None  # line number at the restored offset
    resume_offset: int | None = None  # the restored offset: a first chunk before it means truncated while down
    epoch: int = 0  # copytruncate generations of one inode, and a reused inode's: part of every event key
    # The generation the last reset ended, until the next one starts: a file recreated on the inode the old one
    # freed (the tailer let go of it: deleted, or the path became a directory) must not get its event keys.
    ended: str | None = None
    close_at: float | None = None  # when to close records left open by a quiet source
    gone_since: float | None = None
    resets: dict[str, int] = field(default_factory=dict)
    directory: str = ""  # absolute, to match the directories file events name
    evidence: Evidence = field(default_factory=Evidence)  # is it SGLang? (the pipeline's, built or not)

    def lag_bytes(self) -> int:
        """Bytes in the file not read yet (0 when unknown). An unended last line is read and held, not a backlog: a
        server killed mid-line (or one whose exit leaves a warning without its newline) is caught up."""
        if self.tailer is None:
            return 0
        try:
            st = os.stat(self.path)
        except OSError:
            return 0
        if not stat.S_ISREG(st.st_mode):
            return 0  # a directory at the path (its size is no unread byte) or a FIFO: nothing to catch up on
        return max(0, st.st_size - self.tailer.read_offset)

    def poll(self, now: float, budget: int | None = None) -> bool:
        """Read what is new (up to budget bytes), feed the pipeline generation by generation, then tick.

        Returns True when the budget ran out and more may be waiting: poll again soon. Stopping in the
        middle is safe, because the tailer moves its offsets before it hands out the bytes.
        """
        budget = READ_BUDGET if budget is None else budget
        tailer = self.tailer
        if tailer is None:
            self.pipeline.tick(now)
            return False
        fed = 0
        for item in tailer.poll():
            if isinstance(item, TailReset):
                self.resets[item.reason] = self.resets.get(item.reason, 0) + 1
                self.pipeline.close_open(now)
                self.ended = self.generation or self.ended
                self.generation = None
                if item.reason == TRUNCATED:
                    self.epoch += 1  # same inode, new bytes at old offsets: the keys must differ
                continue
            if self.resume_offset is not None:
                if item.offset < self.resume_offset:
                    self.epoch += 1  # truncated while we were down
                    self.resume_lineno = None
                self.resume_offset = None
            generation = f"{item.dev}:{item.ino}:{self.epoch}"
            if generation == self.ended:
                # Another file on the inode of the one that ended (ext4 reuses a freed inode at once): with the
                # old key, the deduper took its events at the old one's offsets for repeats.
                self.epoch += 1
                generation = f"{item.dev}:{item.ino}:{self.epoch}"
            if generation != self.generation:
                self.ended = None
                lineno = self._lineno_at(item.offset)
                self.pipeline.start_generation(generation, item.offset, lineno)
                self.generation = generation
            self.pipeline.feed(item.data, now)
            fed += len(item.data)
            if fed >= budget:
                break
        if fed:
            self.close_at = now + self.pipeline.quiet_seconds(IDLE_CLOSE_SECONDS)
            self.gone_since = None
        self.tick(now)
        return fed >= budget or tailer.lingering  # a deleted file draining has no directory events: look again

    def tick(self, now: float) -> None:
        """Close records of a quiet source and emit the events whose wait is over."""
        if self.close_at is not None and now >= self.close_at:
            self.pipeline.close_open(now)
            self.close_at = None
        self.pipeline.tick(now)

    def _lineno_at(self, offset: int) -> int:
        """The line number at a generation's first byte: restored, or counted (a start at the end)."""
        if self.resume_lineno is not None:
            lineno, self.resume_lineno = self.resume_lineno, None
            return lineno
        if offset <= 0 or offset > LINE_COUNT_LIMIT:
            return 1
        try:
            with open(self.path, "rb") as fh:
                count, left = 0, offset
                while left > 0 and (block := fh.read(min(left, 1 << 20))):
                    count += block.count(b"\n")
                    left -= len(block)
            return count + 1
        except OSError:
            return 1

    def state(self) -> dict[str, Any] | None:
        """Position (at the oldest byte in flight), line number, epoch and dedupe memory for the state file."""
        if self.tailer is None:
            return None
        pos = self.tailer.position
        if pos is None:
            return None
        lineno: int | None = None  # not known before the first read (a primed start): counted on resume
        if self.generation == f"{pos.dev}:{pos.ino}:{self.epoch}":
            offset, lineno = self.pipeline.resume_point()
            pos = TailPosition(
                pos.path, pos.dev, pos.ino, min(offset, pos.offset), pos.fingerprint, pos.fingerprint_len
            )
        pos = self.tailer.marked(pos)
        return {
            "position": pos.to_dict(), "lineno": lineno, "epoch": self.epoch,
            "dedupe": self.pipeline.export_state(), "sglang": self.evidence.identified,
        }  # fmt: skip
