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

from tests.helpers import wait_until
from tests.test_app import BLOCK, _app, _run
from tests.test_serve_e2e import Daemon, oom_block, settle


def _state_path(tmp_path) -> str:
    return str(tmp_path / "state" / "state.json")


def _write_state(tmp_path, doc: object, *, raw: str | None = None) -> None:
    os.makedirs(tmp_path / "state", exist_ok=True)
    with open(_state_path(tmp_path), "w", encoding="utf-8") as fh:
        fh.write(raw if raw is not None else json.dumps(doc))


def _counted_state(tmp_path, events: int = 2) -> dict:
    """A real state file after a run that counted `events` decode OOMs in a.log."""
    app, clock = _app(tmp_path)
    _run(app, clock, 1.0)
    (tmp_path / "a.log").write_text("".join(BLOCK.format(s=i) for i in range(events)))
    app.loop.request_discover()
    _run(app, clock, 8.0)
    assert app.counts.total("decode") == events
    app.keeper.save()
    with open(_state_path(tmp_path), encoding="utf-8") as fh:
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
    _write_state(tmp_path, doc)
    app, _ = _app(tmp_path)
    app.keeper.load()
    assert app.keeper.errors == 1
    assert app.counts.total("decode") == 0
    assert not os.path.exists(_state_path(tmp_path))
    (aside,) = glob.glob(_state_path(tmp_path) + ".corrupt-*")
    with open(aside, encoding="utf-8") as fh:
        assert json.load(fh) == doc  # kept byte for byte for a human to inspect


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_nan_and_infinity_are_not_counters(tmp_path, value):
    doc = _counted_state(tmp_path)
    raw = json.dumps(doc).replace('"decode": 2.0', f'"decode": {value}', 1)
    assert raw != json.dumps(doc)
    _write_state(tmp_path, None, raw=raw)
    app, _ = _app(tmp_path)
    app.keeper.load()
    assert app.keeper.errors == 1
    assert app.counts.total("decode") == 0
    assert glob.glob(_state_path(tmp_path) + ".corrupt-*")


def test_one_rejected_position_with_counters_kept_does_not_recount_the_file(tmp_path):
    doc = _counted_state(tmp_path, events=2)
    (key,) = doc["data"]["files"]
    doc["data"]["files"][key]["position"]["offset"] = -5  # this one position is bad; the rest is fine
    _write_state(tmp_path, doc)
    app, clock = _app(tmp_path)
    app.keeper.load()
    _run(app, clock, 8.0)
    assert app.counts.total("decode") == 2  # not 4: the counters already hold a.log's two events
    assert app.sources.facts().bad_positions == 1
    with open(tmp_path / "a.log", "a") as fh:
        fh.write(BLOCK.format(s=30))
    _run(app, clock, 8.0)
    assert app.counts.total("decode") == 3  # and what comes next is counted


# --- defect 1: a SIGKILL in the first second ------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(60)
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
    app, clock = _app(tmp_path, state_interval=60.0)  # no periodic save within the test: only the ones it makes
    _run(app, clock, 1.0)
    log.write_text(BLOCK.format(s=1))
    app.loop.request_discover()
    _run(app, clock, 8.0)
    assert app.counts.total("decode") == 1
    app.keeper.save()  # as the periodic save would
    os.rename(log, tmp_path / "a.log.1")
    log.write_text(BLOCK.format(s=2))
    app.loop.mark_changed({str(tmp_path)})
    _run(app, clock, 2.5)  # read and counted (after the traceback wait), no periodic save due
    assert app.counts.total("decode") == 2
    app.sources.close()  # SIGKILL: no save on the way out
    os.rename(log, tmp_path / "a.log.2")  # rotated again while down
    log.write_text(BLOCK.format(s=3))
    app2, clock2 = _app(tmp_path)
    app2.keeper.load()
    _run(app2, clock2, 8.0)
    assert app2.counts.total("decode") == 3
