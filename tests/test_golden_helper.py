"""tests/helpers.write_golden: the expected file comes from the author's events, and test_golden's rules read it."""

from __future__ import annotations

import re

import pytest

from sglang_oom_exporter.scan import scan_paths
from tests.support.helpers import CATALOG, GOLDEN_CORE, golden_counts, load_yaml, write_golden

LINE = "[2026-11-20 04:12:09 TP0] KV page use-after-free: 2 owner page refs are in the free pool, sample pages=[1, 2]"


def test_write_golden_derives_counts_and_retractions_from_the_declared_events(tmp_path):
    retract = "[2026-11-20 04:12:10 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_token_ratio: 0.4 -> 0.5"
    events = [
        {"kind": "memory_leak", "line": 1, "fatal": False, "ranks": ["TP0"], "time": "2026-11-20T04:12:09"},
        {"kind": "retract", "line": 2, "fatal": False, "ranks": ["TP0"], "time": "2026-11-20T04:12:10",
         "numbers": {"retracted_requests": 3}},
    ]  # fmt: skip
    log, expected = write_golden("case", f"{LINE}\n{retract}", "two texts", events, directory=tmp_path)
    data = load_yaml(expected)
    assert data["counts"] == {"memory_leak": 1, "retract": 1}
    assert data["retractions"] == {"events": 1, "retracted_requests": 3}
    got = scan_paths(CATALOG, [str(log)]).to_json()
    assert got["counts"] == golden_counts(data["counts"])
    assert [(e["kind"], e["fatal"], e["source"]) for e in got["events"]] == [
        ("memory_leak", False, f"{log}:1"),
        ("retract", False, f"{log}:2"),
    ]


@pytest.mark.parametrize("missing", GOLDEN_CORE)
def test_write_golden_refuses_an_event_without_a_core_field(tmp_path, missing):
    event = {"kind": "memory_leak", "line": 1, "fatal": False, "ranks": ["TP0"], "time": "2026-11-20T04:12:09"}
    del event[missing]
    with pytest.raises(ValueError, match="missing"):
        write_golden("case", LINE, "x", [event], directory=tmp_path)
    assert not (tmp_path / "case.log").exists()


def test_write_golden_refuses_a_kind_the_catalog_does_not_have(tmp_path):
    event = {"kind": "no_such_kind", "line": 1, "fatal": True, "ranks": [], "time": None}
    with pytest.raises(ValueError, match="unknown kind"):
        write_golden("case", LINE, "x", [event], directory=tmp_path)


def test_every_section_11_case_named_in_the_facts_exists_and_every_2026_case_is_named():
    from pathlib import Path

    from tests.support.helpers import LOGS_DIR

    facts = (Path(__file__).parent.parent / "docs" / "sglang-facts.md").read_text(encoding="utf-8")
    table = facts[facts.index("### 11.13") :]
    named = set(re.findall(r"`([a-z0-9_]*_2026[a-z0-9_]*)`", table))
    on_disk = {p.stem for p in LOGS_DIR.glob("*2026*.log")}
    assert len(named) == 10
    assert named == on_disk
