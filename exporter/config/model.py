"""Configuration, the values: the frozen dataclasses `serve` is given. Raw dicts stop before these.

A new setting is a field here with its default, plus its key in keys.py (the defaults work without any file).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..sources.discover import DEFAULT_CONTAINER_FILTER, DEFAULT_NAMESPACE_FILTER, DEFAULT_POD_FILTER

DEFAULT_PORT = 9877
DEFAULT_LISTEN = f":{DEFAULT_PORT}"


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
    listen: str = DEFAULT_LISTEN
    state_dir: str | None = None
    from_beginning: bool = False
    kubernetes: KubernetesConfig | None = None
    force_polling: bool = False
    poll_interval: float = 1.0  # the loop's tick, and the polling observer's interval with force_polling
    sweep_interval: float = 10.0  # stat every followed file even without a file event (a missed event)
    discover_interval: float = 5.0
    state_interval: float = 5.0
    traceback_wait: float = 2.5
    source_retention: float = 3600.0
    recent_events: int = 200
    catalog: str | None = None
    prefix_regex: tuple[str, ...] = ()
    web_config: str | None = None
    log_level: str = "info"
    sglang_urls: tuple[str, ...] = ()  # SGLang base URLs to scrape (/metrics, /server_info)
    target_sources: Mapping[str, str] = field(default_factory=dict)  # url -> source name it serves
    scrape_interval: float = 15.0
    scrape_timeout: float = 5.0
