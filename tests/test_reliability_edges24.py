"""A state file nested 100,000 levels deep; `--check-config` on a non-UTF-8
file and on an empty config; Kubernetes filter regexes that could backtrack catastrophically on a pod name.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest
import regex

from sglang_oom_exporter.config import ConfigError, load_config
from sglang_oom_exporter.config.values import FILTER_NAME_MAX, filter_problem
from sglang_oom_exporter.sources.discover import KubernetesFilter
from tests.support.app import make_app, state_path, write_state
from tests.support.daemon import Daemon

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
@pytest.mark.timeout(60)
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


CATASTROPHIC = ["(a+)+", "(a|aa)+", "([a-z]+)*", "(.*a){12}", "(x+x+)+y", "(?:[a-z.]+\\.)+"]
SAFE = ["sglang-.*", "llm-(prod|staging)-.*", "(?:[a-z0-9]+-)*[a-z0-9]+", "(?i)(?:[A-Z]+-)+x", ".+",
        "(?!kube-system$).+", "(a{1,5}){1,5}"]  # fmt: skip


def _k8s_config(tmp_path, key: str, value: str):
    path = tmp_path / "c.yaml"
    path.write_text(f"kubernetes:\n  logs_root: {tmp_path}\n  {key}: '{value}'\n")
    return load_config(str(path), env={})


@pytest.mark.parametrize("key", ["namespace", "pod", "container"])
@pytest.mark.parametrize("value", CATASTROPHIC)
def test_a_kubernetes_filter_that_can_backtrack_catastrophically_is_refused_at_load(tmp_path, key, value):
    with pytest.raises(ConfigError, match=rf"kubernetes\.{key}: .*can take exponential time on a chosen pod name"):
        _k8s_config(tmp_path, key, value)  # was: loaded, then a tenant's pod name could stall discovery


@pytest.mark.parametrize("value", SAFE)
def test_linear_kubernetes_filters_load(tmp_path, value):
    assert _k8s_config(tmp_path, "pod", value).kubernetes.pod == value


def test_the_default_filters_pass_the_load_check():
    for key, name_max in FILTER_NAME_MAX.items():
        assert filter_problem(key, getattr(KubernetesFilter(), key), name_max) is None


STDLIB_TIMING = r"""
import re, sys, time
pattern, name = sys.argv[1], sys.argv[2]
started = time.perf_counter()
re.fullmatch(pattern, name)
print(time.perf_counter() - started)
"""


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_the_refused_nesting_is_what_stalls_stdlib_re(tmp_path):
    """Why the check is static for nested repeats: the `regex` module optimises (a+)+, stdlib re does not."""
    name = "a" * 26 + "!"
    took = subprocess.run([sys.executable, "-c", STDLIB_TIMING, "(a+)+", name], capture_output=True, text=True,
                          timeout=50, check=True)  # fmt: skip
    assert float(took.stdout) > 0.05  # exponential: 2^26 ways to split 26 letters (a linear filter: microseconds)
    assert regex.fullmatch("(a+)+", name, timeout=0.1) is None  # while the regex module answers at once
