"""Golden fixtures: each tests/data/logs/<case>.log scanned by the real CLI code path, compared with
<case>.expected.yaml (exact counts per kind: the file lists only the non-zero ones, a missing kind is 0, retraction totals, and every field each listed event gives).

The expected files were written from docs/sglang-facts.md, independently of the parser. Every case runs with
both literal finders of the prefiltering reader (Hyperscan and the portable bytes.find), which must
select the same lines.
"""

from __future__ import annotations

import glob
import os
from typing import Any

import pytest

from sglang_oom_exporter.catalog.loader import EVENT_FIELDS
from sglang_oom_exporter.detect import finder as finders
from sglang_oom_exporter.detect import reader
from sglang_oom_exporter.scan import scan_paths
from tests.support.helpers import CATALOG, golden_counts, load_yaml, scan_bytes

HERE = os.path.dirname(__file__)
CASES = sorted(glob.glob(os.path.join(HERE, "data", "logs", "*.log")))
FINDERS = ("hyperscan", "bytes.find")
# Numbers the matcher derives rather than extracts: a golden may assert them too.
DERIVED_NUMBERS = frozenset({"shortfall_tokens", "shortfall_note", "limiting_pool"})


def load_expected(path: str) -> dict[str, Any]:
    """The parsed <case>.expected.yaml of a log (parsed once per process, through libyaml: both finders'
    cases, the core-fields check and test_scan_lookback read it), a copy each call."""
    return dict(load_yaml(path[: -len(".log")] + ".expected.yaml"))


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
    events = got["events"]
    assert len(events) == len(expected["events"])
    for i, (want, have) in enumerate(zip(expected["events"], events, strict=True)):
        for key, value in want.items():
            where = (i, key)
            if key == "line":
                assert have["source"] == f"{path}:{value}", where
            elif key == "numbers":
                for name, number in value.items():
                    assert name in have["numbers"], (i, name)
                    assert have["numbers"][name] == number, (i, name)
            elif key in have:
                assert have[key] == value, where
            else:
                # A number given at the top level (req_slots_available: 3) must be a real event field.
                assert key in EVENT_FIELDS or key in DERIVED_NUMBERS, f"unknown key {key!r} in the golden"
                assert have["numbers"].get(key) == value, where


def test_every_fixture_has_an_expected_file_with_the_core_fields():
    assert len(CASES) >= 25
    for path in CASES:
        assert os.path.exists(path[: -len(".log")] + ".expected.yaml"), path
        for event in load_expected(path)["events"]:
            missing = [k for k in ("line", "kind", "fatal", "ranks", "time") if k not in event]
            assert not missing, (path, missing)


def test_every_golden_lists_only_known_non_zero_counts():
    for path in CASES:
        golden_counts(load_expected(path)["counts"])  # raises on an unknown id or a stated zero


@pytest.mark.parametrize(("stated", "why"), [({"no_such_kind": 1}, "unknown kind"), ({CATALOG.ids[0]: 0}, "non-zero")])
def test_golden_counts_refuse_an_unknown_kind_or_a_stated_zero(stated, why):
    with pytest.raises(ValueError, match=why):
        golden_counts(stated)


def test_golden_counts_mean_zero_for_a_missing_kind():
    full = golden_counts({"decode": 2})
    assert list(full) == list(CATALOG.ids)
    assert full == {k: 2 if k == "decode" else 0 for k in CATALOG.ids}


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
