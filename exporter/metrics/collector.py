"""The scrape-time collector: the cached families (events, read statistics), targets and the exporter's health."""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .. import __version__
from ..sources.scrape import REASONS as SCRAPE_REASONS
from .events import EventCounts
from .exposition import Fixed, PageCollector, Part, encode
from .names import NAMESPACE, SELF


class TargetView(Protocol):
    """What the collector reads of one scraped SGLang endpoint (sources/scrape.TargetScraper)."""

    url: str

    @property
    def up(self) -> bool: ...
    @property
    def duration(self) -> float: ...
    @property
    def last_success(self) -> float | None: ...
    @property
    def errors_total(self) -> Mapping[str, int]: ...
    @property
    def info_errors_total(self) -> Mapping[str, int]: ...
    def snapshot_values(self) -> Mapping[str, float]: ...
    def snapshot_labels(self) -> Mapping[str, str]: ...
    def server_args(self) -> Mapping[str, Any]: ...


# Mirrored SGLang values under our own names (never `sglang:` names): snapshot key -> (name, type, help).
TARGET_VALUES = {
    "token_usage": ("token_usage", "gauge", "SGLang's token usage: used (not evictable) over capacity, worst rank."),
    "num_used_tokens": ("used_tokens", "gauge", "KV tokens in use (SGLang's num_used_tokens)."),
    "max_total_num_tokens": ("max_total_tokens", "gauge", "KV pool capacity in tokens (max_total_num_tokens)."),
    "kv_available_tokens": ("kv_available_tokens", "gauge", "Free KV slots (0.5.16+)."),
    "kv_evictable_tokens": ("kv_evictable_tokens", "gauge", "Evictable radix-cache KV slots (0.5.16+)."),
    "kv_used_tokens": ("kv_used_tokens", "gauge", "Used KV slots (0.5.16+)."),
    "running_requests": ("running_requests", "gauge", "Requests in the running batch."),
    "queued_requests": ("queued_requests", "gauge", "Requests waiting in the queue."),
    "retracted_reqs": ("retracted_requests_last_step", "gauge", "Requests retracted in the last step."),
    "new_token_ratio": ("new_token_ratio", "gauge", "The scheduler's new-token ratio (jumps after a retraction)."),
    "retracted_requests_total": ("retracted_requests", "counter", "Requests retracted (SGLang 0.5.8+)."),
    "aborted_requests_total": ("aborted_requests", "counter", "Requests aborted (SGLang 0.4.8+)."),
    "pending_prealloc_token_usage": ("pending_prealloc_token_usage", "gauge",
                                     "PD decode: KV tokens promised to transfers, not yet allocated, over capacity."),
    "decode_prealloc_queue_requests": ("decode_prealloc_queue_requests", "gauge",
                                       "PD decode: requests waiting for their KV pre-allocation."),
    # SGLang main of 2026-08 (facts 12.23-12.27); GB as SGLang reports them, per GPU.
    "startup_available_gpu_memory_gb": ("startup_available_gpu_memory_gb", "gauge",
                                        "GPU memory left at start-up after weights, KV pool and graphs, tightest GPU."),
    "weight_memory_gb": ("weight_memory_gb", "gauge", "Model weights on one GPU at start-up, largest GPU."),
    "graph_memory_gb": ("graph_memory_gb", "gauge", "Captured CUDA graphs on one GPU at start-up, largest GPU."),
    "kv_cache_memory_gb": ("kv_cache_memory_gb", "gauge", "The KV pool on one GPU at start-up, largest GPU."),
    "hicache_host_used_tokens": ("hicache_host_used_tokens", "gauge", "HiCache host pool: tokens in use."),
    "hicache_host_total_tokens": ("hicache_host_total_tokens", "gauge", "HiCache host pool: capacity in tokens."),
    "evicted_tokens_total": ("evicted_tokens", "counter", "Device KV slots freed by radix-cache eviction."),
    "hicache_dropped_tokens_total": ("hicache_dropped_tokens", "counter",
                                     "Device KV dropped without a host backup because host memory was short."),
    "hicache_prefetch_alloc_failed_tokens_total": ("hicache_prefetch_alloc_failed_tokens", "counter",
                                                   "HiCache prefetches given up: an aux host pool could not allocate."),
    "prefill_bootstrap_queue_requests": ("prefill_bootstrap_queue_requests", "gauge",
                                         "PD prefill: requests waiting for bootstrap."),
    "prefill_inflight_queue_requests": ("prefill_inflight_queue_requests", "gauge",
                                        "PD prefill: requests whose KV is in flight to the decode server."),
    "decode_transfer_queue_requests": ("decode_transfer_queue_requests", "gauge",
                                       "PD decode: requests whose KV is being transferred in."),
    # SGLang 0.5.23.
    "prealloc_full_token_usage": ("prealloc_full_token_usage", "gauge",
                                  "PD decode: full-attention KV pool share pre-allocated to pending transfers."),
    "prealloc_swa_token_usage": ("prealloc_swa_token_usage", "gauge",
                                 "PD decode: SWA KV pool share pre-allocated to pending transfers."),
    "decode_host_receive_queue_requests": ("decode_host_receive_queue_requests", "gauge",
                                           "PD decode: transfers receiving into host memory or awaiting the device."),
    "decode_deferred_kv_release_requests": ("decode_deferred_kv_release_requests", "gauge",
                                            "PD decode: failed requests whose KV is held until the transfer drains."),
    "hicache_host_mamba_used_states": ("hicache_host_mamba_used_states", "gauge",
                                       "HiCache host mamba pool: state slots in use (hybrid-SSM models)."),
    "hicache_host_mamba_total_states": ("hicache_host_mamba_total_states", "gauge",
                                        "HiCache host mamba pool: capacity in state slots (hybrid-SSM models)."),
    "hicache_unbacked_evicted_tokens_total": ("hicache_unbacked_evicted_tokens", "counter",
                                              "Device KV evicted before its write-through reached host memory, lost."),
    "storage_prefetch_host_capacity_tokens_total": ("storage_prefetch_host_capacity_tokens", "counter",
                                                    "Storage-hit tokens not prefetched: no room in host memory."),
    "storage_prefetch_device_capacity_tokens_total": ("storage_prefetch_device_capacity_tokens", "counter",
                                                      "Storage-hit tokens not prefetched: no room in the device pool."),
}  # fmt: skip
# SGLang labels the mirrored values keep, when SGLang gave them: engine_type (unified | prefill | decode) says
# which role of a PD deployment the numbers are from. A label SGLang did not give is left out, not empty.
TARGET_LABELS = ("engine_type",)
SERVER_ARGS = ("chunked_prefill_size", "max_prefill_tokens", "max_running_requests", "mem_fraction_static",
               "page_size", "context_length", "max_total_num_tokens", "speculative_num_draft_tokens",
               "schedule_conservativeness", "cuda_graph_max_bs")  # fmt: skip


def target_families(
    targets: Iterable[TargetView], labels_for: Callable[[str], Mapping[str, str]] = lambda _url: {}
) -> Iterator[Metric]:
    """Health and mirrored KV values of every scraped SGLang endpoint.

    Each series carries `target` and the SGLang pod (namespace, pod) or source the endpoint serves, when
    labels_for knows it (node discovery, config targets), so an alert on it names the workload and matches
    the OOM alerts of the same pod or source.

    A target whose last scrape failed keeps only its health series (up 0, the scrape's duration and errors,
    the time of its last good scrape): from the first failed scrape on its mirrored values and server args are
    left out, as Prometheus marks a failed target's own series stale, so no panel or alert reads a dead
    server's last numbers as live. They return with the next good scrape.
    """
    targets = list(targets)
    up = GaugeMetricFamily(f"{NAMESPACE}_target_up", "1 when the last scrape of the SGLang endpoint worked.")
    duration = GaugeMetricFamily(f"{NAMESPACE}_target_scrape_duration_seconds", "How long the last scrape took.")
    success = GaugeMetricFamily(
        f"{NAMESPACE}_target_last_success_timestamp_seconds",
        "When a scrape of the SGLang endpoint last worked (kept while it is down).",
    )
    errors = CounterMetricFamily(f"{NAMESPACE}_target_scrape_errors", "Failed scrapes, by reason.")
    info_errors = CounterMetricFamily(f"{NAMESPACE}_target_server_info_errors", "Failed /server_info fetches.")
    args = GaugeMetricFamily(f"{NAMESPACE}_target_server_arg", "Numeric SGLang server args from /server_info.")
    values: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
    for key, (name, typ, doc) in TARGET_VALUES.items():
        family = CounterMetricFamily if typ == "counter" else GaugeMetricFamily
        values[key] = family(f"{NAMESPACE}_target_{name}", doc)
    for t in targets:
        labels = {"target": t.url, **labels_for(t.url)}
        is_up = t.up  # read once: the up gauge and the values it lets through agree
        _add(up, labels, 1.0 if is_up else 0.0)
        _add(duration, labels, t.duration)
        if t.last_success is not None:
            _add(success, labels, t.last_success)
        for reason in SCRAPE_REASONS:
            _add(errors, {**labels, "reason": reason}, float(t.errors_total.get(reason, 0)))
            _add(info_errors, {**labels, "reason": reason}, float(t.info_errors_total.get(reason, 0)))
        if not is_up:
            continue  # a down target's mirrored values go stale (see above)
        # A label SGLang did not give (engine_type before 0.4.3) is left out rather than exported empty.
        extra = {k: v for k, v in t.snapshot_labels().items() if k in TARGET_LABELS and v}
        for key, value in t.snapshot_values().items():
            if key in values:
                _add(values[key], {**labels, **extra}, value)
        for arg, value in t.server_args().items():
            if arg in SERVER_ARGS and isinstance(value, int | float) and not isinstance(value, bool):
                _add(args, {**labels, "arg": arg}, float(value))
    if targets:
        yield from (up, duration, success, errors, info_errors, args, *values.values())


def _add(family: GaugeMetricFamily | CounterMetricFamily, labels: Mapping[str, str], value: float) -> None:
    """One sample with its own label set (a target's pod or source labels vary from target to target)."""
    suffix = "_total" if isinstance(family, CounterMetricFamily) else ""
    family.add_sample(family.name + suffix, dict(labels), value)


class ExporterCollector(PageCollector):
    """The exporter's families: the cached page (events, read statistics) plus what is read at scrape time.

    parts() is the HTTP edge's path: cached bytes, no prometheus_client objects. collect() yields the same
    families as Metric objects, for a CollectorRegistry (tests, get_sample_value).
    """

    def __init__(
        self,
        counts: EventCounts,
        extra: Callable[[], Mapping[str, float]] = dict,
        targets: Callable[[], Iterable[TargetView]] = list,
        reloads: Callable[[], Mapping[str, float]] | None = None,
        target_labels: Callable[[str], Mapping[str, str]] = lambda _url: {},
        groups: Callable[[], Metric | None] = lambda: None,
    ) -> None:
        self._page = counts.page
        self._groups = groups
        self._target_labels = target_labels
        self._extra = extra
        self._targets = targets
        self._reloads = reloads

    def describe(self) -> Iterable[Metric]:
        """Nothing up front: the registry then never calls collect() at registration."""
        return []

    def collect(self) -> Iterator[Metric]:
        """One scrape, as Metric objects."""
        yield from self._page.metrics()
        yield from self._live()

    def parts(self, openmetrics: bool, names: frozenset[str] | None = None) -> list[Part]:
        """One scrape, as page parts: the cached families, then the few read now (no EOF line)."""
        parts = self._page.parts(openmetrics, names)
        live = [m for m in self._live() if names is None or any(s.name in names for s in m.samples)]
        parts.append(Part(encode(Fixed(live), openmetrics)))
        return parts

    def _live(self) -> Iterator[Metric]:
        """Targets, build info, reloads and the loop's numbers: a few series, read at scrape time."""
        yield from target_families(self._targets(), self._target_labels)
        groups = self._groups()
        if groups is not None:
            yield groups
        extra = self._extra()
        yield _info()
        if self._reloads is not None:
            reloads = CounterMetricFamily(
                f"{SELF}_config_reloads",
                "SIGHUP reloads: applied, partial (a part needs a restart), failed.",
                labels=["result"],
            )
            for result, n in self._reloads().items():
                reloads.add_metric([result], n)
            yield reloads
        for name, value in sorted(extra.items()):
            if name.endswith("_total"):
                yield CounterMetricFamily(f"{SELF}_{name[:-6]}", _EXTRA_HELP.get(name, name), value=value)
            else:
                yield _gauge(name, _EXTRA_HELP.get(name, name), value)


_EXTRA_HELP = {
    "state_saves_total": "Successful saves of the state file.",
    "state_errors_total": "Failed loads or saves of the state file (the exporter keeps running).",
    "loop_timestamp_seconds": "When the main loop last completed a pass (a stalled loop stops moving).",
    "pending_events": "Events waiting for their traceback or for other ranks.",
    "busy_sources": "Sources still joining lines or events; a second of quiet closes them (0: caught up).",
    "sources_waiting": "Configured log files that do not exist yet (SGLang not started, or a wrong path).",
    "event_sink_errors_total": "Events that could not be recorded.",
    "numbers_dropped_total": "Numbers in OOM messages out of range (above 2^53), left out of their events.",
    "source_errors_total": "Unexpected errors while reading a source (the loop goes on).",
    "kubernetes_filter_timeouts_total": "Kubernetes filter matches given up at their time limit (counted as no match).",
    "open_files": "Log files open now (at most a bound under the open-file limit; the others are parked).",
    "file_handle_parks_total": "Idle log files closed to stay under the open-file bound, reopened when they change.",
    "open_file_limit_hits_total": "Log file opens refused by the open-file bound or limit (retried; see /healthz).",
}


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{SELF}_{name}", doc, value=value)


def _info() -> GaugeMetricFamily:
    info = GaugeMetricFamily(
        f"{SELF}_build_info", "Version of the exporter; the value is always 1.", labels=["version", "python_version"]
    )
    info.add_metric([__version__, platform.python_version()], 1.0)
    return info
