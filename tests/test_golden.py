"""Golden fixtures: each tests/data/logs/<case>.log scanned by the real CLI code path, compared with
<case>.expected.yaml (exact counts per kind, retraction totals, and each listed event's fields).

The expected files were written from SGLANG-FACTS.md, independently of the parser.
"""

from __future__ import annotations

import glob
import os

import pytest
import yaml

from sglang_oom_exporter.scan import scan_paths
from tests.helpers import CATALOG

HERE = os.path.dirname(__file__)
CASES = sorted(glob.glob(os.path.join(HERE, "data", "logs", "*.log")))
EVENT_KEYS = ("kind", "fatal", "time", "requested_tokens", "available_tokens", "phase", "inferred")
NUMBER_KEYS = ("req_slots_available", "req_slots_requested", "retracted_requests")


def _expected(path: str) -> dict:
    with open(path[: -len(".log")] + ".expected.yaml") as fh:
        return yaml.safe_load(fh)


@pytest.mark.parametrize("path", CASES, ids=[os.path.basename(p)[:-4] for p in CASES])
def test_golden(path):
    expected = _expected(path)
    got = scan_paths(CATALOG, [path]).to_json()
    assert got["counts"] == expected["counts"]
    assert got["retractions"] == expected["retractions"]
    events = got["events"]
    assert len(events) == len(expected["events"])
    for i, (want, have) in enumerate(zip(expected["events"], events, strict=True)):
        assert have["source"] == f"{path}:{want['line']}", i
        for key in EVENT_KEYS:
            if key in want:
                assert have[key] == want[key], (i, key)
        if "ranks" in want:
            assert set(have["ranks"]) == set(want["ranks"]), i
        for key in NUMBER_KEYS:
            if key in want:
                assert have["numbers"].get(key) == want[key], (i, key)


def test_every_fixture_has_an_expected_file():
    assert len(CASES) >= 25
    for path in CASES:
        assert os.path.exists(path[: -len(".log")] + ".expected.yaml"), path
