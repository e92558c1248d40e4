"""A state file nested 100,000 levels deep; `--check-config` on a non-UTF-8
file and on an empty config; Kubernetes filter regexes that backtrack catastrophically on a pod name, matched
under a time limit.
"""

from __future__ import annotations

import glob
import logging
import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sglang_oom_exporter.config.load import ConfigError, load_config
from sglang_oom_exporter.config.model import KubernetesConfig
from sglang_oom_exporter.sources.discover import FILTER_TIMEOUT, FilterTimeouts, KubernetesFilter
from tests.support.app import make_app, state_path, write_state
from tests.support.daemon import Daemon
from tests.support.helpers import Clock

DEEP = 100_000


@pytest.mark.parametrize("raw", ["[" * DEEP + "]" * DEEP, '{"a":' * DEEP + "1" + "}" * DEEP], ids=["lists", "objects"])
def test_a_state_file_nested_100000_levels_deep_is_moved_aside(tmp_path, raw):
    write_state(tmp_path, None, raw=raw)
    app, _ = make_app(tmp_path)
    app.keeper.load()  # was: RecursionError out of json.loads, at every start
    assert app.keeper.errors == 1
    assert not os.path.exists(state_path(tmp_path))
    assert len(glob.glob(state_path(tmp_path) + ".corrupt-*")) == 1


@pytest.mark.e2e
@pytest.mark.slow
def test_serve_starts_on_a_state_file_nested_100000_levels_deep(tmp_path):
    (tmp_path / "a.log").write_text("")
    write_state(tmp_path, None, raw="[" * DEEP + "]" * DEEP)
    d = Daemon([str(tmp_path / "*.log")], str(tmp_path / "state")).start()  # waits for /healthz
    try:
        assert d.metrics("sglang_oom_exporter_state_errors")[("sglang_oom_exporter_state_errors_total", ())] == 1
    finally:
        assert d.stop() == 0


def _check_config(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sglang_oom_exporter", "serve", "--check-config", *args],
                          capture_output=True, text=True, timeout=30, check=False)  # fmt: skip


def test_check_config_names_a_non_utf8_file_without_a_traceback(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(b'paths: ["/var/log/\xff\xfe.log"]\n')
    proc = _check_config("--config", str(path))
    assert proc.returncode == 1
    assert proc.stderr == f"sglang-oom-exporter: bad configuration:\n{path}: not UTF-8 text: byte 0xff at offset 18\n"


@pytest.mark.parametrize("text", ["", "# nothing yet\n", "poll_interval: 1s\n"], ids=["empty", "comment", "no-paths"])
def test_check_config_rejects_what_a_reload_rejects(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    proc = _check_config("--config", str(path))
    assert proc.returncode == 1  # was 0: "configuration ok: 0 path(s)", then SIGHUP refused the same file
    assert "the configuration names no log path and no Kubernetes log root" in proc.stderr
    app, _ = make_app(tmp_path)
    assert app.reload(load_config(str(path), env={}), app.catalog) == "failed"


def test_check_config_passes_a_path_a_log_root_or_stdin(tmp_path):
    assert _check_config("x.log").returncode == 0
    assert _check_config("--kubernetes-logs", str(tmp_path)).returncode == 0
    assert _check_config("-").returncode == 0


# A filter runs on names a tenant chooses. `regex` optimises (a+)+ away, but not an alternation whose branches
# overlap: (a|aa)+$ on 60 a's and a "!" tries every way to split them (Fibonacci(60)), hours without a limit.
CATASTROPHIC = "(a|aa)+$"
LONG_NAME = "a" * 60 + "!"
ORDINARY = [("sglang-.*", "sglang-0", True), ("llm-(prod|staging)-.*", "llm-prod-7", True),
            ("(?:[a-z0-9]+-)*[a-z0-9]+", "sglang-server-0", True), ("(?:[a-z0-9]+-)*[a-z0-9]+", "sglang-", False),
            ("(?i)(?:[A-Z]+-)+x", "ab-cd-x", True), (".+", "x" * 253, True), ("(a{1,5}){1,5}", "a" * 26, False),
            ("(a+)+", "a" * 60 + "!", False)]  # fmt: skip


def _k8s_config(tmp_path, key: str, value: str):
    path = tmp_path / "c.yaml"
    path.write_text(f"kubernetes:\n  logs_root: {tmp_path}\n  {key}: '{value}'\n")
    return load_config(str(path), env={})


@pytest.mark.parametrize("key", ["namespace", "pod", "container"])
def test_a_filter_that_can_backtrack_loads_since_its_matches_are_time_limited(tmp_path, key):
    assert getattr(_k8s_config(tmp_path, key, CATASTROPHIC).kubernetes, key) == CATASTROPHIC  # was: refused


@pytest.mark.parametrize("key", ["namespace", "pod", "container"])
def test_a_filter_that_does_not_compile_is_a_config_error(tmp_path, key):
    with pytest.raises(ConfigError, match=rf"kubernetes\.{key}: bad regex '\(unclosed': missing \)"):
        _k8s_config(tmp_path, key, "(unclosed")


def test_a_catastrophic_filter_gives_up_within_its_budget_as_no_match_and_is_counted():
    flt = KubernetesFilter(pod=CATASTROPHIC)
    started = time.monotonic()
    assert flt.matches_pod("llm", LONG_NAME) is False
    took = time.monotonic() - started
    assert FILTER_TIMEOUT <= took < 5.0  # given up at the budget (0.1 s); without it: hours
    assert flt.timeouts.count == 1
    assert flt.matches_pod("llm", "aaaa") is True  # a short name still matches, uncounted
    assert flt.timeouts.count == 1


@pytest.mark.parametrize(("pattern", "name", "matches"), ORDINARY)
def test_ordinary_filters_still_match_and_time_nothing_out(pattern, name, matches):
    flt = KubernetesFilter(pod=pattern, container=pattern)
    assert (flt.matches_pod("llm", name), flt.matches_container(name)) == (matches, matches)
    assert flt.timeouts.count == 0


def test_filter_timeouts_warn_once_a_minute(caplog):
    clock = Clock()
    timeouts = FilterTimeouts(clock=clock)
    with caplog.at_level(logging.WARNING, logger="sglang_oom_exporter.sources.discover"):
        timeouts.record("pod", CATASTROPHIC, LONG_NAME)
        clock.now += 59.0
        timeouts.record("pod", CATASTROPHIC, LONG_NAME)
        clock.now += 1.0
        timeouts.record("container", CATASTROPHIC, LONG_NAME)
    assert timeouts.count == 3
    assert [r.getMessage() for r in caplog.records] == [
        f"kubernetes filter {key} '(a|aa)+$' took over 0.1s on '{LONG_NAME}' and counts as no match ({n} so far, "
        "sglang_oom_exporter_kubernetes_filter_timeouts_total); write it without nested repetitions"
        for key, n in (("pod", 1), ("container", 3))
    ]


def test_serve_counts_filter_timeouts_on_its_page_across_a_reload(tmp_path):
    pods = tmp_path / "pods"
    for pod in ("sglang-0", LONG_NAME):
        (pods / f"llm_{pod}_0c1d" / "sglang").mkdir(parents=True)
        (pods / f"llm_{pod}_0c1d" / "sglang" / "0.log").write_text("")
    k8s = KubernetesConfig(str(pods), pod=f"sglang-0|{CATASTROPHIC}")
    app, _ = make_app(tmp_path, paths=(), kubernetes=k8s)
    assert [os.path.basename(os.path.dirname(os.path.dirname(p))) for p in app.sources.discover()] == [
        "llm_sglang-0_0c1d"
    ]
    assert app.extra_metrics()["kubernetes_filter_timeouts_total"] == 1.0
    app.reload(replace(app.config, kubernetes=replace(k8s, container="sglang")), app.catalog)
    assert app.extra_metrics()["kubernetes_filter_timeouts_total"] == 2.0  # the reload's discovery: one more
    registry = CollectorRegistry()
    registry.register(app.collector())
    assert "sglang_oom_exporter_kubernetes_filter_timeouts_total 2.0\n" in generate_latest(registry).decode()
