"""`helm upgrade` with the values of an earlier chart: a value that moved keeps working for one minor release,
NOTES.txt names its new key, and the chart README's "Upgrades" lists every value that moved.

tests/data/chart/values-0.1.0.yaml is the first chart's values.yaml (commit 3a3b81b) as a user keeps it for
`helm upgrade -f`, with the one value it had that has since moved (prometheusRule.runbookBaseUrl) set.
"""

from __future__ import annotations

import pytest
import yaml

from tests.support.helm import CHART, ROOT, by_kind, helm, helm_with_values, needs_dashboards, needs_rules, template

pytestmark = pytest.mark.e2e  # every test here runs helm

OLD_VALUES = ROOT / "tests" / "data" / "chart" / "values-0.1.0.yaml"
OLD_BASE = "https://wiki.example.com/sglang/runbooks"
# Every value of an earlier chart that this chart names otherwise: old key -> new key.
MOVED = {"prometheusRule.runbookBaseUrl": "runbookBaseUrl"}


def _old_values() -> dict:
    return yaml.safe_load(OLD_VALUES.read_text())


def _paths(tree: dict, prefix: str = "") -> set[str]:
    """Every key path of a values tree, down to the leaves (maps of user data, such as labels, count as leaves)."""
    out = set()
    for key, value in tree.items():
        path = f"{prefix}{key}"
        out.add(path)
        if isinstance(value, dict) and value and key not in ("nodeLabels", "podSelector", "resources", "stateVolume"):
            out |= _paths(value, f"{path}.")
    return out


def _render_old(extra: dict | None = None) -> tuple[list[dict], str]:
    """The chart rendered with the old values file (and extra values): the documents and NOTES.txt."""
    on = {"prometheusRule": {"enabled": True}, "grafanaDashboards": {"enabled": True}, **(extra or {})}
    argv = [helm(), "install", "t", str(CHART), "-n", "monitoring", "--dry-run=client", "-f", str(OLD_VALUES)]
    proc = helm_with_values(argv, (), on)
    assert proc.returncode == 0, proc.stderr
    manifest, notes = proc.stdout.split("NOTES:\n", 1)
    docs = [d for d in yaml.safe_load_all(manifest.split("MANIFEST:\n", 1)[1]) if d]
    return docs, notes


def test_the_old_values_file_renders_with_its_runbook_base_and_notes_name_the_new_key():
    needs_rules()
    needs_dashboards()
    docs, notes = _render_old()
    text = yaml.safe_dump(docs)
    # Every runbook link of the rules and dashboards moved to the old key's base (19 alerts, 28 dashboard links).
    assert text.count(OLD_BASE) == 19 + 28
    (rule,) = by_kind(docs, "PrometheusRule")
    urls = [r["annotations"]["runbook_url"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    assert len(urls) == 19
    assert [u for u in urls if not u.startswith(OLD_BASE + "/")] == []
    assert notes.count("WARNING: prometheusRule.runbookBaseUrl is deprecated: it moved to runbookBaseUrl") == 1
    assert f'Set runbookBaseUrl={OLD_BASE} instead (the chart\'s README, "Upgrades").' in notes
    assert "the next minor release will not" in notes


def test_the_new_key_wins_over_the_old_one_and_notes_say_so():
    needs_rules()
    docs, notes = _render_old({"runbookBaseUrl": "https://rb.example/new"})
    text = yaml.safe_dump(docs)
    assert OLD_BASE not in text
    assert text.count("https://rb.example/new/") == 19 + 28
    assert "This chart still reads it, but runbookBaseUrl is set too and wins" in notes


def test_the_old_key_reaches_the_kubernetes_events_runbook_links():
    docs = template(values={"events": {"enabled": True}, "prometheusRule": {"runbookBaseUrl": OLD_BASE}})
    cm = next(d for d in by_kind(docs, "ConfigMap") if "config.yaml" in d["data"])
    assert yaml.safe_load(cm["data"]["config.yaml"])["kubernetes"]["events"]["runbook_base_url"] == OLD_BASE


def test_no_warning_without_a_moved_value():
    proc = helm_with_values([helm(), "install", "t", str(CHART), "-n", "monitoring", "--dry-run=client"], (), None)
    assert proc.returncode == 0, proc.stderr
    assert "deprecated" not in proc.stdout.split("NOTES:\n", 1)[1]


def test_every_value_of_the_first_chart_is_still_a_value_or_listed_as_moved():
    current = _paths(yaml.safe_load((CHART / "values.yaml").read_text()))
    gone = sorted(_paths(_old_values()) - current)
    assert gone == sorted(MOVED)
    assert [new for new in MOVED.values() if new not in current] == []


def test_the_upgrades_section_lists_every_moved_value():
    readme = (CHART / "README.md").read_text()
    upgrades = readme.split("\n## Upgrades\n", 1)[1].split("\n## ", 1)[0]
    for old, new in MOVED.items():
        assert f"| `{old}` | `{new}` |" in upgrades
