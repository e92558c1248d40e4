"""Configuration, the values: the frozen dataclasses `serve` is given. Raw dicts stop before these.

A new setting is a field here, its default taken from its row in the settings table (settings.py), where its
key, bounds, variable, flag and help live too. The defaults work without any file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..sources.discover import DEFAULT_CONTAINER_FILTER, DEFAULT_NAMESPACE_FILTER, DEFAULT_POD_FILTER
from .settings import default


@dataclass(frozen=True, slots=True)
class DiscoverTargetsConfig:
    """kubernetes.discover_targets: each followed pod's SGLang endpoint from the Kubernetes API (node mode)."""

    port: int = 30000  # SGLang's port when the pod has no port annotation
    port_annotation: str = "sglang-oom-exporter/port"
    interval: float = 30.0  # how often the node's pods are listed
    service_account_dir: str = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass(frozen=True, slots=True)
class EventsConfig:
    """kubernetes.events: one Warning Event on the SGLang pod per counted OOM (docs/kubernetes-events.md)."""

    service_account_dir: str = "/var/run/secrets/kubernetes.io/serviceaccount"
    nonfatal: bool = False  # also for non-fatal events (retractions, aborted requests): off, they are routine
    runbook_base_url: str = ""  # empty: the runbooks at this release's tag (as the rendered alerts link them)


@dataclass(frozen=True, slots=True)
class KubernetesConfig:
    """Kubernetes node mode: follow /var/log/pods/<ns>_<pod>_<uid>/<container>/<n>.log."""

    logs_root: str
    namespace: str = DEFAULT_NAMESPACE_FILTER  # the defaults, and why, live with the filter in discover.py
    pod: str = DEFAULT_POD_FILTER
    container: str = DEFAULT_CONTAINER_FILTER
    discover_targets: DiscoverTargetsConfig | None = None  # None: off (the default)
    events: EventsConfig | None = None  # None: off (the default)


@dataclass(frozen=True, slots=True)
class Config:
    """Everything `serve` needs to know."""

    paths: tuple[str, ...] = ()
    names: Mapping[str, str] = field(default_factory=dict)  # path or glob -> source name
    listen: str = default("listen")
    state_dir: str | None = default("state_dir")
    from_beginning: bool = default("from_beginning")
    kubernetes: KubernetesConfig | None = None
    force_polling: bool = default("force_polling")
    poll_interval: float = default("poll_interval")
    sweep_interval: float = default("sweep_interval")
    discover_interval: float = default("discover_interval")
    state_interval: float = default("state_interval")
    traceback_wait: float = default("traceback_wait")
    evidence_wait: float = default("evidence_wait")
    source_retention: float = default("source_retention")
    recent_events: int = default("recent_events")
    catalog: str | None = default("catalog")
    prefix_regex: tuple[str, ...] = ()
    web_config: str | None = default("web_config")
    log_level: str = default("log_level")
    sglang_urls: tuple[str, ...] = ()  # SGLang base URLs to scrape (/metrics, /server_info)
    target_sources: Mapping[str, str] = field(default_factory=dict)  # url -> source name it serves
    scrape_interval: float = default("scrape_interval")
    scrape_timeout: float = default("scrape_timeout")
    otlp_listen: str | None = default("otlp_listen")
    otlp_max_request_kib: int = default("otlp_max_request_kib")
    otlp_bearer_token_file: str | None = default("otlp_bearer_token_file")
    otlp_spool_source_mib: int = default("otlp_spool_source_mib")
    otlp_spool_total_mib: int = default("otlp_spool_total_mib")
    otlp_spool_retention: float = default("otlp_spool_retention")
    otlp_spool_max_sources: int = default("otlp_spool_max_sources")
    otlp_spool_dedupe_windows: int = default("otlp_spool_dedupe_windows")
