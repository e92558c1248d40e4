"""`scan --jobs N` gives the JSON of `scan --jobs 1`, byte for byte, wherever the file is cut.

Every golden log and generated scheduler logs are scanned serially and in worker processes with ranges
forced down to a few hundred bytes (so cuts fall inside blocks, tracebacks, the ranks of one tick and CRI
partial lines), with both literal finders and with the read size of the serial scan varied too. Hypothesis
builds random logs from golden pieces and generated lines. A control test shows that a split which does not
check for quiet points gets wrong answers on the same inputs, so these comparisons can fail.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_oom_exporter.detect.pipeline import Pipeline
from sglang_oom_exporter.scan import join as scanjoin
from sglang_oom_exporter.scan.run import scan_paths
from sglang_oom_exporter.scan.serial import InputError
from tests.support.helpers import CATALOG

HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(HERE)
CASES = sorted(glob.glob(os.path.join(HERE, "data", "logs", "*.log")))
FINDERS = ("hyperscan", "bytes.find")
sys.path.insert(0, os.path.join(ROOT, "bench"))
import gen_scheduler_log  # noqa: E402


def _finder(name: str) -> str:
    if name == "hyperscan":
        pytest.importorskip("hyperscan", reason="hyperscan has no wheel for this platform")
    return name


def _json(paths, **kw) -> str:
    return json.dumps(scan_paths(CATALOG, paths, **kw).to_json())


def _generated(tmp_path, lines: int, every: int, seed: int) -> str:
    path = str(tmp_path / f"gen-{lines}-{every}-{seed}.log")
    subprocess.run([sys.executable, os.path.join(ROOT, "bench", "gen_scheduler_log.py"), path, "--lines", str(lines),
                    "--oom-every", str(every), "--seed", str(seed)], check=True, capture_output=True)  # fmt: skip
    return path


# (read size, range size) per finder: all four pairs of the two read sizes (lines split across reads, or
# never) and the two range sizes (a cut on nearly every line, or every few lines) are covered, and each finder
# meets both of each; the full product costs twice as much and reaches no pair these do not.
CUT_PAIRS = {"hyperscan": ((61, 97), (4 * 1024 * 1024, 700)), "bytes.find": ((61, 700), (4 * 1024 * 1024, 97))}


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("finder", FINDERS)
def test_every_golden_log_cut_everywhere_gives_the_serial_json(finder):
    finder = _finder(finder)
    joined = 0
    for path in CASES:
        for chunk, range_size in CUT_PAIRS[finder]:
            serial = _json([path], finder=finder, chunk=chunk)
            got = _json([path], finder=finder, chunk=chunk, jobs=2, range_size=range_size)
            assert got == serial, (os.path.basename(path), chunk, range_size)
            joined += 1
    assert joined == 2 * len(CASES)


def test_the_cut_pairs_cover_every_read_and_range_size_pair():
    pairs = [p for finder in FINDERS for p in CUT_PAIRS[finder]]
    assert sorted(pairs) == sorted({(c, r) for c, _ in pairs for _, r in pairs})
    for finder in FINDERS:
        chunks, ranges = zip(*CUT_PAIRS[finder], strict=True)
        assert len(set(chunks)) == len(set(ranges)) == 2


@pytest.mark.slow
@pytest.mark.parametrize("finder", FINDERS)
def test_generated_scheduler_log_cut_every_few_kilobytes(tmp_path, finder, monkeypatch):
    finder = _finder(finder)
    chained = []
    add = scanjoin.Joiner.add

    def counting(self, segment):
        if segment.index == 0:
            chained.append(0)
        chained[-1] += segment.start is not None
        add(self, segment)

    monkeypatch.setattr(scanjoin.Joiner, "add", counting)
    path = _generated(tmp_path, 20_000, 300, 7)
    truth = json.loads(open(path + ".truth.json").read())
    serial = _json([path], finder=finder)
    doc = json.loads(serial)
    assert (doc["counts"]["prefill"], doc["counts"]["decode"]) == (truth["prefill"], truth["decode"])
    assert doc["inputs"][0]["lines_read"] == 20_000
    for range_size in (1500, 40_000):
        assert _json([path], finder=finder, jobs=2, range_size=range_size) == serial, range_size
    # About 2,000 and 70 ranges: most of them start at a quiet point of their own (the rest are read by the
    # range before them), so the comparison above really went through joins.
    assert chained[0] > 1000
    assert chained[1] > 50


def test_a_worker_finds_each_join_once_for_a_run_of_neighbouring_ranges(tmp_path, monkeypatch):
    from sglang_oom_exporter.scan import parallel as scanpar

    path = _generated(tmp_path, 400, 40, 5)
    cuts = scanjoin.cut_points(path, os.path.getsize(path), 120)
    starts: list[int] = []
    find = scanjoin.find_join

    def counted(path_, start, stop, new):
        starts.append(start)
        return find(path_, start, stop, new)

    monkeypatch.setattr(scanjoin, "find_join", counted)
    worker = scanpar._Worker(CATALOG, scanpar.ScanOptions())
    joiner = scanjoin.Joiner(path, cuts[-1], worker.matcher)
    for i in range(len(cuts) - 1):  # one worker taking every range in order
        joiner.add(worker.range(path, i, cuts))
    events, _ = joiner.finish()
    serial = json.loads(_json([path]))["events"]
    truth = json.loads(open(path + ".truth.json").read())
    assert len(serial) == truth["prefill"] + truth["decode"] == 9
    assert [(e.kind, e.message) for e in events] == [(e["kind"], e["message"]) for e in serial]
    assert len(cuts) - 1 == 120
    assert sorted(starts) == sorted(set(starts))  # never the same cut twice
    assert len(starts) == 119  # and every cut but the first once


def test_a_split_that_ignores_quiet_points_gets_it_wrong(tmp_path, monkeypatch):
    # The control: join at the first line after each cut, whatever is in flight there. The generated log's
    # events are 17-line block+traceback groups, one every 40 lines, so with ranges of 2,000 bytes many cuts
    # fall inside one.
    path = _generated(tmp_path, 3000, 40, 3)
    serial = _json([path])
    assert _json([path], jobs=2, range_size=2000) == serial
    monkeypatch.setattr(Pipeline, "is_quiet", lambda pipe: True)
    assert _json([path], jobs=2, range_size=2000, start_method="fork") != serial


def test_many_files_in_order_with_gzip_and_a_missing_one(tmp_path):
    paths = []
    for i, case in enumerate(CASES[:12]):
        data = open(case, "rb").read()
        if i % 3 == 0:
            p = tmp_path / f"{i}.log.gz"
            p.write_bytes(gzip.compress(data))
        else:
            p = tmp_path / f"{i}.log"
            p.write_bytes(data)
        paths.append(str(p))
    serial = _json(paths)
    assert _json(paths, jobs=2, min_parallel_bytes=0) == serial  # whole files in workers, however small
    assert _json(paths, jobs=3, range_size=300) == serial
    assert [i["path"] for i in json.loads(serial)["inputs"]] == paths
    missing = str(tmp_path / "missing.log")
    for jobs in (1, 2):
        with pytest.raises(InputError, match=f"cannot read {missing}: No such file"):
            scan_paths(CATALOG, [paths[1], missing], jobs=jobs)


def test_spawned_workers_give_the_same_json(tmp_path):
    path = _generated(tmp_path, 2000, 100, 11)
    assert _json([path, CASES[0]], jobs=2, range_size=5000, start_method="spawn") == _json([path, CASES[0]])


def _filler() -> list[bytes]:
    """The lines of a small generated scheduler log with an OOM every 50 lines, made once."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "filler.log"
        gen_scheduler_log.generate(out, 3000, 50, 5)
        return out.read_bytes().splitlines(keepends=True)


_PIECES = [open(p, "rb").read().splitlines(keepends=True) for p in CASES]
_FILLER = _filler()


@st.composite
def _logs(draw):
    parts = []
    for _ in range(draw(st.integers(1, 6))):
        for lines in (draw(st.sampled_from(_PIECES)), _FILLER):
            lo = draw(st.integers(0, len(lines) - 1))
            hi = draw(st.integers(lo, min(len(lines), lo + 120)))
            parts.extend(lines[lo:hi])
    data = b"".join(parts)
    if draw(st.booleans()) and data.endswith(b"\n"):
        data = data[:-1]  # a last line without its newline
    return data


@pytest.mark.slow
@pytest.mark.timeout(600)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_logs(), range_size=st.integers(40, 2000), chunk=st.sampled_from([33, 500, 4 * 1024 * 1024]),
       finder=st.sampled_from(FINDERS))  # fmt: skip
def test_random_logs_cut_anywhere_give_the_serial_json(tmp_path, data, range_size, chunk, finder):
    if finder == "hyperscan":
        pytest.importorskip("hyperscan")
    path = tmp_path / "random.log"
    path.write_bytes(data)
    serial = _json([str(path)], finder=finder, chunk=chunk)
    assert _json([str(path)], finder=finder, chunk=chunk, jobs=2, range_size=range_size) == serial


@pytest.mark.timeout(300)
@pytest.mark.parametrize("range_size", [700, 9000])
def test_a_restart_into_the_same_file_cut_anywhere_gives_each_failure_its_own_runs_description(tmp_path, range_size):
    # Two real 0.5.23 runs in one file (a restart writing into it): page size 16, then 1; the ranges after the
    # first banner know it only from the ranges before them (Segment.server), and the usage lines likewise.
    live = os.path.join(HERE, "data", "logs", "live_0_5_23_{}.log")
    path = tmp_path / "restart.log"
    path.write_bytes(b"".join(open(live.format(name), "rb").read() for name in ("decode", "req_slots", "prefill")))
    serial = _json([str(path)], chunk=61)
    assert _json([str(path)], chunk=61, jobs=2, range_size=range_size) == serial
    events = json.loads(serial)["events"]
    assert [(e["kind"], e["context"]["server_args"]["page_size"], e["context"]["kv_source"]) for e in events] == [
        ("decode", 16, "log line at 2026-12-08 00:00:21"),
        ("req_slots", 1, "log line at 2026-12-08 00:02:17"),
        ("prefill", 16, "log line at 2026-12-07 23:52:19"),
    ]


def test_the_catalog_reads_the_same_through_libyaml_as_through_pure_python():
    # Start-up parses the catalog with libyaml when PyYAML has it; the tree, with the line of every mapping
    # that file:line errors quote, must be the one the pure-Python loader gives.
    import yaml

    from sglang_oom_exporter.catalog import default_catalog_path, yamltree

    if not yaml.__with_libyaml__:
        pytest.skip("PyYAML without libyaml: the pure-Python loader is the only one")
    assert issubclass(yamltree.LineLoader, yaml.CSafeLoader)

    class Pure(yaml.SafeLoader):
        pass

    Pure.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, yamltree.construct_mapping)
    text = open(default_catalog_path(), encoding="utf-8").read()
    fast = yaml.load(text, Loader=yamltree.LineLoader)  # noqa: S506 - a SafeLoader subclass
    assert fast == yaml.load(text, Loader=Pure)  # noqa: S506 - a SafeLoader subclass
    assert fast["kinds"][0]["__line__"] == text[: text.index("- id:")].count("\n") + 1


def test_cli_jobs_with_stdin_between_files_keeps_input_order():
    # stdin is read in the calling process, in its place among the inputs. These inputs are too small for a
    # pool (MIN_PARALLEL_BYTES), so --jobs 2 reads them in one process too: the parallel path's order is
    # tested in-process by test_scan_startup.py's test_stdin_between_files_in_a_pool_keeps_input_order.
    data = open(CASES[1], "rb").read()
    outs = []
    for jobs in ("1", "2"):
        argv = [sys.executable, "-m", "sglang_oom_exporter", "scan", "--format", "json", "--jobs", jobs, CASES[0], "-",
                CASES[2]]  # fmt: skip
        r = subprocess.run(argv, input=data, capture_output=True, check=True)
        outs.append(json.loads(r.stdout))
    assert outs[0] == outs[1]
    assert [i["path"] for i in outs[1]["inputs"]] == [CASES[0], "-", CASES[2]]
    assert outs[1]["inputs"][1]["lines_read"] == data.count(b"\n") + (not data.endswith(b"\n"))


def test_the_calling_process_takes_the_last_tasks_nearest_to_its_share_of_the_bytes():
    from sglang_oom_exporter.scan.parallel import _parent_share

    assert _parent_share([100] * 8, 2) == 4  # half of eight equal ranges
    # Ranges cut at line starts differ by a few bytes: still four, not a fifth (a 25% overshoot it once took).
    assert _parent_share([100, 100, 100, 100, 101, 100, 100, 99], 2) == 4
    assert _parent_share([1] * 1000, 2) == 500
    assert _parent_share([3] * 9, 3) == 6  # a third
    assert _parent_share([5, 1], 2) == 1  # the small last task; the pool always keeps the first
    assert _parent_share([1, 100], 2) == 1
