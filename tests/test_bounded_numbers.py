"""A number too big for any field (400 digits) keeps its event, and `scan` reports a failing
input per file instead of dying with a traceback.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys

import pytest

from sglang_oom_exporter.detect.match import MAX_NUMBER, Matcher
from sglang_oom_exporter.detect.pipeline import Pipeline
from sglang_oom_exporter.scan.run import scan_paths
from tests.support.app import make_app, run_app
from tests.support.helpers import CATALOG
from tests.support.logs import append

BIG = "9" * 400
OK_BLOCK = (
    "[2026-03-14 22:07:01 TP0] Decode out of memory. Try to lower your batch size.\nTry to allocate 5 tokens.\n\n"
)
BIG_PREFILL = (
    f"[2026-03-14 22:07:33 TP0] Prefill out of memory. Try to lower your batch size.Try to allocate {BIG} tokens."
    "Avaliable tokens:3000\n\n"
)


def _giant(line: str) -> str:
    """A catalog example with every number in its message made 400 digits long (not in a path or prefix before it:
    a message must start within 200 characters)."""
    found = Matcher(CATALOG).match_line(line)
    assert found is not None
    start = found[2].start()
    return line[:start] + re.sub(r"\d+", BIG, line[start:])


def _all_numbers(event) -> list[float]:
    values = [v for v in event.numbers.values() if isinstance(v, int | float) and not isinstance(v, bool)]
    for pool in event.pools:
        values += [v for v in pool.as_dict().values() if isinstance(v, int | float) and not isinstance(v, bool)]
    return values


EXAMPLES = [(k.id, i, line) for k in CATALOG.kinds for i, line in enumerate(k.match_examples)]


@pytest.mark.parametrize(("kind", "index", "line"), EXAMPLES, ids=[f"{k}-{i}" for k, i, _ in EXAMPLES])
def test_every_example_with_400_digit_numbers_is_still_the_same_event(tmp_path, kind, index, line):
    plain, giant = tmp_path / "plain.log", tmp_path / "giant.log"
    plain.write_text(line + "\n\n")
    giant.write_text(_giant(line) + "\n\n")
    expected = scan_paths(CATALOG, [str(plain)]).counts()
    result = scan_paths(CATALOG, [str(giant)])  # was: OverflowError for 4 of the examples
    assert result.counts() == expected
    assert result.errors == []
    for event in result.events:
        assert all(abs(v) <= MAX_NUMBER for v in _all_numbers(event))
        json.dumps(event.numbers)


def test_out_of_range_numbers_are_left_out_counted_and_warned_once(caplog):
    caplog.set_level(logging.WARNING, logger="sglang_oom_exporter.detect.match")
    matcher = Matcher(CATALOG)
    events = []
    pipe = Pipeline(CATALOG, matcher, source="s", location="s", sink=events.append)
    for second in range(12):
        pipe.feed(BIG_PREFILL.replace(":33 ", f":{second:02d} ").encode())
    pipe.finish()
    assert [e.kind for e in events] == ["prefill"] * 12
    assert all("requested_tokens" not in e.numbers and e.numbers["available_tokens"] == 3000 for e in events)
    assert matcher.numbers_dropped == 12
    assert len([r for r in caplog.records if "out of range" in r.getMessage()]) == 2  # the 1st and the 10th


def test_floats_out_of_range_and_inf_are_dropped_too():
    matcher = Matcher(CATALOG)
    events = []
    pipe = Pipeline(CATALOG, matcher, source="s", location="s", sink=events.append)
    line = "[2026-03-14 22:01:05 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_token_ratio: "
    pipe.feed(f"{line}1{'0' * 400}.5 -> 0.5\n\n".encode())
    pipe.finish()
    assert len(events) == 1
    assert "new_token_ratio_from" not in events[0].numbers
    assert events[0].numbers["new_token_ratio_to"] == 0.5
    assert events[0].numbers["retracted_requests"] == 3


def test_serve_counts_the_event_with_the_400_digit_number(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("")
    app, clock = make_app(tmp_path)
    run_app(app, clock, 1.0)
    append(log, BIG_PREFILL)
    run_app(app, clock, 4.0)
    assert app.counts.total("prefill") == 1  # was 0: "cannot record event" (OverflowError in the advice)
    assert app.sink.errors == 0
    assert app.extra_metrics()["numbers_dropped_total"] == 1.0
    app.sources.close()


def test_scan_reports_every_valid_input_around_one_with_a_giant_number(cli, tmp_path):
    big, ok = tmp_path / "big.log", tmp_path / "ok.log"
    big.write_text(BIG_PREFILL)
    ok.write_text(OK_BLOCK)
    proc = cli("scan", "--format", "json", str(big), str(ok))
    assert proc.returncode == 0, proc.stderr  # was 1 with a traceback, nothing printed for ok.log
    doc = json.loads(proc.stdout)
    assert doc["counts"]["prefill"] == 1
    assert doc["counts"]["decode"] == 1
    assert b"Traceback" not in proc.stderr


def _poison_feed(monkeypatch) -> None:
    """Pipeline.feed raises on an input holding POISON: a bug that only one input meets."""
    real = Pipeline.feed

    def feed(self, data, *args, **kwargs):
        if b"POISON" in data:
            raise RuntimeError("a bug met by this input")
        return real(self, data, *args, **kwargs)

    monkeypatch.setattr(Pipeline, "feed", feed)


def test_scan_reports_a_failing_input_and_the_others(cli, tmp_path, monkeypatch):
    _poison_feed(monkeypatch)
    paths = [tmp_path / "a.log", tmp_path / "bad.log", tmp_path / "c.log"]
    paths[0].write_text(OK_BLOCK)
    paths[1].write_text("POISON\n" + OK_BLOCK)
    paths[2].write_text(OK_BLOCK.replace("22:07:01", "22:09:01"))
    proc = cli("scan", *map(str, paths))
    assert proc.returncode == 2
    assert b"Traceback" not in proc.stderr
    assert proc.stderr.decode() == (
        f"sglang-oom-exporter: cannot scan {paths[1]} (the other inputs are reported): "
        "RuntimeError: a bug met by this input\n"
    )
    text = proc.stdout.decode()
    assert f"{paths[0]}:1" in text
    assert f"{paths[2]}:1" in text
    assert "decode         2" in text
    proc = cli("scan", "--format", "json", *map(str, paths))
    doc = json.loads(proc.stdout)
    assert doc["errors"] == [{"path": str(paths[1]), "error": "RuntimeError: a bug met by this input"}]
    assert [i["path"] for i in doc["inputs"]] == [str(paths[0]), str(paths[2])]


@pytest.mark.skipif(sys.platform != "linux", reason="the workers inherit the patch by fork")
def test_a_parallel_scan_with_a_failing_input_falls_back_to_reporting_per_file(tmp_path, monkeypatch):
    _poison_feed(monkeypatch)
    paths = [tmp_path / "a.log", tmp_path / "bad.log"]
    paths[0].write_text(OK_BLOCK)
    paths[1].write_text("POISON\n" + OK_BLOCK)
    result = scan_paths(CATALOG, list(map(str, paths)), jobs=2, min_parallel_bytes=0, start_method="fork")
    assert result.counts()["decode"] == 1
    assert [p for p, _ in result.errors] == [str(paths[1])]


def test_the_cli_shows_no_traceback_for_a_giant_number_in_a_subprocess(tmp_path):
    big = tmp_path / "big.log"
    big.write_text(BIG_PREFILL)
    proc = subprocess.run([sys.executable, "-m", "sglang_oom_exporter", "scan", str(big)], capture_output=True,
                          timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 0
    assert b"Traceback" not in proc.stderr
    assert b"out of range" in proc.stderr  # the warning, once
