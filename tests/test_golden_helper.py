"""tests/support/golden.write_golden: the expected file comes from the author's events, and test_golden's rules read it."""

from __future__ import annotations

import re

import pytest

from sglang_oom_exporter.scan.run import scan_paths
from tests.support.golden import (
    GOLDEN_FIELDS,
    from_the_log,
    golden_counts,
    golden_event,
    golden_foreign,
    write_golden,
)
from tests.support.helpers import CATALOG, load_yaml

TEXT = "KV page use-after-free: 2 owner page refs are in the free pool, sample pages=[1, 2]"
LINE = f"[2026-11-20 04:12:09 TP0] {TEXT}"
# What the author states for LINE: every golden field, read off the line and the facts (section 11.2).
EVENT = {"kind": "memory_leak", "line": 1, "fatal": False, "ranks": ["TP0"], "time": "2026-11-20T04:12:09",
         "phase": None, "subphase": None, "inferred": False, "message": TEXT, "numbers": {"use_after_free_refs": 2},
         "pools": [], "excerpt": TEXT}  # fmt: skip


def test_write_golden_derives_counts_and_retractions_from_the_declared_events(tmp_path):
    text = "KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_token_ratio: 0.4 -> 0.5"
    retract = {**EVENT, "kind": "retract", "line": 2, "time": "2026-11-20T04:12:10", "message": text, "excerpt": text,
               "numbers": {"retracted_requests": 3, "new_token_ratio_from": 0.4, "new_token_ratio_to": 0.5}}  # fmt: skip
    log_text = f"{LINE}\n[2026-11-20 04:12:10 TP0] {text}"
    log, expected = write_golden("case", log_text, "two texts", [EVENT, retract], directory=tmp_path)
    data = load_yaml(expected)
    assert data == {"description": "two texts", "counts": {"memory_leak": 1, "retract": 1},
                    "retractions": {"events": 1, "retracted_requests": 3}, "events": [EVENT, retract]}  # fmt: skip
    got = scan_paths(CATALOG, [str(log)]).to_json()
    assert got["counts"] == golden_counts(data["counts"])
    assert [from_the_log(e) for e in got["events"]] == [golden_event(log, e) for e in data["events"]]


def test_write_golden_states_foreign_events_only_when_not_zero(tmp_path):
    cuda = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."  # no SGLang evidence: foreign
    _, quiet = write_golden("quiet", LINE, "x", [EVENT], directory=tmp_path)
    log, foreign = write_golden("foreign", cuda, "y", [], directory=tmp_path, foreign_events=1)
    assert "foreign_events" not in load_yaml(quiet)
    assert golden_foreign(load_yaml(quiet)) == 0
    assert load_yaml(foreign)["foreign_events"] == 1
    assert [i["foreign_events"] for i in scan_paths(CATALOG, [str(log)]).to_json()["inputs"]] == [1]


@pytest.mark.parametrize("stated", [0, -1, True, "1"])
def test_golden_foreign_refuses_anything_but_a_positive_count(stated):
    with pytest.raises(ValueError, match="positive count"):
        golden_foreign({"foreign_events": stated})


@pytest.mark.parametrize("missing", GOLDEN_FIELDS)
def test_write_golden_refuses_an_event_without_a_golden_field(tmp_path, missing):
    event = {k: v for k, v in EVENT.items() if k != missing}
    with pytest.raises(ValueError, match=rf"missing \['{missing}'\]"):
        write_golden("case", LINE, "x", [event], directory=tmp_path)
    assert not (tmp_path / "case.log").exists()


@pytest.mark.parametrize("extra", ["title", "suggestions", "requested_tokens"])
def test_write_golden_refuses_a_field_that_is_not_a_golden_field(tmp_path, extra):
    # Catalog text and the top-level copies of numbers are not stated: test_golden would never compare them.
    with pytest.raises(ValueError, match=rf"not a golden field \['{extra}'\]"):
        write_golden("case", LINE, "x", [{**EVENT, extra: None}], directory=tmp_path)


def test_write_golden_refuses_a_kind_the_catalog_does_not_have(tmp_path):
    with pytest.raises(ValueError, match="unknown kind 'no_such_kind'"):
        write_golden("case", LINE, "x", [{**EVENT, "kind": "no_such_kind"}], directory=tmp_path)


def test_every_section_11_and_12_case_named_in_the_facts_exists_and_every_2026_case_is_named():
    from pathlib import Path

    from tests.support.golden import LOGS_DIR

    facts = (Path(__file__).parent.parent / "docs" / "sglang-facts.md").read_text(encoding="utf-8")
    section_11 = facts[facts.index("### 11.13") : facts.index("## 12.")]
    section_12 = facts[facts.index("### 12.29") :]
    case = r"`([a-z0-9_]*_2026[a-z0-9_]*)`"
    named_11, named_12 = set(re.findall(case, section_11)), set(re.findall(case, section_12))
    on_disk = {p.stem for p in LOGS_DIR.glob("*2026*.log")}
    assert len(named_11) == 10
    assert len(named_12) == 20  # main of 2026-08: every text of section 12
    assert all(name.endswith("_2026_08") for name in named_12)
    assert named_11 | named_12 == on_disk
