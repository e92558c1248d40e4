"""Which SGLang endpoint serves which log source: the scrapers, their threads, and an event's KV context.

    config.sglang_urls + config.target_sources (url -> source name) --> TargetScraper per URL
    LogSource labels --for_source()--> its scraper --context_for()--> sink.Context (args, KV snapshot)

This is the one place targets are mapped to sources: a new way of finding targets (a node's pods, say)
builds the same Config fields and lands here. Reload rebuilds the set, keeping the scrapers (and their
KV history) of URLs that did not change.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ..config.model import Config
from ..events.sink import Context
from ..sources.scrape import ScrapeLoop, TargetScraper

if TYPE_CHECKING:  # node discovery (sources/kubeapi.py) is imported only when the config turns it on
    from ..sources.nodetargets import NodeTargets


class TargetSet:
    """The scraped endpoints of one config; start()/stop() run one thread per endpoint."""

    def __init__(
        self, config: Config, *, wall: Callable[[], float] = time.time, discovery: NodeTargets | None = None
    ) -> None:
        self._wall = wall
        self.discovery = discovery  # node discovery: pod -> scraper, found through the Kubernetes API
        self.scrapers: list[TargetScraper] = []
        self._owners: dict[str, str] = {}
        self._kubernetes = False
        self._interval = config.scrape_interval
        self._loop: ScrapeLoop | None = None
        self._build(config)

    def _build(self, config: Config) -> None:
        old = {(s.url, s.timeout): s for s in self.scrapers}
        self.scrapers = [
            old.get((url, config.scrape_timeout)) or TargetScraper(url, timeout=config.scrape_timeout)
            for url in config.sglang_urls
        ]
        self._owners = dict(config.target_sources)
        self._kubernetes = config.kubernetes is not None
        self._interval = config.scrape_interval

    def start(self) -> None:
        """One scrape thread per endpoint, so a hanging endpoint never delays another or the log tailing."""
        if self._loop is None:
            self._loop = ScrapeLoop(self.scrapers, self._interval)
            self._loop.start()
            if self.discovery is not None:
                self.discovery.start()

    def stop(self) -> None:
        """Stop and join the scrape threads."""
        if self._loop is not None:
            self._loop.stop()
            self._loop = None
            if self.discovery is not None:
                self.discovery.stop()

    def reconfigure(self, config: Config) -> None:
        """A reloaded config: the new URLs, owners, timeout and interval, with threads restarted if running."""
        running = self._loop is not None
        self.stop()
        self._build(config)
        if running:
            self.start()

    def for_source(self, label_map: Mapping[str, str]) -> TargetScraper | None:
        """The endpoint that serves this log: named in the config, found for its pod, or the only one there is."""
        names = {label_map.get("source"), label_map.get("container"), label_map.get("pod")}
        for scraper in self.scrapers:
            if self._owners.get(scraper.url) in names:
                return scraper
        if self.discovery is not None and "pod" in label_map:
            found = self.discovery.scraper_for(label_map.get("namespace", ""), label_map["pod"])
            if found is not None:
                return found
        if len(self.scrapers) == 1 and not self._owners:
            return self.scrapers[0]
        return None

    def context_for(self, label_map: Mapping[str, str]) -> Context:
        """The server args and the last KV snapshot before now, of the endpoint serving this log."""
        scraper = self.for_source(label_map)
        if scraper is None:
            return Context()
        snapshot = scraper.snapshot_before(self._wall())
        info = scraper.server_info
        return Context(dict(info.args) if info else None, snapshot.as_dict() if snapshot else None, scraper.url)

    def labels_for(self, url: str) -> dict[str, str]:
        """The SGLang pod or source a scraped endpoint serves, as labels of its sglang_oom_target_* series.

        A discovered endpoint names its pod (namespace, pod); a configured one its source, when the config maps
        it to one in file mode. Never the exporter's own identity: the scrape adds that (see the chart's monitors).
        """
        if self.discovery is not None:
            pod = self.discovery.pod_of(url)
            if pod is not None:
                return {"namespace": pod[0], "pod": pod[1]}
        owner = self._owners.get(url)
        if owner and not self._kubernetes:
            return {"source": owner}
        return {}

    def views(self) -> list[TargetScraper]:
        """The scraped endpoints (configured, then discovered); each is a metrics.TargetView."""
        return list(self.scrapers) + (self.discovery.scrapers() if self.discovery is not None else [])
