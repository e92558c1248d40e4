"""Node discovery (opt-in): which SGLang endpoint serves which pod log, from the Kubernetes API.

A DaemonSet exporter follows /var/log/pods/<namespace>_<pod>_<uid>/... but cannot tell where that pod's SGLang
listens, so its events would carry no KV snapshot and no suggested flag values. With discovery on, it lists
the pods on its own node, one call:

    GET https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/api/v1/pods?fieldSelector=spec.nodeName=<node>
        &resourceVersion=0                              (from the API server's cache, not etcd)
    Authorization: Bearer <service-account token>       (TLS verified with the service account's ca.crt)

and maps each followed (namespace, pod) to http://<pod IP>:<port>, the port from a pod annotation or a default.
Each mapped endpoint gets a TargetScraper and a scrape thread of its own (a hanging pod never delays another
or the log tailing); pods that leave the node or stop being followed lose theirs. stdlib only (ssl, http.client).

Failures never raise into the daemon: a failed list keeps the last good mapping (a short API outage should not
drop context), counts its reason in `sglang_oom_exporter_discovery_errors_total{reason}` and is logged once per
change. The token is read on every list, because kubelet rotates projected service-account tokens.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import os
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..config import Config
from .scrape import TargetScraper

log = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
NODE_NAME_ENV = "NODE_NAME"
REASONS = ("no_node_name", "no_token", "refused", "timeout", "tls", "http_status", "bad_json", "too_large", "error")
NEW_POD_CHECK_SECONDS = 2.0  # how often the loop looks for followed pods without an endpoint
MAX_BODY_BYTES = 64 << 20  # one node's pod list is far smaller; a runaway answer must not fill memory

PodKey = tuple[str, str]  # (namespace, pod)


class DiscoveryError(Exception):
    """A failed pod list; reason is one of REASONS (a metric label)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason if reason in REASONS else "error"
        self.detail = detail


@dataclass(frozen=True, slots=True)
class PodEndpoint:
    """Where one pod's SGLang listens."""

    namespace: str
    pod: str
    ip: str
    port: int

    @property
    def url(self) -> str:
        """http://<ip>:<port>, with brackets around an IPv6 address."""
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"http://{host}:{self.port}"


# ---------------------------------------------------------------------------------------------- the API call


class ApiClient:
    """Lists the pods of one node through the API server, as the pod's service account.

    timeout bounds each socket operation (connect, TLS handshake, each read), not the whole call: the caller is
    the discovery thread, so a slow API server delays only the next list.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        token_file: str,
        ca_file: str,
        timeout: float = 10.0,
        max_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self.host, self.port = host, port
        self.token_file, self.ca_file = token_file, ca_file
        self.timeout = timeout
        self.max_bytes = max_bytes

    @classmethod
    def in_cluster(
        cls, env: Mapping[str, str], service_account_dir: str = SERVICE_ACCOUNT_DIR, timeout: float = 10.0
    ) -> ApiClient:
        """The client a pod uses: the API server from the service env vars, the mounted token and CA."""
        host = env.get("KUBERNETES_SERVICE_HOST", "")
        try:
            port = int(env.get("KUBERNETES_SERVICE_PORT", "443"))
        except ValueError:
            port = 443
        return cls(
            host,
            port,
            token_file=os.path.join(service_account_dir, "token"),
            ca_file=os.path.join(service_account_dir, "ca.crt"),
            timeout=timeout,
        )

    def list_pods(self, node: str) -> dict[str, Any]:
        """The PodList of the pods scheduled on node; DiscoveryError on any failure."""
        if not self.host:
            raise DiscoveryError("error", "KUBERNETES_SERVICE_HOST is not set (not running in a pod?)")
        token = self._token()
        try:
            context = ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise DiscoveryError("tls", f"cannot load the CA {self.ca_file}: {exc}") from exc
        # resourceVersion=0: served from the API server's watch cache, not etcd; a thousand nodes listing every
        # interval stay cheap (what client-go's informers do for their lists).
        path = "/api/v1/pods?fieldSelector=" + quote(f"spec.nodeName={node}", safe="") + "&resourceVersion=0"
        conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=context)
        try:
            conn.request("GET", path, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
            response = conn.getresponse()
            body = response.read(self.max_bytes + 1)
        except ssl.SSLError as exc:
            raise DiscoveryError("tls", f"TLS with {self.host}:{self.port} failed: {exc}") from exc
        except ConnectionRefusedError as exc:
            raise DiscoveryError("refused", f"connection refused by {self.host}:{self.port}") from exc
        except TimeoutError as exc:
            raise DiscoveryError("timeout", f"no answer from {self.host}:{self.port} within {self.timeout}s") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise DiscoveryError("error", f"{type(exc).__name__}: {exc}") from exc
        finally:
            conn.close()
        if response.status != 200:
            raise DiscoveryError("http_status", f"HTTP {response.status}: {body[:200].decode('utf-8', 'replace')}")
        if len(body) > self.max_bytes:
            raise DiscoveryError("too_large", f"pod list over {self.max_bytes} bytes")
        try:
            doc = json.loads(body)
        except ValueError as exc:
            raise DiscoveryError("bad_json", f"pod list is not JSON: {exc}") from exc
        if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
            raise DiscoveryError("bad_json", "pod list has no items list")
        return doc

    def _token(self) -> str:
        try:
            with open(self.token_file, encoding="utf-8") as fh:
                token = fh.read().strip()
        except OSError as exc:
            raise DiscoveryError("no_token", f"cannot read {self.token_file}: {exc.strerror or exc}") from exc
        if not token:
            raise DiscoveryError("no_token", f"{self.token_file} is empty")
        return token


def endpoints(pod_list: Mapping[str, Any], default_port: int, port_annotation: str) -> dict[PodKey, PodEndpoint]:
    """Each pod with an IP -> its SGLang endpoint; the port from the annotation when it is a valid port."""
    found: dict[PodKey, PodEndpoint] = {}
    for item in pod_list.get("items") or []:
        if not isinstance(item, dict):
            continue
        meta, status = item.get("metadata") or {}, item.get("status") or {}
        namespace, name, ip = meta.get("namespace"), meta.get("name"), status.get("podIP")
        if not (isinstance(namespace, str) and isinstance(name, str) and isinstance(ip, str) and ip):
            continue  # pending pods have no IP yet
        if status.get("phase") in ("Succeeded", "Failed"):
            continue
        port = default_port
        raw = (meta.get("annotations") or {}).get(port_annotation)
        if isinstance(raw, str) and raw.strip().isdigit() and 0 < int(raw) < 65536:
            port = int(raw)
        found[(namespace, name)] = PodEndpoint(namespace, name, ip, port)
    return found


# ---------------------------------------------------------------------------------------------- the loop


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
            found = endpoints(self.client.list_pods(self.node), self.default_port, self.port_annotation)
            followed = set(self._followed())
            self._reconcile({key: ep for key, ep in found.items() if key in followed})
            with self._lock:
                self._listed_early = followed  # every pod followed now has been listed
        except DiscoveryError as exc:
            self._failed(exc.reason, exc.detail)
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


def node_targets(
    config: Config, followed: Callable[[], Iterable[PodKey]], env: Mapping[str, str] | None = None
) -> NodeTargets | None:
    """The NodeTargets that config.kubernetes.discover_targets asks for (None when discovery is off).

    In a pod: the API server from KUBERNETES_SERVICE_HOST/PORT, the node from NODE_NAME (downward API).
    """
    settings = config.kubernetes.discover_targets if config.kubernetes is not None else None
    if settings is None:
        return None
    env = os.environ if env is None else env
    return NodeTargets(
        ApiClient.in_cluster(env, settings.service_account_dir),
        env.get(NODE_NAME_ENV, ""),
        followed,
        default_port=settings.port,
        port_annotation=settings.port_annotation,
        interval=settings.interval,
        scrape_interval=config.scrape_interval,
        scrape_timeout=config.scrape_timeout,
    )


class DiscoveryCollector(Collector):
    """sglang_oom_exporter_discovery_* for the registry: list failures by reason, refreshes, targets."""

    def __init__(self, targets: NodeTargets) -> None:
        self.targets = targets

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        """Yield the discovery metrics."""
        t = self.targets
        errors = CounterMetricFamily(
            "sglang_oom_exporter_discovery_errors", "Failed pod lists of node discovery, by reason.", labels=["reason"]
        )
        for reason in REASONS:
            errors.add_metric([reason], float(t.errors.get(reason, 0)))
        yield errors
        yield CounterMetricFamily(
            "sglang_oom_exporter_discovery_refreshes", "Successful pod lists of node discovery.", value=t.refreshes
        )
        yield GaugeMetricFamily(
            "sglang_oom_exporter_discovery_last_success_timestamp_seconds",
            "When node discovery last listed the node's pods (0: never).",
            value=t.last_success,
        )
        yield GaugeMetricFamily(
            "sglang_oom_exporter_discovered_targets",
            "SGLang endpoints found by node discovery for followed pods.",
            value=len(t.scrapers()),
        )
