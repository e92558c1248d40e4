"""The overview dashboard's query filters and its lower sections: SGLang endpoint context, remediation, health.

Part of the dashboard renderer (render/dashboards.py assembles the dashboard and owns its top half). The filter
helpers here are shared by every query: `sel` filters a selector by the dashboard variables, `scoped` keeps a
series without source labels to the exporters that follow the selected sources.
"""

from __future__ import annotations

import re

from ..catalog import OomKind
from . import grafana as g
from .options import RenderOptions, runbook_kind_url
from .promql import Scope

# The dashboards are written with the default cluster label; render moves them to a configured one with
# promql.relabel_cluster (the chart does the same with its clusterLabel value).
CLUSTERED = Scope()
CLUSTER = f'{CLUSTERED.cluster}=~"$cluster"'

# Every series of ours carries either `source` (plain files) or namespace/pod (Kubernetes); the other labels
# are absent, so the variables' All value is ".*" (an absent label is the empty string, which ".+" rejects).
ALL_VALUE = ".*"
SRC = f'{CLUSTER},namespace=~"$namespace",pod=~"$pod",source=~"$source"'
KIND = 'kind=~"$kind"'
BY_SOURCE = CLUSTERED.labels("namespace", "pod", "container", "source")
# The cluster comes last in legends: where the label is absent it leaves only a trailing space.
IN_CLUSTER = f" {{{{{CLUSTERED.cluster}}}}}"
SOURCE_LEGEND = "{{namespace}} {{pod}} {{container}} {{source}}" + IN_CLUSTER
# Series without source labels (the exporter's globals, the mirrored SGLang endpoint values) are narrowed to
# the exporter instances that follow the selected sources: in sidecar mode that is the selected pod's endpoint.
SCOPE = (
    f"{CLUSTERED.on('job', 'instance')} group {CLUSTERED.by('job', 'instance')} "
    f"(sglang_oom_exporter_file_lag_bytes{{{SRC}}})"
)
_BARE_METRIC = re.compile(r"\b(sglang_oom_[a-z_]+)\b(?!\{)")


def sel(metric: str, *, kind: bool = True, extra: str = "") -> str:
    """A selector filtered by the dashboard's variables (kind only where the metric has that label)."""
    matchers = [KIND] if kind else []
    matchers += [extra] if extra else []
    return f"{metric}{{{','.join([*matchers, SRC])}}}"


def scoped(expr: str) -> str:
    """An expression over series without source labels, kept to the selected cluster and the exporters following
    the selected sources."""
    return f"{_BARE_METRIC.sub(lambda m: f'{m.group(1)}{{{CLUSTER}}}', expr)} and {SCOPE}"


def by_cluster(agg: str, labels: tuple[str, ...], expr: str) -> str:
    """`agg by (<cluster>, labels...) (expr)`, expr kept to the selected cluster and sources' exporters."""
    return f"{agg} {CLUSTERED.by(*labels)} ({scoped(expr)})"


# Per endpoint and PD role: SGLang's engine_type (prefill | decode | unified) tells a PD pair apart.
PER_ROLE = ("target", "engine_type")
ROLE = "{{target}} {{engine_type}}"

# The near-full alert's "used": what an allocation cannot get back, plus what PD transfers were promised.
_IN_USE_OR_PROMISED = (
    "1 - (sglang_oom_target_kv_available_tokens + sglang_oom_target_kv_evictable_tokens) "
    "/ sglang_oom_target_max_total_tokens "
    "+ (sglang_oom_target_pending_prealloc_token_usage or sglang_oom_target_kv_available_tokens * 0)"
)


def _per_target(expr: str) -> str:
    """Per SGLang endpoint, with SGLang's engine_type (prefill | decode | unified) where it gives one: a PD
    pair's two servers are told apart in the legend ("{{target}} decode")."""
    return f"max {CLUSTERED.by(*PER_ROLE)} ({scoped(expr)})"


# What the mirrored panels need: without an endpoint they are empty, which is no sign that all is well.
_NEEDS_TARGET = (
    "Needs an SGLang endpoint the exporter scrapes (--sglang-url, targets: or Kubernetes discovery); empty without "
    "one. An endpoint that stops answering leaves at its first failed scrape: its lines end at the last good one, "
    "never a dead server's numbers shown as live."
)


def context_panels() -> list[tuple[g.Json, int, int]]:
    """The mirrored SGLang endpoint values that show the pressure before an OOM (the events are annotations)."""
    usage = g.timeseries(
        "KV cache token usage",
        "SGLang's token usage per endpoint (used, not evictable, over the pool; worst rank). Near 100% just "
        "before an OOM (red marks) means the pool was full: lower the batch (--max-running-requests, "
        '--chunked-prefill-size) or give the pool more memory. "in use or promised" is what the near-full '
        "alert reads: 1 - (free + evictable) / pool from SGLang 0.5.16's gauges, plus on a PD decode server the "
        "share promised to transfers not yet pre-allocated. " + _NEEDS_TARGET,
        g.targets(
            (_per_target("sglang_oom_target_token_usage"), ROLE + IN_CLUSTER),
            (_per_target(f"({_IN_USE_OR_PROMISED})"), ROLE + " in use or promised" + IN_CLUSTER),
        ),
        g.field_config("percentunit", min=0, max=1, steps=g.thresholds(g.GREEN, (0.9, g.ORANGE), (0.98, g.RED))),
    )
    usage["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"] = {"mode": "line"}
    tokens = g.timeseries(
        "KV tokens: used vs pool",
        "KV tokens in use against the pool's capacity (max_total_num_tokens) per endpoint, and what an allocation "
        "could still get: free plus evictable prefix cache (SGLang 0.5.16+). A small pool relative to "
        "context_length makes every long request risky. " + _NEEDS_TARGET,
        g.targets((_per_target("sglang_oom_target_used_tokens"), ROLE + " used" + IN_CLUSTER),
                  (_per_target("sglang_oom_target_max_total_tokens"), ROLE + " pool" + IN_CLUSTER),
                  (_per_target("(sglang_oom_target_kv_available_tokens + sglang_oom_target_kv_evictable_tokens)"),
                   ROLE + " free + evictable" + IN_CLUSTER)),
        g.field_config("short"),
    )  # fmt: skip
    requests = g.timeseries(
        "Running and queued requests",
        "Requests in the running batch and waiting in the queue per endpoint. A running batch that keeps growing "
        "until an OOM says --max-running-requests is too high for the pool. " + _NEEDS_TARGET,
        g.targets((_per_target("sglang_oom_target_running_requests"), ROLE + " running" + IN_CLUSTER),
                  (_per_target("sglang_oom_target_queued_requests"), ROLE + " queued" + IN_CLUSTER)),
        g.field_config("short"),
    )  # fmt: skip
    retracted = g.timeseries(
        "Retracted requests",
        "Requests retracted to free KV slots, per second: from the SGLang endpoint's own counter (0.5.8+) and "
        "from the retraction lines in the logs (every version). Sustained retractions are the warning before a "
        "decode OOM: raise --schedule-conservativeness or lower --max-running-requests. The logs' series needs "
        "nothing more; the endpoint's needs an SGLang endpoint the exporter scrapes (--sglang-url, targets: or "
        "Kubernetes discovery).",
        g.targets(
            (by_cluster("sum", PER_ROLE, "rate(sglang_oom_target_retracted_requests_total[$__rate_interval])"),
             ROLE + " (endpoint)" + IN_CLUSTER),
            (f"sum by ({BY_SOURCE}) (rate({sel('sglang_oom_retracted_requests_total', kind=False)}"
             "[$__rate_interval]))", f"{SOURCE_LEGEND} (logs)"),
        ),
        g.field_config("reqps"),
    )  # fmt: skip
    aborted = g.timeseries(
        "Aborted requests",
        "Requests the SGLang endpoint aborted, per second (SGLang 0.4.8+). A burst at an OOM mark is the "
        "user-visible damage: those requests failed. " + _NEEDS_TARGET,
        [g.target(by_cluster("sum", PER_ROLE, "rate(sglang_oom_target_aborted_requests_total[$__rate_interval])"),
                  ROLE + IN_CLUSTER)],
        g.field_config("reqps"),
    )  # fmt: skip
    startup = g.timeseries(
        "GPU memory split at start-up",
        "How the last start divided one GPU, in GB as SGLang reports them (SGLang main of 2026-08+): the memory left "
        "over (the tightest GPU; the tuning guide wants 5-8 GB, and a startup OOM means it ran out), and the largest "
        "GPU's weights, captured graphs and KV pool. " + _NEEDS_TARGET,
        g.targets((_per_target("sglang_oom_target_startup_available_gpu_memory_gb"), ROLE + " left" + IN_CLUSTER),
                  (_per_target("sglang_oom_target_weight_memory_gb"), ROLE + " weights" + IN_CLUSTER),
                  (_per_target("sglang_oom_target_graph_memory_gb"), ROLE + " graphs" + IN_CLUSTER),
                  (_per_target("sglang_oom_target_kv_cache_memory_gb"), ROLE + " KV pool" + IN_CLUSTER)),
        g.field_config("gbytes", min=0),
    )  # fmt: skip
    host = g.timeseries(
        "HiCache host pool and eviction",
        "The hierarchical cache's host pools in use over their capacity, KV tokens and a hybrid-SSM model's mamba "
        "states (near 100%: host-pool retraction has no room and aborts requests), and per second the device KV "
        "tokens evicted, dropped without a host backup because host memory was short, evicted before their "
        "write-through reached host memory (lost, but write-through lagging, not host memory), prefetches given "
        "up because a host pool could not allocate, and storage hits not prefetched for want of host or device "
        "room (SGLang main of 2026-08+, the mamba pool, write-through and storage series 0.5.23+; only with "
        "--enable-hierarchical-cache). " + _NEEDS_TARGET,
        g.targets(
            (_per_target("(sglang_oom_target_hicache_host_used_tokens / sglang_oom_target_hicache_host_total_tokens)"),
             ROLE + " host pool used" + IN_CLUSTER),
            (_per_target("(sglang_oom_target_hicache_host_mamba_used_states "
                         "/ sglang_oom_target_hicache_host_mamba_total_states)"),
             ROLE + " host mamba pool used" + IN_CLUSTER),
            (by_cluster("sum", PER_ROLE, "rate(sglang_oom_target_evicted_tokens_total[$__rate_interval])"),
             ROLE + " evicted/s" + IN_CLUSTER),
            (by_cluster("sum", PER_ROLE, "rate(sglang_oom_target_hicache_dropped_tokens_total[$__rate_interval])"),
             ROLE + " dropped for host memory/s" + IN_CLUSTER),
            (by_cluster("sum", PER_ROLE,
                        "rate(sglang_oom_target_hicache_unbacked_evicted_tokens_total[$__rate_interval])"),
             ROLE + " evicted before write-through/s" + IN_CLUSTER),
            (by_cluster("sum", PER_ROLE,
                        "rate(sglang_oom_target_hicache_prefetch_alloc_failed_tokens_total[$__rate_interval])"),
             ROLE + " prefetch failed/s" + IN_CLUSTER),
            (by_cluster("sum", PER_ROLE,
                        "rate(sglang_oom_target_storage_prefetch_host_capacity_tokens_total[$__rate_interval])"),
             ROLE + " prefetch without host room/s" + IN_CLUSTER),
            (by_cluster("sum", PER_ROLE,
                        "rate(sglang_oom_target_storage_prefetch_device_capacity_tokens_total[$__rate_interval])"),
             ROLE + " prefetch without device room/s" + IN_CLUSTER),
        ),
        g.field_config("short", min=0),
    )  # fmt: skip
    pd_pool = g.timeseries(
        "PD decode: KV pool held for transfers",
        "On a PD decode server, the share of the KV pool promised to incoming transfers and not yet pre-allocated "
        "(SGLang 0.5.4+), and the share already pre-allocated to requests whose transfer is still pending, for the "
        "full-attention pool and a hybrid model's SWA pool (0.5.23+; same basis as the pools' token usage). A PD "
        "pre-allocation OOM (KV cache is full, SWA eviction insufficient) follows these shares crowding out the "
        "running batch: lower --max-running-requests on the decode server. " + _NEEDS_TARGET,
        g.targets((_per_target("sglang_oom_target_pending_prealloc_token_usage"), ROLE + " promised" + IN_CLUSTER),
                  (_per_target("sglang_oom_target_prealloc_full_token_usage"),
                   ROLE + " pre-allocated, full" + IN_CLUSTER),
                  (_per_target("sglang_oom_target_prealloc_swa_token_usage"),
                   ROLE + " pre-allocated, SWA" + IN_CLUSTER)),
        g.field_config("percentunit", min=0, max=1),
    )  # fmt: skip
    pd_queues = g.timeseries(
        "PD decode: transfer queues",
        "On a PD decode server, requests waiting for their KV pre-allocation, in transfer, receiving into host "
        "memory or waiting there for device room (0.5.23+), and failed requests whose KV stays allocated until "
        "their transfer drains or times out (0.5.23+): KV the running batch cannot use. " + _NEEDS_TARGET,
        g.targets((_per_target("sglang_oom_target_decode_prealloc_queue_requests"),
                   ROLE + " pre-allocation" + IN_CLUSTER),
                  (_per_target("sglang_oom_target_decode_transfer_queue_requests"), ROLE + " transfer" + IN_CLUSTER),
                  (_per_target("sglang_oom_target_decode_host_receive_queue_requests"),
                   ROLE + " host receive" + IN_CLUSTER),
                  (_per_target("sglang_oom_target_decode_deferred_kv_release_requests"),
                   ROLE + " failed, KV held" + IN_CLUSTER)),
        g.field_config("short", min=0),
    )  # fmt: skip
    return [(usage, 8, 8), (tokens, 8, 8), (requests, 8, 8), (retracted, 12, 8), (aborted, 12, 8), (startup, 12, 8),
            (host, 12, 8), (pd_pool, 12, 8), (pd_queues, 12, 8)]  # fmt: skip


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def remediation_panel(kind: OomKind, options: RenderOptions) -> g.Json:
    """One kind's remediation from the catalog as a markdown panel, linking to its runbook section."""
    url = runbook_kind_url(options, kind.id)
    fatal = {"true": "yes", "false": "no (the server survives)", "raised": "when raised"}.get(kind.fatal, kind.fatal)
    lines = [
        f"**{kind.title}.** Fatal: {fatal}. Alert severity: {kind.severity}.",
        "",
        kind.summary,
        "",
        "| # | flag | action | when |",
        "|---|---|---|---|",
        *(f"| {i} | `{_cell(s.flag)}` | {_cell(s.action)} | {_cell(s.when)} |" for i, s in enumerate(kind.steps, 1)),
        "",
        f"[Runbook section `{kind.id}`]({url})",
    ]
    return g.text(
        kind.id,
        f"What the OOM catalog says to change after a {kind.id} event, safest step first; the same text as the "
        "runbook section this panel links to.",
        "\n".join(lines),
        [g.link(f"Runbook: {kind.id}", url)],
    )


def health_panels() -> list[tuple[g.Json, int, int]]:
    """The exporter's own health: whether it can see OOMs at all."""
    files = g.timeseries(
        "Files followed",
        "Log files each exporter instance follows. A drop to 0 means it lost its logs (wrong glob or hostPath, "
        "pods gone): no OOM can be counted.",
        [
            g.target(
                by_cluster("sum", ("instance",), "sglang_oom_exporter_files_watched"),
                "{{instance}}" + IN_CLUSTER,
            )
        ],
        g.field_config("short", decimals=0),
    )
    lag = g.timeseries(
        "Bytes behind",
        "Bytes written to the logs but not read yet, per source. Growing: the exporter cannot keep up, and "
        "events reach Prometheus late.",
        [g.target(f"sum by ({BY_SOURCE}) ({sel('sglang_oom_exporter_file_lag_bytes', kind=False)})",
                  SOURCE_LEGEND)],
        g.field_config("bytes"),
    )  # fmt: skip
    errors = g.timeseries(
        "Read and state errors",
        "Errors opening or reading log files (permission denied...) per source, and failed loads or saves of the "
        "state file per instance, per $__rate_interval window. Any is worth a look: read errors hide OOMs, state "
        "errors risk recounting them after a restart.",
        g.targets(
            (f"sum by ({BY_SOURCE}) (increase({sel('sglang_oom_exporter_read_errors_total', kind=False)}"
             "[$__rate_interval]))", f"read: {SOURCE_LEGEND}"),
            (by_cluster("sum", ("instance",), "increase(sglang_oom_exporter_state_errors_total[$__rate_interval])"),
             "state: {{instance}}" + IN_CLUSTER),
        ),
        g.field_config("short", decimals=0),
    )  # fmt: skip
    pending = g.timeseries(
        "Pending events",
        "Events waiting for other ranks (0.15 s) or, for the generic 0.5.4+ 'Out of memory' text, for the "
        "traceback that names the phase (normally 0 or briefly 1). Stuck above 0 for seconds: a generic block's "
        "traceback never arrived; it counts as unknown after --traceback-wait.",
        [
            g.target(
                by_cluster("sum", ("instance",), "sglang_oom_exporter_pending_events"),
                "{{instance}}" + IN_CLUSTER,
            )
        ],
        g.field_config("short", decimals=0),
    )
    scrape = g.timeseries(
        "SGLang scrape errors by reason",
        "Failed scrapes of the SGLang endpoints' /metrics and /server_info per $__rate_interval window, by "
        "reason (refused, timeout, http_status, not_metrics...). Empty when every scrape worked. /metrics "
        "errors cost events their KV context; /server_info errors cost them the flag changes that start from the "
        "server's current values.",
        g.targets(
            (f"sum {CLUSTERED.by('target', 'reason')} "
             f"({scoped('increase(sglang_oom_target_scrape_errors_total[$__rate_interval])')}) > 0",
             "{{target}} /metrics {{reason}}" + IN_CLUSTER),
            (f"sum {CLUSTERED.by('target', 'reason')} "
             f"({scoped('increase(sglang_oom_target_server_info_errors_total[$__rate_interval])')}) > 0",
             "{{target}} /server_info {{reason}}" + IN_CLUSTER),
        ),
        g.field_config("short", decimals=0),
    )  # fmt: skip
    loop = g.timeseries(
        "Main loop age",
        "Seconds since each exporter's main loop last completed a pass. Above a minute the loop is stalled and "
        "/healthz fails: events are not being counted.",
        [g.target(f"time() - max {CLUSTERED.by('instance')} ({scoped('sglang_oom_exporter_loop_timestamp_seconds')})",
                  "{{instance}}" + IN_CLUSTER)],
        g.field_config("s", steps=g.thresholds(g.GREEN, (60, g.RED))),
    )  # fmt: skip
    return [(files, 8, 7), (lag, 8, 7), (errors, 8, 7), (pending, 8, 7), (scrape, 8, 7), (loop, 8, 7)]
