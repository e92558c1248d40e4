"""Fuzzing the whole pipeline: random bytes, random splits, rank interleavings, CRI partial splits and NUL runs.

Two properties over every input: nothing raises, and the events do not depend on how the bytes are chunked
(nor on the prefilter). NUL runs get exact-count tests too: copytruncate under a writer without O_APPEND
leaves a run of NUL bytes and then the writer's next line with no newline in between, and that line counts.
bench/fuzz.py runs the same properties for a chosen number of seconds.
"""

from __future__ import annotations

import io
import itertools
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_oom_exporter.daemon.logsource import LogSource
from sglang_oom_exporter.detect.pipeline import Pipeline
from sglang_oom_exporter.scan import scan_stream
from sglang_oom_exporter.sources.tail import FileTailer
from tests.support.helpers import CATALOG, MATCHER, scan_bytes, summary
from tests.support.logs import COMPOSE_FRAGMENTS, FRAGMENTS

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

CRI_PREFIX = (b"2026-03-14T22:07:33.1Z stdout ", b"2026-03-14T22:07:33.1Z stderr ")


@st.composite
def cri_split(draw: st.DrawFn) -> bytes:
    """A fragment as the container runtime writes a long line: partial (P) records, then the final (F) one."""
    line = draw(st.sampled_from(FRAGMENTS)).rstrip(b"\n")
    stream = draw(st.sampled_from(CRI_PREFIX))
    cuts = sorted(draw(st.lists(st.integers(0, len(line)), max_size=3)))
    parts = [line[a:b] for a, b in itertools.pairwise([0, *cuts, len(line)])]
    return b"".join(stream + (b"P " if i < len(parts) - 1 else b"F ") + p + b"\n" for i, p in enumerate(parts))


@st.composite
def rank_line(draw: st.DrawFn) -> bytes:
    """A fragment from another tensor-parallel rank: TP0 becomes TPn, interleaved with the others."""
    return draw(st.sampled_from(FRAGMENTS)).replace(b" TP0]", b" TP%d]" % draw(st.integers(0, 7)))


SEGMENTS = st.one_of(
    st.sampled_from(FRAGMENTS),
    st.sampled_from(COMPOSE_FRAGMENTS),
    rank_line(),
    cri_split(),
    st.binary(max_size=48),
    st.integers(1, 600).map(lambda n: b"\x00" * n),  # a copytruncate hole
    st.sampled_from([b"\n", b"\r\n", b"\x00", b"\xff\xfe", b"\t"]),
)
FUZZ_INPUT = st.lists(SEGMENTS, max_size=80).map(b"".join)


class Pieces(io.RawIOBase):
    """A stream that hands out the input in the given pieces, one per read."""

    def __init__(self, data: bytes, cuts: list[int]) -> None:
        bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
        self.pieces = [data[a:b] for a, b in itertools.pairwise(bounds)]

    def readable(self) -> bool:
        return True

    def read(self, _n: int = -1) -> bytes:  # type: ignore[override]
        return self.pieces.pop(0) if self.pieces else b""


def split_summary(data: bytes, cuts: list[int]) -> list[tuple[str, bool, tuple[str, ...], str]]:
    """The events of data read in the pieces the cuts make."""
    events, _ = scan_stream(CATALOG, MATCHER, "t.log", Pieces(data, cuts))  # type: ignore[arg-type]
    return summary(events)


def same_events_however_split(data: bytes, cuts: list[int]) -> None:
    """Reading in any pieces gives the events of reading in one piece (and nothing raises)."""
    assert split_summary(data, cuts) == summary(scan_bytes(data))


def same_events_with_small_chunks_or_no_prefilter(data: bytes, chunk: int) -> None:
    """The prefilter and the chunk size never change the events."""
    reference = summary(scan_bytes(data, prefilter=False))
    assert summary(scan_bytes(data)) == reference
    assert summary(scan_bytes(data, chunk=chunk)) == reference


CUTS = st.lists(st.integers(min_value=0), max_size=16)
# Each property with the strategies of its arguments: the tests below and bench/fuzz.py run these.
FUZZ_PROPERTIES = (
    (same_events_however_split, (FUZZ_INPUT, CUTS)),
    (same_events_with_small_chunks_or_no_prefilter, (FUZZ_INPUT, st.integers(min_value=1, max_value=64))),
    (same_events_however_split, (st.binary(max_size=8192), CUTS)),
)
# 100 examples per property in the suite; bench/fuzz.py runs the same properties with fresh examples for as
# long as asked (bench/README.md), so the suite only needs to catch a plain regression quickly.
_QUICK = settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


@pytest.mark.parametrize("index", range(len(FUZZ_PROPERTIES)))
def test_fuzz_pipeline(index):
    check, strategies = FUZZ_PROPERTIES[index]
    _QUICK(given(*strategies)(check))()
