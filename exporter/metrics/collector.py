"""The scrape-time collector: event families, per-source read statistics, targets and the exporter's health."""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import __version__
from ..sources.fileid import RESET_REASONS
from ..sources.http import REASONS as SCRAPE_REASONS
from .events import EventCounts
from .names import NAMESPACE, SELF, Labels


@dataclass(slots=True)
class SourceStats:
    """Read statistics of one source (summed over the files that share its labels)."""

    labels: Labels
    files: int = 0
    bytes_read: float = 0.0
    lines_read: float = 0.0
    records: float = 0.0
    matched_records: float = 0.0
    read_errors: float = 0.0
    oversized_lines: float = 0.0
    lag_bytes: float = 0.0
    last_read: float | None = None
    resets: dict[str, float] = field(default_factory=lambda: dict.fromkeys(RESET_REASONS, 0.0))


class TargetView(Protocol):
    """What the collector reads of one scraped SGLang endpoint (sources/scrape.TargetScraper)."""

    url: str

    @property
    def up(self) -> bool: ...
    @property
    def duration(self) -> float: ...
    @property
    def errors_total(self) -> Mapping[str, int]: ...
    @property
    def info_errors_total(self) -> Mapping[str, int]: ...
    def snapshot_values(self) -> Mapping[str, float]: ...
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
}
SERVER_ARGS = ("chunked_prefill_size", "max_prefill_tokens", "max_running_requests", "mem_fraction_static",
               "page_size", "context_length", "max_total_num_tokens", "speculative_num_draft_tokens",
               "schedule_conservativeness", "cuda_graph_max_bs")  # fmt: skip


def target_families(targets: Iterable[TargetView]) -> Iterator[Metric]:
    """Health and mirrored KV values of every scraped SGLang endpoint."""
    targets = list(targets)
    up = GaugeMetricFamily(f"{NAMESPACE}_target_up", "1 when the last scrape of the SGLang endpoint worked.",
                           labels=["target"])  # fmt: skip
    duration = GaugeMetricFamily(f"{NAMESPACE}_target_scrape_duration_seconds", "How long the last scrape took.",
                                 labels=["target"])  # fmt: skip
    errors = CounterMetricFamily(f"{NAMESPACE}_target_scrape_errors", "Failed scrapes, by reason.",
                                 labels=["target", "reason"])  # fmt: skip
    info_errors = CounterMetricFamily(f"{NAMESPACE}_target_server_info_errors", "Failed /server_info fetches.",
                                      labels=["target", "reason"])  # fmt: skip
    args = GaugeMetricFamily(f"{NAMESPACE}_target_server_arg", "Numeric SGLang server args from /server_info.",
                             labels=["target", "arg"])  # fmt: skip
    values: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
    for key, (name, typ, doc) in TARGET_VALUES.items():
        family = CounterMetricFamily if typ == "counter" else GaugeMetricFamily
        values[key] = family(f"{NAMESPACE}_target_{name}", doc, labels=["target"])
    for t in targets:
        up.add_metric([t.url], 1.0 if t.up else 0.0)
        duration.add_metric([t.url], t.duration)
        for reason in SCRAPE_REASONS:
            errors.add_metric([t.url, reason], float(t.errors_total.get(reason, 0)))
            info_errors.add_metric([t.url, reason], float(t.info_errors_total.get(reason, 0)))
        for key, value in t.snapshot_values().items():
            if key in values:
                values[key].add_metric([t.url], value)
        for arg, value in t.server_args().items():
            if arg in SERVER_ARGS and isinstance(value, int | float) and not isinstance(value, bool):
                args.add_metric([t.url, arg], float(value))
    if targets:
        yield from (up, duration, errors, info_errors, args, *values.values())


class ExporterCollector(Collector):
    """Yields the event families and the exporter's own health at scrape time."""

    def __init__(
        self,
        counts: EventCounts,
        sources: Callable[[], Iterable[SourceStats]],
        extra: Callable[[], Mapping[str, float]] = dict,
        targets: Callable[[], Iterable[TargetView]] = list,
        reloads: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        self._reloads = reloads
        self._counts = counts
        self._sources = sources
        self._extra = extra
        self._targets = targets

    def describe(self) -> Iterable[Metric]:
        """Nothing up front: the registry then never calls collect() at registration."""
        return []

    def collect(self) -> Iterator[Metric]:
        """One scrape."""
        yield from self._counts.families()
        yield from self._source_families(list(self._sources()))
        yield from target_families(self._targets())
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

    def _source_families(self, stats: list[SourceStats]) -> Iterator[Metric]:
        names = list(self._counts.label_names)
        files = GaugeMetricFamily(
            f"{SELF}_files_watched", "Log files being followed.", value=sum(s.files for s in stats)
        )
        fams: dict[str, CounterMetricFamily | GaugeMetricFamily] = {
            "bytes": CounterMetricFamily(f"{SELF}_read_bytes", "Bytes read from the logs.", labels=names),
            "lines": CounterMetricFamily(f"{SELF}_lines_read", "Lines read from the logs.", labels=names),
            "records": CounterMetricFamily(
                f"{SELF}_records", "Log records (blocks, tracebacks, lines) near an anchor, assembled.", labels=names
            ),
            "matched": CounterMetricFamily(
                f"{SELF}_matched_records", "Records the catalog classified as an OOM report (before dedupe).",
                labels=names,
            ),
            "errors": CounterMetricFamily(
                f"{SELF}_read_errors", "Errors opening or reading log files.", labels=names
            ),
            "oversized": CounterMetricFamily(
                f"{SELF}_oversized_lines", "Lines longer than the line limit, cut.", labels=names
            ),
            "resets": CounterMetricFamily(
                f"{SELF}_file_resets", "Rotations, truncations, re-creations and deletions seen.",
                labels=[*names, "reason"],
            ),
            "lag": GaugeMetricFamily(
                f"{SELF}_file_lag_bytes", "Bytes written to the logs but not read yet.", labels=names
            ),
            "last": GaugeMetricFamily(
                f"{SELF}_last_read_timestamp_seconds", "When new bytes were last read.", labels=names
            ),
        }  # fmt: skip
        for s in stats:
            labels = list(s.labels)
            fams["bytes"].add_metric(labels, s.bytes_read)
            fams["lines"].add_metric(labels, s.lines_read)
            fams["records"].add_metric(labels, s.records)
            fams["matched"].add_metric(labels, s.matched_records)
            fams["errors"].add_metric(labels, s.read_errors)
            fams["oversized"].add_metric(labels, s.oversized_lines)
            fams["lag"].add_metric(labels, s.lag_bytes)
            for reason in RESET_REASONS:
                fams["resets"].add_metric([*labels, reason], s.resets.get(reason, 0.0))
            if s.last_read is not None:
                fams["last"].add_metric(labels, s.last_read)
        yield files
        yield from fams.values()


_EXTRA_HELP = {
    "state_saves_total": "Successful saves of the state file.",
    "state_errors_total": "Failed loads or saves of the state file (the exporter keeps running).",
    "loop_timestamp_seconds": "When the main loop last completed a pass (a stalled loop stops moving).",
    "pending_events": "Events waiting for their traceback or for other ranks.",
    "busy_sources": "Sources still joining lines or events; a second of quiet closes them (0: caught up).",
    "sources_waiting": "Configured log files that do not exist yet (SGLang not started, or a wrong path).",
    "event_sink_errors_total": "Events that could not be recorded.",
    "source_errors_total": "Unexpected errors while reading a source (the loop goes on).",
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
