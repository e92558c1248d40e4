"""Render, the OOM alerts (rule group sglang-oom): one per fatal kind, one per kind with a `non_fatal` block,
the retraction kind's rate alert, the crash loop and the KV near-full warning, with their templated descriptions.

OOM alerts aggregate `max by` the source labels, so two exporters reporting the same pod (another `instance`)
give one alert with the same count, and a label the exporter does not emit is simply empty.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..catalog import OomKind
from .alertspec import CRASH_LOOP, NEAR_FULL, OOM_GROUP, RETRACTIONS_HIGH, AlertSpec, alert_name, pack_alert
from .promql import SOURCE_LABELS, Scope, fmt, indent, new_events, recent_event


# Templating shared by the OOM alerts' descriptions. Prometheus prepends `$labels` and `$value`.
def who(scope: Scope) -> str:
    """The source an alert is about, and its cluster when the series carry one."""
    cluster = scope.template_label()
    return (
        "{{ if $labels.pod }}pod {{ $labels.namespace }}/{{ $labels.pod }}"
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
    """Defines $sel: the matchers of this alert's series (a label the alert lacks matches series without it)."""
    labels = (scope.cluster, *SOURCE_LABELS)
    job = scope.job_selector.replace("%", "%%")
    fmt_ = ",".join([job, f'kind="{kind}"', *(f"{label}=%q" for label in labels)])
    args = " ".join(f"$labels.{label}" for label in labels)
    return f"{{{{ $sel := printf `{fmt_}` {args} }}}}"


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
    expr = (
        f"max {scope.by(*SOURCE_LABELS, 'kind')} (\n"
        + indent(new_events(series, window, recent_event(scope, window, kind.id)))
        + "\n)\n"
    )
    description = (
        _selector_var(scope, kind.id)
        + f'{{{{ $value | printf "%.0f" }}}} fatal {kind.id} OOM event(s) on {who(scope)} in the last {window}: '
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
    """SGLangKVCacheRetractionsHigh: warn on a sustained rate of the retraction kind's events."""
    alert = kind.alert
    window = str(alert["window"])
    per_minute = float(alert["threshold_per_minute"])
    series = scope.sel("sglang_oom_events_total", kind=kind.id)
    expr = f"max {scope.by(*SOURCE_LABELS)} (\n  rate({series}[{window}])\n) * 60 > {fmt(per_minute)}\n"
    description = (
        _selector_var(scope, kind.id)
        + f'SGLang on {who(scope)} retracted running requests {{{{ $value | printf "%.1f" }}}} times a minute over the '
        + f"last {window} (alert above {fmt(per_minute)}): its KV cache keeps filling up, retracted requests are "
        + "recomputed and slow down, and a fatal decode OOM may follow. "
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
    expr = f"max {scope.by(*SOURCE_LABELS)} (\n" + indent(per_exporter + "\n)") + f"\n) >= {count}\n"
    description = (
        f'SGLang on {who(scope)} had {{{{ $value | printf "%.0f" }}}} fatal OOMs in the last {window} '
        f"(alert at {count}): "
        "SGLang restarts, runs out of memory again and restarts. The per-kind OOM alerts and the events "
        "say which allocation failed and which flag to change; until it is changed every restart fails the same way."
    )
    summary = "SGLang keeps crashing on out-of-memory errors."
    return pack_alert(pack, "crash_loop", CRASH_LOOP, expr, summary, description, window=window,
                      keep_firing_for=str(spec["keep_firing_for"]), threshold=count)  # fmt: skip


def near_full_alert(pack: Mapping[str, Any], scope: Scope) -> AlertSpec:
    """SGLangKVCacheNearFull: SGLang's own token usage (scraped by the exporter) above the threshold."""
    spec = pack["kv_near_full"]
    threshold = float(spec["threshold"])
    usage = scope.sel("sglang_oom_target_token_usage")
    up = scope.sel("sglang_oom_target_up")
    expr = (
        f"(max {scope.by('namespace', 'pod', 'source', 'instance', 'target')} ({usage}) > {fmt(threshold)})\n"
        f"and {scope.on('instance', 'target')}\n({up} == 1)\n"
    )
    description = (
        "SGLang at {{ $labels.target }}{{ if $labels.pod }} (pod {{ $labels.namespace }}/{{ $labels.pod }})"
        "{{ else if $labels.source }} (source {{ $labels.source }}){{ end }}"
        f"{{{{ if {scope.template_label()} }}}} in cluster {{{{ {scope.template_label()} }}}}{{{{ end }}}} has used "
        "{{ $value | humanizePercentage }} of its KV cache for "
        f"{spec['for']} (alert above {threshold:.0%}, read by exporter {{{{ $labels.instance }}}}). New requests "
        "wait or retract running ones, and the next large prefill or decode step may fail with an OOM. Lower "
        "--max-running-requests or --chunked-prefill-size, or give the KV pool more memory (--mem-fraction-static)."
    )
    summary = "SGLang's KV cache has stayed nearly full, so an OOM may follow."
    return pack_alert(pack, "kv_near_full", NEAR_FULL, expr, summary, description, threshold=threshold)
