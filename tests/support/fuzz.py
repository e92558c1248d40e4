"""The whole-pipeline fuzz properties and their input strategies: random bytes, rank interleavings, CRI
partial splits and NUL runs, and a dying scheduler's traceback with any final exception line. tests/test_fuzz_pipeline.py runs each quickly; bench/fuzz.py runs the same
properties for as long as asked.
"""

from __future__ import annotations

import io
import itertools

from hypothesis import strategies as st

from sglang_oom_exporter.scan.serial import scan_stream
from tests.support.helpers import CATALOG, MATCHER, scan_bytes, scan_text, summary
from tests.support.logs import COMPOSE_FRAGMENTS, CRASH_FRAMES, FRAGMENTS, scheduler_crash

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


def a_dying_scheduler_gives_exactly_one_event(
    cls: str, message: str, frames: list[tuple[str, str]], ranks: tuple[str, ...]
) -> None:
    """Never silent, never counted twice: whatever the final exception line, the ranks that die of it together
    are one event. Where no kind's text names it, its frames decide: under memory-pool or allocator code a memory
    kind, else the non-memory crash."""
    line = f"{cls}: {message}"
    events = scan_text(scheduler_crash(line, frames, ranks))
    assert len(events) == 1, (line, frames, summary(events))
    (event,) = events
    assert event.ranks == ranks
    assert event.fatal
    named = MATCHER.match_line(line) is not None or event.numbers.get("exception") is None
    memory = any(f in CRASH_FRAMES["memory"] for f in frames)
    if not named and event.kind != CATALOG.crash.id:
        assert memory, (line, frames, event.kind)
    if not named and not memory and not event.inferred:
        assert event.kind == CATALOG.crash.id, (line, frames, event.kind)


EXCEPTION_CLASS = st.from_regex(r"\A(?:[a-z_]+\.)?[A-Z][A-Za-z]{0,20}(?:Error|Exception)?\Z")
EXCEPTION_MESSAGE = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n"), max_size=200)
CRASH_FRAME = st.sampled_from([f for group in CRASH_FRAMES.values() for f in group])
DYING = (EXCEPTION_CLASS, EXCEPTION_MESSAGE, st.lists(CRASH_FRAME, max_size=5),
         st.sampled_from([("TP0",), ("TP0", "TP1")]))  # fmt: skip
CUTS = st.lists(st.integers(min_value=0), max_size=16)
# Each property with the strategies of its arguments: the tests below and bench/fuzz.py run these.
FUZZ_PROPERTIES = (
    (same_events_however_split, (FUZZ_INPUT, CUTS)),
    (same_events_with_small_chunks_or_no_prefilter, (FUZZ_INPUT, st.integers(min_value=1, max_value=64))),
    (same_events_however_split, (st.binary(max_size=8192), CUTS)),
    (a_dying_scheduler_gives_exactly_one_event, DYING),
)
