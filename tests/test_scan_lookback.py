"""The reader passes no look-back lines by default: the events are those of four look-back lines and of no prefilter.

A record starts at its anchor line whatever came before it, and a CRI partial record ahead of an anchor is a hit of
its own, so the lines before a hit never change an event; passing them cost 30 % of a scan's CPU. These tests scan
every golden log and a generated scheduler log three ways and compare the whole JSON.
"""

from __future__ import annotations

import glob
import json
import os

import pytest

from sglang_oom_exporter.detect import reader
from sglang_oom_exporter.scan.run import scan_paths
from tests.support.golden import load_expected
from tests.support.helpers import CATALOG

HERE = os.path.dirname(__file__)
CASES = sorted(glob.glob(os.path.join(HERE, "data", "logs", "*.log")))


def _json(paths: list[str], **kw) -> str:
    return json.dumps(scan_paths(CATALOG, paths, **kw).to_json())


def _look_back(monkeypatch: pytest.MonkeyPatch, lines: int) -> None:
    monkeypatch.setattr(reader, "DEFAULT_BEFORE", lines)


def test_no_look_back_is_the_default():
    assert reader.DEFAULT_BEFORE == 0
    assert reader.LineReader(["ut of memory"])._before == 0


@pytest.mark.parametrize("finder", ["hyperscan", "bytes.find"])
def test_every_golden_log_gives_the_same_json_with_four_look_back_lines_and_without_prefilter(monkeypatch, finder):
    if finder == "hyperscan":
        pytest.importorskip("hyperscan", reason="hyperscan has no wheel for this platform")
    assert len(CASES) > 50
    events = 0
    for path in CASES:
        none = _json([path], finder=finder)
        unfiltered = _json([path], prefilter=False)
        _look_back(monkeypatch, 4)
        four = _json([path], finder=finder)
        monkeypatch.undo()
        assert none == four, os.path.basename(path)
        assert none == unfiltered, os.path.basename(path)
        events += len(json.loads(none)["events"])
    # The comparison covered every event the golden files expect, not empty results.
    assert events == sum(len(load_expected(path)["events"]) for path in CASES)


def test_a_generated_log_with_retraction_lines_decodes_four_lines_less_per_event_for_the_same_json(
    tmp_path, monkeypatch
):
    import sys

    from sglang_oom_exporter.detect.decode import Decoder

    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))
    import gen_scheduler_log

    path = tmp_path / "gen.log"
    truth = gen_scheduler_log.generate(path, 60_000, 3_000, 17)
    decoded = [0]
    decode = Decoder.decode

    def counting(self, raw):
        decoded[0] += 1
        return decode(self, raw)

    monkeypatch.setattr(Decoder, "decode", counting)
    none = scan_paths(CATALOG, [str(path)])
    passed_none, decoded[0] = decoded[0], 0
    _look_back(monkeypatch, 4)
    four = scan_paths(CATALOG, [str(path)])
    assert json.dumps(none.to_json()) == json.dumps(four.to_json())
    counts = none.counts()
    assert (counts["prefill"], counts["decode"], counts["retract"]) == (
        truth["prefill"],
        truth["decode"],
        truth["retract"],
    )
    # The generator spaces its events (a second of log time apart, hundreds of lines), so each event is one hit
    # region, and each region hands the decoder exactly its four look-back lines more.
    assert len(none.events) == 66
    assert decoded[0] - passed_none == 4 * len(none.events)
