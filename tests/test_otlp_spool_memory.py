"""The spool's memory in all: the dedupe windows held in memory stay under one budget whatever the number of sources
(sources/otlpspool.py Limits.identities); a window out of memory is read back from its .ids file exactly, so a
retried record is still a duplicate; and the .ids reader that does it agrees row for row with recovery's rules."""

from __future__ import annotations

import re
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_oom_exporter.sources import otlpspool
from sglang_oom_exporter.sources.otlpspool import DEDUPE_WINDOW, IDENTITY_BUDGET, Limits, Line, Spool

DATA = b"a line\n"


def _fill(spool: Spool, source: int, n: int = DEDUPE_WINDOW) -> None:
    """Commit n identities (source-unique) to files/s<source>.log in one batch."""
    base = source << 64
    assert spool.append({f"files/s{source}.log": [Line(DATA, (base + i).to_bytes(16, "big")) for i in range(n)]})[
        :2
    ] == (
        n,
        0,
    )


@pytest.mark.timeout(300)  # a hang guard: half a million records through the spool, traced
def test_the_windows_in_memory_stop_growing_at_the_budget_whatever_the_number_of_sources(tmp_path):
    budgeted = 4  # full windows the budget holds (the default holds 16: IDENTITY_BUDGET)
    spool = Spool(str(tmp_path), Limits(identities=budgeted * DEDUPE_WINDOW))
    tracemalloc.start()
    try:
        for s in range(budgeted):
            _fill(spool, s)
        at_budget = tracemalloc.get_traced_memory()[0]
        for s in range(budgeted, 2 * budgeted):
            _fill(spool, s)
        past = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    # A full window takes about 5.3 MiB (a 64-bit int in a set and 16 bytes in a ring an identity); the
    # OrderedDict of bytes it replaces took 8.6 MiB, and every source kept its own: 69 MiB for these eight.
    assert at_budget < budgeted * 6.5 * 2**20
    # Four more busy sources: their windows replace the least recent ones (one window of slack for a batch's own).
    assert past - at_budget < 6.5 * 2**20
    assert spool.stats.window_loads == 0
    assert sum(len(m.ids) for m in spool._memory.values() if m.ids is not None) == budgeted * DEDUPE_WINDOW
    # The windows out of memory are the first four sources', and a retry to each still finds its records.
    assert [rel for rel, m in sorted(spool._memory.items()) if m.ids is None] == [f"files/s{s}.log" for s in range(4)]
    for s in range(budgeted):
        retry = [Line(DATA, ((s << 64) + i).to_bytes(16, "big")) for i in (0, DEDUPE_WINDOW // 2, DEDUPE_WINDOW - 1)]
        assert spool.append({f"files/s{s}.log": retry}) == (0, 3, [])
    assert spool.stats.window_loads == budgeted
    assert IDENTITY_BUDGET == 16 * DEDUPE_WINDOW  # the default: docs/otlp.md "Connections and memory"


def test_a_window_read_back_from_disk_still_finds_a_duplicate(tmp_path):
    spool = Spool(str(tmp_path), Limits(identities=5))
    one = {"files/a.log": [Line(b"a%d\n" % i, (i).to_bytes(16, "big")) for i in range(3)]}
    two = {"files/b.log": [Line(b"b%d\n" % i, (100 + i).to_bytes(16, "big")) for i in range(3)]}
    assert spool.append(one)[:2] == (3, 0)
    assert spool.append(two)[:2] == (3, 0)
    # a's window (3) and b's (3) pass the budget of 5: a, received least recently, left memory.
    assert spool._memory["files/a.log"].ids is None
    assert len(spool._memory["files/b.log"].ids) == 3
    # A retry of a's batch, split another way and with one new record, is read against a's window from disk.
    retry = {"files/a.log": [one["files/a.log"][2], Line(b"a3\n", (3).to_bytes(16, "big")), one["files/a.log"][0]]}
    assert spool.append(retry) == (1, 2, [])
    assert spool.stats.window_loads == 1
    assert list(spool._memory["files/a.log"].ids) == [(i).to_bytes(16, "big") for i in range(4)]
    assert spool._memory["files/b.log"].ids is None  # b is now the least recent
    assert spool.append(two) == (0, 3, [])
    assert (tmp_path / "files/a.log").read_bytes() == b"a0\na1\na2\na3\n"
    assert (tmp_path / "files/b.log").read_bytes() == b"b0\nb1\nb2\n"
    # After a restart with the same budget: the source written last is loaded, the other read back on demand.
    again = Spool(str(tmp_path), Limits(identities=5))
    again.recover()
    assert sum(m.ids is not None for m in again._memory.values()) == 1
    assert again.append({**one, **two}) == (0, 6, [])
    assert again.append(retry) == (0, 3, [])


def test_a_window_out_of_memory_keeps_its_commits_and_its_compaction(tmp_path, monkeypatch):
    monkeypatch.setattr(otlpspool, "DEDUPE_WINDOW", 4)
    spool = Spool(str(tmp_path), Limits(identities=4))
    for i in range(20):  # a and b take turns: each batch evicts the other's window, and a's .ids is compacted
        for name, base in (("a", 0), ("b", 1000)):
            assert spool.append({f"files/{name}.log": [Line(b"%d\n" % i, (base + i).to_bytes(16, "big"))]})[:2] == (
                1,
                0,
            )
    rows = (tmp_path / "files/a.log.ids").read_bytes().splitlines()
    assert len([r for r in rows if not r.startswith(b"=")]) <= 4 * 4
    held = Spool(str(tmp_path))
    held.recover()
    for name, base in (("a", 0), ("b", 1000)):
        window = [(base + i).to_bytes(16, "big") for i in range(16, 20)]
        assert list(held._memory[f"files/{name}.log"].ids) == window
        assert spool.append({f"files/{name}.log": [Line(b"%d\n" % i, (base + i).to_bytes(16, "big")) for i in
                                                   range(16, 20)]}) == (0, 4, [])  # fmt: skip
        assert list(spool._memory[f"files/{name}.log"].ids) == window
    # One past the window (identity 15) is no longer a duplicate: the documented bound.
    assert spool.append({"files/a.log": [Line(b"15\n", (15).to_bytes(16, "big"))]})[:2] == (1, 0)


_ID = re.compile(rb"[0-9a-f]{32}\n")
_MARK = re.compile(rb"=(\d+)(?: (\d+))?\n")


def _rows_replay(raw: bytes, window: int) -> tuple[int, int, int, list[bytes]]:
    """Recovery's rules one row at a time (the reader before the budget): committed end, size, rows, window."""
    pending: list[bytes] = []
    committed: list[bytes] = []
    end = offset = size = lines = 0
    for row in raw.splitlines(keepends=True):
        offset += len(row)
        if _ID.fullmatch(row):
            pending.append(bytes.fromhex(row[:-1].decode()))
            continue
        mark = _MARK.fullmatch(row)
        if mark is None:
            pending = []
            continue
        count = len(pending) if mark.group(2) is None else min(int(mark.group(2)), len(pending))
        committed += pending[len(pending) - count :]
        size, lines, end, pending = int(mark.group(1)), lines + count + 1, offset, []
    return end, size, lines, committed[-window:]


_ROW = st.one_of(
    st.integers(0, 2**128 - 1).map(lambda i: b"%032x\n" % i),
    st.builds(lambda n, c: b"=%d %d\n" % (n, c), st.integers(0, 99), st.integers(0, 6)),
    st.integers(0, 99).map(lambda n: b"=%d\n" % n),
    st.sampled_from([b"0123abc", b"=12", b"=1 2 3\n", b"\r", b"\r\n", b"%032X\n" % 7, b"zz\n", b"=5 1\r\n", b"\n"]),
)


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(_ROW, max_size=30), window=st.integers(1, 8))
def test_the_bulk_ids_reader_agrees_with_recoverys_row_rules(rows, window):
    raw = b"".join(rows)
    memory = otlpspool._Memory(window)
    end = otlpspool._replay(raw, memory)
    want_end, want_size, want_lines, want_window = _rows_replay(raw, window)
    assert (end, memory.size, memory.lines) == (want_end, want_size, want_lines)
    # Identities repeat in these files (or share the 64 bits a window looks them up by) only by chance of the
    # strategy; the window keeps the first.
    first: dict[bytes, bytes] = {}
    for identity in want_window:
        first.setdefault(identity[8:], identity)
    assert list(memory.ids) == list(first.values())


def test_the_budget_is_the_setting_in_full_windows():
    from sglang_oom_exporter.config.model import Config
    from sglang_oom_exporter.daemon.receiver import limits

    assert limits(Config()).identities == IDENTITY_BUDGET
    assert limits(Config(otlp_spool_dedupe_windows=3)).identities == 3 * DEDUPE_WINDOW


@settings(max_examples=200, deadline=None)
@given(batches=st.lists(st.lists(st.integers(0, 40), max_size=12), max_size=12), size=st.integers(1, 9))
def test_a_window_takes_a_batch_at_once_as_it_takes_its_identities_one_by_one(batches, size):
    bulk, single = otlpspool._Window(size), otlpspool._Window(size)
    for batch in batches:
        identities = [(i * 7919).to_bytes(16, "big") for i in batch]  # a repeat inside a batch or the window too
        bulk.extend(b"".join(identities))
        for identity in identities:
            single.add(identity)
        assert list(bulk) == list(single)
        assert bulk.keys == single.keys
