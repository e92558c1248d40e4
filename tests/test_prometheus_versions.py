"""README's minimum Prometheus and prometheus-operator versions hold for the rules file as rendered: every rule
field and PromQL function the rules use is mapped to the release that introduced it, and README's minimum is at
least the newest of them. A field or function not in the tables fails the test until someone looks it up."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "alerts" / "sglang-oom.rules.yaml"

BASELINE = (2, 0, 0)  # Prometheus 2.0's rule file format and every function it had
# Prometheus: the release that added a rule field or a function the rules use (its CHANGELOG and PR).
PROMETHEUS_FIELDS = {
    "name": BASELINE, "rules": BASELINE, "record": BASELINE, "alert": BASELINE, "expr": BASELINE,
    "for": BASELINE, "labels": BASELINE, "annotations": BASELINE,
    "keep_firing_for": (2, 42, 0),  # prometheus/prometheus#11827
}  # fmt: skip
PROMETHEUS_FUNCTIONS = {
    "abs": BASELINE, "absent": BASELINE, "changes": BASELINE, "clamp_max": BASELINE, "clamp_min": BASELINE,
    "delta": BASELINE, "deriv": BASELINE, "increase": BASELINE, "irate": BASELINE, "label_replace": BASELINE,
    "max_over_time": BASELINE, "min_over_time": BASELINE, "avg_over_time": BASELINE, "sum_over_time": BASELINE,
    "count_over_time": BASELINE, "rate": BASELINE, "resets": BASELINE, "time": BASELINE, "timestamp": BASELINE,
    "vector": BASELINE, "scalar": BASELINE, "histogram_quantile": BASELINE, "label_join": BASELINE, "floor": BASELINE,
    "absent_over_time": (2, 16, 0),  # prometheus/prometheus#6490
    "last_over_time": (2, 26, 0),  # prometheus/prometheus#8457
    "clamp": (2, 26, 0), "sgn": (2, 26, 0),  # the same change
}  # fmt: skip
# Aggregations and binary-operator keywords: PromQL since 2.0.
KEYWORDS = {"sum", "min", "max", "avg", "count", "topk", "bottomk", "by", "without", "on", "ignoring",
            "group_left", "group_right", "and", "or", "unless", "bool", "offset"}  # fmt: skip
# prometheus-operator: the release whose PrometheusRule CRD first accepts a rule field (its CHANGELOG).
OPERATOR_FIELDS = {field: (0, 0, 0) for field in PROMETHEUS_FIELDS} | {
    "keep_firing_for": (0, 66, 0),  # prometheus-operator/prometheus-operator#5651, 0.66.0 / 2023-06-14
}  # fmt: skip


def _version(text: str) -> tuple[int, int, int]:
    major, minor, patch = ([int(p) for p in text.split(".")] + [0, 0])[:3]
    return major, minor, patch


def _used() -> tuple[set[str], set[str]]:
    """The rule (and group) fields and the PromQL functions the rules file uses."""
    rules = yaml.safe_load(RULES.read_text())
    fields: set[str] = set()
    functions: set[str] = set()
    for group in rules["groups"]:
        fields |= set(group)
        for rule in group["rules"]:
            fields |= set(rule)
            expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', rule["expr"])  # no word inside a label value
            functions |= set(re.findall(r"\b([a-z_]+)\s*\(", expr)) - KEYWORDS
    return fields, functions


def _readme_minimum(name: str) -> tuple[int, int, int]:
    text = " ".join((ROOT / "README.md").read_text().split())
    (found,) = re.findall(rf"(?<![\w-]){re.escape(name)} (\d+\.\d+)\+", text)
    return _version(found)


def test_every_field_and_function_of_the_rules_has_a_known_version():
    fields, functions = _used()
    assert sorted(fields - PROMETHEUS_FIELDS.keys()) == []
    assert sorted(functions - PROMETHEUS_FUNCTIONS.keys()) == []
    assert "keep_firing_for" in fields
    assert "last_over_time" in functions


def test_readme_states_the_prometheus_the_rules_need():
    fields, functions = _used()
    needed = max([PROMETHEUS_FIELDS[f] for f in fields] + [PROMETHEUS_FUNCTIONS[f] for f in functions])
    assert needed == (2, 42, 0)
    assert _readme_minimum("Prometheus") >= needed


def test_readme_states_the_prometheus_operator_the_prometheusrule_needs():
    fields, _ = _used()
    needed = max(OPERATOR_FIELDS[f] for f in fields)
    assert needed == (0, 66, 0)
    assert _readme_minimum("prometheus-operator") >= needed


def test_the_readme_minimum_is_read_as_written():
    assert _version("2.42") == (2, 42, 0)
    assert _version("0.66.1") == (0, 66, 1)
