"""Config edges: bounded durations, unknown environment variables, and reloads that apply or refuse each change.

And the signal handlers: a storm of SIGHUPs neither crashes the daemon nor stalls it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from sglang_oom_exporter.config import keys as config_module
from sglang_oom_exporter.config.load import ConfigError, load_config
from sglang_oom_exporter.daemon.app import App
from tests.support.app import config_fields, make_app, run_app
from tests.support.helpers import CATALOG, wait_until
from tests.support.logs import BLOCK, append

DURATIONS = ("poll_interval", "sweep_interval", "discover_interval", "state_interval", "traceback_wait",
             "source_retention", "scrape_interval", "scrape_timeout")  # fmt: skip


@pytest.mark.parametrize("key", DURATIONS)
@pytest.mark.parametrize("value", ["99999999999999h", "9" * 400 + "s", "400d"], ids=["overflow", "inf", "400d"])
def test_absurd_durations_are_refused_with_their_bounds(key, value):
    with pytest.raises(ConfigError, match=rf"--{key.replace('_', '-')}: .* must be between .* and .*"):
        load_config(env={}, flags={key: value})


@pytest.mark.parametrize("value", ["0.1ms", "0s"])
def test_a_poll_interval_below_a_millisecond_is_refused(value):
    with pytest.raises(ConfigError, match="--poll-interval"):
        load_config(env={}, flags={"poll_interval": value})


def test_the_largest_durations_that_make_sense_pass():
    config = load_config(env={}, flags={"poll_interval": "1h", "source_retention": "365d", "traceback_wait": "1h"})
    assert (config.poll_interval, config.source_retention, config.traceback_wait) == (3600.0, 365 * 86400.0, 3600.0)


def test_a_huge_discover_targets_interval_is_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("kubernetes: {logs_root: /x, discover_targets: {interval: 99999999999999h}}\n")
    with pytest.raises(ConfigError, match=r"discover_targets: interval .* must be between"):
        load_config(str(path), env={})


def test_check_config_refuses_an_absurd_poll_interval():
    proc = subprocess.run([sys.executable, "-m", "sglang_oom_exporter", "serve", "--check-config",
                           "--poll-interval", "99999999999999h", "x.log"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 1
    assert "--poll-interval: '99999999999999h' must be between 1ms and 1h" in proc.stderr


def test_check_config_refuses_an_otlp_spool_cap_that_cannot_hold_two_requests(tmp_path):
    # Under it, a full batch would be refused with 503 on every retry while the one before it is unread.
    proc = subprocess.run([sys.executable, "-m", "sglang_oom_exporter", "serve", "--check-config", "--otlp-listen",
                           "127.0.0.1:0", "--state-dir", str(tmp_path), "--otlp-max-request-kib", "8192",
                           "--otlp-spool-source-mib", "15"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 1
    assert (
        "otlp_spool_source_mib: 15 MiB cannot hold two requests of --otlp-max-request-kib 8192 (at least 16 MiB)"
        in (proc.stderr)
    )
    assert "otlp_spool_total_mib" not in proc.stderr
    ok = subprocess.run([*proc.args[:-1], "16"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr


def test_unknown_prefixed_variables_are_named():
    env = {"SGLANG_OOM_EXPORTER_LISTN": ":1", "SGLANG_OOM_EXPORTER_LISTEN": ":1", "SGLANG_OOM_EXPORTER_PATHS": "a",
           "SGLANG_OOM_EXPORTER_SGLANG_URL": "http://x", "SGLANG_OOM_EXPORTER_CONFIG": "c", "HOME": "/root",
           "SGLANG_OOM_EXPORTER_KUBERNETES_LOGS": "/x", "SGLANG_OOM_EXPORTER_POLL_INTERVL": "1s"}  # fmt: skip
    assert config_module.unknown_env(env) == ["SGLANG_OOM_EXPORTER_LISTN", "SGLANG_OOM_EXPORTER_POLL_INTERVL"]


@pytest.mark.e2e
def test_check_config_fails_on_an_unknown_variable_and_serve_warns(tmp_path, monkeypatch, daemon_factory):
    monkeypatch.setenv("SGLANG_OOM_EXPORTER_STATE_DIRR", "/tmp/typo")
    proc = subprocess.run([sys.executable, "-m", "sglang_oom_exporter", "serve", "--check-config", "x.log"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 1
    assert "SGLANG_OOM_EXPORTER_STATE_DIRR: unknown variable" in proc.stderr
    (tmp_path / "a.log").write_text("")
    d = daemon_factory(str(tmp_path / "a.log"))
    d.send(signal.SIGTERM)
    assert d.proc is not None
    assert d.proc.wait(timeout=20) == 0
    assert "unknown variable SGLANG_OOM_EXPORTER_STATE_DIRR (ignored)" in d.stderr()


# Reloads


def test_a_reload_to_no_source_at_all_is_refused(tmp_path):
    app, _clock = make_app(tmp_path)
    before = app.config
    assert app.reload(load_config(env={}), CATALOG) == "failed"  # an empty file: zero paths, no Kubernetes
    assert app.config == before
    assert app.reloads == {"applied": 0, "partial": 0, "failed": 1}


def test_a_reload_that_removes_a_path_stops_following_it_and_a_re_add_resumes_exactly(tmp_path):
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text("")
    b.write_text("")
    app, clock = make_app(tmp_path, paths=(str(a), str(b)))
    run_app(app, clock)
    append(b, BLOCK.format(s=1))
    run_app(app, clock)
    assert app.counts.total() == 1
    assert app.reload(App_config(app, paths=(str(a),)), CATALOG) == "applied"
    run_app(app, clock)
    assert app.sources.paths() == [str(a)]
    assert app.counts.total() == 1  # b's series stays for the retention, as a deleted file's does
    append(b, BLOCK.format(s=2))  # written while b is not followed
    run_app(app, clock)
    assert app.counts.total() == 1
    assert app.reload(App_config(app, paths=(str(a), str(b))), CATALOG) == "applied"
    run_app(app, clock)
    assert app.counts.total() == 2  # its counter goes on: the block written meanwhile, once; the first one not again


def App_config(app: App, **changes):  # noqa: N802
    """The running config with some fields changed, as a reload would load it."""
    from sglang_oom_exporter.config.model import Config

    return Config(**{**config_fields(app.config), **changes})


@pytest.mark.e2e
@pytest.mark.slow
def test_a_sighup_storm_neither_crashes_nor_stalls_the_daemon(tmp_path, daemon_factory):
    log = tmp_path / "a.log"
    log.write_text("")
    d = daemon_factory(str(log))
    wait_until(lambda: d.healthy() is True, what="the daemon to be ready", timeout=15.0)
    sent = 500
    for _ in range(sent):  # about 500 a second for a second, as measured; a loaded machine only spreads them
        d.send(signal.SIGHUP)
        time.sleep(0.002)  # the storm's rhythm, not a wait for the daemon
    assert d.proc is not None
    assert d.proc.poll() is None, d.stderr()
    wait_until(lambda: d.healthy() is True, what="the daemon to answer after the storm", timeout=15.0)
    reloads = d.metrics()[("sglang_oom_exporter_config_reloads_total", (("result", "applied"),))]
    assert 1 <= reloads <= sent  # coalesced: one reload per wake-up, never one per signal queued up
    d.send(signal.SIGTERM)
    assert d.proc.wait(timeout=20) == 0
    stderr = d.stderr()
    assert "RecursionError" not in stderr
    assert "Traceback" not in stderr


def test_the_signal_relay_acts_on_a_storm_of_signals_outside_the_handler():
    import os
    import threading

    from sglang_oom_exporter.daemon.signals import SignalRelay

    seen: list[str] = []
    acted = threading.Event()
    lock = threading.Lock()  # held by the action: a handler that took it while the main thread held it would hang

    def on_hup() -> None:
        with lock:
            seen.append(threading.current_thread().name)
        acted.set()

    before = signal.getsignal(signal.SIGHUP)
    relay = SignalRelay({signal.SIGHUP: on_hup})
    relay.install()
    try:
        with lock:  # the main thread holds the lock while 2,000 signals arrive
            for _ in range(2000):
                os.kill(os.getpid(), signal.SIGHUP)
        assert acted.wait(5.0)
    finally:
        relay.close()
    assert 1 <= len(seen) <= 2000
    assert set(seen) == {"sglang-oom-signals"}
    assert signal.getsignal(signal.SIGHUP) == before
