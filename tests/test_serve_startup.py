"""`serve`'s start-up costs: what a plain start imports by the time /healthz answers.

The daemon is started about 45 times by the suite and on every pod start or crash-loop restart, so code that
only some configurations use is imported when they ask for it. This runs the real daemon with Python's import
log (-X importtime) and pins the mechanism: a change that brings such an import back to every start fails here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request

from tests.support.helpers import free_port, wait_until

# Imported only when a setting asks for them; a plain `serve PATH` asks for none. (PyYAML is not among them:
# every start parses the built-in catalog.yaml with it.)
ON_DEMAND = {
    "sglang_oom_exporter.config.yamlfile": "a --config file",
    "sglang_oom_exporter.sources.kubeapi": "kubernetes.discover_targets",
    "sglang_oom_exporter.sources.kubeclient": "kubernetes.discover_targets",
    "sglang_oom_exporter.sources.nodetargets": "kubernetes.discover_targets",
    "sglang_oom_exporter.kubeevents": "kubernetes.events",
    "sglang_oom_exporter.kubeevents.poster": "kubernetes.events",
    "sglang_oom_exporter.render.alertspec": "kubernetes.events (the Events' reasons are the alert names)",
    "watchdog.observers": "--force-polling (or a system without inotify)",
    "watchdog.observers.polling": "--force-polling",
    "sglang_oom_exporter.sources.sglang_metrics": "an SGLang target to scrape",
    "prometheus_client.parser": "an SGLang target to scrape",
}


def _answers(port: int, proc: subprocess.Popen[bytes]) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # "starting" (503) is an answer too: the edge is up
    except OSError:
        assert proc.poll() is None, "the daemon exited before /healthz answered"
        return False


def _imported(log: str) -> set[str]:
    """Module names from Python's -X importtime lines ("import time: self | cumulative | name")."""
    return {line.rsplit("|", 1)[1].strip() for line in log.splitlines() if line.startswith("import time:")}


def test_a_plain_serve_imports_nothing_only_some_settings_need(tmp_path):
    (tmp_path / "a.log").write_text("")
    port = free_port()
    cmd = [sys.executable, "-X", "importtime", "-m", "sglang_oom_exporter", "serve", str(tmp_path / "*.log"),
           "--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "state")]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_OOM_EXPORTER_")}
    with (tmp_path / "stderr").open("wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        try:
            wait_until(lambda: _answers(port, proc), timeout=30, what="/healthz")
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=20)
    assert code == 0
    modules = _imported((tmp_path / "stderr").read_text())
    # The log is read: the command, the HTTP edge and the file watcher it always needs are in it.
    assert {
        "sglang_oom_exporter.serve",
        "sglang_oom_exporter.web.server",
        "sglang_oom_exporter.sources.inotify",
    } <= modules
    assert {name: why for name, why in ON_DEMAND.items() if name in modules} == {}
