"""Render, the OOM alerts (rule group sglang-oom): one per fatal kind, one per kind with a `non_fatal` block,
the retraction kind's rate alert, the crash loop and the KV near-full warning, with their templated
descriptions, and the recording rules they read (oom_records).

The joins live in the recording rules, kubernetes-mixin's way, so each alert reads in one line: the exact count
of new fatal events per source (two exporters reporting the same pod count once, `max by` the source labels),
the same per unit (a serving group's pods counted once), and the exporter's page text for each last event.
A label the exporter does not emit is simply empty.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..catalog import OomKind
from ..config.values import parse_duration
from ..metrics.groups import GROUP_INFO
from .alertspec import (
    CRASH_LOOP,
    CRASH_LOOP_ANY,
    CRASHED,
    NEAR_FULL,
    OOM_GROUP,
    RETRACTIONS_HIGH,
    AlertSpec,
    RecordSpec,
    alert_name,
    pack_alert,
)
from .promql import HOST, SOURCE_LABELS, Scope, exact_increase, fmt, indent, per_group, recent_event, sel, with_host

# What the alerts on SGLang's scraped values group by: the pod (sidecar mode), the exporter and the SGLang URL.
# engine_type (SGLang's prefill | decode | unified, where it gives one) tells a PD pair's servers apart.
TARGET_LABELS = ("namespace", "pod", "source", "instance", "target", "engine_type")


# The recorded series (rule group sglang-oom, before its alerts). A "unit" is what one incident is about: a pod,
# a multi-node server's serving group (its pods counted once), or a plain file's source.
GROUP_MAP = "namespace_pod:sglang_oom_serving_group_info:max"
PD_ROLE = "namespace_pod_source:sglang_oom_target_engine_type:info"
LAST_EVENT_SOURCE = "source_kind:sglang_oom_last_event_info:max"
LAST_EVENT = "unit_kind:sglang_oom_last_event_info:max"
UNIT_LABELS = (*SOURCE_LABELS, "group", HOST)
# What a description's lookup matches the unit by (a pod's containers share its page text).
UNIT_KEY = ("namespace", "pod", "source", "group", HOST)


def source_new(window: str) -> str:
    """Per source and kind: the exact number of new fatal events in the window, two exporters counted once."""
    return f"source_kind:sglang_oom_fatal_events:exact_increase{window}"


def unit_new(window: str) -> str:
    """Per unit (pod, serving group or source) and kind: the exact number of new fatal events in the window."""
    return f"unit_kind:sglang_oom_fatal_events:exact_increase{window}"


def fatal_windows(kinds: Sequence[OomKind], pack: Mapping[str, Any]) -> list[str]:
    """Every window a fatal-kind alert or the crash loop counts new events over, shortest first."""
    windows = {str(k.alert["window"]) for k in kinds if k.fatal in ("true", "raised")}
    windows.add(str(pack["crash_loop"]["window"]))
    return sorted(windows, key=parse_duration)


def oom_records(
    kinds: Sequence[OomKind], pack: Mapping[str, Any], scope: Scope, retract: OomKind | None = None
) -> list[RecordSpec]:
    """The recording rules of the OOM alerts: the serving-group map, the PD role map, the last event's page
    text per source and per unit, per window the exact new fatal events per source and per unit, the
    retraction rates (of the `retract` kind) and the KV cache used."""
    info = scope.sel(GROUP_INFO)
    records = [
        RecordSpec(GROUP_MAP, OOM_GROUP, f"max {scope.by('namespace', 'pod', 'group', 'worker_index')} ({info})\n"),
        RecordSpec(PD_ROLE, OOM_GROUP, _pd_role(scope)),
        RecordSpec(LAST_EVENT_SOURCE, OOM_GROUP, _last_event_source(scope)),
        RecordSpec(LAST_EVENT, OOM_GROUP, _last_event_unit(scope)),
    ]
    for window in fatal_windows(kinds, pack):
        series = scope.sel("sglang_oom_fatal_events_total")
        exact = exact_increase(series, window, recent_event(scope, window))
        per_source = f"max {scope.by(*SOURCE_LABELS, HOST, 'kind')} (\n{indent(with_host(exact))}\n)\n"
        records.append(RecordSpec(source_new(window), OOM_GROUP, per_source))
        grouped = per_group(scope, source_new(window), HOST, "kind", info=GROUP_MAP, sources=source_new(window))
        records.append(RecordSpec(unit_new(window), OOM_GROUP, grouped))
    if retract is not None:
        records += _retraction_records(retract, scope)
    records.append(_kv_used_record(scope))
    return records


def _pd_role(scope: Scope) -> str:
    """(namespace, pod or source) -> engine_type, for the servers SGLang's metrics call a PD prefill or decode
    server (the mirrored sglang_oom_target_* series), the last hour, as the server may be down."""
    usage = sel("sglang_oom_target_token_usage", scope.job_selector, 'engine_type=~"prefill|decode"')
    recent = with_host(f"last_over_time({usage}[1h])")
    return f"max {scope.by('namespace', 'pod', 'source', HOST, 'engine_type')} (\n{indent(recent)}\n)\n"


def _last_event_source(scope: Scope) -> str:
    """The exporter's text for each source's last event of each kind (sglang_oom_last_event_info: the limiting
    pool, the numbers and the advice), two exporters counted once, with the PD role where it is known. Its value
    is when that event was seen (sglang_oom_last_event_timestamp_seconds, whole seconds), so a page can say when
    the OOM was, words that stay true at every repeat of the notification."""
    labels = (*SOURCE_LABELS, HOST, "kind", "limiting_pool", "detail", "advice")
    info, seen = scope.sel("sglang_oom_last_event_info"), scope.sel("sglang_oom_last_event_timestamp_seconds")
    timed = f"{info}\n* ignoring (limiting_pool, detail, advice) group_left\nfloor({seen})"
    last = f"max {scope.by(*labels)} (\n{indent(with_host(timed))}\n)"
    at = scope.on("namespace", "pod", "source", HOST)
    role = f"group {scope.by('namespace', 'pod', 'source', HOST, 'engine_type')} ({PD_ROLE})"
    return f"{last}\n* {at} group_left (engine_type) {role}\nor\n{last}\nunless {at} {PD_ROLE}\n"


def _last_event_unit(scope: Scope) -> str:
    """The same per unit: a serving group's members under the group's labels (member_pod names each), as the
    fatal alerts' labels are."""
    pod = scope.on("namespace", "pod")
    grouped = (
        f"{LAST_EVENT_SOURCE} * {pod} group_left (group) {GROUP_MAP}\nor\n{LAST_EVENT_SOURCE} unless {pod} {GROUP_MAP}"
    )
    copied = f'label_replace(\n{indent(grouped)},\n"member_pod", "$1", "pod", "(.*)")'
    return (
        f'label_replace(label_replace(\n{indent(copied)},\n"pod", "", "group", ".+"), "container", "", "group", ".+")\n'
    )


# Templating shared by the OOM alerts' descriptions. Prometheus prepends `$labels` and `$value`.
def who(scope: Scope) -> str:
    """The unit an alert is about (a serving group, a pod, a file source), and its cluster when it has one."""
    cluster = scope.template_label()
    return (
        "{{ if $labels.group }}group {{ $labels.namespace }}/{{ $labels.group }}"
        "{{ else if $labels.pod }}pod {{ $labels.namespace }}/{{ $labels.pod }}"
        "{{ else }}source {{ $labels.source }}{{ with $labels.host }} on host {{ . }}{{ end }}{{ end }}"
        f"{{{{ with {cluster} }}}} in cluster {{{{ . }}}}{{{{ end }}}}"
    )


def _lower_first(text: str) -> str:
    """Lower-case the first letter unless it starts an acronym (KV, PD)."""
    if len(text) > 1 and (text[1].islower() or text[1] == " "):
        return text[0].lower() + text[1:]
    return text


def _lookup(scope: Scope, metric: str, labels: Sequence[str], *, where: str = "", **matchers: str) -> str:
    """The one query of a description, as `$info`: `metric` where the alert's own labels match (`where`: a
    comparison after the selector)."""
    fixed = [f'{k}="{v}"' for k, v in matchers.items()]
    names = (scope.cluster, *labels)
    fmt_ = ",".join([*fixed, *(f"{label}=%q" for label in names)])
    args = " ".join(f"$labels.{label}" for label in names)
    return f"{{{{ $info := query (printf `{metric}{{{fmt_}}}{where}` {args}) }}}}"


def _text(kind: OomKind) -> str:
    """The last event's numbers and advice as the exporter wrote them, else the catalog's fix for the kind."""
    return (
        "{{ with $info }}{{ with first . }}{{ with .Labels.detail }}{{ . }} {{ end }}{{ .Labels.advice }}{{ end }}"
        f"{{{{ else }}}}Fix: {kind.summary}{{{{ end }}}}"
    )


# The PD role in a description: "SGLang decode server at ...", nothing for a unified (non-PD) server.
_PD_ROLE = '{{ with $labels.engine_type }}{{ if ne . "unified" }} {{ . }} server{{ end }}{{ end }}'


# A page's longest description, rendered, for the longest names a unit has (tests/test_alerts.py renders it).
PAGE_CHARS = 400
# The most of the exporter's advice a page quotes: its suggested values, without the reasons in parentheses
# (those are on /events and in the runbook); the rest of PAGE_CHARS holds the unit, the time and the numbers.
LEVER_CHARS = 120


def _when(window: str) -> str:
    """When the unit's last event of the kind was (the looked-up record's value, the latest of a group's
    members), else the window."""
    latest = "{{ $t := 0.0 }}{{ range . }}{{ if gt .Value $t }}{{ $t = .Value }}{{ end }}{{ end }}"
    at = ", the last at {{ $t | humanizeTimestamp }}"
    return f"{{{{ with $info }}}}{latest}{at}{{{{ else }}}} within {window}{{{{ end }}}}"


def _numbers() -> str:
    """The last event's numbers as the exporter wrote them (its `detail`: "The last one asked for 16384 KV tokens
    while 6100 were available: <note>; state from ..."), without the note and the state the advice read, a pool
    other than the full KV pool named by its label: ": asked for 16384 KV tokens while 6100 were available", ":
    asked for 200 tokens (mamba pool had 3)"; nothing when the unit has no such record."""
    bare = "(reReplaceAll `^(?:The last one )?(.*?)(: [^;]*)?(; state from .*)?\\.?$` `$1` .)"
    short = "(printf ` (%s pool had $1)` $pool)"
    clause = f"{{{{ reReplaceAll `; the .+ was the limit with (\\d+) (?:available|free).*$` {short} {bare} }}}}"
    return (
        "{{ with $info }}{{ with first . }}{{ $pool := .Labels.limiting_pool }}"
        f"{{{{ with .Labels.detail }}}}: {clause}{{{{ end }}}}{{{{ end }}}}{{{{ end }}}}"
    )


def _lever(kind: OomKind) -> str:
    """The last event's advice as the exporter wrote it, without its reasons and cut at LEVER_CHARS, else the
    catalog's fix for the kind (a page without the last event's time and role has room for it whole)."""
    advice = (
        "{{ $a := reReplaceAll `^(Suggested: [^(]*) \\(.*\\)\\.$` `$1.` .Labels.advice }}"
        f"{{{{ if gt (len $a) {LEVER_CHARS} }}}}{{{{ printf `%.{LEVER_CHARS - 1}s` $a }}}}…"
        "{{ else }}{{ $a }}{{ end }}"
    )
    fix = f"Fix: {kind.summary}"
    return f"{{{{ with $info }}}}{{{{ with first . }}}}{advice}{{{{ end }}}}{{{{ else }}}}{fix}{{{{ end }}}}"


def _events(noun: str) -> str:
    """`$value` new events, exact: "1 fatal prefill OOM", "2 fatal prefill OOMs"."""
    return f"{{{{ $value }}}} {noun}{{{{ if ne $value 1.0 }}}}s{{{{ end }}}}"


def fatal_alert(kind: OomKind, scope: Scope) -> AlertSpec:
    """`SGLang<Kind>OOM`: page on the first fatal event of the kind, per unit (pod, serving group, source).

    Its description is one sentence of at most PAGE_CHARS for the longest names (tests/test_alerts.py): how many,
    where, when the last one was (true at every repeat of the notification, unlike "in the last 5m"), its numbers
    (what it asked for and what the pool that failed had) and the lever; what ran out is its summary. The reasons
    and the state the advice read are on /events and in the runbook."""
    alert = kind.alert
    window = str(alert["window"])
    expr = f'{unit_new(window)}{{kind="{kind.id}"}} > 0\n'
    role = "{{ with $info }}{{ with (first .).Labels.engine_type }} (PD {{ . }} server){{ end }}{{ end }}"
    description = (
        _lookup(scope, LAST_EVENT, UNIT_KEY, kind=kind.id)
        + f"{_events(f'fatal {kind.id} OOM')} on {who(scope)}{role}{_when(window)}{_numbers()}. {_lever(kind)}"
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
        _lookup(scope, LAST_EVENT_SOURCE, ("namespace", "pod", "source"), kind=kind.id)
        + f'SGLang on {who(scope)} aborted {{{{ $value | printf "%.2f" }}}} requests a minute (over {window}) '
        + f"on non-fatal {kind.id} OOMs: {_lower_first(kind.title)}. The server keeps running, "
        + "but each aborted request failed. "
        + _text(kind)
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
    logged, counted = retraction_records(kind)
    expr = f"{logged} * 60 > {fmt(per_minute)}\nor\n{counted} * 60 > {fmt(requests_per_minute)}\n"
    description = (
        _lookup(scope, LAST_EVENT_SOURCE, ("namespace", "pod", "source"), kind=kind.id)
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
        + _text(kind)
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


def retraction_records(kind: OomKind) -> tuple[str, str]:
    """The names of the retraction rates: per source from the logs, per SGLang endpoint from its own counter."""
    window = str(kind.alert["window"])
    return (f"source:sglang_oom_{kind.id}_events:rate{window}",
            f"target:sglang_oom_target_retracted_requests:rate{window}")  # fmt: skip


def _retraction_records(kind: OomKind, scope: Scope) -> list[RecordSpec]:
    """The retraction kind's rate per source, and SGLang's own counter of retracted requests per endpoint where
    the exporter reads no retraction logs (one tick of the logs retracts one or more requests)."""
    window = str(kind.alert["window"])
    logged, counted = retraction_records(kind)
    series = scope.sel("sglang_oom_events_total", kind=kind.id)
    requests = scope.sel("sglang_oom_target_retracted_requests_total")
    by_source = f"max {scope.by(*SOURCE_LABELS)} (rate({series}[{window}]))\n"
    by_target = (
        f"max {scope.by(*TARGET_LABELS)} (rate({requests}[{window}]))\n"
        f"unless {scope.on('instance')}\nmax {scope.by('instance')} ({series})\n"
    )
    return [RecordSpec(logged, OOM_GROUP, by_source), RecordSpec(counted, OOM_GROUP, by_target)]


KV_USED = "target:sglang_oom_kv_cache_used:ratio"


def _kv_used_record(scope: Scope) -> RecordSpec:
    """What SGLang's KV cache cannot give back, per endpoint that answers, by the higher of two readings.

    "Used" is what an allocation cannot get back: 1 - (free + evictable) / capacity from SGLang's
    kv_available_tokens and kv_evictable_tokens gauges (0.5.16+; evictable radix cache is reclaimable), or
    SGLang's token_usage (the same quantity; every release, the worst rank and pool). On a PD decode server the
    share already promised to transfers and not yet pre-allocated (pending_prealloc_token_usage) counts as used
    too. The gauges are summed over data-parallel groups, so with DP attention token_usage (the worst group,
    the one that runs out) can be the higher one: the record keeps the higher.
    """
    usage = scope.sel("sglang_oom_target_token_usage")
    free = scope.sel("sglang_oom_target_kv_available_tokens")
    evictable = scope.sel("sglang_oom_target_kv_evictable_tokens")
    capacity = scope.sel("sglang_oom_target_max_total_tokens")
    promised = scope.sel("sglang_oom_target_pending_prealloc_token_usage")
    up = scope.sel("sglang_oom_target_up")
    gauges = f"1 - ({free} + {evictable}) / {capacity}\n  + ({promised} or {free} * 0)"
    token_usage = f"{usage}\n  + ({promised} or {usage} * 0)"
    expr = (
        f"max {scope.by(*TARGET_LABELS)} (\n"
        f'  label_replace(\n    {indent(gauges, "  ").strip()},\n  "reading", "gauges", "", "")\n  or\n'
        f'  label_replace(\n    {indent(token_usage, "  ").strip()},\n  "reading", "token_usage", "", "")\n)\n'
        f"and {scope.on('instance', 'target')}\n({up} == 1)\n"
    )
    return RecordSpec(KV_USED, OOM_GROUP, expr)


def crash_windows(crash: OomKind) -> list[str]:
    """The windows the crash alerts count new crashes over: the one crash's and the crash loop's."""
    return sorted({str(crash.alert["window"]), str(crash.alert["loop"]["window"])}, key=parse_duration)


def crash_new(level: str, window: str) -> str:
    """Per source (level "source") or unit ("unit"): the exact number of new non-memory crashes in the window."""
    return f"{level}:sglang_oom_crashes:exact_increase{window}"


def crash_records(crash: OomKind, scope: Scope) -> list[RecordSpec]:
    """Per window of the crash alerts: the exact new crashes per source (two exporters counted once) and per unit
    (a serving group's pods once), as the fatal OOMs' records count theirs."""
    records = []
    for window in crash_windows(crash):
        series = scope.sel("sglang_oom_crashes_total")
        # The last crash's time carries kind="crash"; the counter has no kind label to match it on.
        last = scope.sel("sglang_oom_last_event_timestamp_seconds", kind=crash.id)
        recent = f"(time() - max without (kind) ({last})) < {int(parse_duration(window))}"
        exact = exact_increase(series, window, recent)
        per_source = f"max {scope.by(*SOURCE_LABELS, HOST)} (\n{indent(with_host(exact))}\n)\n"
        records.append(RecordSpec(crash_new("source", window), OOM_GROUP, per_source))
        source = crash_new("source", window)
        grouped = per_group(scope, source, HOST, info=GROUP_MAP, sources=source)
        records.append(RecordSpec(crash_new("unit", window), OOM_GROUP, grouped))
    return records


def crashed_alert(crash: OomKind, scope: Scope) -> AlertSpec:
    """SGLangCrashed: an SGLang process died of an exception that is no memory failure, per unit; a warning (the
    pod restarts itself, and one crash may be a one-off), with the exception's last line."""
    alert = crash.alert
    window = str(alert["window"])
    description = (
        _lookup(scope, LAST_EVENT, UNIT_KEY, kind=crash.id)
        + "{{ $value }} SGLang crash{{ if ne $value 1.0 }}es{{ end }}"
        + f" on {who(scope)}{_when(window)}: {_lower_first(crash.title)}, so no OOM "
        + "alert says why it restarted. "
        + _text(crash)
    )
    return AlertSpec(
        name=CRASHED,
        group=OOM_GROUP,
        role="crash",
        severity=crash.severity,
        expr=f"{crash_new('unit', window)} > 0\n",
        for_=str(alert["for"]),
        keep_firing_for=str(alert["keep_firing_for"]),
        window=window,
        summary="SGLang died of an exception that is no out-of-memory error.",
        description=description,
        kind=crash,
    )


def crash_loop_any_alert(crash: OomKind, scope: Scope) -> AlertSpec:
    """SGLangCrashLoop: `count` non-memory crashes on one unit within the window: the server keeps dying of
    something no OOM alert covers, so it pages."""
    loop = crash.alert["loop"]
    window, count = str(loop["window"]), int(loop["count"])
    description = (
        _lookup(scope, LAST_EVENT, UNIT_KEY, kind=crash.id)
        + f"SGLang on {who(scope)} died {{{{ $value }}}} times within {window} (alert at {count}) of "
        + "exceptions that are no out-of-memory error: it restarts and dies again, and no OOM alert says why. "
        + _text(crash)
    )
    return AlertSpec(
        name=CRASH_LOOP_ANY,
        group=OOM_GROUP,
        role="crash_loop_any",
        severity=str(loop["severity"]),
        expr=f"{crash_new('unit', window)} >= {count}\n",
        for_=str(loop.get("for", "0m")),
        keep_firing_for=str(loop["keep_firing_for"]) if loop.get("keep_firing_for") else None,
        window=window,
        threshold=count,
        summary="SGLang keeps dying of an exception that is no out-of-memory error.",
        description=description,
        kind=crash,
    )


def crash_loop_alert(pack: Mapping[str, Any], scope: Scope) -> AlertSpec:
    """SGLangOOMCrashLoop: `count` fatal OOMs of any kind on one unit within the window, each kind listed."""
    spec = pack["crash_loop"]
    window = str(spec["window"])
    count = int(spec["count"])
    expr = f"sum {scope.by(*UNIT_LABELS)} ({unit_new(window)}) >= {count}\n"
    description = (
        _lookup(scope, unit_new(window), UNIT_KEY, where=" > 0")
        + f"SGLang on {who(scope)} had {_events('fatal OOM')} within {window} (alert at {count})"
        + '{{ with $info }}: {{ range $i, $r := sortByLabel "kind" . }}{{ if $i }}, {{ end }}'
        + "{{ $r.Labels.kind }} {{ $r.Value }}{{ end }}{{ end }}. "
        "SGLang restarts, runs out of memory again and restarts. The per-kind OOM alerts and the events "
        "say which allocation failed and which flag to change; until it is changed every restart fails the same way."
    )
    summary = "SGLang keeps crashing on out-of-memory errors."
    return pack_alert(pack, "crash_loop", CRASH_LOOP, expr, summary, description, window=window,
                      keep_firing_for=str(spec["keep_firing_for"]), threshold=count)  # fmt: skip


def near_full_alert(pack: Mapping[str, Any], scope: Scope) -> AlertSpec:
    """SGLangKVCacheNearFull: little of SGLang's KV cache is left, read from what the exporter scrapes (the
    higher of two readings of "used", _kv_used_record)."""
    spec = pack["kv_near_full"]
    threshold = float(spec["threshold"])
    expr = f"{KV_USED} > {fmt(threshold)}\n"
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
