"""When an event is counted: as soon as it is decidable, by an injected clock or by position.

- A block whose own text names its kind counts once the rank window closed, not after the traceback wait.
- A block and its traceback written together count within the rank window, with the traceback's fields
  (the phase its frames give, speculative verify turning a "Prefill" text into a decode step).
- The generic 0.5.4+ text, whose kind is in the frames, still waits for its traceback.
- A traceback that comes after its block was counted joins it: exactly one increment.
- In a backlog (the reader far past a block), the block is final at once, whatever the clock says.
Driven through the real daemon (App, one Loop.step() at a time) or the real Pipeline, never by sleeping.
"""

from __future__ import annotations

import pytest

from sglang_oom_exporter.config.model import Config
from sglang_oom_exporter.daemon.app import App
from sglang_oom_exporter.detect.dedupe import FRAMES_LINES, RANK_WINDOW_SECONDS, SETTLE_LINES
from sglang_oom_exporter.detect.match import Matcher
from sglang_oom_exporter.detect.model import OomEvent
from sglang_oom_exporter.detect.pipeline import Pipeline
from tests.support.helpers import CATALOG, MATCHER, Clock, frames

TS = "2026-03-14 22:07:33"
PREFILL = "Prefill out of memory. Try to lower your batch size.\nTry to allocate 4096 tokens.\nAvailable tokens: 100 (available_size=60 + evictable_size=40)\n"
GENERIC = "Out of memory. Try to lower your batch size.\nTry to allocate 96 tokens.\nAvailable tokens: 40 (available_size=40 + evictable_size=0)\n"
DECODE_FRAMES = ("update_running_batch", "prepare_for_decode", "alloc_for_decode", "alloc_token_slots")
VERIFY_FRAMES = ("forward", "verify", "prepare_for_verify", "alloc_paged_token_slots_extend")


def block(text: str, rank: str = "TP0", ts: str = TS) -> str:
    """A logged block as SGLang writes it: prefixed first line, detail lines, one blank line."""
    return f"[{ts} {rank}] {text}\n"


def traceback(text: str, funcs: tuple[str, ...], rank: str = "TP0", ts: str = TS) -> str:
    """The scheduler's traceback that repeats the block: header, frames, exception text, two blank lines."""
    head = f"[{ts} {rank}] Scheduler hit an exception: Traceback (most recent call last):\n"
    return head + frames(*funcs) + f"RuntimeError: {text}\n\n"


@pytest.fixture
def daemon(tmp_path):
    """An App on one empty file with the default traceback wait, its clock, and an append() that wakes it."""
    log = tmp_path / "a.log"
    log.write_text("")
    clock = Clock()
    config = Config(paths=(str(log),), state_dir=str(tmp_path / "state"), traceback_wait=2.5, poll_interval=1.0,
                    discover_interval=60.0, sweep_interval=60.0)  # fmt: skip
    app = App(config, CATALOG, clock=clock, wall=clock)
    app.loop.step()
    clock.now += 1.0

    def append(text: str) -> None:
        with open(log, "a") as fh:
            fh.write(text)
        app.loop.mark_changed({str(tmp_path)})  # what the waker reports
        app.loop.step()

    return app, clock, append


def test_a_block_without_traceback_counts_when_the_rank_window_closes(daemon):
    app, clock, append = daemon
    append(block(PREFILL))
    assert app.counts.total("prefill") == 0  # other ranks of the same tick may still come
    # The loop wakes when the window closes, not at the next busy tick nor after the 2.5 s traceback wait.
    assert app.loop.next_timeout() == pytest.approx(RANK_WINDOW_SECONDS)
    clock.now += RANK_WINDOW_SECONDS
    app.loop.step()
    assert app.counts.total("prefill") == 1
    assert app.counts.total() == 1


def test_ranks_of_one_tick_inside_the_window_are_one_event(daemon):
    app, clock, append = daemon
    append(block(PREFILL, "TP0"))
    clock.now += RANK_WINDOW_SECONDS / 2
    append(block(PREFILL, "TP1"))
    clock.now += RANK_WINDOW_SECONDS / 2
    app.loop.step()
    assert app.counts.total() == 1
    assert [e.ranks for e in app.store.recent()] == [("TP0", "TP1")]


def test_a_block_and_its_traceback_count_within_the_window_with_the_frames_phase(daemon):
    app, clock, append = daemon
    text = "Decode out of memory. Try to lower your batch size.\nTry to allocate 64 tokens.\n"
    append(block(text) + traceback(text, ("forward", "verify", "prepare_for_verify", "alloc_for_spec_decode")))
    assert app.counts.total() == 0
    # The traceback is whole (exception text, blank lines): it closes after the window, not after 1 s of quiet.
    assert app.loop.next_timeout() == pytest.approx(RANK_WINDOW_SECONDS)
    clock.now += RANK_WINDOW_SECONDS
    app.loop.step()
    assert app.counts.total("decode") == 1
    [event] = app.store.recent()
    assert (event.kind, event.phase, event.subphase, event.numbers["requested_tokens"]) == (
        "decode", "decode", "spec_verify", 64,
    )  # fmt: skip


def test_speculative_verify_frames_still_turn_a_prefill_text_into_a_decode_event(daemon):
    app, clock, append = daemon
    append(block(PREFILL) + traceback(PREFILL, VERIFY_FRAMES))
    clock.now += RANK_WINDOW_SECONDS
    app.loop.step()
    assert (app.counts.total("prefill"), app.counts.total("decode")) == (0, 1)


def test_a_traceback_being_written_holds_the_block_until_it_is_whole(daemon):
    app, clock, append = daemon
    head = f"[{TS} TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    append(block(PREFILL) + head + frames("forward", "verify", "prepare_for_verify"))  # cut mid-write
    for _ in range(3):
        clock.now += 0.2
        app.loop.step()
    assert app.counts.total() == 0  # its frames may still change the kind
    append(frames("alloc_paged_token_slots_extend") + f"RuntimeError: {PREFILL}\n\n")
    clock.now += RANK_WINDOW_SECONDS
    app.loop.step()
    assert (app.counts.total("prefill"), app.counts.total("decode")) == (0, 1)


def test_a_traceback_cut_short_for_good_counts_after_the_idle_close(daemon):
    app, clock, append = daemon
    head = f"[{TS} TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    append(block(PREFILL) + head + frames("get_new_batch_prefill", "prepare_for_extend"))
    clock.now += 0.8
    app.loop.step()
    assert app.counts.total() == 0
    clock.now += 0.2  # a second of quiet: the record is closed as cut
    app.loop.step()
    assert app.counts.total("prefill") == 1
    assert app.counts.total() == 1


def test_the_generic_text_waits_for_its_traceback(daemon):
    app, clock, append = daemon
    append(block(GENERIC))
    clock.now += 1.0
    app.loop.step()
    assert app.counts.total() == 0  # its kind is in the frames
    append(traceback(GENERIC, DECODE_FRAMES))
    clock.now += RANK_WINDOW_SECONDS
    app.loop.step()
    assert (app.counts.total("decode"), app.counts.total()) == (1, 1)


def test_the_generic_text_without_traceback_counts_at_the_wait(daemon):
    app, clock, append = daemon
    append(block(GENERIC))
    clock.now += 2.4
    app.loop.step()
    assert app.counts.total() == 0
    clock.now += 0.1
    app.loop.step()
    assert app.counts.total(CATALOG.fallback_kind) == 1


def test_a_traceback_after_its_block_was_counted_joins_it_exactly_once(daemon):
    app, clock, append = daemon
    append(block(PREFILL, "TP0") + block(PREFILL, "TP1"))
    clock.now += RANK_WINDOW_SECONDS
    app.loop.step()
    assert app.counts.total("prefill") == 1
    clock.now += 2.0  # a tree dump, a slow disk: the tracebacks come later
    append(traceback(PREFILL, ("get_new_batch_prefill", "prepare_for_extend")) + traceback(PREFILL, (), "TP1"))
    for _ in range(10):
        clock.now += 0.25
        app.loop.step()
    assert app.counts.total() == 1
    assert len(app.store.recent()) == 1


SWA_WARNING = "SWA eviction insufficient: needed=3072, available=1024, req=c3d2"
KV_FULL = ("KV cache is full! Bug in memory estimation. available=9216, evictable=0, protected=0, required_alloc=4096, "
           "swa_available=1024, swa_evictable=0, required_swa=3072, page_size=64, req=c3d2")  # fmt: skip


def _advance(app: App, clock: Clock, seconds: float) -> None:
    """Step the daemon through `seconds` of its clock, a quarter second at a time."""
    for _ in range(round(seconds / 0.25)):
        clock.now += 0.25
        app.loop.step()


def test_a_pd_swa_warning_waits_for_the_assertion_that_may_follow_and_counts_it_fatal(daemon):
    # 0.5.23 logs the warning in _pre_alloc and asserts for the same request: however late the assertion's
    # traceback is written (within the traceback wait), it must not find the warning counted as non-fatal.
    app, clock, append = daemon
    append(block(SWA_WARNING))
    _advance(app, clock, 2.0)
    assert app.counts.total() == 0
    append(
        traceback(KV_FULL, ("process_decode_queue", "pop_preallocated", "_pre_alloc")).replace("Runtime", "Assertion")
    )
    _advance(app, clock, 2.0)
    assert [(e.kind, e.fatal) for e in app.store.recent()] == [("pd_prealloc", True)]
    assert app.counts.total() == 1


def test_a_pd_swa_warning_before_another_requests_assertion_is_counted_first(daemon):
    # The warning's request is not the one the scheduler dies of: the assertion for another request decides
    # both, in log order, so the newest event (what the last-event gauges show) is the fatal one, whatever the
    # clock says about the warning's own wait.
    app, clock, append = daemon
    append(block(SWA_WARNING))
    _advance(app, clock, 0.25)
    other = KV_FULL.replace("req=c3d2", "req=e5f6").replace("required_alloc=4096", "required_alloc=8192")
    append(traceback(other, ("process_decode_queue", "pop_preallocated", "_pre_alloc")).replace("Runtime", "Assertion"))
    _advance(app, clock, 1.5)
    assert [(e.kind, e.fatal, e.numbers.get("requested_tokens")) for e in app.store.recent()] == [
        ("pd_prealloc", True, 8192),
        ("pd_prealloc", False, 3072),
    ]
    assert app.counts.total() == 2


def test_a_pd_swa_abort_alone_counts_once_not_fatal(daemon):
    app, clock, append = daemon
    append(block(SWA_WARNING))
    _advance(app, clock, 5.0)
    assert [(e.kind, e.fatal) for e in app.store.recent()] == [("pd_prealloc", False)]
    assert app.counts.total() == 1


def _pipeline(events: list[OomEvent]) -> Pipeline:
    pipe = Pipeline(CATALOG, Matcher(CATALOG), source="t", location="t.log", sink=events.append)
    pipe.start_generation("1:2:0")
    return pipe


def _filler(n: int) -> str:
    return "".join(f"[{TS} TP0] Decode batch, #running-req: 37, #token: {i}, token usage: 0.62, \n" for i in range(n))


@pytest.mark.parametrize(("text", "lines", "kind"), [(PREFILL, SETTLE_LINES, "prefill"),
                                                     (GENERIC, FRAMES_LINES, "unknown")])  # fmt: skip
def test_in_a_backlog_a_block_far_behind_the_reader_is_final_at_once(text, lines, kind):
    events: list[OomEvent] = []
    pipe = _pipeline(events)
    # The block's record starts at line 1 and takes 4 lines; the reader is then at line `lines`: one short.
    pipe.feed((block(text) + _filler(lines - 5)).encode(), now=5.0)
    pipe.tick(5.0)  # no wall time passed: the clock says wait
    assert events == []
    pipe.feed(_filler(1).encode(), now=5.0)
    pipe.tick(5.0)
    assert [(e.kind, e.location) for e in events] == [(kind, "t.log:1")]
    assert pipe.pending() == 0


def test_the_window_and_the_replay_keys_stay_small_on_a_long_live_run():
    # Before: a followed file kept 256 groups and 1,024 keys whatever their age.
    events: list[OomEvent] = []
    pipe = _pipeline(events)
    for i in range(400):
        now = 10.0 * i
        ts = f"2026-03-14 {i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}"
        pipe.feed((block(PREFILL, ts=ts) + traceback(PREFILL, ("prepare_for_extend",), ts=ts)).encode(), now=now)
        pipe.close_open(now + 0.2)
        pipe.tick(now + 0.2)
    assert len(events) == 400
    deduper = pipe._deduper
    assert len(deduper._groups) <= 4  # 30 s of groups at one event per 10 s
    assert deduper.export_state()["emitted_keys"] == []  # every event is behind the point a restart re-reads from


def test_a_restart_between_a_counted_block_and_its_traceback_counts_once():
    events: list[OomEvent] = []
    pipe = _pipeline(events)
    data = (block(PREFILL) + traceback(PREFILL, ("prepare_for_extend",))).encode()
    cut = data.index(b"[", 1)  # the block alone was written when the daemon read
    pipe.feed(data[:cut], now=1.0)
    pipe.tick(1.0 + RANK_WINDOW_SECONDS)
    assert len(events) == 1
    offset, lineno = pipe.resume_point()
    saved = pipe.export_state()
    assert offset == cut  # the counted block is not re-read
    again: list[OomEvent] = []
    restarted = _pipeline(again)
    restarted.restore_state(saved)
    restarted.start_generation("1:2:0", offset, lineno)
    restarted.feed(data[offset:], now=500.0)
    restarted.close_open(501.0)
    restarted.tick(501.0)
    restarted.finish()
    assert again == []


def _reference_groups(reports: list) -> list[list[int]]:
    """The join rules as a plain linear scan over every group, newest first (what dedupe did before its index)."""
    from sglang_oom_exporter.detect.window import CROSS_RANK_SECONDS, SAME_RANK_SECONDS, close

    groups: list[dict] = []  # {"body", "epoch", "lineno", "members": {rank: {"block": (short, epoch, line), ...}}}
    for i, (r, epoch) in enumerate(reports):
        rank, typ = r.record.ranks, ("trace" if r.record.kind == "traceback" else "block")
        other_typ = "block" if typ == "trace" else "trace"
        found = None
        for g in reversed(groups):
            m = g["members"].get(rank)
            if m is None or m.get(typ) is not None or m.get(other_typ) is None:
                continue
            short, e, line = m[other_typ]
            if r.short and short and r.short != short:
                continue
            if close(epoch, e, r.record.lineno, line, SAME_RANK_SECONDS):
                found = g
                break
        if found is None and r.body:
            for g in reversed(groups):
                near = close(epoch, g["epoch"], r.record.lineno, g["lineno"], CROSS_RANK_SECONDS)
                if g["body"] == r.body and rank not in g["members"] and near:
                    found = g
                    break
        if found is None:
            found = {"body": r.body, "epoch": epoch, "lineno": r.record.lineno, "members": {}, "ids": []}
            groups.append(found)
        found["members"].setdefault(rank, {})[typ] = (r.short, epoch, r.record.lineno)
        found["ids"].append(i)
        found["epoch"] = found["epoch"] if found["epoch"] is not None else epoch
    return sorted(g["ids"] for g in groups)


@pytest.mark.parametrize("seed", range(40))
def test_the_indexed_window_joins_exactly_as_a_scan_of_every_group(seed):
    import random

    from sglang_oom_exporter.detect.dedupe import Deduper
    from sglang_oom_exporter.detect.model import Record, Report

    rng = random.Random(seed)  # noqa: S311 - a reproducible sequence, not a secret
    reports: list = []
    lineno = 0
    for i in range(200):
        lineno += rng.choice([1, 7, 3000])  # in log order, sometimes far apart (the no-timestamp join is by lines)
        second = rng.choice([None, *range(30, 40)]) if rng.random() < 0.9 else None
        time = None if second is None else f"2026-03-14 22:07:{second:02d}"
        kind = rng.choice(["block", "traceback"])
        record = Record(kind, lineno, time, rng.choice(["TP0", "TP1", "TP2", ""]), "",
                        ("x",), offset=i)  # fmt: skip
        report = Report("prefill", "prefill", True, record, rng.choice(["", "a", "b"]), rng.choice(["", "s1", "s2"]),
                        "m", None, False, {}, ())  # fmt: skip
        reports.append(report)
    deduper = Deduper("t", "t.log", lambda e: None, resolve=MATCHER.resolve)
    for r in reports:
        deduper.add(r)
    from sglang_oom_exporter.detect.dedupe import _epoch

    got = sorted(sorted(reports.index(r) for m in g.members.values() for r in m.reports) for g in deduper._groups)
    assert got == _reference_groups([(r, _epoch(r)) for r in reports])


class _Pump:
    """What the loop asks of the stdin pump: the chunks read since the last look, and whether stdin ended."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.done = False

    def drain(self) -> tuple[list[bytes], bool]:
        chunks, self.chunks = self.chunks, []
        return chunks, self.done


def test_stdin_counts_a_block_and_its_traceback_within_the_window_too(tmp_path):
    import io

    clock = Clock()
    config = Config(paths=(), state_dir=str(tmp_path / "state"), traceback_wait=2.5, poll_interval=1.0)
    app = App(config, CATALOG, clock=clock, wall=clock, stdin=io.BytesIO(b""), stdout=io.BytesIO())
    pump = _Pump()
    app.loop._stdin = pump  # type: ignore[assignment]
    app.loop.step()
    pump.chunks.append((block(PREFILL) + traceback(PREFILL, ("get_new_batch_prefill", "prepare_for_extend"))).encode())
    app.loop.step()
    assert app.counts.total() == 0
    clock.now += RANK_WINDOW_SECONDS
    app.loop.step()
    assert (app.counts.total("prefill"), app.counts.total()) == (1, 1)
