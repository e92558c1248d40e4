"""Render, the runbook pages of the pack alerts (crash loop, KV near full and the exporter guards), which are
not one per kind: their Meaning, Impact and Mitigation are written here, about the exporter and the pack itself.
"""

from __future__ import annotations

from ..catalog import Catalog
from .alertspec import AlertSpec
from .options import RenderOptions
from .runbook_parts import PORT, dashboard_note, find_exporter, labels_note, page, series_note

# What each pack alert (not one per kind) means, in the runbook's four parts. Kind alerts take theirs from
# the catalog; these describe the exporter and the pack itself.
_PACK_TEXT: dict[str, dict[str, str]] = {
    "crash_loop": {
        "meaning": "The same SGLang server had several fatal out-of-memory errors within the window: it restarts, "
        "runs out of memory again under the same load, and restarts again.",
        "impact": "Every crash fails all in-flight requests and drops the prefix cache; while it loops, the server "
        "is mostly unavailable and its restarts add load to the other replicas.",
        "mitigation": "Apply the fix of the kind that keeps failing (its own alert and runbook name the flag and a "
        "value computed from the event). Until the new flags are rolled out, consider taking the server out of "
        "rotation or scaling out, so one crash-looping replica does not carry traffic.",
    },
    "kv_near_full": {
        "meaning": "SGLang reports that its KV cache (the GPU memory holding every running request's tokens) has "
        'stayed almost completely used. "Used" is what cannot be had back: 1 - (free + evictable) / capacity '
        "from SGLang 0.5.16's `kv_available_tokens`, `kv_evictable_tokens` and `max_total_num_tokens` (evictable "
        "prefix cache is reclaimable, so it counts as free), or SGLang's `token_usage` (every release; the worst "
        "rank and pool, so with DP attention the fullest group), whichever is higher. On a PD decode server the "
        "share of the pool already promised to incoming transfers (`pending_prealloc_token_usage`) counts as used "
        "too. The exporter mirrors these from SGLang's /metrics, under either spelling of their names (`sglang:` "
        "or the escaped `sglang_`).",
        "impact": "Nothing failed yet. New requests queue, running ones get retracted and recomputed, and the next "
        "large prefill or decode step may fail with a fatal OOM.",
        "mitigation": "Admit less work per server or give the KV cache more room: lower `--max-running-requests` "
        "or `--chunked-prefill-size`, raise `--mem-fraction-static` if the startup log shows spare GPU memory "
        "(5-8 GB of available_gpu_mem is the tuning guide's mark), or add replicas.",
    },
    "exporter_down": {
        "meaning": "Prometheus cannot scrape the SGLang OOM exporter, or has no scrape target for it at all. "
        "Without it, no OOM alert can fire.",
        "impact": "No user impact by itself, but OOMs on the servers it watches go unnoticed until it is back "
        "(with --state-dir, OOMs logged meanwhile are counted when it returns).",
        "mitigation": "Restart or fix the exporter (a crash, an OOM-killed pod, a bad config: run "
        "`sglang-oom-exporter serve --config FILE --check-config`). If the target is missing, check the "
        "scrape job name (`job` must be `{job}`), the ServiceMonitor or PodMonitor labels that Prometheus "
        "selects (kube-prometheus-stack wants `release: <its release>`), and the Service's port.",
    },
    "exporter_no_logs": {
        "meaning": "An SGLang server runs where the exporter reads none of its logs, so its OOMs cannot be "
        "counted. It fires on: an SGLang server container (kube-state-metrics) on the node of an exporter that "
        "follows no SGLang source, a wrong hostPath or log root (the alert names the node and the exporter pod); "
        "an SGLang endpoint the exporter scrapes answering (`sglang_oom_target_up == 1`) while it follows no "
        "SGLang source; a log file it was given missing for a whole window; SGLang running requests "
        "(`sglang_oom_target_running_requests`) while its followed logs gave no line for a whole window; or "
        "SGLang servers in the cluster while no exporter of the job follows any (none runs on their nodes).\n\n"
        "It never fires on the exporter's own pods, SGLang router or gateway pods, a fresh cluster without an "
        "SGLang server, a node without one, or an idle server: SGLang logs nothing without requests, so silence "
        "counts only while it runs some. A server image is one whose `image` matches the catalog's "
        "`alert_pack.exporter_no_logs.server_images` (by default any name with `sglang`) and not its "
        "`excluded_images` (by default the exporter, `sglang-router`, `sglang-model-gateway`); the exporter's "
        "own container is also left out by the `exporter_namespace`/`exporter_pod`/`exporter_container` labels "
        "the chart's monitors give its `up`. The recording rules before the alert hold each finding: "
        "`node:sglang_oom_sglang_server_containers:count`, `exporter_pod:kube_pod_info:relabel`, "
        "`instance:sglang_oom_unread_sglang:count`, `job:sglang_oom_unread_sglang:count`, "
        "`instance:sglang_oom_exporter_sources_waiting:min_over_time1h` and "
        "`instance:sglang_oom_busy_sglang_silence:seconds`.\n\n"
        "At `--log-level info` a busy SGLang server writes `Decode batch` and `Prefill batch` lines every few "
        "seconds; at `--log-level warning` those INFO lines vanish, so a busy server logs almost nothing. The "
        "silence finding therefore needs evidence that the log is written at info level (new lines at 60 or "
        "more evaluations within a day) and stays quiet for a server run at warning level; such a server's "
        "broken log path is then seen only by the other findings. A configured file that does not exist yet "
        "is normal while SGLang starts (`/healthz` says so), so it waits a full window before the alert starts "
        "its `for`: with the defaults it warns 75 minutes after the file was first missed.",
        "impact": "No user impact by itself; OOMs on the unread servers never alert.",
        "mitigation": "Fix the paths: the glob or file names in its config, `--kubernetes-logs` pointing at the "
        "node's pod-log directory (usually /var/log/pods, mounted read-only; `daemonset.logsHostPath` and "
        "`daemonset.extraLogHostPaths` in the chart), the namespace/pod/container filters, and file permissions. "
        "When no exporter runs on the SGLang nodes, check the chart's placement (`gpuNodes`, `nodeSelector`, "
        "`affinity`, `tolerations`) against the nodes' labels and taints. A file it waits for (named in "
        "`/healthz`) belongs to an SGLang server that never started or logs elsewhere: start it, fix its path, "
        "or remove it from the config (SIGHUP reloads it). If an image that is not an SGLang server warns (a "
        "custom router or proxy), or a server image is not seen (a name without `sglang`), set the patterns "
        "(RE2, matched against the whole image) with `render --overrides`: `alerts: {SGLangOOMExporterNoLogs: "
        "{server_images: '...', excluded_images: '...'}}`.",
    },
    "target_down": {
        "meaning": "The exporter cannot scrape the SGLang endpoint (`--sglang-url`) it reads KV usage and server "
        "arguments from.",
        "impact": "OOMs are still counted from the logs, but their alerts carry only the generic fix instead of "
        "concrete flag values, and the KV near-full warning is blind for this server. Its mirrored "
        "`sglang_oom_target_*` values left `/metrics` at the first failed scrape, so the dashboard's KV panels "
        "show nothing for it rather than a dead server's last numbers; "
        "`time() - sglang_oom_target_last_success_timestamp_seconds` is how long it has not answered.",
        "mitigation": "Start SGLang with `--enable-metrics`, check the URL and port in `--sglang-url` or the "
        "config's `targets:`, and network policy between the exporter and SGLang. A server that is restarting "
        "after an OOM is unreachable for a while; that is expected and resolves on its own.",
    },
    "state_errors": {
        "meaning": "The exporter could not write its state file, or found it unreadable or corrupt at start. The "
        "state file is how a restarted exporter neither loses nor recounts an OOM.\n\nOne error is enough to "
        "warn: a corrupt state at start has already cost counts, and a save that failed on a full or read-only "
        "disk fails again at every interval (each attempt is counted). The alert resolves one window after the "
        "last error; while saves keep failing, `/healthz` also says so.",
        "impact": "No user impact now. After a corrupt state it started like a first run (old OOMs not counted "
        "again, but OOMs logged while it was down may be missed); if saves keep failing, its next restart will.",
        "mitigation": "Give `--state-dir` space and write permission (the chart mounts a small hostPath), then "
        "check the exporter's log for the reason. A moved-aside `state.json.corrupt-<time>` can be deleted once "
        "read.",
    },
}

# Which series and pages each pack alert's diagnosis points at.
_PACK_SERIES = {
    "crash_loop": ["sglang_oom_fatal_events_total", "sglang_oom_last_event_timestamp_seconds"],
    "kv_near_full": [
        "sglang_oom_target_token_usage",
        "sglang_oom_target_kv_available_tokens",
        "sglang_oom_target_kv_evictable_tokens",
        "sglang_oom_target_max_total_tokens",
        "sglang_oom_target_pending_prealloc_token_usage",
        "sglang_oom_target_decode_prealloc_queue_requests",
        "sglang_oom_target_running_requests",
        "sglang_oom_target_queued_requests",
    ],
    "exporter_down": ["up", "sglang_oom_exporter_build_info"],
    "exporter_no_logs": [
        "instance:sglang_oom_unread_sglang:count",
        "sglang_oom_exporter_sglang_sources",
        "sglang_oom_exporter_files_watched",
        "sglang_oom_exporter_sources_waiting",
        "sglang_oom_exporter_lines_read_total",
        "sglang_oom_exporter_read_errors_total",
        "sglang_oom_exporter_last_read_timestamp_seconds",
        "sglang_oom_target_running_requests",
    ],
    "target_down": [
        "sglang_oom_target_up",
        "sglang_oom_target_scrape_errors_total",
        "sglang_oom_target_last_success_timestamp_seconds",
    ],
    "state_errors": ["sglang_oom_exporter_state_errors_total", "sglang_oom_exporter_state_saves_total"],
}


def pack_page(spec: AlertSpec, catalog: Catalog, options: RenderOptions) -> str:
    """The page of one pack alert."""
    job = str(catalog.alert_pack["job"])
    text = _PACK_TEXT[spec.role]
    if spec.role == "crash_loop":
        commands = (
            "```sh\n"
            + find_exporter(job)
            + f"curl -s 'http://127.0.0.1:{PORT}/events?limit=50' | jq '.events[] | select(.fatal) | "
            "{time, kind, labels, suggestions}'\n"
            "kubectl get pod -n NAMESPACE POD   # RESTARTS\n"
            "kubectl logs -n NAMESPACE POD -c CONTAINER --previous | sglang-oom-exporter scan -\n```\n"
        )
    elif spec.role == "kv_near_full":
        commands = (
            "```sh\n# The exporter's mirror of SGLang's KV state (sidecar mode: the exporter runs in the SGLang pod):\n"
            f"kubectl port-forward -n NAMESPACE pod/POD {PORT} &\n"
            f"curl -s http://127.0.0.1:{PORT}/metrics | grep -E "
            "'^sglang_oom_target_(token_usage|kv_|max_total|pending_prealloc|decode_prealloc|running|queued)'\n"
            "# SGLang's own view (start it with --enable-metrics), from a pod that reaches it:\n"
            "curl -s http://SGLANG_HOST:30000/metrics | grep -E "
            "'token_usage|kv_(available|evictable)_tokens|prealloc|num_running_reqs|num_queue_reqs'\n"
            "kubectl logs -n NAMESPACE POD -c CONTAINER --since=15m | grep -E 'token usage|Retract'\n```\n"
        )
    elif spec.role in ("exporter_down", "exporter_no_logs", "state_errors", "target_down"):
        commands = (
            "```sh\n"
            f"kubectl get pods -A -l app.kubernetes.io/name={job} -o wide\n"
            "kubectl logs -n EXPORTER_NAMESPACE EXPORTER_POD --tail=100\n"
            f"kubectl port-forward -n EXPORTER_NAMESPACE pod/EXPORTER_POD {PORT} &\n"
            f"curl -s http://127.0.0.1:{PORT}/healthz; echo\n"
            f"curl -s http://127.0.0.1:{PORT}/metrics | grep -E '^sglang_oom_(exporter|target)_'\n"
            "# Plain hosts: the same curls against EXPORTER_HOST, and the service's journal or log.\n```\n"
        )
    else:  # pragma: no cover - every pack role is listed above
        raise ValueError(spec.role)
    diagnosis = (
        _pack_labels(spec) + commands + "\n" + series_note(_PACK_SERIES[spec.role]) + "\n" + dashboard_note(options)
    )
    return page(spec, text["meaning"], text["impact"], diagnosis, text["mitigation"].replace("{job}", job))


def _pack_labels(spec: AlertSpec) -> str:
    if spec.role == "crash_loop":
        return labels_note()
    if spec.role == "kv_near_full":
        return (
            "The alert's `target` label is the SGLang URL the exporter scrapes, `instance` the exporter's address, "
            "and `namespace`/`pod` (sidecar mode) the pod both run in.\n\n"
        )
    return "The alert's `instance` label is the exporter's address (host:port of its /metrics).\n\n"
