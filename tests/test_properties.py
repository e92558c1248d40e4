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
from tests.support.fuzz import DYING, a_dying_scheduler_gives_exactly_one_event
from tests.support.helpers import CATALOG, scan_bytes, scan_text, summary
from tests.support.logs import COMPOSE_FRAGMENTS, CRI_FRAGMENTS, DOCKER_FRAGMENTS, FRAGMENTS, scheduler_crash

HERE = os.path.dirname(__file__)
SAMPLE = open(sample_path(), "rb").read()
FIXTURES = sorted(glob.glob(os.path.join(HERE, "data", "logs", "*.log")))


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


def _whole(events):
    return [(e.kind, e.fatal, e.ranks, e.phase, e.location, e.offset, e.numbers, e.excerpt) for e in events]


@pytest.mark.parametrize(
    "fragments", [COMPOSE_FRAGMENTS, CRI_FRAGMENTS, DOCKER_FRAGMENTS], ids=["compose", "cri", "docker"]
)
@settings(max_examples=150, deadline=None)
@given(parts=st.data(), chunk=st.integers(min_value=1, max_value=257))
def test_interleaved_streams_give_the_same_events_with_or_without_prefilter_and_any_chunking(fragments, parts, chunk):
    # While a record is open, a line of a stream with nothing open downstream is only counted (the reader asks the
    # pipeline): every event, its numbers, its first line and its excerpt must be what reading every line gives.
    data = b"".join(parts.draw(st.lists(st.sampled_from(fragments), max_size=80)))
    reference = _whole(scan_bytes(data, prefilter=False))
    assert _whole(scan_bytes(data)) == reference
    assert _whole(scan_bytes(data, chunk=chunk)) == reference


LOG_FORMATS = {"bare": FRAGMENTS, "compose": COMPOSE_FRAGMENTS, "cri": CRI_FRAGMENTS, "docker": DOCKER_FRAGMENTS}
LONG_EXAMPLES = 20_000


# The two properties above at the size that found the reader's holes (each shipped, then found at 20,000 examples):
# in `make all` (CI), not in `make test`. The timeout is a hang guard for a machine at load 12, not a speed claim.
@pytest.mark.slow
@pytest.mark.timeout(7200)
@pytest.mark.parametrize("fragments", list(LOG_FORMATS.values()), ids=list(LOG_FORMATS))
@settings(max_examples=LONG_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.data())
def test_prefilter_gives_the_same_events_as_reading_every_line_at_length(fragments, parts):
    data = b"".join(parts.draw(st.lists(st.sampled_from(fragments), max_size=80)))
    assert _whole(scan_bytes(data)) == _whole(scan_bytes(data, prefilter=False))


@settings(max_examples=300, deadline=None)
@given(*DYING)
def test_a_dying_scheduler_gives_exactly_one_event_whatever_its_exception_says(cls, message, frames, ranks):
    a_dying_scheduler_gives_exactly_one_event(cls, message, frames, ranks)


def test_ranks_that_die_together_of_different_exceptions_are_one_crash():
    other = [("managers/scheduler.py", "event_loop_overlap")]
    log = scheduler_crash("ValueError: bad batch", other, ("TP0",))
    log += scheduler_crash("RuntimeError: NCCL communicator was aborted on rank 1.", other, ("TP1",))
    (event,) = scan_text(log)
    assert (event.kind, event.ranks, event.message) == (CATALOG.crash.id, ("TP0", "TP1"), "ValueError: bad batch")


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


def test_compose_status_lines_inside_a_record_leave_its_window_open():
    # Hypothesis's find: compose's own lines carry no service prefix, and three of them after a detail line
    # used up the four-line window, so the record lost its "Try to allocate" numbers.
    anchor = b"sglang-1  | [2026-03-14 22:07:33 TP0] Out of memory. Try to lower your batch size.\n"
    detail, numbers = b"sglang-1  |  0 [] r=1\n", b"sglang-1  | Try to allocate 96 tokens.\n"
    mixed = anchor + detail + b"sglang-1 exited with code 137\n" * 3 + numbers
    (event,) = scan_bytes(mixed)
    assert (event.kind, event.numbers) == ("unknown", {"requested_tokens": 96})


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

    from sglang_oom_exporter.scan.serial import scan_stream
    from tests.support.helpers import CATALOG, MATCHER

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
