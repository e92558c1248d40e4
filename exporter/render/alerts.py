"""Render: catalog -> alerts/sglang-oom.rules.yaml (the Prometheus rules) and alerts/alertmanager.example.yml.

`alert_pack(catalog)` is the one list of alerts: the rules file, the example Alertmanager config and the runbooks
(render/runbooks.py) are all written from it. What comes from where:

- one critical alert per fatal kind (fatal true or raised), named `SGLang<Kind>OOM` from the kind id, with the
  kind's severity, `for`, window and `keep_firing_for` from its `alert:` block;
- one warning per kind whose `alert.non_fatal` block covers its non-fatal patterns (the 0.5.10+ decode aborts):
  `SGLang<Kind><non_fatal.name>` on the rate of events minus fatal events;
- the retraction kind's rate alert, and the pack alerts (crash loop, KV near full, the exporter guards) with
  their thresholds from the catalog's `alert_pack` section. Their names are contracts, fixed here.

Series and labels are the README's Metrics table: events carry `kind` plus the source labels (`source` for
files; `namespace`, `pod`, `container` in Kubernetes mode). OOM alerts aggregate `max by` those labels, so two
exporters reporting the same pod (another `instance`) give one alert with the same count, and a label the
exporter does not emit is simply empty.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from ..catalog import Catalog, OomKind
from ..config import parse_duration
from ..metrics import FILE_LABELS, KUBERNETES_LABELS
from . import (
    DASHBOARD_URL_VARIABLES,
    GENERATED_NOTE,
    OVERVIEW_DASHBOARD_UID,
    Files,
    RenderOptions,
    runbook_page_url,
)

RULES_PATH = "alerts/sglang-oom.rules.yaml"
ALERTMANAGER_PATH = "alerts/alertmanager.example.yml"
OOM_GROUP = "sglang-oom"
EXPORTER_GROUP = "sglang-oom-exporter"

# Alert names that are a contract (README, ROADMAP, user routes and silences); the per-kind ones are derived.
RETRACTIONS_HIGH = "SGLangKVCacheRetractionsHigh"
CRASH_LOOP = "SGLangOOMCrashLoop"
NEAR_FULL = "SGLangKVCacheNearFull"
EXPORTER_DOWN = "SGLangOOMExporterDown"
NO_LOGS = "SGLangOOMExporterNoLogs"
TARGET_DOWN = "SGLangOOMTargetDown"
STATE_ERRORS = "SGLangOOMExporterStateErrors"

# What OOM alerts group by: every source label of either scheme (a missing one is empty), so both work.
SOURCE_LABELS: tuple[str, ...] = (*KUBERNETES_LABELS, *FILE_LABELS)
# Words of a kind id that are acronyms keep their case in alert names (CUDA, not Cuda).
ACRONYMS = {"cuda": "CUDA", "kv": "KV", "oom": "OOM", "pd": "PD", "gpu": "GPU", "swa": "SWA"}
# Receivers of the example Alertmanager config, by severity.
RECEIVERS = {"critical": "pager", "warning": "ticket", "info": "null"}

NAME_RE = re.compile(r"^SGLang[A-Z][A-Za-z0-9]+$")
# How far back an OOM alert looks for a counter's value before its window, across an exporter outage.
OUTAGE_LOOKBACK = "1h"


@dataclass(frozen=True, slots=True)
class AlertSpec:
    """One alerting rule, plus what the runbooks and tests need to know about it."""

    name: str
    group: str
    role: str  # fatal, non_fatal, retraction, or the alert_pack key (crash_loop, kv_near_full, exporter_down, ...)
    severity: str
    expr: str
    for_: str
    summary: str
    description: str
    window: str | None = None  # the range its expression looks back over, if it has one
    keep_firing_for: str | None = None
    kind: OomKind | None = None
    threshold: float | None = None

    def rule(self, options: RenderOptions) -> dict[str, Any]:
        """The rule as it goes into the rules file."""
        rule: dict[str, Any] = {"alert": self.name, "expr": self.expr, "for": self.for_}
        if self.keep_firing_for:
            rule["keep_firing_for"] = self.keep_firing_for
        rule["labels"] = {"severity": self.severity}
        annotations = {
            "summary": self.summary,
            "description": self.description,
            "runbook_url": runbook_page_url(options, self.name),
        }
        if options.grafana_url:
            annotations["dashboard_url"] = dashboard_url(options)
        rule["annotations"] = annotations
        return rule


def alert_name(kind_id: str, suffix: str = "OOM") -> str:
    """`SGLang` + the kind id in CamelCase (acronyms kept) + suffix, without doubling a trailing OOM."""
    words = [ACRONYMS.get(w, w.capitalize()) for w in kind_id.split("_")]
    if suffix == "OOM" and words[-1] == "OOM":
        suffix = ""
    return "SGLang" + "".join(words) + suffix


def dashboard_url(options: RenderOptions) -> str:
    """The overview dashboard, with a var-<label> for each dashboard variable the alert has a value for."""
    params = "".join(
        f"{{{{ if $labels.{v} }}}}&var-{v}={{{{ $labels.{v} | urlquery }}}}{{{{ end }}}}"
        for v in DASHBOARD_URL_VARIABLES
    )
    return f"{options.grafana_url}/d/{OVERVIEW_DASHBOARD_UID}?from=now-3h&to=now{params}"


def _sel(metric: str, **matchers: str) -> str:
    inner = ", ".join(f'{k}="{v}"' for k, v in matchers.items())
    return f"{metric}{{{inner}}}"


def _by(*labels: str) -> str:
    return ", ".join(labels)


def _new_events(series: str, window: str, recent: str | None = None) -> str:
    """Per-series count of new events in the window, only where it is above zero. Three branches:

    1. `increase()`, which also bridges counter resets (an exporter restarted without its state);
    2. the value now minus the last one before the window, up to OUTAGE_LOOKBACK back: an exporter outage
       longer than the window leaves increase() one sample, but with --state-dir its counters continue, so an
       OOM logged while it was down still shows (and a counter that only re-appears with old counts does not);
    3. a series born non-zero with no earlier sample (a new pod whose first log lines hold the OOM, counted
       before the first scrape), which increase() cannot see. `recent` narrows it to series with an event in
       the window, so counters restored after a longer outage do not page again.
    """
    before = f"last_over_time({series}[{OUTAGE_LOOKBACK}] offset {window})"
    born = f"({series} > 0 unless {before})"
    if recent:
        born = f"(\n  {born}\n  and\n  {recent}\n)"
    return f"(increase({series}[{window}]) > 0)\nor\n({series} - {before} > 0)\nor\n{born}"


def _recent_event(job: str, window: str, kind: str | None = None) -> str:
    matchers = {"job": job, **({"kind": kind} if kind else {})}
    return f"(time() - {_sel('sglang_oom_last_event_timestamp_seconds', **matchers)}) < {int(parse_duration(window))}"


def _lower_first(text: str) -> str:
    """Lower-case the first letter unless it starts an acronym (KV, PD)."""
    if len(text) > 1 and (text[1].islower() or text[1] == " "):
        return text[0].lower() + text[1:]
    return text


# Templating shared by the OOM alerts' descriptions. Prometheus prepends `$labels` and `$value`.
WHO = (
    "{{ if $labels.pod }}pod {{ $labels.namespace }}/{{ $labels.pod }}"
    "{{ else if $labels.source }}source {{ $labels.source }}"
    "{{ else }}container {{ $labels.container }}{{ end }}"
)


def _num(var: str) -> str:
    """A float as people write it: 16384 not 1.6384e+04, 0.88 as is."""
    return f'{{{{ if ge {var} 1000.0 }}}}{{{{ printf "%.0f" {var} }}}}{{{{ else }}}}{{{{ {var} }}}}{{{{ end }}}}'


def _selector_var(job: str, kind: str) -> str:
    """Defines $sel: the matchers of this alert's series (a label the alert lacks matches series without it)."""
    fmt = ",".join([f'job="{job}"', f'kind="{kind}"', *(f"{label}=%q" for label in SOURCE_LABELS)])
    args = " ".join(f"$labels.{label}" for label in SOURCE_LABELS)
    return f"{{{{ $sel := printf `{fmt}` {args} }}}}"


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


def _fatal(kind: OomKind, job: str) -> AlertSpec:
    alert = kind.alert
    window = str(alert["window"])
    series = _sel("sglang_oom_fatal_events_total", job=job, kind=kind.id)
    expr = (
        f"max by ({_by(*SOURCE_LABELS, 'kind')}) (\n"
        + _indent(_new_events(series, window, _recent_event(job, window, kind.id)))
        + "\n)\n"
    )
    description = (
        _selector_var(job, kind.id)
        + f'{{{{ $value | printf "%.0f" }}}} fatal {kind.id} OOM event(s) on {WHO} in the last {window}: '
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


def _non_fatal(kind: OomKind, job: str) -> AlertSpec:
    spec = kind.alert["non_fatal"]
    window = str(spec["window"])
    per_minute = float(spec["threshold_per_minute"])
    events = _sel("sglang_oom_events_total", job=job, kind=kind.id)
    fatal = _sel("sglang_oom_fatal_events_total", job=job, kind=kind.id)
    expr = (
        f"max by ({_by(*SOURCE_LABELS, 'kind')}) (\n"
        f"  rate({events}[{window}]) - rate({fatal}[{window}])\n"
        f") * 60 > {_fmt(per_minute)}\n"
    )
    description = (
        _selector_var(job, kind.id)
        + f'SGLang on {WHO} aborted {{{{ $value | printf "%.2f" }}}} requests a minute (over {window}) on non-fatal '
        + f"{kind.id} OOMs: {_lower_first(kind.title)}. The server keeps running, but each aborted request failed. "
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


def _retraction(kind: OomKind, job: str) -> AlertSpec:
    alert = kind.alert
    window = str(alert["window"])
    per_minute = float(alert["threshold_per_minute"])
    series = _sel("sglang_oom_events_total", job=job, kind=kind.id)
    expr = f"max by ({_by(*SOURCE_LABELS)}) (\n  rate({series}[{window}])\n) * 60 > {_fmt(per_minute)}\n"
    description = (
        _selector_var(job, kind.id)
        + f'SGLang on {WHO} retracted running requests {{{{ $value | printf "%.1f" }}}} times a minute over the '
        + f"last {window} (alert above {_fmt(per_minute)}): its KV cache keeps filling up, retracted requests are "
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


def _pack_alert(pack: Mapping[str, Any], key: str, name: str, expr: str, summary: str, description: str,
                **extra: Any) -> AlertSpec:  # fmt: skip
    """A pack alert: its severity and `for` from the catalog's alert_pack.<key>, its role the key itself."""
    spec = pack[key]
    group = OOM_GROUP if key in ("crash_loop", "kv_near_full") else EXPORTER_GROUP
    return AlertSpec(name=name, group=group, role=key, severity=str(spec["severity"]), expr=expr,
                     for_=str(spec["for"]), summary=summary, description=description, **extra)  # fmt: skip


def _crash_loop(pack: Mapping[str, Any], job: str) -> AlertSpec:
    spec = pack["crash_loop"]
    window = str(spec["window"])
    count = int(spec["count"])
    series = _sel("sglang_oom_fatal_events_total", job=job)
    per_exporter = f"sum by ({_by(*SOURCE_LABELS, 'job', 'instance')}) (\n" + _indent(
        _new_events(series, window, _recent_event(job, window))
    )
    expr = f"max by ({_by(*SOURCE_LABELS)}) (\n" + _indent(per_exporter + "\n)") + f"\n) >= {count}\n"
    description = (
        f'SGLang on {WHO} had {{{{ $value | printf "%.0f" }}}} fatal OOMs in the last {window} (alert at {count}): '
        "SGLang restarts, runs out of memory again and restarts. The per-kind OOM alerts and the events "
        "say which allocation failed and which flag to change; until it is changed every restart fails the same way."
    )
    summary = "SGLang keeps crashing on out-of-memory errors."
    return _pack_alert(pack, "crash_loop", CRASH_LOOP, expr, summary, description, window=window,
                       keep_firing_for=str(spec["keep_firing_for"]), threshold=count)  # fmt: skip


def _near_full(pack: Mapping[str, Any], job: str) -> AlertSpec:
    spec = pack["kv_near_full"]
    threshold = float(spec["threshold"])
    usage = _sel("sglang_oom_target_token_usage", job=job)
    up = _sel("sglang_oom_target_up", job=job)
    expr = (
        f"(max by (namespace, pod, instance, target) ({usage}) > {_fmt(threshold)})\n"
        f"and on (instance, target)\n({up} == 1)\n"
    )
    description = (
        "SGLang at {{ $labels.target }}{{ if $labels.pod }} (pod {{ $labels.namespace }}/{{ $labels.pod }})"
        "{{ end }} has used {{ $value | humanizePercentage }} of its KV cache for "
        f"{spec['for']} (alert above {threshold:.0%}, read by exporter {{{{ $labels.instance }}}}). New requests "
        "wait or retract running ones, and the next large prefill or decode step may fail with an OOM. Lower "
        "--max-running-requests or --chunked-prefill-size, or give the KV pool more memory (--mem-fraction-static)."
    )
    summary = "SGLang's KV cache has stayed nearly full, so an OOM may follow."
    return _pack_alert(pack, "kv_near_full", NEAR_FULL, expr, summary, description, threshold=threshold)


def _exporter_down(pack: Mapping[str, Any], job: str) -> AlertSpec:
    up = _sel("up", job=job)
    # absent() takes its labels from the bare selector's `=` matchers, so the alert keeps job="<job>".
    expr = f"{up} == 0\nor\nabsent({up})\n"
    description = (
        "{{ if $labels.instance }}Prometheus cannot scrape the SGLang OOM exporter at {{ $labels.instance }}"
        f'{{{{ else }}}}Prometheus has no target with job="{job}" at all{{{{ end }}}} '
        f"(for {pack['exporter_down']['for']}). OOMs on the servers it watches go uncounted until it is back: check "
        f'the exporter pod or process, its logs, and that the scrape job is named "{job}".'
    )
    summary = "The SGLang OOM exporter is down or not scraped, so no OOM alert can fire."
    return _pack_alert(pack, "exporter_down", EXPORTER_DOWN, expr, summary, description)


def _no_logs(pack: Mapping[str, Any], job: str) -> AlertSpec:
    window = str(pack["exporter_no_logs"]["window"])
    files = _sel("sglang_oom_exporter_files_watched", job=job)
    lines = _sel("sglang_oom_exporter_lines_read_total", job=job)
    expr = (
        f"max by (job, instance) ({files}) == 0\n"
        "or\n(\n"
        f"  sum by (job, instance) (increase({lines}[{window}])) == 0\n"
        # Only once the exporter has had sources for a whole window: a fresh install is not "silent for 1h".
        f"  and on (job, instance)\n  max by (job, instance) ({lines} offset {window})\n)\n"
    )
    description = (
        "The SGLang OOM exporter at {{ $labels.instance }} is up but follows no log file, or read nothing "
        f"from its files in the last {window}: a wrong path or glob, a wrong hostPath or "
        "container filter, unreadable files, or servers that logged nothing. Check its /healthz and its "
        "sglang_oom_exporter_read_errors_total."
    )
    summary = "The SGLang OOM exporter reads no SGLang logs, so no OOM alert can fire."
    return _pack_alert(pack, "exporter_no_logs", NO_LOGS, expr, summary, description, window=window)


def _target_down(pack: Mapping[str, Any], job: str) -> AlertSpec:
    expr = f"{_sel('sglang_oom_target_up', job=job)} == 0\n"
    description = (
        "The exporter at {{ $labels.instance }} has failed to scrape SGLang at {{ $labels.target }} for "
        f"{pack['target_down']['for']}. OOMs are still counted from the logs, but without the server's KV state and "
        "flags their alerts fall back to generic fixes, and the KV near-full alert is blind. See "
        'sglang_oom_target_scrape_errors_total{target="{{ $labels.target }}"} for the reason.'
    )
    summary = "The SGLang OOM exporter cannot reach an SGLang endpoint, so pages lose their suggested values."
    return _pack_alert(pack, "target_down", TARGET_DOWN, expr, summary, description)


def _state_errors(pack: Mapping[str, Any], job: str) -> AlertSpec:
    window = str(pack["state_errors"]["window"])
    series = _sel("sglang_oom_exporter_state_errors_total", job=job)
    expr = "max by (job, instance) (\n" + _indent(_new_events(series, window)) + "\n)\n"
    description = (
        '{{ $value | printf "%.0f" }} state file error(s) in the last '
        f"{window} on the exporter at {{{{ $labels.instance }}}}: it could not write its --state-dir, or found the "
        "state file unreadable or corrupt at start (moved aside as state.json.corrupt-<time>). Check the "
        "directory's free space, permissions and mount, and the exporter's log."
    )
    summary = "The SGLang OOM exporter cannot save or load its state, so a restart may lose or recount OOMs."
    return _pack_alert(pack, "state_errors", STATE_ERRORS, expr, summary, description, window=window)


def _indent(text: str, by: str = "  ") -> str:
    return "\n".join(by + line if line else line for line in text.splitlines())


def _fmt(value: float) -> str:
    """A threshold as PromQL and people write it (1, 0.1, 0.98)."""
    return f"{value:g}"


def retraction_kind(catalog: Catalog) -> OomKind | None:
    """The kind whose events are retractions: the catalog's retraction_kind role."""
    return catalog.kind(catalog.retraction_kind) if catalog.retraction_kind else None


def alert_pack(catalog: Catalog) -> list[AlertSpec]:
    """Every alert of the pack, OOM alerts first, in catalog order."""
    pack = catalog.alert_pack
    job = str(pack["job"])
    retract = retraction_kind(catalog)
    specs: list[AlertSpec] = []
    for kind in catalog.kinds:
        if kind.fatal in ("true", "raised"):
            specs.append(_fatal(kind, job))
        if "non_fatal" in kind.alert:
            specs.append(_non_fatal(kind, job))
        if retract is not None and kind.id == retract.id:
            specs.append(_retraction(kind, job))
    specs += [_crash_loop(pack, job), _near_full(pack, job)]
    specs += [_exporter_down(pack, job), _no_logs(pack, job), _target_down(pack, job), _state_errors(pack, job)]
    return specs


class _Dumper(yaml.SafeDumper):
    """Block scalars for multi-line strings (the expressions), never wrapped lines."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_yaml(data: Any) -> str:
    """YAML as we commit it: key order kept, expressions as block scalars, no line wrapping."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=100000, allow_unicode=True)


def rules_file(catalog: Catalog, options: RenderOptions) -> str:
    """The text of alerts/sglang-oom.rules.yaml."""
    specs = alert_pack(catalog)
    groups = []
    for group in (OOM_GROUP, EXPORTER_GROUP):
        groups.append({"name": group, "rules": [s.rule(options) for s in specs if s.group == group]})
    header = (
        f"# {GENERATED_NOTE}\n"
        "# The SGLang OOM alert pack: load with `rule_files:` (plain Prometheus) or through the Helm chart's\n"
        f'# PrometheusRule. Every rule matches job="{catalog.alert_pack["job"]}": name the scrape job so.\n'
    )
    return header + dump_yaml({"groups": groups})


def _alternation(names: Sequence[str]) -> str:
    return "|".join(names)


def alertmanager_example(catalog: Catalog) -> str:
    """The text of alerts/alertmanager.example.yml: severity routing and the pack's inhibitions."""
    specs = alert_pack(catalog)
    pages = [s.name for s in specs if s.role in ("fatal", "crash_loop")]
    per_source = [s.name for s in specs if s.role in ("non_fatal", "retraction")]
    source_equal = ", ".join(SOURCE_LABELS)
    return f"""# {GENERATED_NOTE}
# An example Alertmanager config for the SGLang OOM alert pack: critical alerts page, warnings open tickets,
# and a pod's warnings stay quiet while its OOM page fires. Replace the two webhook URLs with your pager
# and ticket integrations (or merge the routes and inhibit_rules into your own config).
# Check it: amtool check-config {ALERTMANAGER_PATH}
route:
  receiver: ticket
  group_by: [alertname, {source_equal}, instance]
  group_wait: 30s
  group_interval: 5m
  repeat_interval: 12h
  routes:
    - receiver: pager
      matchers: ['alertname=~"SGLang.*"', 'severity="critical"']
      repeat_interval: 1h
    - receiver: ticket
      matchers: ['alertname=~"SGLang.*"', 'severity="warning"']
    - receiver: "null"
      matchers: ['severity="info"']

receivers:
  - name: pager
    webhook_configs:
      - url: http://pager.example.invalid/sglang-oom
  - name: ticket
    webhook_configs:
      - url: http://tickets.example.invalid/sglang-oom
  - name: "null"

inhibit_rules:
  # The source already paged for an OOM: its retraction and abort warnings add nothing.
  - source_matchers: ['alertname=~"{_alternation(pages)}"']
    target_matchers: ['alertname=~"{_alternation(per_source)}"']
    equal: [{source_equal}]
  # Same for the pod's KV near-full warning (labelled by pod and target; without namespace/pod labels,
  # as with plain files, any OOM page quiets every near-full warning).
  - source_matchers: ['alertname=~"{_alternation(pages)}"']
    target_matchers: ['alertname="{NEAR_FULL}"']
    equal: [namespace, pod]
  # An exporter that is down reads no logs either: one warning is enough.
  - source_matchers: ['alertname="{EXPORTER_DOWN}"']
    target_matchers: ['alertname="{NO_LOGS}"']
    equal: [instance]
"""


def render_alerts(catalog: Catalog, options: RenderOptions, files_so_far: Mapping[str, str]) -> Files:
    """Renderer: the rules file and the example Alertmanager config."""
    return {RULES_PATH: rules_file(catalog, options), ALERTMANAGER_PATH: alertmanager_example(catalog)}
