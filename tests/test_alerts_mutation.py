"""The mutation check of the alert pack (tools/mutate_alerts.py), and the structural test its fatal-kind family
rests on: every fatal-kind rule is the SGLangPrefillOOM rule with only the kind changed, so a change to any one
of them fails here, and the check counts their mutants as killed by this test. The recording rules are mutated
too, each judged by the tests of the alerts that read it.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path

import promql_parser
import pytest
import yaml

from sglang_oom_exporter.catalog import load_catalog
from sglang_oom_exporter.render.alerts import alert_pack
from tests.support.helpers import load_yaml
from tests.support.promtool_rules import RULES
from tools import mutate_alerts
from tools.mutate_alerts import KIND_RE, families, load_equivalents, mutants, readers, rule_name, shape

CATALOG = load_catalog()
SPECS = alert_pack(CATALOG)
KINDS = [k.id for k in CATALOG.kinds]
REFERENCE = "SGLangPrefillOOM"
EXACT_5M = "source_kind:sglang_oom_fatal_events:exact_increase5m"

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) "
                                    "is not installed; .ci/run installs it")  # fmt: skip


def _rules() -> dict[str, dict]:
    """Every rule of the pack by its name: alerts and recording rules."""
    return {rule_name(r): r for g in load_yaml(RULES)["groups"] for r in g["rules"]}


def test_every_fatal_kind_rule_is_the_prefill_rule_with_only_its_kind_changed():
    rules = _rules()
    fatal = [s for s in SPECS if s.role == "fatal"]
    assert [s.name for s in fatal][:1] == [REFERENCE]
    assert len(fatal) == len([k for k in CATALOG.kinds if k.fatal in ("true", "raised")]) == 9
    reference = rules[REFERENCE]
    for spec in fatal:
        rule = rules[spec.name]
        assert spec.kind is not None
        assert set(KIND_RE.findall(rule["expr"])) == {spec.kind.id}, spec.name
        assert rule["expr"].count(f'kind="{spec.kind.id}"') == reference["expr"].count('kind="prefill"') == 1
        assert shape(rule) == shape(reference), spec.name
        assert rule["labels"] == reference["labels"], spec.name
    # The check's families are exactly these: no other alert shares a shape.
    assert families(list(rules.values())) == {s.name: REFERENCE for s in fatal[1:]}


def test_any_mutant_of_a_fatal_kind_rule_breaks_its_equality_with_the_prefill_rule():
    # What the check counts as "killed by structure": this test's equality fails for each of them.
    rules = _rules()
    decode = mutants(rules["SGLangDecodeOOM"], KINDS)
    assert len(decode) == 6
    assert all(shape(m.rule) != shape(rules[REFERENCE]) for m in decode)


def test_the_mutants_of_the_fatal_shape_by_operator():
    rule = _rules()[REFERENCE]
    found = mutants(rule, KINDS)
    # The alert reads its recorded count: `> 0` (a number and a comparison), its kind, for: 0m (doubled only) and
    # keep_firing_for (both ways).
    assert Counter(m.operator for m in found) == {
        "number": 1, "comparison": 1, "kind": 1, "for": 1, "keep_firing_for": 2,
    }  # fmt: skip
    assert {m.change for m in found if m.operator == "kind"} == {"prefill → decode"}
    assert {m.change for m in found if m.operator == "keep_firing_for"} == {"10m → 20m", "10m → 5m"}
    assert len({m.key for m in found}) == len(found)


def test_the_mutants_of_the_exact_count_by_operator_and_who_judges_them():
    rule = _rules()[EXACT_5M]
    found = mutants(rule, KINDS)
    # 4 numbers (`>= 0`, clamp's 0, `== 0`, `< 300`), 5 ranges and 3 offsets, 3 comparisons, and the branches:
    # the 3-branch `or` chain, the born branch's `unless` and `and`, its `or` of two conditions, and the `max by`
    # argument's set operations.
    assert Counter(m.operator for m in found) == {"number": 4, "range": 5, "offset": 3, "comparison": 3, "drop": 9}
    assert {m.change for m in found if m.operator in ("range", "offset")} == {
        "[1h] → [3h]", "[5m] → [15m]", "offset 5m → 15m",
    }  # fmt: skip
    for m in found:
        promql_parser.parse(m.rule["expr"])
        assert m.rule != rule, m.key
    # Judged by the tests of the alerts that read it through the per-unit count: the fatal family (its first
    # member's file stands for it) and nothing else.
    assert readers(list(_rules().values()))[EXACT_5M] == [s.name for s in SPECS if s.role == "fatal"]


def test_a_mutant_is_named_by_what_it_changes_not_by_where_the_line_is():
    rule = _rules()["SGLangOOMCrashLoop"]
    moved = {**rule, "expr": "\n\n" + re.sub(r"\n", "\n    ", rule["expr"]) + "\n"}
    assert [m.key for m in mutants(moved, KINDS)] == [m.key for m in mutants(rule, KINDS)]


def test_every_listed_equivalent_names_a_mutant_of_the_current_rules_with_a_reason():
    rules = _rules()
    listed = load_equivalents()
    # Six for the OOM pack, the same three of the fatal counts' for the non-memory crash counter, and the last
    # event's PD role join (pages quote the first series of a lookup, and the role-bearing one sorts first).
    assert len(listed) == 10
    for key, reason in listed.items():
        alert = key[0]
        assert key in {m.key for m in mutants(rules[alert], KINDS)}, key
        assert len(reason) > 80, key


@pytest.mark.needs_promtool
@needs_promtool
# One alert with one test file: 9 mutants, about 2 s alone (a recording rule's 24 mutants under its 9 readers'
# files took 17 s alone and over a minute beside the whole-pack check in the suite).
@pytest.mark.e2e
def test_the_check_fails_on_a_new_survivor_and_on_a_stale_entry(tmp_path):
    alert = "SGLangDecodeRequestsAborted"
    listed = yaml.safe_load(mutate_alerts.EQUIVALENTS.read_text(encoding="utf-8"))
    own = [e for e in listed["equivalents"] if e["alert"] == alert]
    assert [(e["operator"], e["change"]) for e in own] == [("comparison", "> → >=")]
    # The real equivalent left out (so it is new), and an entry for a mutant that does not survive (so it is stale).
    stale = {**own[0], "change": "> → <"}
    (tmp_path / "equivalents.yaml").write_text(yaml.safe_dump({"equivalents": [stale]}, allow_unicode=True))
    report = mutate_alerts.check([alert], equivalents_path=tmp_path / "equivalents.yaml")
    assert report.problems == [
        f"new survivor: {alert} | comparison | {own[0]['site']} | > → >=",
        f"stale entry in equivalents.yaml (no such surviving mutant): {alert} | comparison | {own[0]['site']} | > → <",
        "only 88.9 % of the valid mutants killed (at least 90 %)",
    ]
    assert Counter(o.status for o in report.outcomes) == {"killed": 8, "survived": 1}
    # The survivor ran every case of the alert's file; a killed mutant stopped at the case that killed it.
    cases = len(load_yaml(mutate_alerts._test_file(alert))["tests"])
    assert cases >= 2
    assert [o.cases for o in report.outcomes if o.status == "survived"] == [cases]
    assert all(1 <= o.cases <= cases for o in report.outcomes)
    assert report.case_runs() == sum(o.cases for o in report.outcomes) < 9 * cases


def test_a_test_file_is_cut_into_one_file_per_case_cheapest_first(tmp_path):
    # Cost: evaluation steps (the last eval_time over the interval, plus one) times input series (plus one).
    long = {
        "name": "long",
        "interval": "1m",
        "input_series": [{"series": "a", "values": "1x75"}] * 2,
        "alert_rule_test": [{"eval_time": "15m", "alertname": "A"}, {"eval_time": "75m", "alertname": "A"}],
    }
    short = {
        "name": "short",
        "input_series": [{"series": "b", "values": "1x5"}],
        "promql_expr_test": [{"expr": "b", "eval_time": "10m", "exp_samples": []}],
    }
    test = {"rule_files": ["x.rules.yaml"], "evaluation_interval": "2m", "tests": [long, short]}
    assert mutate_alerts._split_cases(tmp_path, "x.test.yaml", test) == [(12.0, "x-c01.test.yaml"),
                                                                          (228.0, "x-c00.test.yaml")]  # fmt: skip
    assert load_yaml(tmp_path / "x-c00.test.yaml") == {**test, "tests": [long]}
    assert load_yaml(tmp_path / "x-c01.test.yaml") == {**test, "tests": [short]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x-c00.test.yaml", "x-c01.test.yaml"]


@pytest.mark.slow
@pytest.mark.needs_promtool
@needs_promtool
# Mutants run in rounds, one test case each, cheapest first, stopping at the first that kills (tools/mutate_alerts.py):
# 256 CPU s for 299 mutants, against 700 CPU s when every mutant ran its whole files (both side by side at a load
# of 12-16, `time python tools/mutate_alerts.py`); in the suite it shares the CPUs with the xdist workers.
@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_the_mutation_check_of_the_pack_passes(tmp_path: Path):
    """The whole check, as CI runs it: at least 90 % killed, every survivor listed as equivalent."""
    report = mutate_alerts.check(work_dir=tmp_path)
    summary = mutate_alerts.summary(report)
    assert report.problems == [], summary
    assert report.killed_percent() >= 90.0, summary
    statuses = Counter(o.status for o in report.outcomes)
    assert statuses["survived"] == statuses["invalid"] == statuses["unjudged"] == 0, summary
    assert statuses["equivalent"] == len(load_equivalents())
    # Every alert of the pack was mutated, and every family member counted through the structural test.
    # (a record with no mutation point, a plain `max by`, has no mutant)
    assert {o.mutant.alert for o in report.outcomes} == {n for n, r in _rules().items() if mutants(r, KINDS)}
    assert {s.name for s in SPECS} <= {o.mutant.alert for o in report.outcomes}
    members = len([s for s in SPECS if s.role == "fatal"]) - 1
    assert statuses["killed-by-structure"] == 6 * members


@pytest.mark.e2e
@pytest.mark.needs_promtool
@needs_promtool
def test_the_command_line_prints_the_table_and_writes_every_outcome(tmp_path, capsys):
    out = tmp_path / "outcomes.json"
    assert mutate_alerts.main(["--alert", "SGLangOOMTargetDown", "--json", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"SGLangOOMTargetDown +4 +4( +0){5}", printed[1])
    assert printed[-1].startswith("killed 100.0 % of 4 valid mutants (promtool: 4/4 run; structure: 0)")
    rows = json.loads(out.read_text())
    assert sorted((r["operator"], r["change"], r["status"]) for r in rows) == [
        ("comparison", "== → !=", "killed"), ("for", "10m → 20m", "killed"), ("for", "10m → 5m", "killed"),
        ("number", "0 → 1", "killed"),
    ]  # fmt: skip
