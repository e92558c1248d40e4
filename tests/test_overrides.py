"""Configuration without forking: `render --overrides FILE` merges job_selector, cluster_label
and per-alert numbers onto the built-in catalog, checks them with file:line errors, and the rules it renders
behave as configured under promtool. Also: moving rendered text to another cluster label (what the chart's
clusterLabel does, promql.relabel_cluster) gives exactly what a render with that label gives.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from sglang_oom_exporter.catalog import CatalogError, load_catalog
from sglang_oom_exporter.cli import main
from sglang_oom_exporter.render import render_all
from sglang_oom_exporter.render.alerts import RULES_PATH, alert_pack
from sglang_oom_exporter.render.options import RenderOptions
from sglang_oom_exporter.render.overrides import load_with_overrides
from sglang_oom_exporter.render.promql import relabel_cluster

CATALOG = load_catalog()
OVERRIDES = """\
# ours: the scrape jobs are per cluster, Mimir's external label is k8s_cluster, and we want more warning
job_selector: 'job=~"sglang-oom.*"'
cluster_label: k8s_cluster
alerts:
  SGLangKVCacheNearFull: {threshold: 0.95, for: 15m}
  SGLangPrefillOOM:
    for: 1m
    keep_firing_for: 30m
  SGLangKVCacheRetractionsHigh: {threshold_per_minute: 5}
"""


def _rules(catalog: Any) -> dict[str, dict[str, Any]]:
    """Every rule of the rendered pack by its name: the alerts and the recording rules they read."""
    text = render_all(catalog)[RULES_PATH]
    return {r.get("alert") or r["record"]: r for g in yaml.safe_load(text)["groups"] for r in g["rules"]}


def _raw_selectors(expr: str) -> list[str]:
    """The matchers of every selector of a series the exporter (or kube-state-metrics) exports, not a recorded one."""
    return re.findall(r"\b(?:sglang_oom_\w+|up)\{([^}]*)\}", expr)


@pytest.fixture(scope="module")
def overridden(tmp_path_factory) -> Any:
    path = tmp_path_factory.mktemp("ov") / "my-overrides.yaml"
    path.write_text(OVERRIDES)
    return load_with_overrides(str(path))


def test_overrides_change_the_job_selector_cluster_label_and_the_named_numbers_only(overridden):
    default, mine = _rules(CATALOG), _rules(overridden)
    assert sorted(default) == sorted(mine)
    for name, rule in mine.items():
        assert all('job=~"sglang-oom.*"' in m for m in _raw_selectors(rule["expr"])), name
        assert 'job="sglang-oom-exporter"' not in rule["expr"], name
        assert "cluster, " not in rule["expr"].replace("k8s_cluster, ", ""), name
    near_full = mine["SGLangKVCacheNearFull"]
    assert near_full["expr"] == "target:sglang_oom_kv_cache_used:ratio > 0.95\n"  # both readings of "used"
    assert default["SGLangKVCacheNearFull"]["expr"] == "target:sglang_oom_kv_cache_used:ratio > 0.98\n"
    assert near_full["for"] == "15m"
    assert (mine["SGLangPrefillOOM"]["for"], mine["SGLangPrefillOOM"]["keep_firing_for"]) == ("1m", "30m")
    assert " * 60 > 5\nor\n" in mine["SGLangKVCacheRetractionsHigh"]["expr"]  # the log branch's threshold
    changed = {"SGLangKVCacheNearFull": {"for"}, "SGLangPrefillOOM": {"for", "keep_firing_for"}}
    for name in default:  # every other alert keeps its `for`, keep_firing_for and severity
        for key in {"for", "keep_firing_for"} - changed.get(name, set()):
            assert mine[name].get(key) == default[name].get(key), (name, key)
        assert mine[name].get("labels") == default[name].get("labels"), name
    # The runbooks and the example Alertmanager config follow: the page states the new threshold.
    files = render_all(overridden)
    assert (
        "above 95%" in files["docs/runbooks/sglangkvcachenearfull.md"]
        or "0.95" in files["docs/runbooks/sglangkvcachenearfull.md"]
    )
    assert "equal: [k8s_cluster, namespace, pod, container, source]" in files["alerts/alertmanager.example.yml"]


def _promtool_test(tmp_path: Path, rules_text: str, cases: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "rules.yaml").write_text(rules_text)
    doc = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": cases}
    (tmp_path / "t.test.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return subprocess.run(["promtool", "test", "rules", "t.test.yaml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip


# KV usage 0.96 for 20 minutes on one pod of job sglang-oom-exporter-eu, cluster eu-west (label k8s_cluster).
_NEAR_FULL_CASE = {
    "name": "a job the selector matches, usage between the two thresholds",
    "interval": "1m",
    "input_series": [
        {"series": 'sglang_oom_target_token_usage{k8s_cluster="eu-west",job="sglang-oom-exporter-eu",'
                   'instance="10.0.0.7:9877",target="http://10.1.0.5:30000",namespace="llm",pod="sglang-0"}',
         "values": "0.96x20"},
        {"series": 'sglang_oom_target_up{k8s_cluster="eu-west",job="sglang-oom-exporter-eu",instance="10.0.0.7:9877",'
                   'target="http://10.1.0.5:30000"}', "values": "1x20"},
    ],
}  # fmt: skip


NEAR_FULL_TEXT = {
    "summary": "SGLang's KV cache has stayed nearly full, so an OOM may follow.",
    "description": "SGLang at http://10.1.0.5:30000 (pod llm/sglang-0) in cluster eu-west has used 96% of its KV "
    "cache for 15m (alert above 95%, read by exporter 10.0.0.7:9877). New requests wait or retract running ones, "
    "and the next large prefill or decode step may fail with an OOM. Lower --max-running-requests or "
    "--chunked-prefill-size, or give the KV pool more memory (--mem-fraction-static).",
    "runbook_url": "https://github.com/sglang-oom-exporter/sglang-oom-exporter/blob/main/docs/runbooks/"
    "sglangkvcachenearfull.md",
}


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_the_overridden_rules_fire_on_the_selected_job_at_the_new_threshold_and_for(tmp_path, overridden):
    labels = {"severity": "warning", "k8s_cluster": "eu-west", "namespace": "llm", "pod": "sglang-0",
              "instance": "10.0.0.7:9877", "target": "http://10.1.0.5:30000"}  # fmt: skip
    mine = {**_NEAR_FULL_CASE, "alert_rule_test": [
        {"eval_time": "14m", "alertname": "SGLangKVCacheNearFull", "exp_alerts": []},  # for: 15m, not 10m
        {"eval_time": "15m", "alertname": "SGLangKVCacheNearFull", "exp_alerts": [{"exp_labels": labels,
                                                                                    "exp_annotations": NEAR_FULL_TEXT}]},
    ]}  # fmt: skip
    proc = _promtool_test(tmp_path, render_all(overridden)[RULES_PATH], [mine])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The built-in rules: another job, and 0.96 is below 0.98, so they never fire on the same series.
    default = {**_NEAR_FULL_CASE, "alert_rule_test": [
        {"eval_time": "20m", "alertname": "SGLangKVCacheNearFull", "exp_alerts": []},
    ]}  # fmt: skip
    proc = _promtool_test(tmp_path, render_all(CATALOG)[RULES_PATH], [default])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # ... and the test above is no tautology: the overridden expectation fails against the built-in rules.
    proc = _promtool_test(tmp_path, render_all(CATALOG)[RULES_PATH], [mine])
    assert proc.returncode == 1, proc.stdout + proc.stderr


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_the_overridden_retraction_threshold_decides_between_the_two(tmp_path, overridden):
    """A retraction rate halfway between the catalog's threshold and the override's 5 a minute: exactly the
    rules whose threshold is below it warn."""
    default = float(CATALOG.kind(CATALOG.retraction_kind or "").alert["threshold_per_minute"])
    assert default != 5
    per_minute = (default + 5) / 2
    quiet = {
        "name": f"{per_minute:g} retractions a minute",
        "interval": "1m",
        "input_series": [{"series": 'sglang_oom_events_total{k8s_cluster="c1",job="sglang-oom-exporter",instance="i",'
                                    f'kind="{CATALOG.retraction_kind}",namespace="llm",pod="sglang-0",container="s"}}',
                          "values": f"0+{per_minute:g}x40"}],
        "alert_rule_test": [{"eval_time": "40m", "alertname": "SGLangKVCacheRetractionsHigh", "exp_alerts": []}],
    }  # fmt: skip
    mine, builtin = render_all(overridden)[RULES_PATH], render_all(CATALOG)[RULES_PATH]
    silent, warns = (mine, builtin) if per_minute <= 5 else (builtin, mine)
    proc = _promtool_test(tmp_path, silent, [quiet])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = _promtool_test(tmp_path, warns, [quiet])  # fails because the alert fires, for this pod and cluster
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert 'alertname="SGLangKVCacheRetractionsHigh", container="s"' in proc.stderr


BAD = """\
job_selector: 'job sglang'
cluster_label: 1cluster
colour: red
alerts:
  SGLangKVCacheNearFull: {threshold: 2, for: 15}
  SGLangPrefillOOM:
    for: 10m
  SGLangNope: {for: 1m}
  SGLangOOMCrashLoop: {count: 0, nonsense: 1}
  SGLangDecodeRequestsAborted: {name: Other}
"""


def test_a_bad_key_or_value_is_named_with_its_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(BAD)
    with pytest.raises(CatalogError) as err:
        load_with_overrides(str(path))
    p = str(path)
    assert err.value.problems == [
        f"{p}:3: colour: unknown key (use job_selector, cluster_label, alerts)",
        f"{p}:1: job_selector: 'job sglang' is not label matchers like job=~\"sglang-oom.*\"",
        f"{p}:2: cluster_label: '1cluster' is not a Prometheus label name",
        f"{p}:5: alerts.SGLangKVCacheNearFull.for: 15 is not a Prometheus duration (5m, 1h)",
        f"{p}:5: alerts.SGLangKVCacheNearFull.threshold: is a ratio: at most 1",
        f"{p}:7: alerts.SGLangPrefillOOM.for: must be shorter than the window (5m)",
        f"{p}:8: alerts.SGLangNope: no such alert (one of {', '.join(sorted(s.name for s in alert_pack(CATALOG)))})",
        f"{p}:9: alerts.SGLangOOMCrashLoop.nonsense: unknown key",
        f"{p}:9: alerts.SGLangOOMCrashLoop.count: must be a positive number",
        f"{p}:10: alerts.SGLangDecodeRequestsAborted.name: cannot be overridden "
        "(settable: for, severity, threshold_per_minute, window)",
    ]


def test_render_overrides_on_the_command_line(tmp_path, capsys):
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(OVERRIDES)
    bad.write_text("alerts:\n  SGLangPrefillOOM: {for: 5m}\n")
    assert main(["render", "--overrides", str(good), str(tmp_path / "out")]) == 0
    rules = (tmp_path / "out" / RULES_PATH).read_text()
    assert 'up{job=~"sglang-oom.*"} == 0' in rules
    capsys.readouterr()
    assert main(["render", "--overrides", str(bad), str(tmp_path / "out2")]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2: alerts.SGLangPrefillOOM.for: must be shorter than the window (5m)" in err
    assert not (tmp_path / "out2").exists()


@pytest.mark.parametrize("label", ["k8s_cluster", "tenant", "cluster_id"])
def test_moving_rendered_text_to_another_cluster_label_equals_rendering_with_it(label):
    """What the chart's clusterLabel does to its copies (regexReplaceAll with promql's two patterns) is exactly
    a render with cluster_label set: rules, example Alertmanager config and dashboard."""
    options = RenderOptions(grafana_url="https://grafana.example.com")
    other = dataclasses.replace(CATALOG, alert_pack={**CATALOG.alert_pack, "cluster_label": label})
    default, relabelled = render_all(CATALOG, options), render_all(other, options)
    for path in (RULES_PATH, "alerts/alertmanager.example.yml", "dashboards/sglang-oom-overview.json"):
        assert relabel_cluster(default[path], label) == relabelled[path], path
        assert relabelled[path] != default[path], path


def test_the_documented_overrides_example_renders_as_it_says(tmp_path):
    """docs/multi-cluster.md's example file: valid, and each key does what the page says."""
    doc = (Path(__file__).resolve().parent.parent / "docs" / "multi-cluster.md").read_text()
    block = doc.split("<!-- overrides example: tests/test_overrides.py renders it -->\n```yaml\n", 1)[1]
    path = tmp_path / "my-overrides.yaml"
    path.write_text(block.split("```", 1)[0])
    rules = _rules(load_with_overrides(str(path)))
    assert all('job=~"sglang-oom.*"' in m for r in rules.values() for m in _raw_selectors(r["expr"]))
    source = rules["source_kind:sglang_oom_fatal_events:exact_increase5m"]["expr"]
    assert source.startswith("max by (k8s_cluster, namespace, pod, container, source, host, kind)")
    assert rules["SGLangKVCacheNearFull"]["expr"] == "target:sglang_oom_kv_cache_used:ratio > 0.95\n"
    assert " * 60 > 5\nor\n" in rules["SGLangKVCacheRetractionsHigh"]["expr"]
    assert (rules["SGLangPrefillOOM"]["for"], rules["SGLangPrefillOOM"]["keep_firing_for"]) == ("1m", "30m")
    assert rules["SGLangOOMExporterNoLogs"]["labels"] == {"severity": "info"}


def _records(catalog: Any) -> dict[str, str]:
    text = render_all(catalog)[RULES_PATH]
    return {r["record"]: r["expr"] for g in yaml.safe_load(text)["groups"] for r in g["rules"] if "record" in r}


@pytest.mark.e2e
def test_no_logs_image_patterns_are_overridden_escaped_and_checked(tmp_path):
    """NoLogs' server and excluded images: set by name like its numbers, written into PromQL escaped (a
    backslash doubled), and a pattern RE2 cannot read is named with its file and line."""
    good, bad = tmp_path / "images.yaml", tmp_path / "bad-images.yaml"
    good.write_text(
        "alerts:\n  SGLangOOMExporterNoLogs:\n"
        "    server_images: '(?i).*(sglang|llm-serve).*'\n    excluded_images: 'registry\\.corp/tools/.*'\n"
    )
    expr = _records(load_with_overrides(str(good)))["node:sglang_oom_sglang_server_containers:count"]
    assert 'kube_pod_container_info{image=~"(?i).*(sglang|llm-serve).*", image!~"registry\\\\.corp/tools/.*"}' in expr
    default = _records(CATALOG)["node:sglang_oom_sglang_server_containers:count"]
    assert (
        'image=~"(?i).*sglang.*", image!~"(?i).*sglang[-_]?(oom[-_]?exporter|router|(model[-_]?)?gateway).*"' in default
    )
    if shutil.which("promtool"):
        rules = tmp_path / "rules.yaml"
        rules.write_text(render_all(load_with_overrides(str(good)))[RULES_PATH])
        check = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True, check=False)
        assert check.returncode == 0, check.stdout + check.stderr
    bad.write_text("alerts:\n  SGLangOOMExporterNoLogs:\n    server_images: '(?=sglang).*'\n    excluded_images: ''\n")
    with pytest.raises(CatalogError) as err:
        load_with_overrides(str(bad))
    assert err.value.problems == [
        f"{bad}:3: alerts.SGLangOOMExporterNoLogs.server_images: '(?=sglang).*' is not an RE2 regex of container images",
        f"{bad}:3: alerts.SGLangOOMExporterNoLogs.excluded_images: '' is not an RE2 regex of container images",
    ]


def test_the_crash_alerts_take_overrides_like_any_other(tmp_path):
    path = tmp_path / "o.yaml"
    path.write_text("alerts:\n  SGLangCrashLoop: {count: 5, window: 2h}\n  SGLangCrashed: {keep_firing_for: 30m}\n")
    catalog = load_with_overrides(str(path))
    rules = _rules(catalog)
    assert rules["SGLangCrashLoop"]["expr"] == "unit:sglang_oom_crashes:exact_increase2h >= 5\n"
    assert rules["SGLangCrashed"]["keep_firing_for"] == "30m"
    path.write_text("alerts:\n  SGLangCrashLoop: {loop: {count: 1}}\n")
    with pytest.raises(CatalogError, match=r"alerts\.SGLangCrashLoop\.loop"):
        load_with_overrides(str(path))
