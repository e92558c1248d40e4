"""/healthz and the guard metrics say what the daemon waits for or fails at, and log it once.

A configured plain path that does not exist yet (SGLang not started) is waited for, said so, and counted in
sglang_oom_exporter_sources_waiting; a state directory where no save succeeds makes /healthz fail with the
reason while sglang_oom_exporter_state_errors_total counts every failure.
"""

from __future__ import annotations

import http.client
import logging
import os

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sglang_oom_exporter.config.model import Config
from sglang_oom_exporter.daemon.app import App
from sglang_oom_exporter.sources.otlpspool import Line
from tests.support.helpers import CATALOG, Clock, wait_until

WAITING = "waiting for {path} to appear (normal until SGLang starts and writes its log)"


def _app(tmp_path, **fields) -> tuple[App, Clock]:
    clock = Clock()
    config = Config(**{"state_dir": str(tmp_path / "state"), "discover_interval": 1.0, "state_interval": 1.0, **fields})
    return App(config, CATALOG, clock=clock, wall=clock), clock


def _steps(app: App, clock: Clock, n: int = 8) -> None:
    for _ in range(n):
        app.loop.step()
        clock.now += 0.5


def _metric(app: App, name: str) -> float:
    registry = CollectorRegistry()
    registry.register(app.collector())
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not exported")


def test_a_missing_plain_path_is_waited_for_said_so_and_counted(tmp_path):
    path = tmp_path / "sglang.log"
    app, clock = _app(tmp_path, paths=(str(path),))
    _steps(app, clock)
    health = app.loop.health()
    assert (health.ok, health.reason) == (False, WAITING.format(path=path))
    assert _metric(app, "sglang_oom_exporter_sources_waiting") == 1.0
    path.write_text("")
    _steps(app, clock, 4)  # discovery runs every second here
    assert (app.loop.health().ok, app.loop.health().reason) == (True, "following 1 log source(s)")
    assert _metric(app, "sglang_oom_exporter_sources_waiting") == 0.0


def test_one_missing_path_of_two_is_named_while_the_other_is_followed(tmp_path):
    there, missing = tmp_path / "a.log", tmp_path / "b.log"
    there.write_text("")
    app, clock = _app(tmp_path, paths=(str(there), str(missing)))
    _steps(app, clock)
    health = app.loop.health()
    assert (health.ok, health.reason) == (True, f"following 2 log source(s); {WAITING.format(path=missing)}")
    assert _metric(app, "sglang_oom_exporter_sources_waiting") == 1.0


def test_a_waiting_path_is_logged_once_and_its_arrival_once(tmp_path, caplog):
    path = tmp_path / "sglang.log"
    app, clock = _app(tmp_path, paths=(str(path),))
    with caplog.at_level(logging.INFO, logger="sglang_oom_exporter.daemon.loop"):
        _steps(app, clock, 40)
        path.write_text("")
        _steps(app, clock, 40)
    lines = [r.getMessage() for r in caplog.records if r.name == "sglang_oom_exporter.daemon.loop"]
    assert lines == [f"health: {WAITING.format(path=path)}", "health: following 1 log source(s)"]


def test_a_state_dir_where_no_save_succeeds_fails_health_until_one_does(tmp_path):
    (tmp_path / "a.log").write_text("")
    blocked = tmp_path / "state"
    blocked.write_text("a file where the state directory should be")  # every save fails, even as root
    app, clock = _app(tmp_path, paths=(str(tmp_path / "a.log"),))
    with open(tmp_path / "a.log", "a") as fh:
        fh.write("a line, so that there is something to save\n")
    _steps(app, clock, 6)
    health = app.loop.health()
    assert not health.ok
    assert health.reason == (
        f"the state cannot be saved in {blocked} (sglang_oom_exporter_state_errors_total counts it; "
        "see the log): a restart would re-read from the end of every file"
    )
    errors = _metric(app, "sglang_oom_exporter_state_errors_total")
    assert errors >= 2
    blocked.unlink()
    with open(tmp_path / "a.log", "a") as fh:
        fh.write("another line\n")
    _steps(app, clock, 4)
    assert (app.loop.health().ok, app.loop.health().reason) == (True, "following 1 log source(s)")
    assert _metric(app, "sglang_oom_exporter_state_errors_total") == errors  # no new failure after the fix


def _healthz(port: int) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


@pytest.mark.e2e
@pytest.mark.slow
def test_serve_reports_a_missing_plain_path_on_healthz_and_in_metrics(tmp_path, daemon_factory):
    path = tmp_path / "sglang.log"
    d = daemon_factory(str(path))
    wait_until(lambda: not _healthz(d.port)[1].startswith("starting"), what="the start to finish", timeout=15.0)
    assert _healthz(d.port) == (503, WAITING.format(path=path) + "\n")
    assert d.metrics()[("sglang_oom_exporter_sources_waiting", ())] == 1.0
    path.write_text("")
    wait_until(lambda: d.healthy() is True, what="the path to be followed", timeout=15.0)
    assert _healthz(d.port) == (200, "ok: following 1 log source(s)\n")
    assert d.metrics()[("sglang_oom_exporter_sources_waiting", ())] == 0.0
    d.stop()


@pytest.mark.e2e
@pytest.mark.slow
def test_serve_with_an_unusable_state_dir_fails_healthz(tmp_path, daemon_factory):
    log = tmp_path / "a.log"
    log.write_text("")
    state = tmp_path / "state"
    state.write_text("")  # a file where the directory should be: every save fails, even as root
    d = daemon_factory(str(log))
    wait_until(lambda: d.healthy() is False, what="/healthz to report the failing saves", timeout=15.0)
    assert d.metrics()[("sglang_oom_exporter_state_errors_total", ())] >= 1.0
    state.unlink()
    with open(log, "a") as fh:
        fh.write("something new to save\n")
    wait_until(lambda: d.healthy() is True, what="a save to succeed", timeout=15.0)
    assert os.path.isfile(state / "state.json")
    d.stop()


def test_a_loop_not_yet_started_says_starting(tmp_path):
    # serve binds /healthz before the loop primes the files; a probe then must not read "ready" or any other
    # reason, or a writer racing the start could append before the starting positions are taken.
    (tmp_path / "a.log").write_text("")
    app, clock = _app(tmp_path, paths=(str(tmp_path / "a.log"),))
    health = app.loop.health()
    assert (health.ok, health.reason) == (False, "starting: saving where each log file will be read from")
    _steps(app, clock)
    assert (app.loop.health().ok, app.loop.health().reason) == (True, "following 1 log source(s)")


def test_the_receiver_says_where_it_listens_and_what_it_received(tmp_path):
    app, clock = _app(tmp_path, otlp_listen=":4318")
    receiver = app.receiver
    assert receiver is not None
    clock.now = 1_790_000_000.0  # 2026-09-21 14:13:20 UTC
    _steps(app, clock)
    idle = "receiving OTLP/HTTP logs on :4318: nothing received yet (an agent must send to it: docs/otlp.md)"
    assert (app.loop.health().ok, app.loop.health().reason) == (True, f"{idle}; following 0 log source(s)")
    receiver.bound(4318)  # the port serve bound: the configured one (or the system's choice for port 0)
    pod = "pods/llm_sglang-0_u1/server/0.log"
    service = "files/decode@node-a.log"
    lines = [Line(b"starting\n", bytes([i]) * 16) for i in range(3)]
    receiver.accept({pod: lines, service: lines[:2]})
    receiver.accept({service: lines[:2]})  # a retried batch: its records are received again, as duplicates
    _steps(app, clock, 4)
    got = "receiving OTLP/HTTP logs on :4318: 7 record(s) received from 2 source(s), the last batch at 2026-09-21 14:13:24 UTC"
    assert (app.loop.health().ok, app.loop.health().reason) == (True, f"{got}; following 2 log source(s)")


def test_the_receiver_names_the_port_the_system_chose_for_port_0(tmp_path):
    app, _ = _app(tmp_path, otlp_listen="127.0.0.1:0")
    assert app.receiver is not None
    app.receiver.bound(40123)
    assert app.receiver.facts().listen == "127.0.0.1:40123"
