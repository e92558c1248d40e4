"""A first start killed in its first moments is known to the next start.

A first start reads existing files from their end. If it dies before it saves where it started, the next start
is a first start again and loses what was written in between. The save is now the first thing a start does,
before binding HTTP: each test runs the real `serve` process and kills (or fails) it at the earliest moment.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from tests.support.daemon import Daemon, settle
from tests.support.helpers import wait_until
from tests.support.logs import oom_block

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STATE_ENV = {"SGLANG_OOM_EXPORTER_STATE_INTERVAL": "60s"}  # no periodic save: only the start's own


def _history(tmp_path, n: int = 3) -> list:
    logs = [tmp_path / f"r{i}.log" for i in range(n)]
    for log in logs:
        log.write_text(oom_block())  # history: a first start reads from the end
    return logs


def _write_while_down(logs) -> int:
    for log in logs:
        with open(log, "a") as fh:
            fh.write(oom_block() + oom_block())
    return 2 * len(logs)


def _spawn(daemon: Daemon) -> subprocess.Popen[bytes]:
    return subprocess.Popen(daemon.command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, **STATE_ENV})  # fmt: skip


def _restart_counts(tmp_path, state: str, expected: int) -> None:
    second = Daemon([str(tmp_path / "*.log")], state).start()
    try:
        settle(second, expected)
    finally:
        second.stop()


def test_a_first_start_killed_as_its_state_file_appears_is_known_to_the_next(tmp_path):
    logs = _history(tmp_path)
    state = str(tmp_path / "state")
    first = Daemon([str(tmp_path / "*.log")], state)
    proc = _spawn(first)
    path = os.path.join(state, "state.json")
    try:
        deadline = time.monotonic() + 60  # a hang guard: a daemon start at load 12
        while not os.path.exists(path):  # a tight poll: the kill lands within a millisecond of the save
            assert proc.poll() is None
            assert time.monotonic() < deadline
            time.sleep(0.001)
        proc.kill()
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr and proc.stderr.close()  # type: ignore[func-returns-value]
    _restart_counts(tmp_path, state, _write_while_down(logs))


def test_the_starting_positions_are_saved_before_http_answers(tmp_path):
    """At the first moment /healthz can be reached, the state file is already there (was: HTTP first)."""
    _history(tmp_path)
    state = str(tmp_path / "state")
    first = Daemon([str(tmp_path / "*.log")], state)
    proc = _spawn(first)
    try:
        deadline = time.monotonic() + 60  # a hang guard: a daemon start at load 12
        while True:
            assert proc.poll() is None
            assert time.monotonic() < deadline
            try:
                socket.create_connection(("127.0.0.1", first.port), timeout=1).close()
            except OSError:
                time.sleep(0.001)
                continue
            break
        assert os.path.exists(os.path.join(state, "state.json"))
    finally:
        proc.kill()
        proc.wait()
        proc.stderr and proc.stderr.close()  # type: ignore[func-returns-value]


def test_a_first_start_that_cannot_bind_http_is_known_to_the_next(tmp_path):
    """A start that dies at the HTTP bind (port in use) has saved where it started: nothing written after is lost."""
    logs = _history(tmp_path)
    state = str(tmp_path / "state")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cmd = [sys.executable, "-m", "sglang_oom_exporter", "serve", "--listen", f"127.0.0.1:{port}",
               "--state-dir", state, str(tmp_path / "*.log")]  # fmt: skip
        failed = subprocess.run(cmd, capture_output=True, timeout=30, check=False, env={**os.environ, **STATE_ENV})
    assert failed.returncode == 2, failed.stderr
    assert b"cannot listen" in failed.stderr
    _restart_counts(tmp_path, state, _write_while_down(logs))


def test_ready_still_waits_for_the_saved_positions(tmp_path):
    """/healthz 200 still means the positions are on disk (the e2e harness relies on it)."""
    _history(tmp_path, 1)
    d = Daemon([str(tmp_path / "*.log")], str(tmp_path / "state"), STATE_ENV).start()
    try:
        wait_until(lambda: d.healthy() is True, what="/healthz 200", timeout=15.0)
        assert os.path.exists(os.path.join(d.state_dir, "state.json"))
    finally:
        d.stop()
