"""The loop's hand-off to the metrics page: each file's read statistics, as the loop reads them.

Sits between the loop (loop.py, which calls it under the source set's lock after each source it looked at)
and metrics/sources.SourceTable, which keeps the series encoded. Nothing here runs at scrape time: a scrape
reads what was published last, so it never waits for the loop, and its cost does not grow with idle files.
"""

from __future__ import annotations

from ..metrics.sources import SourceStats
from .logsource import LogSource
from .sourceset import SourceSet, add_stats


class Publisher:
    """Publishes the files the loop looked at; after discovery or a reload, also the new and the gone ones."""

    def __init__(self, sources: SourceSet) -> None:
        self.sources = sources
        self._table = sources.counts.sources
        self.resync = True  # the set of files may have changed: publish new files, unpublish gone ones
        self._marks: dict[str, tuple[int, ...] | None] = {}  # per file: what it had read when last published

    def publish(self, source: LogSource, always: bool = True) -> None:
        """Hand one file's read statistics to the page (only changed values are re-encoded there).

        A file a sweep looked at without reading a byte is skipped by its mark: nothing it reports can have
        moved (a quiet source closing records is ticked, and ticked sources are always published). While files
        wait for a handle, their lag grows unread: then every look publishes.
        """
        t = source.tailer
        mark = None if t is None else (t.stats.bytes_read, t.stats.read_errors, t.stats.generations,
                                       sum(source.resets.values()), id(source.pipeline),
                                       source.evidence.sglang)  # fmt: skip
        same = mark is not None and self._marks.get(source.path) == mark
        if same and not always and not self.sources.waiting_for_handles():
            return
        self._marks[source.path] = mark
        stats = SourceStats(source.labels)
        add_stats(stats, source)
        self._table.update(source.path, stats)

    def after_pass(self) -> None:
        """stdin every pass (fed by the pump, not polled); after discovery or a reload, the changed set of files."""
        stdin = self.sources.stdin()
        if stdin is not None:
            self.publish(stdin)
        if not self.resync:
            return
        self.resync = False
        published, current = self._table.paths(), set(self.sources.paths())
        for path in published - current:
            self._table.remove(path)
            self._marks.pop(path, None)
        for path in current - published:
            source = self.sources.get(path)
            if source is not None:
                self.publish(source)
