"""Render, the guard alerts (rule group sglang-oom-exporter): the exporter itself is down, reads no logs,
cannot reach SGLang, or cannot keep its state. A pack that silently cannot fire is worse than none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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

# kube-state-metrics' container images that run SGLang (RE2, matched against the whole `image` label).
SGLANG_IMAGE = "(?i).*sglang.*"
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


def _sglang_nodes(scope: Scope) -> str:
    """node -> 1 where kube-state-metrics shows a container with an SGLang image on it."""
    return (
        f'max {scope.by("node")} (\n  kube_pod_container_info{{image=~"{SGLANG_IMAGE}"}}\n'
        f"  * {scope.on('namespace', 'pod')} group_left (node)\n"
        f'  max {scope.by("namespace", "pod", "node")} (kube_pod_info{{node!=""}})\n)'
    )


def _exporter_nodes(scope: Scope) -> str:
    """(exporter_namespace, exporter_pod) -> node: the node each exporter pod runs on (kube-state-metrics)."""
    relabelled = 'label_replace(kube_pod_info{node!=""}, "exporter_namespace", "$1", "namespace", "(.+)")'
    relabelled = f'label_replace({relabelled}, "exporter_pod", "$1", "pod", "(.+)")'
    return f"max {scope.by('exporter_namespace', 'exporter_pod', 'node')} (\n  {relabelled}\n)"


def no_logs_alert(pack: Mapping[str, Any], scope: Scope) -> AlertSpec:
    """SGLangOOMExporterNoLogs: SGLang is expected where an exporter reads none of its logs.

    Only where SGLang is known to run (a node without SGLang is normal, not an alert): an SGLang endpoint the
    exporter scrapes answers while it follows no SGLang source; kube-state-metrics shows an SGLang container on
    the node of an exporter that follows no SGLang source, or SGLang containers while no exporter of the job
    follows any; a log file the user named is missing for a whole window; or the SGLang sources it follows gave
    no line for a whole window.
    """
    window = str(pack["exporter_no_logs"]["window"])
    sglang = scope.sel("sglang_oom_exporter_sglang_sources")
    up = scope.sel("sglang_oom_target_up")
    lines = scope.sel("sglang_oom_exporter_lines_read_total")
    waiting = scope.sel("sglang_oom_exporter_sources_waiting")
    by_exporter, on_exporter = scope.by("job", "instance"), scope.on("job", "instance")
    node_unread = (
        f"(\n  max {scope.by('job', 'instance', *EXPORTER_POD_LABELS)} ({sglang} == 0)\n"
        f"  * {scope.on(*EXPORTER_POD_LABELS)} group_left (node)\n" + indent(_exporter_nodes(scope)) + "\n"
        f"  and {scope.on('node')}\n" + indent(_sglang_nodes(scope)) + "\n)"
    )
    expr = (
        # 1. SGLang answers at an endpoint this exporter scrapes, and it follows none of its logs. Every branch
        # needs sglang_sources reported (`== 0`, not its absence): an exporter without the gauge is no evidence.
        f"(\n  max {by_exporter} ({up} == 1)\n"
        f"  and {on_exporter}\n  max {by_exporter} ({sglang}) == 0\n)\n"
        # 2. An SGLang container on the node of an exporter that follows no SGLang log (a wrong hostPath).
        f"or\n{node_unread}\n"
        # 3. SGLang containers in the cluster, and no exporter of the job follows any SGLang log (unless 2 says
        # on which node already).
        f"or\n(\n  sum {scope.by('job')} ({sglang}) == 0\n  and {scope.on()}\n"
        f'  count {scope.by()} (kube_pod_container_info{{image=~"{SGLANG_IMAGE}"}}) > 0\n'
        f"  unless {scope.on('job')}\n{indent(node_unread)}\n)\n"
        # 4. A named file that has not appeared for a whole window (SGLang never started there, or a wrong
        # path), even while the other files are read. Waiting at start is normal, so only once it lasted a window.
        "or\n(\n"
        f"  max {by_exporter} (min_over_time({waiting}[{window}])) > 0\n"
        f"  and {on_exporter}\n  max {by_exporter} ({waiting} offset {window})\n)\n"
        # 5. It follows SGLang sources but read nothing for a whole window, once it has had them that long.
        "or\n(\n"
        f"  sum {by_exporter} (increase({lines}[{window}])) == 0\n"
        f"  and {on_exporter}\n  max {by_exporter} ({lines} offset {window})\n"
        f"  and {on_exporter}\n  max {by_exporter} ({sglang} > 0)\n)\n"
    )
    description = (
        "{{ if $labels.node }}kube-state-metrics shows an SGLang container on node {{ $labels.node }}, but the "
        "SGLang OOM exporter there ({{ $labels.exporter_namespace }}/{{ $labels.exporter_pod }} at "
        "{{ $labels.instance }}) follows none of its logs: a wrong hostPath, container filter or runtime log "
        "directory, or unreadable files."
        "{{ else if $labels.instance }}The SGLang OOM exporter at {{ $labels.instance }} reads no SGLang log "
        "where SGLang is expected: an SGLang endpoint it scrapes answers while it follows no SGLang log, a log "
        f"file it was given has been missing for {window}, or its SGLang logs gave no line in {window}. A wrong "
        "path or glob, hostPath or filter, unreadable files, or an SGLang server that never started or logs "
        "elsewhere."
        "{{ else }}kube-state-metrics shows SGLang containers, but no SGLang OOM exporter matching "
        f"{scope.job_selector} follows any SGLang log: it runs on none of their nodes (check its nodeSelector "
        "and affinity) "
        "or reads the wrong directory.{{ end }}"
        " Its /healthz names the files it waits for; see also sglang_oom_exporter_sglang_sources, "
        "sglang_oom_exporter_sources_waiting and sglang_oom_exporter_read_errors_total."
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
    return [RecordSpec(state_errors_record(pack), EXPORTER_GROUP, errors)]


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
