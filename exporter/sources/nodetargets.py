"""Node discovery, the loop: one thread lists the node's pods every interval (sooner for a newly followed
pod), keeps a scraper per followed pod's SGLang endpoint, and scrapes each in a thread of its own, so a hanging
pod never delays another or the log tailing; pods that leave the node or stop being followed lose theirs.

A failed list keeps the last good mapping (a short API outage should not drop context), is counted by reason
and logged once per change.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable

from .http import LABELS, HttpError
from .kubeclient import REASONS, ApiClient, DiscoveryError, PodEndpoint, PodKey, endpoints, lws_labels
from .scrape import TargetScraper

log = logging.getLogger(__name__)

NODE_NAME_ENV = "NODE_NAME"
NEW_POD_CHECK_SECONDS = 2.0  # how often the loop looks for followed pods without an endpoint


class NodeTargets:
    """Pod -> SGLang scraper for the followed pods on this node, kept fresh by one thread; thread-safe reads."""

    def __init__(
        self,
        client: ApiClient,
        node: str,
        followed: Callable[[], Iterable[PodKey]],
        *,
        default_port: int = 30000,
        port_annotation: str = "sglang-oom-exporter/port",
        interval: float = 30.0,
        scrape_interval: float = 15.0,
        scrape_timeout: float = 5.0,
        new_scraper: Callable[[str], TargetScraper] | None = None,
    ) -> None:
        self.client = client
        self.node = node
        self._followed = followed
        self.default_port = default_port
        self.port_annotation = port_annotation
        self.interval = interval
        self.scrape_interval = scrape_interval
        self._new_scraper = new_scraper or (lambda url: TargetScraper(url, timeout=scrape_timeout))
        self._lock = threading.Lock()
        self._endpoints: dict[PodKey, PodEndpoint] = {}
        self._lws: dict[PodKey, dict[str, str]] = {}  # followed pod -> its leaderworkerset.sigs.k8s.io/* labels
        self._listed_early: set[PodKey] = set()  # followed pods that already had their early list
        self._scrapers: dict[str, TargetScraper] = {}  # url -> scraper
        self._scrape_stops: dict[str, threading.Event] = {}
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors = dict.fromkeys(REASONS, 0)
        self.refreshes = 0
        self.last_success = 0.0  # wall time of the last good list
        self._last_problem = ""

    # --- reads (any thread) ------------------------------------------------------------------

    def scraper_for(self, namespace: str, pod: str) -> TargetScraper | None:
        """The scraper of this pod's SGLang, or None when the pod is unknown or not followed."""
        with self._lock:
            endpoint = self._endpoints.get((namespace, pod))
            return self._scrapers.get(endpoint.url) if endpoint is not None else None

    def pod_of(self, url: str) -> PodKey | None:
        """The (namespace, pod) whose SGLang this scraper's URL is, or None (for the target metrics' labels)."""
        with self._lock:
            return next((key for key, ep in self._endpoints.items() if ep.url == url), None)

    def pod_labels(self, namespace: str, pod: str) -> dict[str, str] | None:
        """The LeaderWorkerSet labels of a followed pod, as last listed (kept while the pod is followed)."""
        with self._lock:
            return self._lws.get((namespace, pod))

    def scrapers(self) -> list[TargetScraper]:
        """Every discovered scraper (for the target metrics)."""
        with self._lock:
            return list(self._scrapers.values())

    # --- one refresh -------------------------------------------------------------------------

    def refresh_once(self) -> bool:
        """List the node's pods and reconcile the scrapers; False (counted, logged) on a failure."""
        try:
            if not self.node:
                raise DiscoveryError("no_node_name", f"set {NODE_NAME_ENV} from the downward API (spec.nodeName)")
            listed = self.client.list_pods(self.node)
            found = endpoints(listed, self.default_port, self.port_annotation)
            followed = set(self._followed())
            self._keep_labels(lws_labels(listed), followed)
            self._reconcile({key: ep for key, ep in found.items() if key in followed})
            with self._lock:
                self._listed_early = followed  # every pod followed now has been listed
        except DiscoveryError as exc:
            self._failed(exc.reason, exc.detail)
            return False
        except HttpError as exc:
            self._failed(LABELS[exc.reason].discovery, exc.detail)
            return False
        except Exception as exc:  # a bug here must not end discovery, let alone the daemon
            self._failed("error", f"{type(exc).__name__}: {exc}")
            return False
        with self._lock:
            self.refreshes += 1
            self.last_success = time.time()
        if self._last_problem:
            log.info("node discovery recovered node=%s", self.node)
            self._last_problem = ""
        return True

    def _keep_labels(self, listed: dict[PodKey, dict[str, str]], followed: set[PodKey]) -> None:
        """Remember followed pods' LWS labels; a pod deleted from the API keeps them while its logs are read."""
        with self._lock:
            kept = {key: labels for key, labels in self._lws.items() if key in followed}
            kept.update((key, labels) for key, labels in listed.items() if key in followed)
            self._lws = kept

    def _failed(self, reason: str, detail: str) -> None:
        with self._lock:
            self.errors[reason] = self.errors.get(reason, 0) + 1
        message = f"{reason}: {detail}"
        if message != self._last_problem:  # once per change, not once per interval
            log.warning("node discovery failed, keeping the last mapping node=%s reason=%s detail=%s",
                        self.node, reason, detail)  # fmt: skip
            self._last_problem = message

    def _reconcile(self, wanted: dict[PodKey, PodEndpoint]) -> None:
        urls = {ep.url for ep in wanted.values()}
        with self._lock:
            self._endpoints = wanted
            gone = [url for url in self._scrapers if url not in urls]
            for url in gone:
                del self._scrapers[url]
                self._scrape_stops.pop(url).set()
            new = [url for url in sorted(urls) if url not in self._scrapers]
            for url in new:
                self._scrapers[url] = self._new_scraper(url)
                self._scrape_stops[url] = threading.Event()
            started = [(self._scrapers[url], self._scrape_stops[url]) for url in new]
        for url in gone:
            log.info("discovered target removed target=%s", url)
        if self._thread is not None:  # scrape threads only run under start()
            for scraper, stop in started:
                self._start_scrape(scraper, stop)
        for key, ep in sorted(wanted.items()):
            if ep.url in new:
                log.info("discovered target namespace=%s pod=%s target=%s", key[0], key[1], ep.url)

    # --- threads -----------------------------------------------------------------------------

    def start(self) -> None:
        """Refresh at once, then every interval, in a daemon thread; scrape each target in its own.

        Restartable (a reload stops and starts the targets): the known targets get their threads back.
        """
        if self._thread is not None:
            raise RuntimeError("NodeTargets already started")
        self._stop = threading.Event()
        with self._lock:
            self._scrape_stops = {url: threading.Event() for url in self._scrapers}
            known = [(self._scrapers[url], self._scrape_stops[url]) for url in self._scrapers]
        self._thread = threading.Thread(target=self._run, name="node discovery", daemon=True)
        self._thread.start()
        for scraper, stop in known:
            self._start_scrape(scraper, stop)

    def _run(self) -> None:
        last = -math.inf
        while not self._stop.is_set():
            if time.monotonic() - last >= self.interval or self.unmapped_new():
                last = time.monotonic()
                self.refresh_once()
            self._stop.wait(min(self.interval, NEW_POD_CHECK_SECONDS))

    def unmapped_new(self) -> bool:
        """Whether a followed pod has no endpoint and was never listed early: worth one list before the interval.

        A new SGLang pod then gets its endpoint within seconds, not an interval; a pod that stays unmapped
        (deleted, its log kept for source_retention) costs one early list, not one every few seconds.
        """
        try:
            followed = set(self._followed())
        except Exception:  # the regular refresh counts a broken callback
            return False
        with self._lock:
            new = followed - self._endpoints.keys() - self._listed_early
            self._listed_early |= new
        return bool(new)

    def _start_scrape(self, scraper: TargetScraper, stop: threading.Event) -> None:
        def run() -> None:
            while not stop.is_set() and not self._stop.is_set():
                started = time.monotonic()
                scraper.scrape_once(stop)
                stop.wait(max(0.0, self.scrape_interval - (time.monotonic() - started)))

        thread = threading.Thread(target=run, name=f"scrape {scraper.target}", daemon=True)
        thread.start()
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]

    def stop(self, timeout: float | None = None) -> bool:
        """Stop discovery and every scrape thread; False if one is still running after the deadline."""
        self._stop.set()
        with self._lock:
            for event in self._scrape_stops.values():
                event.set()
            threads = list(self._threads)
            self._threads = []
        if self._thread is not None:
            threads.append(self._thread)
            self._thread = None
        wait = timeout if timeout is not None else self.client.timeout + 1.0
        deadline = time.monotonic() + wait
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in threads if t.is_alive()]
        if alive:
            log.warning("discovery threads still running after stop threads=%s", alive)
        return not alive
