"""The daemon's parts wired together (App), driven one Loop.step() at a time with an injected clock.

No threads and no sleeps: the clock moves by hand, and file events are handed to the loop as the waker
would hand them (mark_changed + request_discover).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from sglang_oom_exporter.catalog import CatalogError, default_catalog_path, load_catalog
from sglang_oom_exporter.config.model import Config
from sglang_oom_exporter.daemon.app import App
from sglang_oom_exporter.daemon.logsource import LogSource
from sglang_oom_exporter.daemon.state import StateStore
from sglang_oom_exporter.scan.run import scan_paths
from sglang_oom_exporter.sources.otlpspool import Line
from tests.support.app import config_fields, make_app, run_app
from tests.support.helpers import CATALOG
from tests.support.logs import BLOCK, append


def test_first_start_reads_existing_files_from_their_end_and_later_files_from_zero(tmp_path):
    (tmp_path / "old.log").write_text(BLOCK.format(s=1))
    app, clock = make_app(tmp_path)
    run_app(app, clock)
    assert app.counts.total() == 0  # history, not a page
    (tmp_path / "new.log").write_text(BLOCK.format(s=2))
    app.loop.request_discover()
    run_app(app, clock)
    assert app.counts.total("decode") == 1
    append(tmp_path / "old.log", BLOCK.format(s=3))
    run_app(app, clock)
    assert app.counts.total("decode") == 2


def test_from_beginning_reads_existing_files(tmp_path):
    (tmp_path / "old.log").write_text(BLOCK.format(s=1) + BLOCK.format(s=5))
    app, clock = make_app(tmp_path, from_beginning=True)
    run_app(app, clock)
    assert app.counts.total("decode") == 2


def test_block_naming_its_kind_counts_after_the_rank_window_not_before(tmp_path):
    # A block whose text names its kind does not wait for a traceback (--traceback-wait is for the generic
    # text): it counts once the rank window has closed, in well under half a second, and only once.
    log = tmp_path / "a.log"
    log.write_text("")
    app, clock = make_app(tmp_path)
    run_app(app, clock, 1)
    log.write_text("[2026-03-14 22:07:33 TP0] Prefill out of memory. Try to lower your batch size.\n\n")
    app.loop.step()
    assert app.counts.total("prefill") == 0  # the other ranks of this tick may still be on their way
    run_app(app, clock, 0.5)
    assert app.counts.total("prefill") == 1
    run_app(app, clock, 3)
    assert app.counts.total("prefill") == 1


def test_source_series_are_dropped_after_the_retention(tmp_path):
    log = tmp_path / "gone.log"
    log.write_text("x\n")
    app, clock = make_app(tmp_path, source_retention=60.0)
    run_app(app, clock, 1)
    assert ("gone",) in app.counts.known()
    log.unlink()
    run_app(app, clock, 30)
    assert ("gone",) in app.counts.known()
    run_app(app, clock, 40)
    assert ("gone",) not in app.counts.known()
    assert app.sources.paths() == []


def test_health_says_why(tmp_path):
    app, clock = make_app(tmp_path)
    app.loop.step()
    health = app.loop.health()
    assert (health.ok, health.reason) == (False, "no log file matches the configured paths yet")
    (tmp_path / "a.log").write_text("")
    app.loop.request_discover()
    clock.now += 1.0  # a requested discovery runs at most once a second
    app.loop.step()
    assert (app.loop.health().ok, app.loop.health().reason) == (True, "following 1 log source(s)")
    clock.now += 1000  # the loop stops moving
    assert app.loop.health().reason == "the main loop has not run for 1000s"


def test_between_sweeps_only_files_in_changed_directories_are_read(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (tmp_path / "a.log").write_text("")
    (other / "b.log").write_text("")
    app, clock = make_app(tmp_path, paths=(str(tmp_path / "*.log"), str(other / "*.log")), sweep_interval=600.0)
    run_app(app, clock, 1)
    append(tmp_path / "a.log", BLOCK.format(s=1))
    append(other / "b.log", BLOCK.format(s=2))
    app.loop.mark_changed({str(other)})  # what the waker reports for the event in other/
    run_app(app, clock, 3)
    assert app.counts.total("decode") == 1  # b.log only: a.log's directory had no event yet
    app.loop.mark_changed(None)  # too many events to track: read everything
    run_app(app, clock, 3)
    assert app.counts.total("decode") == 2


def test_a_backlog_is_read_in_slices_and_counted_exactly_once(tmp_path, monkeypatch):
    import sglang_oom_exporter.daemon.logsource as logsource

    monkeypatch.setattr(logsource, "READ_BUDGET", 1000)  # bytes per source per pass
    log = tmp_path / "a.log"
    filler = "[2026-03-14 22:07:00 TP0] Decode batch, #running-req: 3, token usage: 0.50\n" * 40
    log.write_text("".join(filler + BLOCK.format(s=s) for s in range(10)))
    app, clock = make_app(tmp_path, from_beginning=True, sweep_interval=600.0)
    app.loop.step()
    assert app.counts.total("decode") < 10  # one pass read one slice, not the whole file
    assert app.loop.next_timeout() == 0.0
    run_app(app, clock, 4)
    assert app.counts.total("decode") == 10


# --- defect 1: a file created within a second of the last discovery waited for the 10 s sweep -------------


def test_a_file_created_right_after_a_discovery_is_read_within_a_second(tmp_path):
    app, clock = make_app(tmp_path, sweep_interval=10.0)
    app.loop.step()  # discovery at t=0 (nothing yet), sweep at t=0
    clock.now += 0.3
    (tmp_path / "new.log").write_text(BLOCK.format(s=1))
    app.loop.request_discover()
    assert app.loop.next_timeout() == pytest.approx(0.7)  # wait only until discovery may run again
    app.loop.mark_changed({str(tmp_path)})  # the waker's report of the create event
    app.loop.step()  # t=0.3: too soon after the last discovery; the file is not a source yet
    assert app.sources.paths() == []
    clock.now += 0.7
    app.loop.step()  # t=1.0: discovered, and read in the same pass
    clock.now += 1.0  # the traceback wait (1 s) of the fatal block
    app.loop.step()
    assert app.counts.total("decode") == 1  # 2 s after it was written, not after the 10 s sweep


# --- defect 2: an unexpected exception in one source must never stop the loop --------------------------------


def test_an_exception_in_one_source_is_counted_and_the_others_are_read(tmp_path, monkeypatch):
    (tmp_path / "bad.log").write_text("")
    (tmp_path / "good.log").write_text("")
    app, clock = make_app(tmp_path)
    run_app(app, clock, 1)
    poll = LogSource.poll

    def boom(self, now, budget=None):
        if self.path.endswith("bad.log"):
            raise RuntimeError("a bug in one source")
        return poll(self, now, budget)

    monkeypatch.setattr(LogSource, "poll", boom)
    append(tmp_path / "good.log", BLOCK.format(s=1))
    run_app(app, clock, 3)
    assert app.counts.total("decode") == 1
    assert app.extra_metrics()["source_errors_total"] == 3  # one per sweep (every second), the only passes that poll


# --- defect 3: SIGHUP applies the catalog and the targets, and says what it cannot apply -----------------------


NEW_KIND_LINE = "[2026-03-14 22:07:33 TP0] Host KV swap space exhausted; 512 tokens dropped\n"


def _catalog_with_a_new_kind(tmp_path) -> str:
    """A copy of the shipped catalog with one more kind, built from a copy of an existing kind's entry."""
    with open(default_catalog_path(), encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    template = next(k for k in data["kinds"] if k["id"] == "mamba")
    kind = {
        **template,
        "id": "host_swap",
        "title": "The host KV swap space ran out",
        "anchors": ["swap space exhausted"],
        "patterns": [
            {"regex": r"Host KV swap space exhausted; (?P<requested_tokens>\d+) tokens dropped", "versions": "t"}
        ],
        "extract": [],
        "suggest": "none",
        "examples": {"match": [NEW_KIND_LINE.strip()], "no_match": ["[2026-03-14 22:07:33 TP0] Host KV swap 40% full"]},
    }
    data["kinds"].append(kind)
    path = tmp_path / "catalog-copy.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def _exposition(app: App) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(app.collector())
    return generate_latest(registry).decode()


def test_a_kind_added_only_to_a_catalog_copy_is_detected_counted_zero_initialised_and_exported(tmp_path):
    catalog = load_catalog(_catalog_with_a_new_kind(tmp_path))
    log = tmp_path / "a.log"
    log.write_text("")
    app, clock = make_app(tmp_path, catalog)
    run_app(app, clock, 1)
    assert 'sglang_oom_events_total{kind="host_swap",source="a"} 0.0' in _exposition(app)
    append(log, NEW_KIND_LINE)
    run_app(app, clock, 3)
    assert app.counts.total("host_swap") == 1
    text = _exposition(app)
    assert 'sglang_oom_events_total{kind="host_swap",source="a"} 1.0' in text
    assert 'sglang_oom_last_event_requested_tokens{kind="host_swap",source="a"} 512.0' in text
    assert scan_paths(catalog, [str(log)]).counts()["host_swap"] == 1  # scan detects it too


def test_reload_applies_a_new_catalog_to_files_already_followed(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("")
    app, clock = make_app(tmp_path)
    run_app(app, clock, 1)
    new = load_catalog(_catalog_with_a_new_kind(tmp_path))
    assert app.reload(app.config, new) == "applied"
    assert 'sglang_oom_events_total{kind="host_swap",source="a"} 0.0' in _exposition(app)
    append(log, NEW_KIND_LINE)
    append(log, BLOCK.format(s=9))
    run_app(app, clock, 3)
    assert app.counts.total("host_swap") == 1
    assert app.counts.total("decode") == 1
    assert app.reloads == {"applied": 1, "partial": 0, "failed": 0}


def test_reload_rebuilds_the_scrapers_and_keeps_an_unchanged_one(tmp_path):
    app, _clock = make_app(tmp_path, sglang_urls=("http://127.0.0.1:1",))
    kept = app.targets.views()[0]
    app.reload(
        Config(**{**config_fields(app.config), "sglang_urls": ("http://127.0.0.1:1", "http://127.0.0.1:2")}), CATALOG
    )
    assert [t.url for t in app.targets.views()] == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert app.targets.views()[0] is kept  # its KV history stays


def test_reload_refuses_what_needs_a_restart_and_says_so(tmp_path, caplog):
    app, _clock = make_app(tmp_path)
    changed = Config(**{**config_fields(app.config), "listen": "127.0.0.1:1", "poll_interval": 3.0})
    with caplog.at_level("WARNING", logger="sglang_oom_exporter.daemon.app"):
        assert app.reload(changed, CATALOG) == "partial"
    assert "kept listen as they were; changing them needs a restart" in caplog.text
    assert (app.config.listen, app.config.poll_interval) == (":9877", 3.0)  # the rest was applied
    app.reload_failed("bad.yaml: colour: unknown key")
    assert 'sglang_oom_exporter_config_reloads_total{result="partial"} 1.0' in _exposition(app)
    assert 'sglang_oom_exporter_config_reloads_total{result="failed"} 1.0' in _exposition(app)
    assert 'sglang_oom_exporter_config_reloads_total{result="applied"} 0.0' in _exposition(app)


def test_reload_picks_up_new_paths(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "b.log").write_text("")
    app, clock = make_app(tmp_path)
    run_app(app, clock, 1)
    assert app.sources.paths() == []
    app.reload(Config(paths=(str(other / "*.log"),), state_dir=app.config.state_dir, traceback_wait=1.0), CATALOG)
    run_app(app, clock, 1)
    assert app.sources.paths() == [str(other / "b.log")]


# --- the state keeper ----------------------------------------------------------------------------------------


def test_state_round_trip_continues_counters_and_positions(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("")
    app, clock = make_app(tmp_path)
    run_app(app, clock, 1)
    log.write_text(BLOCK.format(s=1))
    run_app(app, clock)
    app.keeper.save()
    saved = json.loads((tmp_path / "state" / "state.json").read_text())["data"]
    assert saved["files"][str(log)]["position"]["offset"] == log.stat().st_size
    append(log, BLOCK.format(s=2))
    again, clock2 = make_app(tmp_path)
    again.keeper.load()
    run_app(again, clock2)
    assert again.counts.total("decode") == 2


def test_the_periodic_save_writes_only_when_something_changed(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("")
    app, clock = make_app(tmp_path, state_interval=5.0)
    run_app(app, clock, 6)
    assert app.keeper.saves == 1  # the first due save writes the initial positions
    run_app(app, clock, 20)
    assert app.keeper.saves == 1  # idle: nothing read, nothing counted, no fsync
    append(log, BLOCK.format(s=1))
    run_app(app, clock, 6)
    # Soon after the empty file's first bytes identify it (a copy of it can be told apart from then on), once
    # the OOM they hold is counted (an eager save waits up to 1 s for events in flight): nothing left for later.
    assert app.keeper.saves == 2


def test_state_with_other_labels_is_a_warning_and_a_fresh_start(tmp_path):
    StateStore(tmp_path / "state").save(
        {"files": {}, "counters": {"label_names": ["namespace", "pod", "container"], "sources": []}}
    )
    app, clock = make_app(tmp_path)
    app.keeper.load()
    assert app.extra_metrics()["state_errors_total"] == 1
    run_app(app, clock, 1)
    assert app.counts.total() == 0


def test_a_catalog_without_the_fallback_kind_is_rejected_with_a_clear_error(tmp_path):
    with open(default_catalog_path(), encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    data["kinds"] = [k for k in data["kinds"] if k["id"] != "unknown"]
    path = tmp_path / "no-unknown.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(CatalogError) as info:
        load_catalog(str(path))
    assert [p for p in info.value.problems if "fallback_kind" in p] == [
        f"{path}:1: fallback_kind: names unknown kind 'unknown': it must be one of this catalog's kind ids"
    ]


class FakeWaker:
    """What the loop needs of sources/watch.Waker, recording how it was asked."""

    def __init__(self) -> None:
        self.timeouts: list[float | None] = []
        self.watched: list[set[str]] = []
        self.quieted: list[set[str]] = []

    def wait(self, timeout: float | None) -> bool:
        self.timeouts.append(timeout)
        return False

    def take_changed(self) -> set[str] | None:
        return set()  # no event: nothing was watching when the bytes were written

    def take_created(self) -> bool:
        return False

    def watch_dirs(self, dirs: set[str]) -> None:
        self.watched.append(set(dirs))

    def quiet(self, dirs: set[str]) -> None:
        self.quieted.append(set(dirs))


def test_bytes_written_before_a_new_directory_is_watched_are_read_at_once(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    log = other / "b.log"
    log.write_text("")
    app, clock = make_app(tmp_path, sweep_interval=600.0)
    waker = FakeWaker()
    app.loop.step()
    app.loop._wait(waker, lambda: None)  # the first watch: every directory is looked at once more
    app.loop.step()
    app.reload(Config(**{**config_fields(app.config), "paths": (str(other / "*.log"),)}), CATALOG)
    app.loop.step()  # b.log is discovered and read (empty)
    append(log, BLOCK.format(s=1))  # written before other/ is watched: no file event will come
    app.loop._wait(waker, lambda: None)
    assert (waker.watched[-1], waker.timeouts[-1]) == ({str(other)}, 0.0)
    app.loop.step()
    clock.now += 1.0  # the traceback wait
    app.loop.step()
    assert app.counts.total("decode") == 1  # without the extra look: only at the 600 s sweep


def test_the_loop_wakes_when_a_quiet_file_closes_its_records(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("")
    app, clock = make_app(tmp_path, poll_interval=1.0)
    run_app(app, clock, 1)
    append(log, "[2026-03-14 22:07:33 TP0] Prefill out of memory. Try to lower your batch size.\n")
    app.loop.mark_changed({str(tmp_path)})
    app.loop.step()  # read: the record stays open until a second of quiet
    clock.now += 0.9
    assert app.loop.next_timeout() == pytest.approx(0.1)  # not the 0.2 s busy tick: the close is due sooner


def test_a_received_new_source_is_followed_before_the_answer_not_at_the_next_discovery(tmp_path):
    # Until a source reads them, acknowledged lines show nowhere in the daemon's report (lag, pending, busy):
    # left to the next discovery (up to a second later), a daemon would say it had caught up while they waited.
    app, clock = make_app(tmp_path, otlp_listen="127.0.0.1:0")
    run_app(app, clock, 1)
    assert app.receiver is not None
    rel = "pods/llm_sglang-0_u1/server/0.log"
    lines = [Line(text.encode() + b"\n", bytes([n]) * 16) for n, text in enumerate(BLOCK.format(s=7).splitlines())]
    assert app.receiver.accept({rel: lines}).written == 3
    assert app.sources.get(app.receiver.spool.path(rel)) is not None
    app.loop.step()  # the same instant: no discovery is due, the source is read anyway
    assert (app.loop.pending, app.loop.busy) == (1, 1)  # the block waits for the other ranks of its tick
    run_app(app, clock, 2)
    assert app.counts.total("decode") == 1


def test_a_followed_scheduler_that_dies_of_a_non_memory_exception_counts_one_crash_and_no_oom(tmp_path):
    log = tmp_path / "a.log"
    log.write_text("")
    app, clock = make_app(tmp_path)
    run_app(app, clock, 1)
    assert 'sglang_oom_crashes_total{source="a"} 0.0' in _exposition(app)
    append(log, (Path(__file__).parent / "data" / "logs" / "crash_non_memory_tp2_0_5_23.log").read_text())
    run_app(app, clock, 3)
    text = _exposition(app)
    assert 'sglang_oom_crashes_total{source="a"} 1.0' in text
    assert app.counts.total() == 1
    assert all(f'sglang_oom_events_total{{kind="{k}",source="a"}} 0.0' in text for k in CATALOG.ids)
    assert 'sglang_oom_events_total{kind="crash"' not in text
    (event,) = app.store.recent()
    exception = ("RuntimeError: generation result has an uncopied auxiliary output after its device-to-host copy "
                 "was scheduled")  # fmt: skip
    assert (event.kind, event.ranks, event.message) == ("crash", ("TP0", "TP1"), exception)
    assert f'detail="The last one died of {exception}."' in text
