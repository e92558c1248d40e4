"""Reliability, state half: the first seconds are covered by a state file, and a bad state file is handled as
README promises (moved aside when its types are wrong, no NaN or Infinity counters, and one file's rejected
position never re-reads that file from 0 while the counters that already hold its events are kept).
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.app import counted_app, make_app, run_app, state_path, write_state
from tests.support.daemon import Daemon, settle
from tests.support.helpers import wait_until
from tests.support.logs import BLOCK, oom_block


def _counted_state(tmp_path, events: int = 2) -> dict:
    """A real state file after a run that counted `events` decode OOMs in a.log."""
    counted_app(tmp_path, events)
    with open(state_path(tmp_path), encoding="utf-8") as fh:
        return json.load(fh)


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda d: d["data"].__setitem__("counters", "three"), id="counters-a-string"),
        pytest.param(lambda d: d["data"].__setitem__("files", [1, 2]), id="files-a-list"),
        pytest.param(lambda d: d["data"].pop("counters"), id="counters-missing"),
    ],
)
def test_wrong_types_are_moved_aside_and_counted(tmp_path, mutate):
    doc = _counted_state(tmp_path)
    mutate(doc)
    write_state(tmp_path, doc)
    app, _ = make_app(tmp_path)
    app.keeper.load()
    assert app.keeper.errors == 1
    assert app.counts.total("decode") == 0
    assert not os.path.exists(state_path(tmp_path))
    (aside,) = glob.glob(state_path(tmp_path) + ".corrupt-*")
    with open(aside, encoding="utf-8") as fh:
        assert json.load(fh) == doc  # kept byte for byte for a human to inspect


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_nan_and_infinity_are_not_counters(tmp_path, value):
    doc = _counted_state(tmp_path)
    raw = json.dumps(doc).replace('"decode": 2.0', f'"decode": {value}', 1)
    assert raw != json.dumps(doc)
    write_state(tmp_path, None, raw=raw)
    app, _ = make_app(tmp_path)
    app.keeper.load()
    assert app.keeper.errors == 1
    assert app.counts.total("decode") == 0
    assert glob.glob(state_path(tmp_path) + ".corrupt-*")


def test_one_rejected_position_with_counters_kept_does_not_recount_the_file(tmp_path):
    doc = _counted_state(tmp_path, events=2)
    (key,) = doc["data"]["files"]
    doc["data"]["files"][key]["position"]["offset"] = -5  # this one position is bad; the rest is fine
    write_state(tmp_path, doc)
    app, clock = make_app(tmp_path)
    app.keeper.load()
    run_app(app, clock, 8.0)
    assert app.counts.total("decode") == 2  # not 4: the counters already hold a.log's two events
    assert app.sources.facts().bad_positions == 1
    with open(tmp_path / "a.log", "a") as fh:
        fh.write(BLOCK.format(s=30))
    run_app(app, clock, 8.0)
    assert app.counts.total("decode") == 3  # and what comes next is counted


# --- defect 1: a SIGKILL in the first second ------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.slow
def test_sigkill_in_the_first_second_loses_nothing_written_while_down(tmp_path):
    """The daemon is killed as soon as it says it is ready, long before its first periodic save."""
    logs = [tmp_path / f"r{i}.log" for i in range(3)]
    for log in logs:
        log.write_text(oom_block())  # history: a first start reads from the end
    state = str(tmp_path / "state")
    first = Daemon([str(tmp_path / "*.log")], state)
    cmd = [sys.executable, "-m", "sglang_oom_exporter", "serve", "--listen", f"127.0.0.1:{first.port}",
           "--state-dir", state, "--poll-interval", "0.5s", str(tmp_path / "*.log")]  # fmt: skip
    # A periodic save a minute away: only the save before the first read can cover the restart.
    env = {**os.environ, "SGLANG_OOM_EXPORTER_STATE_INTERVAL": "60s"}
    started = time.monotonic()
    proc = first.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        wait_until(lambda: first.healthy() is True, timeout=20, what="/healthz 200")
        proc.send_signal(signal.SIGKILL)
        ready_after = time.monotonic() - started
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # Ready means the starting positions are on disk: no periodic save can have run yet.
    assert ready_after < 60
    for log in logs:
        with open(log, "a") as fh:
            fh.write(oom_block() + oom_block())
    second = Daemon([str(tmp_path / "*.log")], state).start()
    try:
        settle(second, 6)
    finally:
        second.stop()


def test_a_generation_born_after_the_last_save_and_rotated_away_while_down_is_read(tmp_path):
    """The state is saved as soon as a new generation is seen, so a restart can find it by its inode."""
    log = tmp_path / "a.log"
    app, clock = make_app(tmp_path, state_interval=60.0)  # no periodic save within the test: only the ones it makes
    run_app(app, clock, 1.0)
    log.write_text(BLOCK.format(s=1))
    app.loop.request_discover()
    run_app(app, clock, 8.0)
    assert app.counts.total("decode") == 1
    app.keeper.save()  # as the periodic save would
    os.rename(log, tmp_path / "a.log.1")
    log.write_text(BLOCK.format(s=2))
    app.loop.mark_changed({str(tmp_path)})
    run_app(app, clock, 2.5)  # read and counted (after the traceback wait), no periodic save due
    assert app.counts.total("decode") == 2
    app.sources.close()  # SIGKILL: no save on the way out
    os.rename(log, tmp_path / "a.log.2")  # rotated again while down
    log.write_text(BLOCK.format(s=3))
    app2, clock2 = make_app(tmp_path)
    app2.keeper.load()
    run_app(app2, clock2, 8.0)
    assert app2.counts.total("decode") == 3
