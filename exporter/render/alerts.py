"""Render: catalog -> alerts/sglang-oom.rules.yaml (the Prometheus rules) and alerts/alertmanager.example.yml.

`alert_pack(catalog)` is the one list of alerts: the rules file, the example Alertmanager config and the runbooks
(render/runbooks.py) are all written from it. What comes from where:

- one critical alert per fatal kind (fatal true or raised), named `SGLang<Kind>OOM` from the kind id, with the
  kind's severity, `for`, window and `keep_firing_for` from its `alert:` block;
- one warning per kind whose `alert.non_fatal` block covers its non-fatal patterns (the 0.5.10+ decode aborts):
  `SGLang<Kind><non_fatal.name>` on the rate of events minus fatal events;
- the retraction kind's rate alert, and the pack alerts (crash loop, KV near full, the exporter guards) with
  their thresholds from the catalog's `alert_pack` section. Their names are contracts, fixed in alertspec.py.

The alerts themselves are built in oom_alerts.py (rule group sglang-oom) and guard_alerts.py (sglang-oom-exporter),
from the PromQL pieces in promql.py. Series and labels are the README's Metrics table: events carry `kind` plus
the source labels (`source` for files; `namespace`, `pod`, `container` in Kubernetes mode).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from ..catalog import Catalog, OomKind
from .alertspec import (
    EXPORTER_DOWN,
    EXPORTER_GROUP,
    NEAR_FULL,
    NO_LOGS,
    OOM_GROUP,
    AlertSpec,
    RecordSpec,
)
from .guard_alerts import exporter_down_alert, guard_records, no_logs_alert, state_errors_alert, target_down_alert
from .oom_alerts import (
    crash_loop_alert,
    crash_loop_any_alert,
    crash_records,
    crashed_alert,
    fatal_alert,
    near_full_alert,
    non_fatal_alert,
    oom_records,
    retraction_alert,
)
from .options import GENERATED_NOTE, Files, RenderOptions
from .promql import HOST, SOURCE_LABELS, Scope

RULES_PATH = "alerts/sglang-oom.rules.yaml"
ALERTMANAGER_PATH = "alerts/alertmanager.example.yml"
# Receivers of the example Alertmanager config, by severity.
RECEIVERS = {"critical": "pager", "warning": "ticket", "info": "null"}
# What one incident is, as the pages' labels say it: a pod, a multi-node server's serving group (its alerts
# carry `group` and no pod), or a plain file's `source` on its `host`. container is left out: a pod is one
# incident.
INCIDENT_LABELS = ("namespace", "pod", "group", "source", HOST)
# The pager route's group_wait: how long Alertmanager holds a new incident's first page to gather its other alerts.
# Every page is `for: 0m` in one rule group, so the alerts of one crash (its ranks merged by the exporter within
# 0.15 s, counted within 0.2 s) are found by one evaluation and reach Alertmanager within that evaluation's run
# (milliseconds to about a second): 10 s holds them into one notification with room for a slow ruler, and
# costs 10 s of the time to page instead of Alertmanager's default 30 s.
PAGE_GROUP_WAIT = "10s"


def retraction_kind(catalog: Catalog) -> OomKind | None:
    """The kind whose events are retractions: the catalog's retraction_kind role."""
    return catalog.kind(catalog.retraction_kind) if catalog.retraction_kind else None


def alert_pack(catalog: Catalog) -> list[AlertSpec]:
    """Every alert of the pack, OOM alerts first, in catalog order."""
    pack = catalog.alert_pack
    job = Scope.of(pack)
    retract = retraction_kind(catalog)
    specs: list[AlertSpec] = []
    for kind in catalog.kinds:
        if kind.fatal in ("true", "raised"):
            specs.append(fatal_alert(kind, job))
        if "non_fatal" in kind.alert:
            specs.append(non_fatal_alert(kind, job))
        if retract is not None and kind.id == retract.id:
            specs.append(retraction_alert(kind, job))
    if catalog.crash is not None:
        specs += [crashed_alert(catalog.crash, job), crash_loop_any_alert(catalog.crash, job)]
    specs += [crash_loop_alert(pack, job), near_full_alert(pack, job)]
    specs += [exporter_down_alert(pack, job), no_logs_alert(pack, job), target_down_alert(pack, job)]
    specs.append(state_errors_alert(pack, job))
    return specs


def recording_rules(catalog: Catalog) -> list[RecordSpec]:
    """Every recording rule of the pack, in the order they are evaluated (each reads only those before it)."""
    scope = Scope.of(catalog.alert_pack)
    records = oom_records(catalog.kinds, catalog.alert_pack, scope, retraction_kind(catalog))
    if catalog.crash is not None:
        records += crash_records(catalog.crash, scope)
    return records + guard_records(catalog.alert_pack, scope)


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
    records = recording_rules(catalog)
    scope = Scope.of(catalog.alert_pack)
    groups = []
    for group in (OOM_GROUP, EXPORTER_GROUP):
        rules = [r.rule() for r in records if r.group == group]
        rules += [s.rule(options, scope.cluster) for s in specs if s.group == group]
        groups.append({"name": group, "rules": rules})
    header = (
        f"# {GENERATED_NOTE}\n"
        "# The SGLang OOM alert pack: load with `rule_files:` (plain Prometheus) or through the Helm chart's\n"
        f"# PrometheusRule. Every rule matches {scope.job_selector}: name the scrape job so. Aggregations keep\n"
        f"# the cluster label ({scope.cluster}), so one ruler over many clusters keeps them apart\n"
        "# (docs/multi-cluster.md).\n"
    )
    return header + dump_yaml({"groups": groups})


def _alternation(names: Sequence[str]) -> str:
    return "|".join(names)


def alertmanager_example(catalog: Catalog) -> str:
    """The text of alerts/alertmanager.example.yml: the pack's route subtree under a stand-in for an existing
    config's root, the pack's receivers, and its inhibitions.

    The subtree matches the pack's alert names and nothing else, so merged first under any root route it
    leaves every other alert where it went before (tests/test_alerts.py merges it under a catch-all)."""
    specs = alert_pack(catalog)
    pages = [s.name for s in specs if s.role in ("fatal", "crash_loop", "crash_loop_any")]
    per_source = [s.name for s in specs if s.role in ("non_fatal", "retraction", "crash")]
    scope = Scope.of(catalog.alert_pack)
    source_equal = scope.labels(*SOURCE_LABELS)
    unit = scope.labels(*INCIDENT_LABELS)
    return f"""# {GENERATED_NOTE}
# The SGLang OOM alert pack's Alertmanager routing, as a subtree to merge into the config you already have:
# critical alerts page, warnings open tickets, and a pod's warnings stay quiet while its OOM page fires.
# One incident, one page: the pages are grouped by what failed (the pod, a multi-node server's serving group,
# or a plain file's source), not by alert name, so a pod's prefill, decode and crash-loop alerts are one
# Alertmanager group, one group key at the pager (PagerDuty's dedup_key, Opsgenie's alias): one incident
# whose notification lists every kind. docs/alertmanager-routing.md says more.
# The subtree matches this pack's alerts by name and nothing else, so your other alerts keep their routes.
# To merge: put the `routes:` entry marked below FIRST under your root route's `routes:` (before any catch-all
# of yours, which would take our alerts first), add the receivers pager, ticket and "null" (or point the
# subtree at receivers you have), and append the inhibit_rules. The root route and the `default` receiver
# stand for your own; as it is, the file is a complete config. Check it: amtool check-config {ALERTMANAGER_PATH}
route:
  receiver: default  # stands for your root route and its receiver
  routes:
    # --- the SGLang OOM pack: merge from here ---
    - matchers: ['alertname=~"{_alternation([s.name for s in specs])}"']
      receiver: {RECEIVERS["warning"]}
      group_by: [alertname, {unit}, instance]
      repeat_interval: 12h
      routes:
        - receiver: {RECEIVERS["critical"]}
          matchers: ['severity="critical"']
          group_by: [{unit}]  # one incident per pod, serving group or source
          # {PAGE_GROUP_WAIT}, not the default 30s: every page is `for: 0m` in one rule group, so one
          # evaluation finds all of a crash's alerts (the exporter counts it within 0.2 s) and they reach
          # Alertmanager within about a second; the wait sends them as ONE notification, and pages 20 s sooner.
          # A kind first seen by a later evaluation joins the same incident (same group key) after group_interval.
          # docs/alertmanager-routing.md says more.
          group_wait: {PAGE_GROUP_WAIT}
          repeat_interval: 1h
        - receiver: "{RECEIVERS["info"]}"
          matchers: ['severity="info"']
    # --- to here ---

receivers:
  - name: default  # stands for yours
  - name: {RECEIVERS["critical"]}
    webhook_configs:
      - url: http://pager.example.invalid/sglang-oom
  - name: {RECEIVERS["warning"]}
    webhook_configs:
      - url: http://tickets.example.invalid/sglang-oom
  - name: "{RECEIVERS["info"]}"

inhibit_rules:
  # The source already paged for an OOM: its retraction and abort warnings add nothing.
  - source_matchers: ['alertname=~"{_alternation(pages)}"']
    target_matchers: ['alertname=~"{_alternation(per_source)}"']
    equal: [{source_equal}]
  # Same for the KV near-full warning of the paged pod (node discovery and sidecar label it by pod) ...
  - source_matchers: ['alertname=~"{_alternation(pages)}"']
    target_matchers: ['alertname="{NEAR_FULL}"', 'pod=~".+"']
    equal: [{scope.labels("namespace", "pod")}]
  # ... or of the paged source (config targets: [{{url, source}}]). A warning naming neither stays.
  - source_matchers: ['alertname=~"{_alternation(pages)}"']
    target_matchers: ['alertname="{NEAR_FULL}"', 'pod=""', 'source=~".+"']
    equal: [{scope.labels("source")}]
  # An exporter that is down reads no logs either: one warning is enough.
  - source_matchers: ['alertname="{EXPORTER_DOWN}"']
    target_matchers: ['alertname="{NO_LOGS}"']
    equal: [{scope.labels("instance")}]
"""


def render_alerts(catalog: Catalog, options: RenderOptions, files_so_far: Mapping[str, str]) -> Files:
    """Renderer: the rules file and the example Alertmanager config."""
    return {RULES_PATH: rules_file(catalog, options), ALERTMANAGER_PATH: alertmanager_example(catalog)}
