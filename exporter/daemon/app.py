"""The live daemon behind `serve`, assembled from its parts; and the reload that reconfigures them.

    TargetSet (scrapers) --context--> SourceSet (LogSource: FileTailer -> Pipeline) --> EventSink
        --> EventCounts (metrics/) + EventStore (web)        StateKeeper <--> state.json
    Loop: steps the SourceSet on file events and ticks, saves through the keeper, starts every thread.

Exactly once across restarts: the state holds, per file, the offset of the oldest byte still in flight
(a partial line, an open traceback, an event waiting for its traceback), the counters at that moment,
and the keys (file identity + offset) of the events already counted. A restart re-reads from that
offset; events rebuilt from bytes that were already counted are recognised by their key and skipped,
and anything counted after the last save was lost with the counters, so it is counted again, once.
A reload rebuilds every file source the same way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, BinaryIO

from ..catalog import Catalog
from ..config.load import nothing_to_follow
from ..config.model import Config
from ..config.settings import SETTINGS
from ..events.sink import EventSink
from ..events.store import EventStore
from ..metrics.collector import ExporterCollector
from ..metrics.events import EventCounts, crash_kind, fatal_kinds
from ..metrics.groups import group_family
from ..metrics.names import label_names_for
from ..sources.stdin import StdinPump
from .loop import Loop, Service
from .receiver import Receiver
from .sourceset import SourceSet
from .state import StateKeeper, StateStore
from .targets import TargetSet

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from ..kubeevents.poster import EventPoster
    from ..sources.nodetargets import NodeTargets

log = logging.getLogger(__name__)

RELOAD_RESULTS = ("applied", "partial", "failed")
# Settings a running daemon cannot change (reload=False in the settings table): the socket, the state file,
# the TLS/auth setup, the kind of file watcher and the size of the event ring are built once. A reload keeps
# them and says so.
RESTART_ONLY = tuple(s.name for s in SETTINGS if s.reload is False)


def pod_labels(config: Config) -> bool:
    """Series carry namespace/pod/container in Kubernetes mode and with the OTLP receiver (its records name pods)."""
    return config.kubernetes is not None or bool(config.otlp_listen)


class App:
    """The parts of one daemon, wired together; reload() applies a new config and catalog to all of them."""

    def __init__(
        self,
        config: Config,
        catalog: Catalog,
        *,
        stdin: BinaryIO | None = None,
        stdout: BinaryIO | None = None,
        wake: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.config, self.catalog = config, catalog
        self.catalog_listeners: list[Callable[[Catalog], None]] = []  # e.g. the HTTP edge's event titles
        self.counts = EventCounts(catalog.ids, label_names_for(pod_labels(config)), catalog.retraction_kind,
                                  fatal_kinds=fatal_kinds(catalog), crash_kind=crash_kind(catalog))  # fmt: skip
        self.store = EventStore(config.recent_events)
        self.events_poster = self._event_poster(config, catalog)
        self.sink = EventSink(catalog, counts=self.counts, store=self.store, wall=wall,
                              on_live=self.events_poster.offer if self.events_poster is not None else None)  # fmt: skip
        self.targets = TargetSet(config, wall=wall, discovery=self._node_targets(config))
        self.sources = SourceSet(config, catalog, self.counts, self.sink, self.targets.context_for, clock=clock)
        store = StateStore(config.state_dir) if config.state_dir else None
        self.keeper = StateKeeper(
            store, self.counts, self.sources, interval=config.state_interval, clock=clock, events=self.store
        )
        self.stdin = StdinPump(stdin, stdout, wake) if stdin is not None else None
        if self.stdin is not None:
            self.sources.add_stdin()
        self.loop = Loop(config, self.sources, self.keeper, stdin=self.stdin, clock=clock, wall=wall)
        # The OTLP receiver's spool (its HTTP endpoint is web/otlp.py, which serve wires to it).
        # The source set follows the spool as one of its roots when the config has one (otlp_listen and state_dir).
        self.receiver = Receiver(self.sources, self.loop, wake, config, wall) if self.sources.received_root else None
        self.reloads = dict.fromkeys(RELOAD_RESULTS, 0)

    def _node_targets(self, config: Config) -> NodeTargets | None:
        """Node discovery, when the config turns it on."""
        settings = config.kubernetes.discover_targets if config.kubernetes is not None else None
        if settings is None:
            return None  # the Kubernetes API client is imported only when discovery is on
        from ..sources.kubeapi import node_targets

        return node_targets(
            settings, self._followed_pods, scrape_interval=config.scrape_interval, scrape_timeout=config.scrape_timeout
        )

    def _event_poster(self, config: Config, catalog: Catalog) -> EventPoster | None:
        """The Kubernetes Events poster, when the config turns it on."""
        if config.kubernetes is None or config.kubernetes.events is None:
            return None  # imported only when the setting is on
        from ..kubeevents import event_poster

        poster = event_poster(config, catalog)
        if poster is not None:
            self.catalog_listeners.append(poster.set_catalog)
            log.info("kubernetes events on: api=%s:%d node=%s ledger=%s", poster.client.host, poster.client.port,
                     poster.node, poster.ledger.path)  # fmt: skip
        return poster

    def _followed_pods(self) -> set[tuple[str, str]]:
        """(namespace, pod) of every followed Kubernetes log: the pods node discovery looks up."""
        maps = self.sources.label_maps()
        return {(m["namespace"], m["pod"]) for m in maps if "namespace" in m and "pod" in m}

    def services(self) -> list[Service]:
        """The app's own threads (scrapers, stdin), for Loop.run to start and stop."""
        services: list[Service] = [self.targets]
        if self.events_poster is not None:
            services.append(self.events_poster)
        if self.stdin is not None:
            services.append(self.stdin)
        return services

    def collector(self) -> ExporterCollector:
        """The scrape-time collector over every part's numbers."""
        return ExporterCollector(self.counts, self.extra_metrics, self.targets.views,
                                 reloads=lambda: dict(self.reloads), target_labels=self.targets.labels_for,
                                 groups=self.group_info)  # fmt: skip

    def group_info(self) -> Metric | None:
        """sglang_oom_serving_group_info: the followed pods of multi-node servers (metrics/groups.py)."""
        names = self.counts.label_names
        sources = [dict(zip(names, labels, strict=True)) for labels in self.counts.known()]
        discovery = self.targets.discovery
        return group_family(sources, discovery.pod_labels if discovery is not None else lambda _ns, _pod: None)

    def extra_metrics(self) -> dict[str, float]:
        """Loop, state and sink health for the collector."""
        facts = self.sources.facts()
        return {
            "state_saves_total": float(self.keeper.saves),
            "state_errors_total": float(self.keeper.errors + facts.bad_positions),
            "event_sink_errors_total": float(self.sink.errors),
            "numbers_dropped_total": float(facts.numbers_dropped),
            "source_errors_total": float(facts.errors),
            "kubernetes_filter_timeouts_total": float(facts.filter_timeouts),
            "loop_timestamp_seconds": self.loop.last_loop(),
            "pending_events": float(self.loop.pending),  # as of the loop's last pass: a scrape never waits for it
            "busy_sources": float(self.loop.busy),
            "open_files": float(facts.open_files),
            "file_handle_parks_total": float(facts.file_handle_parks),
            "open_file_limit_hits_total": float(facts.open_file_limit_hits),
            "sources_waiting": float(len(facts.waiting)),
        }

    def reload(self, config: Config, catalog: Catalog) -> str:
        """Apply a new config and catalog (SIGHUP); returns applied, partial (a part needs a restart) or failed."""
        problem = nothing_to_follow(config, stdin=self.stdin is not None)
        if problem:
            # An empty or truncated file (an editor mid-save) would otherwise stop every source at once.
            self.reload_failed(f"the new {problem.removeprefix('the ')}")
            return "failed"
        refused = [key for key in RESTART_ONLY if getattr(config, key) != getattr(self.config, key)]
        config = replace(config, **{key: getattr(self.config, key) for key in RESTART_ONLY})
        if label_names_for(pod_labels(config)) != self.counts.label_names:
            refused.append("kubernetes on/off")
            config = replace(config, kubernetes=self.config.kubernetes)
        new_k, old_k = config.kubernetes, self.config.kubernetes
        if new_k is not None and old_k is not None and new_k.discover_targets != old_k.discover_targets:
            # Node discovery is built once, with its API client and service-account token.
            refused.append("kubernetes.discover_targets")
            config = replace(config, kubernetes=replace(new_k, discover_targets=old_k.discover_targets))
        new_k, old_k = config.kubernetes, self.config.kubernetes
        if new_k is not None and old_k is not None and new_k.events != old_k.events:
            # The Events poster is built once, with its API client, thread and ledger.
            refused.append("kubernetes.events")
            config = replace(config, kubernetes=replace(new_k, events=old_k.events))
        with self.sources.locked():
            self.config, self.catalog = config, catalog
            self.counts.set_kinds(catalog.ids, catalog.retraction_kind, fatal_kinds(catalog), crash_kind(catalog))
            self.sink.catalog = catalog
            self.sources.reconfigure(config, catalog)
            self.loop.configure(config)
        self.targets.reconfigure(config)
        logging.getLogger().setLevel(config.log_level.upper())
        for listener in self.catalog_listeners:
            listener(catalog)
        result = "partial" if refused else "applied"
        self.reloads[result] += 1
        if refused:
            log.warning("reload: kept %s as they were; changing them needs a restart", ", ".join(refused))
        log.info("configuration reloaded result=%s paths=%d targets=%d kinds=%d", result, len(config.paths),
                 len(config.sglang_urls), len(catalog.kinds))  # fmt: skip
        return result

    def reload_failed(self, message: str) -> None:
        """A reload whose config or catalog did not load: the running one stays, counted and logged."""
        self.reloads["failed"] += 1
        log.error("reload failed, keeping the running configuration: %s", message.replace("\n", "; "))
