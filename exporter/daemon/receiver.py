"""The OTLP receiver's daemon side: received lines go to the spool, and the loop reads the spool like pod logs.

    web/otlp.py --accept(lines by spool path)--> Spool.append (durable), a new file followed --> the loop: tail, detect

The spool lives in the state directory (<state_dir>/otlp), a discovery root of the source set like a log root
(sourceset.py takes it from the config). A container run's lines are a file in the kubelet's
layout, so the source set names its series exactly as it names /var/log/pods ones, and the rest of the daemon
(positions, dedupe memory, evidence, retention) treats it as any followed file. append() runs under the source
set's lock: a state save never sees a read position inside a batch that is not committed yet (otlpspool.py).
Each durable state save tells the spool what was read (StateKeeper.on_saved), so it can drop rotated segments
and idle sources. The lines of a source the filters leave out (the Kubernetes system namespaces, the exporter's
own container) would never be read, so they are not spooled: counted as filtered.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..config.model import Config
from ..metrics.names import SELF
from ..sources.otlpspool import DEDUPE_WINDOW, Limits, Line, Spool
from .health import ReceivedFacts
from .loop import Loop
from .sourceset import SourceSet


@dataclass(frozen=True, slots=True)
class Accepted:
    """What one request added: lines written to the spool and retried copies skipped."""

    written: int
    duplicates: int
    filtered: int = 0


class Receiver:
    """Makes received lines durable in the spool and wakes the loop to read them."""

    def __init__(
        self,
        sources: SourceSet,
        loop: Loop,
        wake: Callable[[], None],
        config: Config,
        wall: Callable[[], float] = time.time,
    ) -> None:
        root = sources.received_root
        if root is None:
            raise ValueError("the OTLP receiver needs otlp_listen and state_dir (the source set's spool root)")
        self.spool = Spool(root, limits(config))
        self.spool.recover()  # before the loop first reads: a batch cut short by a crash is not read
        self._sources = sources
        self._loop = loop
        self._wake = wake
        loop.keeper.on_saved = self.spool.consumed
        self.written = 0
        self.duplicates = 0
        self.filtered = 0
        # Where it listens (serve names the bound port once it binds) and when it last answered a batch 200.
        self.listen = config.otlp_listen or ""
        self.last_batch: float | None = None
        self._wall = wall
        loop.watch_receiver(self.facts)

    def bound(self, port: int) -> None:
        """The port the OTLP server bound (the configured one, or the one the system chose for port 0)."""
        self.listen = f"{self.listen.rpartition(':')[0]}:{port}"

    def facts(self) -> ReceivedFacts:
        """What /healthz says it has taken in (never waits for the spool's lock: a probe must not wait a fsync)."""
        records = self.written + self.duplicates + self.filtered
        return ReceivedFacts(self.listen, records, self.spool.use().sources, self.last_batch)

    def accept(self, batch: Mapping[str, Sequence[Line]]) -> Accepted:
        """Spool a request's lines (SpoolError when the disk refuses), then have the loop read them."""
        wanted = {rel: lines for rel, lines in batch.items() if self._sources.follows_received(self.spool.path(rel))}
        filtered = sum(len(lines) for rel, lines in batch.items() if rel not in wanted)
        try:
            with self._sources.locked():
                written, duplicates, new = self.spool.append(wanted)
                # Followed before the 2xx: a file left to the next discovery would let the daemon report itself
                # caught up (no lag, nothing pending) while the lines it just acknowledged wait unread.
                self._sources.follow_received(new)
                self.written += written
                self.duplicates += duplicates
                self.filtered += filtered
                self.last_batch = self._wall()
        finally:
            if self.spool.wants_save:  # the spool waits for a save to rotate a log or drop a read segment
                self.spool.wants_save = False
                # Look at the batch's logs now (one may have been rotated in a request refused after it), then
                # save: the save that names the new logs lets the spool drop the segments they were drained from.
                self._loop.mark_changed({os.path.dirname(self.spool.path(rel)) for rel in wanted})
                self._loop.keeper.request_save()
                self._wake()
        if written:
            self._loop.mark_changed({os.path.dirname(self.spool.path(rel)) for rel in wanted})
            self._wake()
        return Accepted(written, duplicates, filtered)


def limits(config: Config) -> Limits:
    """The spool's bounds from the settings."""
    mib = 1024 * 1024
    return Limits(config.otlp_spool_source_mib * mib, config.otlp_spool_total_mib * mib, config.otlp_spool_retention,
                  config.otlp_spool_max_sources, config.otlp_spool_dedupe_windows * DEDUPE_WINDOW)  # fmt: skip


class SpoolCollector(Collector):
    """The spool's numbers for /metrics: its use now, and what it recovered, rotated, deleted and refused."""

    def __init__(self, spool: Spool) -> None:
        self._spool = spool

    def describe(self) -> Iterable[CounterMetricFamily]:
        """Nothing up front: the registry then never calls collect() at registration."""
        return []

    def collect(self) -> Iterable[CounterMetricFamily | GaugeMetricFamily]:
        """Gauges of its use, counters of its events (each zero from the start)."""
        use, s = self._spool.use(), self._spool.stats
        p = f"{SELF}_otlp_spool"
        yield GaugeMetricFamily(f"{p}_sources", "Sources the OTLP spool holds (--otlp-spool-max-sources caps them).",
                                value=use.sources)  # fmt: skip
        yield GaugeMetricFamily(f"{p}_disk_bytes", "Bytes of disk blocks the OTLP spool takes (files and "
                                "directories, as an emptyDir's sizeLimit counts them).",
                                value=use.disk_bytes)  # fmt: skip
        yield GaugeMetricFamily(f"{p}_unread_bytes", "Bytes of the OTLP spool a durable state save does not show read "
                                "yet (what the spool cannot free to make room).", value=use.unread_bytes)  # fmt: skip
        yield GaugeMetricFamily(f"{p}_inodes", "Files and directories the OTLP spool takes.", value=use.inodes)
        yield GaugeMetricFamily(f"{p}_dedupe_identities", "Record identities the OTLP spool's dedupe windows hold in "
                                "memory (--otlp-spool-dedupe-windows caps them).", value=use.identities)  # fmt: skip
        yield CounterMetricFamily(f"{p}_recovered_bytes", "Uncommitted bytes cut from spooled logs at a start (a "
                                  "crash between a batch's writes; its shipper got no 2xx).",
                                  value=s.recovered_bytes)  # fmt: skip
        yield CounterMetricFamily(f"{p}_write_errors", "Batches a spool write or fsync failed for (answered 503 and "
                                  "cut back to their commit).", value=s.write_errors)  # fmt: skip
        yield CounterMetricFamily(f"{p}_rotations", "Spooled logs rotated into a segment.", value=s.rotations)
        yield CounterMetricFamily(f"{p}_dropped_segments", "Rotated segments deleted once read.",
                                  value=s.dropped_segments)  # fmt: skip
        yield CounterMetricFamily(f"{p}_reclaimed_logs", "Spooled logs read to their end deleted to make room under "
                                  "the total cap.", value=s.reclaimed_logs)  # fmt: skip
        yield CounterMetricFamily(f"{p}_removed_sources", "Idle spooled sources read to their end and removed.",
                                  value=s.removed_sources)  # fmt: skip
        yield CounterMetricFamily(f"{p}_window_loads", "Dedupe windows read back from disk: a source received while "
                                  "its window was out of memory (past --otlp-spool-dedupe-windows).",
                                  value=s.window_loads)  # fmt: skip
        family = CounterMetricFamily(f"{p}_refusals", "Batches the spool refused (503), by the cap they would "
                                     "pass: source (--otlp-spool-source-mib), total (--otlp-spool-total-mib, once "
                                     "read lines are freed), sources (--otlp-spool-max-sources).",
                                     labels=["cap"])  # fmt: skip
        family.add_metric(["source"], s.refused_source)
        family.add_metric(["total"], s.refused_total)
        family.add_metric(["sources"], s.refused_sources)
        yield family
