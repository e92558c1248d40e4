"""Golden fixtures: each tests/data/logs/<case>.log scanned by the real CLI code path, compared with
<case>.expected.yaml: exact counts per kind (the file lists only the non-zero ones, a missing kind is 0), retraction
totals, the input's foreign events (OOM text seen and not counted; stated only when not 0, a missing count is 0),
and every event whole: each field scan's JSON gives from the log, nothing left out (tests/support/golden.py names
the few fields that come from the catalog or the server instead, and why).

The expected files were written from docs/sglang-facts.md, independently of the parser; the fields added when the
comparison became whole were proposed from a scan and each checked against the log text first. Every case runs with
both literal finders of the prefiltering reader (Hyperscan and the portable bytes.find), which must
select the same lines.
"""

from __future__ import annotations

import glob
import os

import pytest

from sglang_oom_exporter.detect import finder as finders
from sglang_oom_exporter.detect import reader
from sglang_oom_exporter.scan.run import scan_paths
from tests.support.golden import (
    COPIES_OF_NUMBERS,
    GOLDEN_FIELDS,
    NOT_FROM_THE_LOG,
    from_the_log,
    golden_counts,
    golden_event,
    golden_foreign,
    load_expected,
)
from tests.support.helpers import CATALOG, scan_bytes

HERE = os.path.dirname(__file__)
CASES = sorted(glob.glob(os.path.join(HERE, "data", "logs", "*.log")))
FINDERS = ("hyperscan", "bytes.find")
BARE = os.path.join(HERE, "data", "logs", "bare_runtime_error_r4.log")  # one event with numbers and a pool


@pytest.fixture(params=FINDERS)
def finder(request, monkeypatch):
    """Make every LineReader use this finder; skip Hyperscan where it has no wheel."""
    name = request.param
    if name == "hyperscan":
        pytest.importorskip("hyperscan", reason="hyperscan has no wheel for this platform")
    build = finders.HyperscanFinder if name == "hyperscan" else finders.BytesFinder
    monkeypatch.setattr(reader, "make_finder", lambda literals, prefer="auto": build(literals))
    return name


@pytest.mark.parametrize("path", CASES, ids=[os.path.basename(p)[:-4] for p in CASES])
def test_golden(path, finder):
    expected = load_expected(path)
    got = scan_paths(CATALOG, [path]).to_json()
    assert got["counts"] == golden_counts(expected["counts"])
    assert got["retractions"] == expected["retractions"]
    assert [i["foreign_events"] for i in got["inputs"]] == [golden_foreign(expected)]
    assert len(got["events"]) == len(expected["events"])
    for i, (want, have) in enumerate(zip(expected["events"], got["events"], strict=True)):
        assert from_the_log(have) == golden_event(path, want), f"event {i}"


def test_every_fixture_has_an_expected_file_whose_events_state_exactly_the_golden_fields():
    assert len(CASES) >= 81  # a floor, not the count: a new kind's case touches only its own files
    events = 0
    for path in CASES:
        assert os.path.exists(path[: -len(".log")] + ".expected.yaml"), path
        for event in load_expected(path)["events"]:
            assert sorted(event) == sorted(GOLDEN_FIELDS), path
            events += 1
    assert events >= 118


def test_the_golden_fields_and_the_fields_not_from_the_log_are_every_field_of_a_json_event_once():
    """A field scan's JSON gains must be sorted into one list or the other: test_golden compares whole events."""
    event = scan_paths(CATALOG, [BARE]).to_json()["events"][0]
    stated = [f for f in GOLDEN_FIELDS if f != "line"] + ["source", *COPIES_OF_NUMBERS]
    assert sorted(stated + list(NOT_FROM_THE_LOG)) == sorted(event)
    assert not set(stated) & set(NOT_FROM_THE_LOG)


@pytest.mark.parametrize("field", [*(f for f in GOLDEN_FIELDS if f != "line"), "a_new_json_field"])
def test_an_event_matches_only_the_golden_that_states_all_of_it(field):
    """Whole-event comparison: a golden leaving a field out, or a JSON field in neither list, is a mismatch."""
    have = from_the_log(scan_paths(CATALOG, [BARE]).to_json()["events"][0])
    want = load_expected(BARE)["events"][0]
    assert have == golden_event(BARE, want)
    if field in want:
        del want[field]
    else:
        have[field] = 1
    assert have != golden_event(BARE, want)


def test_every_golden_lists_only_known_non_zero_counts():
    for path in CASES:
        golden_counts(load_expected(path)["counts"])  # raises on an unknown id or a stated zero


@pytest.mark.parametrize(("stated", "why"), [({"no_such_kind": 1}, "unknown kind"), ({CATALOG.ids[0]: 0}, "non-zero")])
def test_golden_counts_refuse_an_unknown_kind_or_a_stated_zero(stated, why):
    with pytest.raises(ValueError, match=why):
        golden_counts(stated)


def test_golden_counts_mean_zero_for_a_missing_kind():
    full = golden_counts({"decode": 2})
    assert list(full) == [*CATALOG.ids, "crash"]
    assert full == {k: 2 if k == "decode" else 0 for k in CATALOG.event_ids}


def test_the_finder_fixture_really_swaps_the_finder(finder):
    line_reader = reader.LineReader(["ut of memory"])
    assert line_reader._finder.name == finder


@pytest.mark.parametrize(
    "case", ["compose_foreign_lines_tp8_prefill_0_4_10", "compose_foreign_lines_tp1_generic_decode_0_5_6"]
)
def test_compose_cases_give_what_the_sglang_service_alone_gives(case, finder):
    with open(os.path.join(HERE, "data", "logs", f"{case}.log"), "rb") as fh:
        lines = fh.read().splitlines(keepends=True)
    alone = b"".join(line for line in lines if line.startswith(b"sglang-1 "))
    assert len(alone.splitlines()) < len(lines) - 5

    def what(events):
        return [(e.kind, e.fatal, e.ranks, e.phase, e.numbers, e.pools) for e in events]

    mixed_events = what(scan_bytes(b"".join(lines)))
    assert len(mixed_events) == 1
    assert mixed_events == what(scan_bytes(alone))
