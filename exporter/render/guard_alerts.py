"""Render, the guard alerts (rule group sglang-oom-exporter): the exporter itself is down, reads no logs,
cannot reach SGLang, or cannot keep its state. A pack that silently cannot fire is worse than none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..config.values import parse_duration
from .alertspec import (
    EXPORTER_DOWN,
    EXPORTER_GROUP,
    NO_LOGS,
    STATE_ERRORS,
    TARGET_DOWN,
    AlertSpec,
    RecordSpec,
    pack_alert,
)
from .promql import Scope, exact_increase, indent

# The exporter's own pod, as the chart's monitors relabel the operator's target labels (templates/_helpers.tpl).
EXPORTER_POD_LABELS = ("exporter_namespace", "exporter_pod")
EXPORTER_POD_TEXT = (
    "{{ if $labels.exporter_pod }} (pod {{ $labels.exporter_namespace }}/{{ $labels.exporter_pod }}){{ end }}"
)


def exporter_down_alert(pack: Mapping[str, Any], scope: Scope) -> AlertSpec:
    """SGLangOOMExporterDown: the target is down, or there is no target at all."""
    up = scope.sel("up")
    # absent() takes its labels from the bare selector's `=` matchers, so the alert keeps job="<job>" (none
    # with a regex job selector). It fires only where no cluster has the target: a ruler over many clusters
    # sees one cluster's absence as `up == 0` only while the target is known (docs/multi-cluster.md).
    expr = f"{up} == 0\nor\nabsent({up})\n"
    description = (
        "{{ if $labels.instance }}Prometheus cannot scrape the SGLang OOM exporter at {{ $labels.instance }}"
        f"{EXPORTER_POD_TEXT}"
        f"{{{{ else }}}}Prometheus has no target with {scope.job_selector} at all{{{{ end }}}} "
        f"(for {pack['exporter_down']['for']}). OOMs on the servers it watches go uncounted until it is back: check "
        f"the exporter pod or process, its logs, and that the scrape job matches {scope.job_selector}."
    )
    summary = "The SGLang OOM exporter is down or not scraped, so no OOM alert can fire."
    return pack_alert(pack, "exporter_down", EXPORTER_DOWN, expr, summary, description)


# The NoLogs records (level:metric:operations). The kube-state-metrics joins: SGLang server containers per
# node, and the node of each exporter pod; then, per exporter, what it should read and does not.
SERVER_CONTAINERS = "node:sglang_oom_sglang_server_containers:count"
EXPORTER_NODES = "exporter_pod:kube_pod_info:relabel"
UNREAD = "instance:sglang_oom_unread_sglang:count"
UNREAD_JOB = "job:sglang_oom_unread_sglang:count"
WAITING = "instance:sglang_oom_exporter_sources_waiting:min_over_time{window}"
LAST_READ = "instance:sglang_oom_exporter_last_read_timestamp_seconds:max"
SILENCE = "instance:sglang_oom_busy_sglang_silence:seconds"
# Evidence that the SGLang logs are written at info level (batch lines every few seconds while busy), so that
# their silence means a broken read: new lines at this many evaluations within this range. A server run at
# --log-level warning writes no batch lines and rarely reaches it, so its quiet busy hours never warn.
INFO_EVIDENCE = ("1d", 60)


def _promql_string(text: str) -> str:
    """text as a double-quoted PromQL string (backslash and quote escaped, as Go's strconv reads them)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _server_containers(pack: Mapping[str, Any], scope: Scope) -> str:
    """node -> the number of SGLang server containers on it (kube-state-metrics): images that match
    server_images and not excluded_images, and never the exporter's own container (the chart's monitors
    keep it as exporter_namespace/exporter_pod/exporter_container; in sidecar mode its pod is SGLang's)."""
    block = pack["exporter_no_logs"]
    include, exclude = _promql_string(str(block["server_images"])), _promql_string(str(block["excluded_images"]))
    containers = f"kube_pod_container_info{{image=~{include}, image!~{exclude}}}"
    own = f"group {scope.by(*EXPORTER_POD_LABELS, 'exporter_container')} ({scope.sel('up')})"
    for label in ("namespace", "pod", "container"):
        own = f'label_replace({own}, "{label}", "$1", "exporter_{label}", "(.+)")'
    return (
        f"count {scope.by('node')} (\n  (\n"
        f"    max {scope.by('namespace', 'pod', 'container')} ({containers})\n"
        f"    unless {scope.on('namespace', 'pod', 'container')}\n    {own}\n  )\n"
        f"  * {scope.on('namespace', 'pod')} group_left (node)\n"
        f'  max {scope.by("namespace", "pod", "node")} (kube_pod_info{{node!=""}})\n)\n'
    )


def _exporter_nodes(scope: Scope) -> str:
    """(exporter_namespace, exporter_pod) -> node: the node each pod runs on, under the exporter's labels."""
    relabelled = 'label_replace(kube_pod_info{node!=""}, "exporter_namespace", "$1", "namespace", "(.+)")'
    relabelled = f'label_replace({relabelled}, "exporter_pod", "$1", "pod", "(.+)")'
    return f"max {scope.by(*EXPORTER_POD_LABELS, 'node')} (\n  {relabelled}\n)\n"


def _unread(scope: Scope) -> str:
    """Per exporter that follows no SGLang source: the SGLang server containers on its node (labelled with
    the node), else the SGLang endpoints it scrapes that answer."""
    exporter = scope.by("job", "instance", *EXPORTER_POD_LABELS)
    none = f"max {exporter} ({scope.sel('sglang_oom_exporter_sglang_sources')}) == 0"
    return (
        f"group {exporter} ({none})\n"
        f"* {scope.on(*EXPORTER_POD_LABELS)} group_left (node) {EXPORTER_NODES}\n"
        f"* {scope.on('node')} group_left () {SERVER_CONTAINERS}\n"
        f"or {scope.on('job', 'instance')}\n"
        f"count {exporter} ({scope.sel('sglang_oom_target_up')} == 1)\n"
        f"and {scope.on('job', 'instance')} ({none})\n"
    )


def _unread_job(scope: Scope) -> str:
    """Per job: the SGLang server containers of the cluster while no exporter of the job follows any SGLang
    source (it runs on none of their nodes)."""
    sources = scope.sel("sglang_oom_exporter_sglang_sources")
    return (
        f"(sum {scope.by('job')} ({sources}) == 0)\n"
        f"+ {scope.on()} group_left ()\nsum {scope.by()} ({SERVER_CONTAINERS})\n"
    )


def _waiting(scope: Scope, window: str) -> str:
    """Per exporter: the fewest named files missing at once over the window, once it has a window of history."""
    waiting = scope.sel("sglang_oom_exporter_sources_waiting")
    exporter = scope.by("job", "instance", *EXPORTER_POD_LABELS)
    return (
        f"max {exporter} (min_over_time({waiting}[{window}]))\n"
        f"and {scope.on('job', 'instance')}\nmax {scope.by('job', 'instance')} ({waiting} offset {window})\n"
    )


def _last_read(scope: Scope) -> str:
    """Per exporter: when it last read a line of any source. Recorded, so that the day-long look back of
    _silence reads one series per exporter, not one per followed file (thousands on a busy node)."""
    last = scope.sel("sglang_oom_exporter_last_read_timestamp_seconds")
    return f"max {scope.by('job', 'instance', *EXPORTER_POD_LABELS)} ({last})\n"


def _silence(scope: Scope, window: str) -> str:
    """Per exporter: seconds since its SGLang logs were last read, where its SGLang ran requests within the
    window and those logs are known to be written at info level (INFO_EVIDENCE)."""
    running = scope.sel("sglang_oom_target_running_requests")
    on = scope.on("job", "instance")
    evidence, count = INFO_EVIDENCE
    return (
        f"time() - {LAST_READ}\n"
        f"and {on}\nmax {scope.by('job', 'instance')} (max_over_time({running}[{window}])) > 0\n"
        f"and {on}\nmax {scope.by('job', 'instance')} (changes({LAST_READ}[{evidence}])) >= {count}\n"
    )


def no_logs_records(pack: Mapping[str, Any], scope: Scope) -> list[RecordSpec]:
    """NoLogs' recording rules, in evaluation order (each reads only those before it)."""
    window = str(pack["exporter_no_logs"]["window"])
    return [
        RecordSpec(SERVER_CONTAINERS, EXPORTER_GROUP, _server_containers(pack, scope)),
        RecordSpec(EXPORTER_NODES, EXPORTER_GROUP, _exporter_nodes(scope)),
        RecordSpec(UNREAD, EXPORTER_GROUP, _unread(scope)),
        RecordSpec(UNREAD_JOB, EXPORTER_GROUP, _unread_job(scope)),
        RecordSpec(WAITING.format(window=window), EXPORTER_GROUP, _waiting(scope, window)),
        RecordSpec(LAST_READ, EXPORTER_GROUP, _last_read(scope)),
        RecordSpec(SILENCE, EXPORTER_GROUP, _silence(scope, window)),
    ]


def no_logs_alert(pack: Mapping[str, Any], scope: Scope) -> AlertSpec:
    """SGLangOOMExporterNoLogs: SGLang runs where an exporter reads none of its logs (no_logs_records).

    Never for what is not an SGLang server (this exporter, a router or gateway), a node or cluster without
    one, or an idle server: SGLang logs nothing without requests, so silence counts only while it runs some.
    """
    window = str(pack["exporter_no_logs"]["window"])
    instance = f"or {scope.on('job', 'instance')}"
    expr = (
        f"{UNREAD}\n{instance} {WAITING.format(window=window)} > 0\n"
        f"{instance} {SILENCE} > {int(parse_duration(window))}\nor {scope.on('job')} {UNREAD_JOB}\n"
    )
    description = (
        "{{ if $labels.instance }}The SGLang OOM exporter at {{ $labels.instance }}"
        + EXPORTER_POD_TEXT
        + "{{ if $labels.node }} follows no log of the SGLang server on node {{ $labels.node }}"
        "{{ else }} reads no SGLang log: an SGLang endpoint it scrapes answers while it follows none, a named "
        f"file is missing for {window}, or SGLang ran requests while its logs gave no line for {window}"
        "{{ end }}{{ else }}SGLang servers run, but no SGLang OOM exporter follows their logs{{ end }}. "
        "Check paths, hostPath, filters, placement and its /healthz."
    )
    summary = "SGLang runs where the OOM exporter reads none of its logs, so its OOMs go unseen."
    return pack_alert(pack, "exporter_no_logs", NO_LOGS, expr, summary, description, window=window)


def target_down_alert(pack: Mapping[str, Any], scope: Scope) -> AlertSpec:
    """SGLangOOMTargetDown: the exporter cannot scrape an SGLang endpoint."""
    expr = f"{scope.sel('sglang_oom_target_up')} == 0\n"
    description = (
        "The exporter at {{ $labels.instance }} has failed to scrape SGLang at {{ $labels.target }} for "
        f"{pack['target_down']['for']}. OOMs are still counted from the logs, but without the server's KV state and "
        "flags their alerts fall back to generic fixes, and the KV near-full alert is blind. See "
        'sglang_oom_target_scrape_errors_total{target="{{ $labels.target }}"} for the reason.'
    )
    summary = "The SGLang OOM exporter cannot reach an SGLang endpoint, so pages lose their suggested values."
    return pack_alert(pack, "target_down", TARGET_DOWN, expr, summary, description)


def state_errors_record(pack: Mapping[str, Any]) -> str:
    """Per exporter: the exact number of state file errors within the window."""
    return f"instance:sglang_oom_exporter_state_errors:exact_increase{pack['state_errors']['window']}"


def guard_records(pack: Mapping[str, Any], scope: Scope) -> list[RecordSpec]:
    """The recording rules of the guard alerts (rule group sglang-oom-exporter, before its alerts)."""
    window = str(pack["state_errors"]["window"])
    series = scope.sel("sglang_oom_exporter_state_errors_total")
    errors = (
        f"max {scope.by('job', 'instance', *EXPORTER_POD_LABELS)} (\n"
        + indent(exact_increase(series, window))
        + "\n)\n"
    )
    return [RecordSpec(state_errors_record(pack), EXPORTER_GROUP, errors), *no_logs_records(pack, scope)]


def state_errors_alert(pack: Mapping[str, Any], scope: Scope) -> AlertSpec:
    """SGLangOOMExporterStateErrors: new state file errors within the window."""
    window = str(pack["state_errors"]["window"])
    expr = f"{state_errors_record(pack)} > 0\n"
    description = (
        "{{ $value }} state file error{{ if ne $value 1.0 }}s{{ end }} in the last "
        f"{window} on the exporter at {{{{ $labels.instance }}}}{EXPORTER_POD_TEXT}: it could not write its "
        "--state-dir, or found the state file unreadable or corrupt at start (moved aside as "
        "state.json.corrupt-<time>). Check the directory's free space, permissions and mount, and the exporter's log."
    )
    summary = "The SGLang OOM exporter cannot save or load its state, so a restart may lose or recount OOMs."
    return pack_alert(pack, "state_errors", STATE_ERRORS, expr, summary, description, window=window)
