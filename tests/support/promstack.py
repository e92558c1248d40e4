"""A real Prometheus (and optionally Alertmanager) on loopback for end-to-end tests of rules and dashboards.

Starts Debian's `prometheus` and `prometheus-alertmanager` binaries on free 127.0.0.1 ports with temporary
storage, fast intervals (1s scrape and rule evaluation by default) and no clustering, polls their readiness
endpoints with a deadline, and stops them on exit. A webhook receiver (an http.server thread) collects what
Alertmanager delivers. Nothing here sleeps to synchronise: every wait polls a condition until a deadline.

    require_binaries("prometheus")                       # pytest.skip with the reason when one is missing
    with Prometheus(tmp_path / "prom", rule_files=[rules], targets=["127.0.0.1:9877"]) as prom:
        prom.wait_for_targets_up()
        value = prom.query_value('sum(sglang_oom_events_total)')
        alert = prom.wait_for_alert("SGLangPrefillOOM", state="firing", timeout=20)

    with WebhookReceiver() as hook, Alertmanager(tmp_path / "am", config_text) as am, \\
            Prometheus(tmp_path / "prom", rule_files=[rules], targets=[...], alertmanager_url=am.url) as prom:
        note = hook.wait_for(lambda n: n["commonLabels"].get("alertname") == "SGLangPrefillOOM", timeout=30)

Ports: each daemon gets a port freshly bound and released by the OS; should another process grab it in the
tiny gap, the daemon exits at once and start() retries on a new port (up to three times).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from sglang_oom_exporter.render.alerts import ALERTMANAGER_PATH
from tests.support.helpers import free_port, wait_until

PROMETHEUS = "prometheus"
ALERTMANAGER = "prometheus-alertmanager"  # Debian's name; upstream tarballs call it `alertmanager`
DEFAULT_JOB = "sglang-oom-exporter"
ROOT = Path(__file__).resolve().parents[2]
_START_ATTEMPTS = 3


def find_binary(name: str) -> str | None:
    """The binary's path on PATH; for Alertmanager the upstream name `alertmanager` is accepted too."""
    found = shutil.which(name)
    if found is None and name == ALERTMANAGER:
        found = shutil.which("alertmanager")
    return found


def require_binaries(*names: str) -> None:
    """Skip the calling test, naming what is missing and how CI gets it, unless every binary is on PATH."""
    missing = [n for n in names if find_binary(n) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not on PATH (Debian packages prometheus, prometheus-alertmanager; .ci/run)")


def rfc3339_seconds(rfc3339: str) -> float:
    """Prometheus' RFC 3339 timestamps (nanoseconds, Z) as epoch seconds."""
    from datetime import datetime

    head, _, frac = rfc3339.rstrip("Z").partition(".")
    return datetime.fromisoformat(head + "+00:00").timestamp() + float(f"0.{frac or 0}")


def http_get_json(url: str, *, timeout: float = 5.0) -> Any:
    """GET a JSON document (HTTP errors raise)."""
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback URLs built by this module
        return json.loads(r.read())


class _Daemon:
    """A subprocess with a loopback HTTP port, a readiness path, a work dir and a log file."""

    binary = ""
    ready_path = "/-/ready"

    def __init__(self, workdir: str | Path) -> None:
        self.workdir = Path(workdir)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.workdir / f"{self.binary}.log"

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:41234."""
        return f"http://127.0.0.1:{self.port}"

    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _prepare(self) -> None:
        """Write config files into workdir before each start attempt."""

    def start(self, *, timeout: float = 20.0) -> _Daemon:
        """Start the daemon and wait until its readiness endpoint answers 200."""
        binary = find_binary(self.binary)
        if binary is None:
            pytest.skip(f"{self.binary} not on PATH")
        self.workdir.mkdir(parents=True, exist_ok=True)
        for attempt in range(_START_ATTEMPTS):  # a new port only when the last one was taken
            self.port = free_port()
            self._prepare()
            with self.log_path.open("ab") as log:
                self.proc = subprocess.Popen([binary, *self._argv()], stdout=log, stderr=subprocess.STDOUT)
            if self._wait_ready(timeout):
                return self
            port_taken = self.proc.poll() is not None and "address already in use" in self.log_tail(5)
            if attempt + 1 == _START_ATTEMPTS or not port_taken:
                break
        self.stop()
        raise AssertionError(f"{self.binary} did not become ready:\n{self.log_tail()}")

    def _wait_ready(self, timeout: float) -> bool:
        """True once ready; False when the process exited (e.g. the port was taken) or the deadline passed."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(self.url + self.ready_path, timeout=1) as r:  # noqa: S310
                    if r.status == 200:
                        return True
            except (OSError, urllib.error.HTTPError):
                pass
            time.sleep(0.05)
        return False

    def stop(self, *, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after timeout; idempotent."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout)
        self.proc = None

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the daemon's own log, for assertion messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Prometheus(_Daemon):
    """A Prometheus server scraping static targets under one job, evaluating rule files, optionally alerting.

    rule_files are copied into workdir, so a test may derive and write its own copy anywhere. Targets are
    host:port strings scraped at /metrics under `job` (default sglang-oom-exporter, the name the rules
    match). extra_scrape_configs are appended verbatim (dicts in Prometheus config form).
    """

    binary = PROMETHEUS

    def __init__(
        self,
        workdir: str | Path,
        *,
        rule_files: Sequence[str | Path] = (),
        targets: Sequence[str] = (),
        job: str = DEFAULT_JOB,
        interval: str = "1s",
        alertmanager_url: str | None = None,
        extra_scrape_configs: Iterable[Mapping[str, Any]] = (),
        extra_args: Sequence[str] = (),
        target_labels: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(workdir)
        self.rule_files = [Path(p) for p in rule_files]
        self.targets = list(targets)
        self.job = job
        self.interval = interval
        self.alertmanager_url = alertmanager_url
        self.extra_scrape_configs = [dict(c) for c in extra_scrape_configs]
        self.extra_args = list(extra_args)
        self.target_labels = dict(target_labels or {})  # e.g. {"cluster": ...}, as a ruler over many sees them

    def _static_config(self) -> dict[str, Any]:
        """The targets of the job, with their target labels if any."""
        return {"targets": self.targets, **({"labels": self.target_labels} if self.target_labels else {})}

    def config(self) -> dict[str, Any]:
        """The prometheus.yml this instance runs with."""
        rules_dir = self.workdir / "rules"
        cfg: dict[str, Any] = {
            "global": {
                "scrape_interval": self.interval,
                "evaluation_interval": self.interval,
                "scrape_timeout": self.interval,
            },
            "rule_files": [str(rules_dir / f"{i:02d}-{p.name}") for i, p in enumerate(self.rule_files)],
            "scrape_configs": [
                {"job_name": self.job, "static_configs": [self._static_config()]},
                *self.extra_scrape_configs,
            ],
        }
        if self.alertmanager_url:
            parsed = urllib.parse.urlsplit(self.alertmanager_url)
            cfg["alerting"] = {"alertmanagers": [{"scheme": parsed.scheme or "http",
                                                  "static_configs": [{"targets": [parsed.netloc]}]}]}  # fmt: skip
        return cfg

    def _prepare(self) -> None:
        rules_dir = self.workdir / "rules"
        rules_dir.mkdir(parents=True, exist_ok=True)
        for i, path in enumerate(self.rule_files):
            shutil.copyfile(path, rules_dir / f"{i:02d}-{path.name}")
        (self.workdir / "prometheus.yml").write_text(yaml.safe_dump(self.config(), sort_keys=False))

    def _argv(self) -> list[str]:
        return [
            f"--config.file={self.workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-lifecycle",
            # Resend firing alerts every second, so Alertmanager hears at once after its own restart.
            "--rules.alert.resend-delay=1s",
            *self.extra_args,
        ]

    def reload(self, *, rule_files: Sequence[str | Path] | None = None, timeout: float = 10.0) -> int:
        """Rewrite the config (and copy rule_files, if given) and reload through /-/reload; wait until every
        rule was evaluated once. Returns the number of rules. Unchanged rules keep their alert state."""
        if rule_files is not None:
            self.rule_files = [Path(p) for p in rule_files]
        self._prepare()
        request = urllib.request.Request(f"{self.url}/-/reload", method="POST")  # noqa: S310 - loopback
        with urllib.request.urlopen(request, timeout=timeout) as r:  # noqa: S310 - loopback URL built here
            assert r.status == 200, r.status
        expected = sum(len(g["rules"]) for p in self.rule_files for g in yaml.safe_load(p.read_text())["groups"])

        def reloaded() -> int:
            groups = self.rule_groups()
            rules = [r for g in groups for r in g["rules"]]
            return len(rules) if len(rules) == expected else 0

        wait_until(reloaded, timeout=timeout, what="the reloaded rules")
        return self.wait_for_rules_loaded(timeout=timeout)

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path> and return its `data`; fails on a non-success status."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        body = http_get_json(f"{self.url}/api/v1/{path}{query}")
        assert body.get("status") == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query: the result vector, each {"metric": {...}, "value": [ts, "v"]}."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        return list(data["result"])

    def query_value(self, expr: str) -> float | None:
        """The single value of an instant query, None when the vector is empty (fails on more than one)."""
        result = self.query(expr)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (pending and firing), each with labels, annotations, state and activeAt."""
        return list(self.api("alerts")["alerts"])

    def rule_groups(self) -> list[dict[str, Any]]:
        """Loaded rule groups with their rules' health and last error."""
        return list(self.api("rules")["groups"])

    def wait_for_rules_loaded(self, *, timeout: float = 10.0) -> int:
        """Wait until every loaded rule was evaluated once without error; return the number of rules."""

        def healthy() -> int:
            rules = [r for g in self.rule_groups() for r in g["rules"]]
            if not rules or any(r.get("health") != "ok" for r in rules):
                bad = [(r["name"], r.get("lastError")) for r in rules if r.get("health") == "err"]
                assert not bad, f"rules failing to evaluate: {bad}"
                return 0
            return len(rules)

        return int(wait_until(healthy, timeout=timeout, what="every rule evaluated"))

    def wait_for_targets_up(self, *, timeout: float = 15.0) -> None:
        """Wait until every configured target was scraped successfully."""

        def up() -> bool:
            active = self.api("targets", state="active")["activeTargets"]
            return bool(active) and all(t["health"] == "up" for t in active)

        wait_until(up, timeout=timeout, what=f"targets up ({self.targets})")

    def wait_for_alert(
        self, name: str, *, state: str = "firing", timeout: float = 30.0, **labels: str
    ) -> dict[str, Any]:
        """Wait until an alert with this name, state and these labels is active; return it."""

        def found() -> dict[str, Any] | None:
            for alert in self.alerts():
                lab = alert["labels"]
                if (
                    lab.get("alertname") == name
                    and alert["state"] == state
                    and all(lab.get(k) == v for k, v in labels.items())
                ):
                    return alert
            return None

        return dict(wait_until(found, timeout=timeout, what=f"{name} {state} in Prometheus"))


class Alertmanager(_Daemon):
    """An Alertmanager with the given config text, no cluster gossip, temporary storage."""

    binary = ALERTMANAGER

    def __init__(self, workdir: str | Path, config_text: str, *, extra_args: Sequence[str] = ()) -> None:
        super().__init__(workdir)
        self.config_text = config_text
        self.extra_args = list(extra_args)

    def _prepare(self) -> None:
        (self.workdir / "alertmanager.yml").write_text(self.config_text)

    def _argv(self) -> list[str]:
        return [
            f"--config.file={self.workdir / 'alertmanager.yml'}",
            f"--storage.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",  # no gossip: one instance, no port 9094 taken
            *self.extra_args,
        ]

    def alerts(self, **filters: str) -> list[dict[str, Any]]:
        """GET /api/v2/alerts (active, silenced and inhibited ones); each has status.state and inhibitedBy."""
        query = f"?{urllib.parse.urlencode(filters)}" if filters else ""
        return list(http_get_json(f"{self.url}/api/v2/alerts{query}"))

    def wait_for_alert(self, name: str, *, state: str = "active", timeout: float = 30.0) -> dict[str, Any]:
        """Wait until Alertmanager holds an alert of this name in this state (active, suppressed)."""

        def found() -> dict[str, Any] | None:
            for alert in self.alerts():
                if alert["labels"].get("alertname") == name and alert["status"]["state"] == state:
                    return alert
            return None

        return dict(wait_until(found, timeout=timeout, what=f"{name} {state} in Alertmanager"))


class WebhookReceiver:
    """An HTTP server on 127.0.0.1 recording every webhook notification Alertmanager POSTs (as parsed JSON)."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        self.received_at: list[float] = []  # time.monotonic() of each notification
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _WebhookHandler)
        self._server.daemon_threads = True
        self._server.block_on_close = True
        self._server.receiver = self  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The base URL; receivers may append a path (e.g. /pager) to tell themselves apart."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> WebhookReceiver:
        """Serve in a background thread."""
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="webhook")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and join the threads (the conftest guard fails tests that leak threads)."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
            self._thread = None
        self._server.server_close()

    def record(self, path: str, body: dict[str, Any]) -> None:
        """Store one notification, with the path it was posted to under the key `_path`."""
        with self._lock:
            self.notifications.append({**body, "_path": path})
            self.received_at.append(time.monotonic())

    def snapshot(self) -> list[dict[str, Any]]:
        """The notifications so far, in arrival order."""
        with self._lock:
            return list(self.notifications)

    def alerts(self, path: str | None = None) -> list[dict[str, Any]]:
        """Every alert of every notification (optionally only those posted to path), in arrival order."""
        return [a for n in self.snapshot() if path is None or n["_path"] == path for a in n.get("alerts", [])]

    def wait_for(self, pred: Callable[[dict[str, Any]], bool], *, timeout: float, what: str) -> dict[str, Any]:
        """Wait for a notification matching pred; return it."""

        def found() -> dict[str, Any] | None:
            return next((n for n in self.snapshot() if pred(n)), None)

        return dict(wait_until(found, timeout=timeout, what=what, interval=0.05))

    def __enter__(self) -> WebhookReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _WebhookHandler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        self.server.receiver.record(self.path, body)  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


def alertmanager_config(hook_url: str) -> str:
    """The example Alertmanager config, its webhooks pointed at the test's receiver (path = receiver name), 1s waits."""
    config = yaml.safe_load((ROOT / ALERTMANAGER_PATH).read_text())
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = f"{hook_url}/{receiver['name']}"
    config["route"].update(group_wait="1s", group_interval="1s")
    return str(yaml.safe_dump(config, sort_keys=False))


@contextlib.contextmanager
def alerting(
    workdir: Path, hook: WebhookReceiver, rule_files: Sequence[Path], **prometheus: Any
) -> Iterator[tuple[Prometheus, Alertmanager]]:
    """An Alertmanager with the example config delivering to `hook`, and a Prometheus evaluating `rule_files` and
    sending it the alerts (its other arguments, the targets or scrape configs, as given); both stopped on exit."""
    with (
        Alertmanager(workdir / "am", alertmanager_config(hook.url)) as am,
        Prometheus(workdir / "prom", rule_files=rule_files, alertmanager_url=am.url, **prometheus) as prom,
    ):
        yield prom, am
