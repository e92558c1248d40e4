"""Properties of the whole pipeline: no input raises, and chunking or the prefilter never change events."""

from __future__ import annotations

import functools
import glob
import itertools
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_oom_exporter.cli import sample_path
from tests.helpers import scan_bytes, summary

HERE = os.path.dirname(__file__)
SAMPLE = open(sample_path(), "rb").read()
FIXTURES = sorted(glob.glob(os.path.join(HERE, "data", "logs", "*.log")))

# Fragments that exercise every state of the assembler, glued in random order by the strategies below.
FRAGMENTS = [
    b"[2026-03-14 22:07:33 TP0] Out of memory. Try to lower your batch size.\n",
    b"Try to allocate 96 tokens.\n",
    b"Available tokens: 40 (available_size=40 + evictable_size=0)\n",
    b"\n",
    b"[2026-03-14 22:07:33 TP1] Scheduler hit an exception: Traceback (most recent call last):\n",
    b'  File "/x/sglang/srt/managers/scheduler.py", line 1, in prepare_for_decode\n',
    b"    batch.prepare_for_decode()\n",
    b'  File "/x/sglang/srt/mem_cache/allocation.py", line 9, in alloc_token_slots\n',
    b"RuntimeError: Out of memory. Try to lower your batch size.\n",
    b" 0 [] r=1\n",
    b"#tokens: 61420\n",
    b"[2026-03-14 22:07:34 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 2, #new_token_ratio: 0.1 -> 0.2\n",
    b"2026-03-14T22:07:33.1Z stderr P [2026-03-14 22:07:33 TP0] Decode out of\n",
    b"2026-03-14T22:07:33.1Z stderr F  memory. Try to lower your batch size.\n",
    b"[2026-03-14 22:07:33] SIGQUIT received. It usually means one child failed.\n",
    b"\r\n",
    b"\xff\xfe\x00garbage\n",
    b"[2026-03-14 22:07:35 TP0] Decode batch, #running-req: 3, token usage: 1.00\n",
    # Section 10 variants
    b"[gpu_id=1] Prefill out of memory. Try to lower your batch size.\n",
    b"RuntimeError: CUDA Error: out of memory (2) /x/flashinfer/handler.cuh: line 1 at function cudaMallocAsync(b)\n",
    b"ValueError: pool memory leak detected! [full] total=9, available=1, evictable=2, protected=0, session_held=0, "
    b"uncached=0\n",
    b"[swa] total=5, available=5, evictable=0, protected=0, session_held=0, uncached=0\n",
    b"/x/sglang/srt/managers/router/model_rpc.py:1: UserWarning: Warning: available_size=1, max_total_num_token=2\n",
    b"KV cache pool leak detected!\n",
    b"Exception in ControllerSingle:\n",
    b"Traceback (most recent call last):\n",
    b'  File "/x/sglang/srt/speculative/eagle_info.py", line 3, in prepare_for_verify\n',
    b"AssertionError: No space left for only one request, self.token_to_kv_pool_allocator.available_size()=6\n",
    b"[2026-03-14 22:07:33] SIGQUIT received. signum=None, frame=None. It usually means one child failed.\n",
    b"Available tokens: 6100\n",
]
# The same records as docker-compose prints them, with another service's lines to mix in anywhere.
COMPOSE_FRAGMENTS = [b"sglang-1  | " + f for f in FRAGMENTS if not f.startswith((b"2026-03-14T", b"\xff"))] + [
    b'webui-1   | INFO:     172.19.0.1:40112 - "GET /health HTTP/1.1" 200 OK\n',
    b"webui-1   | Traceback (most recent call last):\n",
    b"webui-1   | [2026-03-14 22:07:33] WARNING: chat task failed, retrying\n",
    b"sglang-1 exited with code 137\n",
]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=4096), st.integers(min_value=1, max_value=4096))
def test_arbitrary_bytes_never_raise(data, chunk):
    scan_bytes(data, chunk=chunk)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=60), st.integers(min_value=1, max_value=257))
def test_any_chunking_gives_the_same_events(parts, chunk):
    data = b"".join(parts)
    assert summary(scan_bytes(data, chunk=chunk)) == summary(scan_bytes(data))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=60))
def test_prefilter_gives_the_same_events_as_reading_every_line(parts):
    data = b"".join(parts)
    assert summary(scan_bytes(data)) == summary(scan_bytes(data, prefilter=False))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(COMPOSE_FRAGMENTS), max_size=80), st.integers(min_value=1, max_value=257))
def test_compose_interleaving_gives_the_same_events_with_or_without_prefilter_and_any_chunking(parts, chunk):
    data = b"".join(parts)
    reference = summary(scan_bytes(data, prefilter=False))
    assert summary(scan_bytes(data)) == reference
    assert summary(scan_bytes(data, chunk=chunk)) == reference


FOREIGN = COMPOSE_FRAGMENTS[-4:]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(COMPOSE_FRAGMENTS[:-4]), max_size=60), st.data())
def test_another_service_never_ends_splits_or_joins_an_sglang_record(parts, data):
    mixed: list[bytes] = []
    for part in parts:
        mixed += [*data.draw(st.lists(st.sampled_from(FOREIGN), max_size=3)), part]

    def what(events):
        return [(e.kind, e.fatal, e.ranks, e.phase, e.numbers) for e in events]

    reference = what(scan_bytes(b"".join(parts)))
    assert what(scan_bytes(b"".join(mixed))) == reference
    assert what(scan_bytes(b"".join(mixed), prefilter=False)) == reference


@functools.cache
def _sample_events() -> tuple[tuple[str, bool, tuple[str, ...], str], ...]:
    """The sample's events read in one piece: the same for every example below, so scanned once."""
    return tuple(summary(scan_bytes(SAMPLE)))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(SAMPLE)), max_size=12))
def test_splitting_the_sample_at_any_bytes_gives_the_same_events(cuts):
    reference = list(_sample_events())
    bounds = sorted({0, len(SAMPLE), *cuts})
    import io

    from sglang_oom_exporter.scan import scan_stream
    from tests.helpers import CATALOG, MATCHER

    class Pieces(io.RawIOBase):
        def __init__(self):
            self.pieces = [SAMPLE[a:b] for a, b in itertools.pairwise(bounds)]

        def read(self, _n=-1):
            return self.pieces.pop(0) if self.pieces else b""

    events, _ = scan_stream(CATALOG, MATCHER, "t.log", Pieces())  # type: ignore[arg-type]
    assert summary(events) == reference


@pytest.mark.parametrize("path", FIXTURES, ids=[os.path.basename(p) for p in FIXTURES])
def test_fixture_events_do_not_depend_on_prefilter_or_chunking(path):
    data = open(path, "rb").read()
    reference = summary(scan_bytes(data))
    assert summary(scan_bytes(data, prefilter=False)) == reference
    assert summary(scan_bytes(data, chunk=97)) == reference
