"""Found by the soak: rotations and deletes around a SIGKILL or a restart lose nothing the daemon could
still count. Each case is the daemon's parts driven with the fake clock; "SIGKILL" is closing the files without
the save on the way out, and the restart is a new App on the same state directory.
"""

from __future__ import annotations

import json
import logging
import os
import shutil

import pytest

from sglang_oom_exporter.config.model import Config
from tests.support.app import config_fields, first_life, make_app, restarted_app, run_app, started_app
from tests.support.logs import BLOCK, EVENT, HISTORY, append


def _state_files(tmp_path) -> dict:
    with open(tmp_path / "state" / "state.json", encoding="utf-8") as fh:
        return json.load(fh)["data"]["files"]


@pytest.mark.parametrize("how", ["rename", "copytruncate"])
def test_rotated_while_down_and_not_recreated_is_drained_at_the_restart(tmp_path, how):
    """A glob no longer matches a renamed file: its saved position still names the generation to drain."""
    log = first_life(tmp_path, HISTORY)
    append(log, BLOCK.format(s=2))  # written while down
    if how == "rename":
        os.rename(log, log + ".1")
    else:
        shutil.copyfile(log, log + ".1")
        os.truncate(log, 0)
    app = restarted_app(tmp_path)
    assert app.counts.total("decode") == 2


def test_a_saved_file_not_followed_now_keeps_its_entry_across_saves(tmp_path):
    """Renamed away while down (or removed by a reload): a save must not drop what a later start needs."""
    log = first_life(tmp_path, HISTORY)
    other = tmp_path / "elsewhere"
    other.mkdir()
    moved = str(other / "a.log")
    os.rename(log, moved)  # the configured glob (tmp_path/*.log) does not match it now
    entry = _state_files(tmp_path)[log]
    app, clock = started_app(tmp_path)  # its start saves
    run_app(app, clock, 2.0)
    app.keeper.save()
    app.sources.close()
    kept = _state_files(tmp_path)[log]
    assert (kept["position"], kept["epoch"], kept["dedupe"]) == (entry["position"], entry["epoch"], entry["dedupe"])
    os.rename(moved, log)
    append(log, BLOCK.format(s=3))
    app = restarted_app(tmp_path)
    assert app.counts.total("decode") == 2  # resumed where it stopped: the first OOM is not counted again


def test_a_reload_removed_path_keeps_its_position_across_a_restart(tmp_path):
    log = first_life(tmp_path, HISTORY)
    app, clock = started_app(tmp_path)
    run_app(app, clock, 1.0)
    config = app.config
    app.reload(Config(**{**config_fields(config), "paths": (str(tmp_path / "other-*.log"),)}), app.catalog)
    app.keeper.save()
    app.sources.close()
    append(log, BLOCK.format(s=4))  # written while it was not followed
    app = restarted_app(tmp_path)  # the original config names it again
    # The reload kept a.log's counter (within the retention it goes on); resumed where it stopped, only
    # the OOM written since is counted on top. Without its saved position it would be read from 0: 3.
    assert app.counts.total("decode") == 2


@pytest.mark.parametrize("how", ["rename", "copytruncate"])
def test_an_event_in_flight_when_its_generation_ends_survives_a_sigkill(tmp_path, how):
    """Read, not yet emitted, its file rotated, a save (any file's new generation triggers one), SIGKILL."""
    log = first_life(tmp_path, HISTORY)
    app, clock = started_app(tmp_path)
    run_app(app, clock, 1.0)
    append(log, EVENT.format(s=5))
    app.loop.mark_changed({str(tmp_path)})
    app.loop.step()  # read at once; the settle has not passed on the fake clock
    assert app.loop.pending == 1
    if how == "rename":
        os.rename(log, log + ".1")  # and no new file yet
    else:
        shutil.copyfile(log, log + ".1")
        os.truncate(log, 0)
    app.loop.mark_changed({str(tmp_path)})
    app.loop.step()
    assert app.loop.pending == 1  # the generation ended with the event still waiting
    app.keeper.save()
    app.sources.close()
    app = restarted_app(tmp_path)
    assert app.counts.total("prefill") == 1
    assert app.counts.total("decode") == 1


def test_what_was_counted_from_a_file_deleted_while_up_is_saved_before_a_sigkill(tmp_path):
    log = first_life(tmp_path, HISTORY)
    app, clock = started_app(tmp_path)
    run_app(app, clock, 1.0)
    append(log, EVENT.format(s=6))
    app.loop.mark_changed({str(tmp_path)})
    app.loop.step()
    os.remove(log)  # the daemon still holds it; nothing else can ever read these bytes again
    app.loop.mark_changed({str(tmp_path)})
    run_app(app, clock, 1.0)  # emitted after its settle, and saved soon after: the periodic save is 60 s away
    assert app.counts.total("prefill") == 1
    app.sources.close()
    app = restarted_app(tmp_path)
    assert app.counts.total("prefill") == 1


def test_a_failing_save_warns_once_per_streak_and_counts_every_failure(tmp_path, caplog):
    (tmp_path / "state").write_text("a file where the state directory should be")
    app, clock = make_app(tmp_path, state_interval=1.0)
    caplog.set_level(logging.DEBUG, logger="sglang_oom_exporter.daemon.state")
    app.loop._start()
    for s in range(3):
        append(tmp_path / "a.log", BLOCK.format(s=s))  # something new, so that every due save is tried
        app.loop.request_discover()
        run_app(app, clock, 2.0)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "cannot save" in r.getMessage()]
    assert len(warnings) == 1
    failures = app.keeper.errors
    assert failures >= 3
    os.remove(tmp_path / "state")
    append(tmp_path / "a.log", BLOCK.format(s=9))
    run_app(app, clock, 2.0)
    assert app.keeper.errors == failures
    assert app.keeper.saves >= 1
    assert any("saved again" in r.getMessage() for r in caplog.records)


def test_eager_saves_wait_as_long_as_the_last_save_took(tmp_path, monkeypatch):
    """A large state on a busy machine: saving on every rotation must not starve the reading."""
    log = first_life(tmp_path, HISTORY)
    app, clock = started_app(tmp_path)
    store = app.keeper._store
    assert store is not None
    real_save = store.save

    def slow_save(data):
        real_save(data)
        clock.now += 2.0  # this save took 2 s

    monkeypatch.setattr(store, "save", slow_save)
    run_app(app, clock, 1.0)
    saves = app.keeper.saves
    app.keeper.save()  # took 2 s
    assert app.keeper.saves == saves + 1
    os.rename(log, log + ".1")  # a new generation: an eager save is due ...
    log_path = tmp_path / "a.log"
    log_path.write_text(BLOCK.format(s=7))
    app.loop.mark_changed({str(tmp_path)})
    app.loop.step()
    assert app.keeper.saves == saves + 1  # ... but not sooner than the last save took
    clock.now += 2.0
    app.loop.step()
    assert app.keeper.saves == saves + 2
