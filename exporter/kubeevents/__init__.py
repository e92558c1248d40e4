"""Kubernetes Events (opt-in, `kubernetes.events`): one Warning Event on the SGLang pod per counted OOM, so
`kubectl describe pod` says why SGLang died and what to change. docs/kubernetes-events.md is the user's page.

    EventSink.record (counting thread) --offer--> EventPoster (its thread, queue, ledger, API calls)

The Event's text and the create-or-patch decision are pure; the ledger on disk means a restart never posts one
OOM twice. The modules are in docs/architecture.md, the one code map.

Imported only when the setting is on: a plain `serve` never loads it (tests/test_serve_startup.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from ..catalog import Catalog
from ..config.model import Config
from ..sources.kubeclient import ApiClient
from .correlate import Correlator
from .ledger import Ledger
from .poster import RESULTS, EventPoster
from .text import node_name


def event_poster(config: Config, catalog: Catalog, env: Mapping[str, str] | None = None) -> EventPoster | None:
    """The EventPoster that config.kubernetes.events asks for (None when it is off).

    The API server from KUBERNETES_SERVICE_HOST/PORT with the service account's token and CA, the node (the
    reportingInstance) from NODE_NAME, and the ledger in the state directory.
    """
    k = config.kubernetes
    settings = k.events if k is not None else None
    if k is None or settings is None:
        return None
    env = os.environ if env is None else env
    return EventPoster(
        ApiClient.in_cluster(env, settings.service_account_dir),
        catalog,
        logs_root=k.logs_root,
        node=node_name(env),
        nonfatal=settings.nonfatal,
        runbook_base=settings.runbook_base_url,
        ledger=Ledger(config.state_dir),
        correlator=Correlator(),
    )


class EventsCollector(Collector):
    """sglang_oom_exporter_k8s_events_total{result}: every OOM the poster was offered, by what became of it."""

    def __init__(self, poster: EventPoster) -> None:
        self.poster = poster

    def collect(self) -> Iterator[CounterMetricFamily]:
        """Yield the counter, every result zero-initialised."""
        counts = self.poster.counts()
        family = CounterMetricFamily(
            "sglang_oom_exporter_k8s_events",
            "OOMs offered to the Kubernetes Events poster, by result (created, updated, rate_limited, failures).",
            labels=["result"],
        )
        for result in RESULTS:
            family.add_metric([result], float(counts.get(result, 0)))
        yield family
