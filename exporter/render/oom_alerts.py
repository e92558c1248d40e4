"""Render, the OOM alerts (rule group sglang-oom): one per fatal kind, one per kind with a `non_fatal` block,
the retraction kind's rate alert, the crash loop and the KV near-full warning, with their templated descriptions.

OOM alerts aggregate `max by` the source labels, so two exporters reporting the same pod (another `instance`)
give one alert with the same count, and a label the exporter does not emit is simply empty.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..catalog import OomKind
from ..config import parse_duration
from ..metrics import GROUP_INFO
from .alertspec import CRASH_LOOP, NEAR_FULL, OOM_GROUP, RETRACTIONS_HIGH, AlertSpec, alert_name, pack_alert
from .promql import SOURCE_LABELS, Scope, fmt, indent, new_events, per_group, recent_event

# What the alerts on SGLang's scraped values group by: the pod (sidecar mode), the exporter and the SGLang URL.
# engine_type (SGLang's prefill | decode | unified, where it gives one) tells a PD pair's servers apart.
TARGET_LABELS = ("namespace", "pod", "source", "instance", "target", "engine_type")


# Templating shared by the OOM alerts' descriptions. Prometheus prepends `$labels` and `$value`.
def who(scope: Scope, pods: str = "") -> str:
    """The source an alert is about, and its cluster when the series carry one. With `pods` (a template that
    lists the pods of $labels.group that logged it), a multi-node server's group and its pods."""
    cluster = scope.template_label()
    group = "{{ "
    if pods:
        group = f"{{{{ if $labels.group }}}}group {{{{ $labels.namespace }}}}/{{{{ $labels.group }}}}{pods}{{{{ else "
    return (
        f"{group}if $labels.pod }}}}pod {{{{ $labels.namespace }}}}/{{{{ $labels.pod }}}}"
        "{{ else if $labels.source }}source {{ $labels.source }}"
        "{{ else }}container {{ $labels.container }}{{ end }}"
        f"{{{{ if {cluster} }}}} in cluster {{{{ {cluster} }}}}{{{{ end }}}}"
    )


def _lower_first(text: str) -> str:
    """Lower-case the first letter unless it starts an acronym (KV, PD)."""
    if len(text) > 1 and (text[1].islower() or text[1] == " "):
        return text[0].lower() + text[1:]
    return text


def _num(var: str) -> str:
    """A float as people write it: 16384 not 1.6384e+04, 0.88 as is."""
    return f'{{{{ if ge {var} 1000.0 }}}}{{{{ printf "%.0f" {var} }}}}{{{{ else }}}}{{{{ {var} }}}}{{{{ end }}}}'


def _selector_var(scope: Scope, kind: str) -> str:
    """Defines $sel: the matchers of this alert's series (a label the alert lacks matches series without it).
    A group's alert (no pod label) matches the group's pods by LWS's pod names, `<group>` and `<group>-<n>`."""
    labels = (scope.cluster, *SOURCE_LABELS)
    job = scope.job_selector.replace("%", "%%")
    fmt_ = ",".join([job, f'kind="{kind}"', *(f"{label}=%q" for label in labels)])
    args = " ".join(f"$labels.{label}" for label in labels)
    in_group = ",".join([job, f'kind="{kind}"', f"{scope.cluster}=%q", "namespace=%q", "pod=~%q"])
    group_args = f'{scope.template_label()} $labels.namespace (printf "%s(-[0-9]+)?" $labels.group)'
    return (
        f"{{{{ $sel := printf `{fmt_}` {args} }}}}"
        f"{{{{ if $labels.group }}}}{{{{ $sel = printf `{in_group}` {group_args} }}}}{{{{ end }}}}"
    )


def _pods_text(scope: Scope, window: str, kind: str | None = None) -> str:
    """(pods a, b): the pods of the alert's group whose last event (of the kind) is within the window."""
    job = scope.job_selector.replace("%", "%%")
    kind_matcher = [f'kind="{kind}"'] if kind else []
    where = ",".join([job, f"{scope.cluster}=%q", "namespace=%q"])
    last = f"sglang_oom_last_event_timestamp_seconds{{{','.join([*kind_matcher, where])}}}"
    info = f"{GROUP_INFO}{{{where},group=%q}}"
    query = (
        f"max by (pod) ((time() - {last}) < {int(parse_duration(window))} and {scope.on('namespace', 'pod')} {info})"
    )
    c = scope.template_label()
    return (
        f"{{{{ with query (printf `{query}` {c} $labels.namespace {c} $labels.namespace $labels.group) }}}}"
        ' (pods {{ range $i, $p := sortByLabel "pod" . }}{{ if $i }}, {{ end }}{{ $p.Labels.pod }}{{ end }})'
        "{{ end }}"
    )


# The PD role in a description: "SGLang decode server at ...", nothing for a unified (non-PD) server.
_PD_ROLE = '{{ with $labels.engine_type }}{{ if ne . "unified" }} {{ . }} server{{ end }}{{ end }}'


def _role_text(scope: Scope) -> str:
    """(decode server): the PD role SGLang's metrics gave the alert's server (engine_type on the mirrored
    sglang_oom_target_* series of its pod or source, the last hour, as the server may be down), else nothing.
    A group's server is its leader pod, named as the group."""
    job = scope.job_selector.replace("%", "%%")
    pd = 'engine_type=~"prefill|decode"'
    where = ",".join([job, f"{scope.cluster}=%q", "namespace=%q", "pod=%q", "source=%q", pd])
    query = f"max by (engine_type) (last_over_time(sglang_oom_target_token_usage{{{where}}}[1h]))"
    args = f"{scope.template_label()} $labels.namespace (or $labels.pod $labels.group) $labels.source"
    return (
        f"{{{{ with query (printf `{query}` {args}) }}}}"
        ' (PD {{ range $i, $r := sortByLabel "engine_type" . }}{{ if $i }}/{{ end }}'
        "{{ $r.Labels.engine_type }}{{ end }} server){{ end }}"
    )


def _numbers_text() -> str:
    """Requested versus available tokens of the last event, when the event said."""
    return (
        '{{ with query (printf "max(sglang_oom_last_event_requested_tokens{%s})" $sel) }}'
        'The last one asked for {{ . | first | value | printf "%.0f" }} KV tokens'
        '{{ with query (printf "max(sglang_oom_last_event_available_tokens{%s})" $sel) }}'
        ' while {{ . | first | value | printf "%.0f" }} were available{{ end }}. {{ end }}'
    )


def _fix_text(kind: OomKind) -> str:
    """The exporter's concrete suggestion (current -> suggested value per flag), else the catalog's fix."""
    return (
        '{{ with query (printf "max by (flag) (sglang_oom_suggested_flag_value{%s})" $sel) }}Suggested:'
        '{{ range $i, $s := sortByLabel "flag" . }}{{ if $i }},{{ end }} --{{ $s.Labels.flag }}'
        '{{ with query (printf "max(sglang_oom_current_flag_value{%s,flag=%q})" $sel $s.Labels.flag) }}'
        f" from {{{{ $v := . | first | value }}}}{_num('$v')}{{{{ end }}}}"
        f" to {{{{ $v := $s.Value }}}}{_num('$v')}{{{{ end }}}}."
        f"{{{{ else }}}}Fix: {kind.summary}{{{{ end }}}}"
    )


def fatal_alert(kind: OomKind, scope: Scope) -> AlertSpec:
    """`SGLang<Kind>OOM`: page on the first fatal event of the kind."""
    alert = kind.alert
    window = str(alert["window"])
    series = scope.sel("sglang_oom_fatal_events_total", kind=kind.id)
    per_pod = (
        f"max {scope.by(*SOURCE_LABELS, 'kind')} (\n"
        + indent(new_events(series, window, recent_event(scope, window, kind.id)))
        + "\n)"
    )
    expr = per_group(scope, per_pod, "kind")
    pods = _pods_text(scope, window, kind.id)
    description = (
        _selector_var(scope, kind.id)
        + f'{{{{ $value | printf "%.0f" }}}} fatal {kind.id} OOM event(s) on {who(scope, pods)}{_role_text(scope)}'
        + f" in the last {window}: "
        + f"{_lower_first(kind.title)}. "
        + _numbers_text()
        + _fix_text(kind)
    )
    return AlertSpec(
        name=alert_name(kind.id),
        group=OOM_GROUP,
        role="fatal",
        severity=kind.severity,
        expr=expr,
        for_=str(alert["for"]),
        keep_firing_for=str(alert["keep_firing_for"]),
        window=window,
        summary=f"SGLang fatal OOM: {_lower_first(kind.title)}.",
        description=description,
        kind=kind,
    )


def non_fatal_alert(kind: OomKind, scope: Scope) -> AlertSpec:
    """`SGLang<Kind><non_fatal.name>`: warn on the rate of the kind's non-fatal events (events minus fatal)."""
    spec = kind.alert["non_fatal"]
    window = str(spec["window"])
    per_minute = float(spec["threshold_per_minute"])
    events = scope.sel("sglang_oom_events_total", kind=kind.id)
    fatal = scope.sel("sglang_oom_fatal_events_total", kind=kind.id)
    expr = (
        f"max {scope.by(*SOURCE_LABELS, 'kind')} (\n"
        f"  rate({events}[{window}]) - rate({fatal}[{window}])\n"
        f") * 60 > {fmt(per_minute)}\n"
    )
    description = (
        _selector_var(scope, kind.id)
        + f'SGLang on {who(scope)} aborted {{{{ $value | printf "%.2f" }}}} requests a minute (over {window}) '
        + f"on non-fatal {kind.id} OOMs: {_lower_first(kind.title)}. The server keeps running, "
        + "but each aborted request failed. "
        + _numbers_text()
        + _fix_text(kind)
    )
    return AlertSpec(
        name=alert_name(kind.id, str(spec["name"])),
        group=OOM_GROUP,
        role="non_fatal",
        severity=str(spec["severity"]),
        expr=expr,
        for_=str(spec["for"]),
        window=window,
        threshold=per_minute,
        summary=f"SGLang keeps aborting requests: {_lower_first(kind.title)}.",
        description=description,
        kind=kind,
    )


def retraction_alert(kind: OomKind, scope: Scope) -> AlertSpec:
    """SGLangKVCacheRetractionsHigh: warn on a sustained rate of the retraction kind's events.

    The retraction lines in the logs count ticks (facts 8). Where an exporter reads no logs at all (it has no
    series of the retraction kind) but scrapes SGLang 0.5.8+, SGLang's own counter of retracted requests
    stands in, with its own threshold: it counts requests, and one tick retracts one or more.
    """
    alert = kind.alert
    window = str(alert["window"])
    per_minute = float(alert["threshold_per_minute"])
    requests_per_minute = float(alert.get("requests_threshold_per_minute", per_minute))
    series = scope.sel("sglang_oom_events_total", kind=kind.id)
    requests = scope.sel("sglang_oom_target_retracted_requests_total")
    expr = (
        f"max {scope.by(*SOURCE_LABELS)} (\n  rate({series}[{window}])\n) * 60 > {fmt(per_minute)}\n"
        "or\n"
        f"(\n  max {scope.by(*TARGET_LABELS)} (\n    rate({requests}[{window}])\n  ) * 60"
        f" > {fmt(requests_per_minute)}\n"
        f"  unless {scope.on('instance')}\n  max {scope.by('instance')} ({series})\n)\n"
    )
    description = (
        _selector_var(scope, kind.id)
        + "{{ if $labels.target }}"
        + f"SGLang{_PD_ROLE} at {{{{ $labels.target }}}}"
        + f"{{{{ if {scope.template_label()} }}}} in cluster {{{{ {scope.template_label()} }}}}{{{{ end }}}}"
        + ' retracted {{ $value | printf "%.1f" }} requests a minute over the '
        + f"last {window} by its own counter (alert above {fmt(requests_per_minute)}; exporter "
        + "{{ $labels.instance }} reads no retraction logs)"
        + "{{ else }}"
        + f'SGLang on {who(scope)} retracted running requests {{{{ $value | printf "%.1f" }}}} times a minute over the '
        + f"last {window} (alert above {fmt(per_minute)})"
        + "{{ end }}"
        + ": its KV cache keeps filling up, retracted requests are recomputed and slow down, and a fatal decode "
        + "OOM may follow. "
        + _fix_text(kind)
    )
    return AlertSpec(
        name=RETRACTIONS_HIGH,
        group=OOM_GROUP,
        role="retraction",
        severity=kind.severity,
        expr=expr,
        for_=str(alert["for"]),
        window=window,
        threshold=per_minute,
        summary="SGLang keeps retracting requests because its KV cache is full.",
        description=description,
        kind=kind,
    )


def crash_loop_alert(pack: Mapping[str, Any], scope: Scope) -> AlertSpec:
    """SGLangOOMCrashLoop: `count` fatal OOMs of any kind on one source within the window."""
    spec = pack["crash_loop"]
    window = str(spec["window"])
    count = int(spec["count"])
    series = scope.sel("sglang_oom_fatal_events_total")
    per_exporter = f"sum {scope.by(*SOURCE_LABELS, 'job', 'instance')} (\n" + indent(
        new_events(series, window, recent_event(scope, window))
    )
    per_pod = f"max {scope.by(*SOURCE_LABELS)} (\n" + indent(per_exporter + "\n)") + "\n)"
    expr = f"{per_group(scope, per_pod).rstrip()} >= {count}\n"
    pods = _pods_text(scope, window)
    description = (
        f'SGLang on {who(scope, pods)} had {{{{ $value | printf "%.0f" }}}} fatal OOMs in the last {window} '
        f"(alert at {count}): "
        "SGLang restarts, runs out of memory again and restarts. The per-kind OOM alerts and the events "
        "say which allocation failed and which flag to change; until it is changed every restart fails the same way."
    )
    summary = "SGLang keeps crashing on out-of-memory errors."
    return pack_alert(pack, "crash_loop", CRASH_LOOP, expr, summary, description, window=window,
                      keep_firing_for=str(spec["keep_firing_for"]), threshold=count)  # fmt: skip


def near_full_alert(pack: Mapping[str, Any], scope: Scope) -> AlertSpec:
    """SGLangKVCacheNearFull: little of SGLang's KV cache is left, read from what the exporter scrapes.

    "Used" is what an allocation cannot get back: 1 - (free + evictable) / capacity from SGLang's
    kv_available_tokens and kv_evictable_tokens gauges (0.5.16+; evictable radix cache is reclaimable), or
    SGLang's token_usage (the same quantity; every release, the worst rank and pool). On a PD decode server the
    share already promised to transfers and not yet pre-allocated (pending_prealloc_token_usage) counts as used
    too. Either reading above the threshold warns: the gauges are summed over data-parallel groups, so with DP
    attention token_usage (the worst group, the one that runs out) can be the higher one.
    """
    spec = pack["kv_near_full"]
    threshold = float(spec["threshold"])
    usage = scope.sel("sglang_oom_target_token_usage")
    free = scope.sel("sglang_oom_target_kv_available_tokens")
    evictable = scope.sel("sglang_oom_target_kv_evictable_tokens")
    capacity = scope.sel("sglang_oom_target_max_total_tokens")
    promised = scope.sel("sglang_oom_target_pending_prealloc_token_usage")
    up = scope.sel("sglang_oom_target_up")
    by = f"max {scope.by(*TARGET_LABELS)}"
    expr = (
        f"(\n  {by} (\n    1 - ({free} + {evictable}) / {capacity}\n    + ({promised} or {free} * 0)\n"
        f"  ) > {fmt(threshold)}\n"
        f"  or\n"
        f"  {by} (\n    {usage}\n    + ({promised} or {usage} * 0)\n  ) > {fmt(threshold)}\n)\n"
        f"and {scope.on('instance', 'target')}\n({up} == 1)\n"
    )
    description = (
        f"SGLang{_PD_ROLE} at {{{{ $labels.target }}}}"
        "{{ if $labels.pod }} (pod {{ $labels.namespace }}/{{ $labels.pod }})"
        "{{ else if $labels.source }} (source {{ $labels.source }}){{ end }}"
        f"{{{{ if {scope.template_label()} }}}} in cluster {{{{ {scope.template_label()} }}}}{{{{ end }}}} has used "
        "{{ $value | humanizePercentage }} of its KV cache for "
        f"{spec['for']} (alert above {threshold:.0%}, read by exporter {{{{ $labels.instance }}}}). New requests "
        "wait or retract running ones, and the next large prefill or decode step may fail with an OOM. Lower "
        "--max-running-requests or --chunked-prefill-size, or give the KV pool more memory (--mem-fraction-static)."
    )
    summary = "SGLang's KV cache has stayed nearly full, so an OOM may follow."
    return pack_alert(pack, "kv_near_full", NEAR_FULL, expr, summary, description, threshold=threshold)
