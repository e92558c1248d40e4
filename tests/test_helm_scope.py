"""The chart's jobSelector, clusterLabel and prometheusRule.renderedRules: the PrometheusRule
and the dashboards it ships equal what `render` gives with the same keys in an overrides file, and a rules file
rendered with other thresholds ships as it is.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import yaml

from sglang_oom_exporter.catalog import load_catalog
from sglang_oom_exporter.render import render_all
from sglang_oom_exporter.render.alerts import RULES_PATH
from sglang_oom_exporter.render.dashboards import OVERVIEW_PATH
from sglang_oom_exporter.render.options import RenderOptions
from tests.support.helm import CHART, by_kind, helm, needs_dashboards, needs_rules, one, template

pytestmark = [pytest.mark.e2e]

CATALOG = load_catalog()
SCOPE = {"jobSelector": 'job=~"sglang-oom.*"', "clusterLabel": "k8s_cluster"}
ON = {"prometheusRule": {"enabled": True, "grafanaUrl": "https://g.example"}, "grafanaDashboards": {"enabled": True}}


def _rendered(**pack: str) -> dict[str, str]:
    catalog = dataclasses.replace(CATALOG, alert_pack={**CATALOG.alert_pack, **pack})
    return render_all(catalog, RenderOptions(grafana_url="https://g.example"))


def test_job_selector_and_cluster_label_values_equal_a_render_with_them():
    needs_rules()
    needs_dashboards()
    docs = template(values={**ON, **SCOPE})
    files = _rendered(job_selector=SCOPE["jobSelector"], cluster_label=SCOPE["clusterLabel"])
    pr = one(docs, "PrometheusRule")
    assert pr["spec"]["groups"] == yaml.safe_load(files[RULES_PATH])["groups"]
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]]
    (text,) = cm["data"].values()
    assert json.loads(text) == json.loads(files[OVERVIEW_PATH])
    # ... and they did change something: the defaults give the built-in render.
    default = one(template(values=ON), "PrometheusRule")
    assert default["spec"]["groups"] == yaml.safe_load(_rendered()[RULES_PATH])["groups"]
    assert default["spec"]["groups"] != pr["spec"]["groups"]


def test_rendered_rules_with_other_thresholds_ship_as_given(tmp_path):
    needs_rules()
    overrides = tmp_path / "ov.yaml"
    overrides.write_text("alerts:\n  SGLangKVCacheNearFull: {threshold: 0.9, for: 20m}\n")
    out = tmp_path / "out"
    subprocess.run([sys.executable, "-m", "sglang_oom_exporter", "render", "--overrides", str(overrides), str(out)],
                   check=True, capture_output=True, text=True)  # fmt: skip
    rules = out / RULES_PATH
    proc = subprocess.run([helm(), "template", "t", str(CHART), "--set", "prometheusRule.enabled=true",
                           "--set-file", f"prometheusRule.renderedRules={rules}"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (pr,) = [d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "PrometheusRule"]
    assert pr["spec"]["groups"] == yaml.safe_load(rules.read_text())["groups"]
    near_full = next(r for g in pr["spec"]["groups"] for r in g["rules"] if r.get("alert") == "SGLangKVCacheNearFull")
    assert near_full["expr"] == "target:sglang_oom_kv_cache_used:ratio > 0.9\n"
    assert near_full["for"] == "20m"


@pytest.mark.parametrize(
    "values",
    [{"jobSelector": "job sglang"}, {"jobSelector": "job=\"a%b\""}, {"clusterLabel": "1cluster"},
     {"clusterLabel": "a-b"}],
)  # fmt: skip
def test_the_schema_refuses_a_selector_or_label_that_would_break_the_rules(values):
    error = template(values={**ON, **values}, ok=False)
    assert "values don't meet the specifications of the schema" in error
