"""The daemon's wiring, driven one step() at a time with an injected clock: no threads, no sleeps."""

from __future__ import annotations

import json

from sglang_oom_exporter.config import Config
from sglang_oom_exporter.daemon.app import App
from sglang_oom_exporter.daemon.state import StateStore
from tests.helpers import CATALOG

BLOCK = "[2026-03-14 22:07:{s:02d} TP0] Decode out of memory. Try to lower your batch size.\nTry to allocate {s} tokens.\n\n"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _app(tmp_path, **overrides) -> tuple[App, Clock]:
    clock = Clock()
    fields = {"paths": (str(tmp_path / "*.log"),), "state_dir": str(tmp_path / "state"), "traceback_wait": 1.0,
              "discover_interval": 5.0, "state_interval": 5.0, "sweep_interval": 1.0, **overrides}  # fmt: skip
    return App(Config(**fields), CATALOG, clock=clock, wall=clock), clock


def _run(app: App, clock: Clock, seconds: float = 3.0) -> None:
    end = clock.now + seconds
    while clock.now < end:
        app.step()
        clock.now += 0.25


def test_first_start_reads_existing_files_from_their_end_and_later_files_from_zero(tmp_path):
    (tmp_path / "old.log").write_text(BLOCK.format(s=1))
    app, clock = _app(tmp_path)
    _run(app, clock)
    assert app.counts.total() == 0  # history, not a page
    (tmp_path / "new.log").write_text(BLOCK.format(s=2))
    app.request_discover()
    _run(app, clock)
    assert app.counts.total("decode") == 1
    with open(tmp_path / "old.log", "a") as fh:
        fh.write(BLOCK.format(s=3))
    _run(app, clock)
    assert app.counts.total("decode") == 2


def test_from_beginning_reads_existing_files(tmp_path):
    (tmp_path / "old.log").write_text(BLOCK.format(s=1) + BLOCK.format(s=5))
    app, clock = _app(tmp_path, from_beginning=True)
    _run(app, clock)
    assert app.counts.total("decode") == 2


def test_block_without_traceback_counts_after_the_wait_not_before(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("")
    app, clock = _app(tmp_path)
    _run(app, clock, 1)
    log.write_text("[2026-03-14 22:07:33 TP0] Prefill out of memory. Try to lower your batch size.\n\n")
    app.step()
    assert app.counts.total("prefill") == 0  # waiting for its traceback
    _run(app, clock, 1.5)
    assert app.counts.total("prefill") == 1


def test_source_series_are_dropped_after_the_retention(tmp_path):
    log = tmp_path / "gone.log"
    log.write_text("x\n")
    app, clock = _app(tmp_path, source_retention=60.0)
    _run(app, clock, 1)
    assert ("gone",) in app.counts.known()
    log.unlink()
    _run(app, clock, 30)
    assert ("gone",) in app.counts.known()
    _run(app, clock, 40)
    assert ("gone",) not in app.counts.known()
    assert app.sources == {}


def test_reload_picks_up_new_paths(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "b.log").write_text("")
    app, clock = _app(tmp_path)
    _run(app, clock, 1)
    assert app.sources == {}
    app.reload(Config(paths=(str(other / "*.log"),), state_dir=app.config.state_dir, traceback_wait=1.0))
    _run(app, clock, 1)
    assert list(app.sources) == [str(other / "b.log")]


def test_health_says_why(tmp_path):
    app, clock = _app(tmp_path)
    app.step()
    health = app.health()
    assert (health.ok, health.reason) == (False, "no log file matches the configured paths yet")
    (tmp_path / "a.log").write_text("")
    app.request_discover()
    clock.now += 1.0  # a requested discovery runs at most once a second
    app.step()
    assert app.health().ok
    clock.now += 1000  # the loop stops moving
    assert app.health().reason == "the main loop has not run for 1000s"


def test_state_round_trip_continues_counters_and_positions(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("")
    app, clock = _app(tmp_path)
    _run(app, clock, 1)
    log.write_text(BLOCK.format(s=1))
    _run(app, clock)
    app.shutdown()
    saved = json.loads((tmp_path / "state" / "state.json").read_text())["data"]
    assert saved["files"][str(log)]["position"]["offset"] == log.stat().st_size
    with open(log, "a") as fh:
        fh.write(BLOCK.format(s=2))
    again, clock2 = _app(tmp_path)
    again.load_state()
    _run(again, clock2)
    assert again.counts.total("decode") == 2


def test_state_with_other_labels_is_a_warning_and_a_fresh_start(tmp_path):
    StateStore(tmp_path / "state").save({"state_version": 1, "files": {},
        "counters": {"label_names": ["namespace", "pod", "container"], "sources": []}})  # fmt: skip
    app, clock = _app(tmp_path)
    app.load_state()
    assert app.extra["state_errors_total"] == 1
    _run(app, clock, 1)
    assert app.counts.total() == 0


def test_between_sweeps_only_files_in_changed_directories_are_read(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (tmp_path / "a.log").write_text("")
    (other / "b.log").write_text("")
    app, clock = _app(tmp_path, paths=(str(tmp_path / "*.log"), str(other / "*.log")), sweep_interval=600.0)
    _run(app, clock, 1)
    with open(tmp_path / "a.log", "a") as fh:
        fh.write(BLOCK.format(s=1))
    with open(other / "b.log", "a") as fh:
        fh.write(BLOCK.format(s=2))
    app.mark_changed({str(other)})  # what the waker reports for the event in other/
    _run(app, clock, 3)
    assert app.counts.total("decode") == 1  # b.log only: a.log's directory had no event yet
    app.mark_changed(None)  # too many events to track: read everything
    _run(app, clock, 3)
    assert app.counts.total("decode") == 2


def test_a_backlog_is_read_in_slices_and_counted_exactly_once(tmp_path, monkeypatch):
    import sglang_oom_exporter.daemon.logsource as logsource

    monkeypatch.setattr(logsource, "READ_BUDGET", 1000)  # bytes per source per pass
    log = tmp_path / "a.log"
    filler = "[2026-03-14 22:07:00 TP0] Decode batch, #running-req: 3, token usage: 0.50\n" * 40
    log.write_text("".join(filler + BLOCK.format(s=s) for s in range(10)))
    app, clock = _app(tmp_path, from_beginning=True, sweep_interval=600.0)
    app.step()
    assert app.counts.total("decode") < 10  # one pass read one slice, not the whole file
    assert app._next_timeout() == 0.0
    _run(app, clock, 4)
    assert app.counts.total("decode") == 10
