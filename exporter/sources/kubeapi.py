"""Node discovery (opt-in): which SGLang endpoint serves which pod log, from the Kubernetes API.

A DaemonSet exporter follows /var/log/pods/<namespace>_<pod>_<uid>/... but cannot tell where that pod's SGLang
listens, so its events would carry no KV snapshot and no suggested flag values. With discovery on, it lists
the pods on its own node, one call:

    GET https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/api/v1/pods?fieldSelector=spec.nodeName=<node>
        &resourceVersion=0                              (from the API server's cache, not etcd)
    Authorization: Bearer <service-account token>       (TLS verified with the service account's ca.crt)

and maps each followed (namespace, pod) to http://<pod IP>:<port>, the port from a pod annotation or a default.
Each mapped endpoint gets a TargetScraper and a scrape thread of its own (a hanging pod never delays another
or the log tailing); pods that leave the node or stop being followed lose theirs. stdlib only (http.py's client).

Failures never raise into the daemon: a failed list keeps the last good mapping (a short API outage should not
drop context), counts its reason in `sglang_oom_exporter_discovery_errors_total{reason}` and is logged once per
change. The token is read on every list, because kubelet rotates projected service-account tokens.

kubeclient.py makes the API call, nodetargets.py runs the loop and the scrape threads; this module builds
them from the discovery settings (the daemon passes its config's) and exports their metrics.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .kubeclient import REASONS, ApiClient, PodKey
from .nodetargets import NODE_NAME_ENV, NodeTargets


class DiscoverySettings(Protocol):
    """What node discovery needs of its settings (config's DiscoverTargetsConfig has these)."""

    @property
    def port(self) -> int: ...
    @property
    def port_annotation(self) -> str: ...
    @property
    def interval(self) -> float: ...
    @property
    def service_account_dir(self) -> str: ...


def node_targets(
    settings: DiscoverySettings,
    followed: Callable[[], Iterable[PodKey]],
    *,
    scrape_interval: float,
    scrape_timeout: float,
    env: Mapping[str, str] | None = None,
) -> NodeTargets:
    """The NodeTargets that discover_targets settings ask for, scraping at scrape_interval and scrape_timeout.

    In a pod: the API server from KUBERNETES_SERVICE_HOST/PORT, the node from NODE_NAME (downward API).
    """
    env = os.environ if env is None else env
    return NodeTargets(
        ApiClient.in_cluster(env, settings.service_account_dir),
        env.get(NODE_NAME_ENV, ""),
        followed,
        default_port=settings.port,
        port_annotation=settings.port_annotation,
        interval=settings.interval,
        scrape_interval=scrape_interval,
        scrape_timeout=scrape_timeout,
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
