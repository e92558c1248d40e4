"""Render: the Helm chart's generated parts (helm/sglang-oom-exporter/): Chart.yaml and the files/ copies.

Helm cannot read outside the chart, so the rendered rules file and dashboards are copied into its files/
byte for byte (the PrometheusRule template loads the rules with `.Files.Get | fromYaml`, the dashboard
ConfigMaps take the JSON as it is). Chart.yaml is rendered so that the chart's version and appVersion
always equal the package version. files/render-defaults.yaml tells the templates what render assumed: the
runbook base URL in the rules (which the top-level `runbookBaseUrl` swaps) and, per alert, the
dashboard_url path that `prometheusRule.grafanaUrl` is put in front of. The paths come from rendering the
rules once more with a sentinel Grafana URL, so the chart never re-implements the alert renderer's links.
Runs last: it reads what the other renderers produced.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import yaml

from .. import __version__
from ..catalog import Catalog
from .alerts import RULES_PATH, render_alerts
from .options import GENERATED_NOTE, Files, RenderOptions
from .promql import Scope, cluster_patterns

CHART_DIR = "helm/sglang-oom-exporter"
DASHBOARD_DIR = "dashboards/"
CHART_RULES = f"{CHART_DIR}/files/sglang-oom.rules.yaml"
CHART_DEFAULTS = f"{CHART_DIR}/files/render-defaults.yaml"
# Never a real host: it only marks where the Grafana URL sits in a rendered dashboard_url.
_SENTINEL = "http://grafana.sentinel.invalid"


def chart_yaml(version: str, project_url: str) -> str:
    """Chart.yaml for this package version (version and appVersion are the same)."""
    return f"""\
# {GENERATED_NOTE}
apiVersion: v2
name: sglang-oom-exporter
description: SGLang KV-cache OOM events from logs as Prometheus metrics, with the alert rules and Grafana dashboards.
type: application
version: {version}
appVersion: "{version}"
kubeVersion: ">=1.25.0-0"
keywords:
  - sglang
  - prometheus
  - oom
  - kv-cache
home: {project_url}
sources:
  - {project_url}
annotations:
  artifacthub.io/license: Apache-2.0
"""


def dashboard_paths(rules_text: str) -> dict[str, str]:
    """Per alert, the dashboard_url after the sentinel Grafana URL, in a rules file rendered with it."""
    doc = yaml.safe_load(rules_text) or {}
    paths: dict[str, str] = {}
    for group in doc.get("groups") or []:
        for rule in group.get("rules") or []:
            url = (rule.get("annotations") or {}).get("dashboard_url", "")
            if rule.get("alert") and isinstance(url, str) and url.startswith(_SENTINEL):
                paths[str(rule["alert"])] = url[len(_SENTINEL) :]
    return paths


def _rules_with_sentinel(catalog: Catalog, options: RenderOptions) -> str | None:
    """The rules file as the alerts renderer writes it when a Grafana URL is set; None without rules."""
    return render_alerts(catalog, replace(options, grafana_url=_SENTINEL), {}).get(RULES_PATH)


def render_defaults(options: RenderOptions, paths: Mapping[str, str], scope: Scope | None = None) -> str:
    """files/render-defaults.yaml: the runbook base in the copied rules, each alert's dashboard path, and the
    job selector and cluster label the copies were rendered with, with the patterns that move the label
    (promql.cluster_patterns), for the chart's jobSelector and clusterLabel."""
    scope = scope or Scope()
    data: dict[str, Any] = {
        "runbookBaseUrl": options.runbook_base_url,
        "jobSelector": scope.job_selector,
        "clusterLabel": scope.cluster,
        "clusterPatterns": cluster_patterns(scope.cluster),
        "dashboardUrls": dict(sorted(paths.items())),
    }
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=1000)
    return f"# {GENERATED_NOTE}\n# Read by templates/prometheusrule.yaml, dashboards.yaml and _helpers.tpl.\n{body}"


def render_chart(catalog: Catalog, options: RenderOptions, files_so_far: Mapping[str, str]) -> Files:
    """Chart.yaml, the rules and dashboards copied into the chart, and the defaults the templates need."""
    out: Files = {f"{CHART_DIR}/Chart.yaml": chart_yaml(__version__, options.project_url)}
    if RULES_PATH in files_so_far:
        out[CHART_RULES] = files_so_far[RULES_PATH]
        sentinel = _rules_with_sentinel(catalog, options)
        out[CHART_DEFAULTS] = render_defaults(options, dashboard_paths(sentinel or ""), Scope.of(catalog.alert_pack))
    for path, text in sorted(files_so_far.items()):
        if path.startswith(DASHBOARD_DIR) and path.endswith(".json") and "/" not in path[len(DASHBOARD_DIR) :]:
            out[f"{CHART_DIR}/files/{path}"] = text
    return out
