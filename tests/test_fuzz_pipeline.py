"""Fuzzing the whole pipeline: random bytes, random splits, rank interleavings, CRI partial splits and NUL runs.

Two properties over every input: nothing raises, and the events do not depend on how the bytes are chunked
(nor on the prefilter). NUL runs get exact-count tests too: copytruncate under a writer without O_APPEND
leaves a run of NUL bytes and then the writer's next line with no newline in between, and that line counts.
The properties and their strategies live in tests/support/fuzz.py; bench/fuzz.py runs the same properties
for a chosen number of seconds.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings

from sglang_oom_exporter.daemon.logsource import LogSource
from sglang_oom_exporter.detect.pipeline import Pipeline
from sglang_oom_exporter.sources.tail import FileTailer
from tests.support.fuzz import FUZZ_PROPERTIES
from tests.support.helpers import CATALOG, MATCHER, scan_bytes

OOM = b"[2026-03-14 22:07:33 TP0] Prefill out of memory. Try to lower your batch size.\n"
NOISE = b"[2026-03-14 22:07:35 TP0] Decode batch, #running-req: 3, token usage: 0.50\n"


def _kinds(data: bytes, chunk: int = 1 << 20) -> list[str]:
    return [e.kind for e in scan_bytes(data, chunk=chunk)]


# --- NUL runs (defect 5) ------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, 1 << 20])
def test_a_line_glued_behind_a_nul_run_counts(chunk):
    # A writer without O_APPEND keeps its offset after copytruncate: NULs up to it, then its next line.
    glued = NOISE + NOISE[:20] + b"\x00" * 300 + OOM + NOISE
    assert _kinds(glued, chunk) == ["prefill"]


@pytest.mark.parametrize("chunk", [1, 5, 1 << 20])
def test_a_file_starting_with_a_nul_run_counts_its_first_line(chunk):
    # The truncated file's own first bytes are the hole: NULs then the writer's line, at offset 0.
    data = b"\x00" * 4096 + OOM + b"\x00" * 17 + OOM + NOISE + b"\x00" * 5 + OOM
    assert _kinds(data, chunk) == ["prefill"] * 3


def test_nul_runs_behind_complete_lines_change_no_count():
    clean = (NOISE + OOM) * 5
    holed = b"".join(NOISE + b"\x00" * n + OOM for n in (1, 2, 100, 4097, 0))
    assert _kinds(holed) == _kinds(clean) == ["prefill"] * 5


def test_serve_counts_a_line_glued_behind_a_nul_run_after_copytruncate(tmp_path):
    # The daemon's own path: a real file, a real tailer, a copytruncate, then a writer at its old offset.
    path = tmp_path / "s.log"
    path.write_bytes(NOISE * 3)
    events = []
    pipeline = Pipeline(CATALOG, MATCHER, source="s", location=str(path), sink=events.append, wait_seconds=0.0)
    source = LogSource(str(path), ("s",), {"source": "s"}, pipeline, FileTailer(str(path), start_at_end=False))
    source.poll(0.0)
    old_size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.truncate(0)
    fh = os.open(path, os.O_WRONLY)  # no O_APPEND: the writer goes on at its own offset
    try:
        os.lseek(fh, old_size, os.SEEK_SET)
        os.write(fh, OOM + NOISE)
    finally:
        os.close(fh)
    for now in (1.0, 10.0, 20.0):
        source.poll(now)
    pipeline.finish()
    assert [e.kind for e in events] == ["prefill"]


# --- the whole pipeline under random input ------------------------------------------------------------

# 100 examples per property in the suite; bench/fuzz.py runs the same properties with fresh examples for as
# long as asked (bench/README.md), so the suite only needs to catch a plain regression quickly.
_QUICK = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


@pytest.mark.parametrize("index", range(len(FUZZ_PROPERTIES)))
def test_fuzz_pipeline(index):
    check, strategies = FUZZ_PROPERTIES[index]
    _QUICK(given(*strategies)(check))()
