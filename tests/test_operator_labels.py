"""A page names the workload: behind the chart's ServiceMonitor or PodMonitor, with the Prometheus
Operator's target labels and honorLabels, every OOM page and every SGLang-side series names the SGLang pod or
source, never the exporter's pod, and the exporter's own identity stays under exporter_* labels.

    helm template (the chart's monitor) --operator_scrape.py--> the scrape config the operator generates
    file_sd: the exporter's 127.0.0.1 port with the __meta_kubernetes_* labels the Kubernetes SD would attach
    real serve (daemonset / daemonset + node discovery / deployment / sidecar) <- real prometheus
        (the committed rules, every `for` set to 0s) -> real prometheus-alertmanager (the example config)

Per mode: an SGLang prefill OOM is appended to the SGLang log; SGLangPrefillOOM must fire naming the SGLang pod
(daemonset, sidecar) or source (deployment) in its labels and description; every sglang_oom_* series that is
not the exporter's own (sglang_oom_exporter_*) must name that pod or source; `up` must carry the exporter's pod
as exporter_pod and, outside sidecar mode, no `pod`. Where the exporter scrapes SGLang (discovery, deployment,
sidecar), SGLang reports 99% KV usage: SGLangKVCacheNearFull must fire naming the same pod or source, and
Alertmanager must hold it suppressed by the OOM page (the example's inhibition).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sglang_oom_exporter.render.alerts import RULES_PATH
from tests.support.daemon import Daemon
from tests.support.fake_kubeapi import FakeKubeApi, pod
from tests.support.fake_sglang import FakeSGLang
from tests.support.helm import CHART, template
from tests.support.helpers import wait_until
from tests.support.logs import append, cri, oom_block
from tests.support.operator_scrape import meta_for_endpoint, meta_for_pod, pod_monitor_config, service_monitor_config
from tests.support.promstack import (
    ALERTMANAGER,
    PROMETHEUS,
    Alertmanager,
    Prometheus,
    WebhookReceiver,
    alerting,
    require_binaries,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
RELEASE_NS = "monitoring"
EXPORTER_POD = "t-sglang-oom-exporter-x7k2p"
EXPORTER_CONTAINER = "oom-exporter"
SGLANG_NS, SGLANG_POD = "llm", "llama-0"
SOURCE = "llama-70b"
KV_FULL = b"# TYPE sglang:token_usage gauge\nsglang:token_usage 0.99\n"
SELECTOR = {"app.kubernetes.io/name": "sglang-oom-exporter", "app.kubernetes.io/instance": "t"}


def _fast_rules(path: Path) -> Path:
    """The committed rules with every `for` at 0s (labels and annotations as shipped)."""
    rules = yaml.safe_load((ROOT / RULES_PATH).read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = "0s"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    return path


def _monitor(docs: tuple[dict, ...]) -> dict[str, Any]:
    (monitor,) = [d for d in docs if d["kind"] in ("ServiceMonitor", "PodMonitor")]
    return monitor


def _scrape_config(monitor: dict, sd_file: Path, port: int, mode: str) -> dict[str, Any]:
    """The operator's scrape config for the monitor, and its one target's SD labels written to sd_file."""
    if monitor["kind"] == "ServiceMonitor":
        service_labels = {**SELECTOR, "helm.sh/chart": "sglang-oom-exporter", "app.kubernetes.io/managed-by": "Helm"}
        if mode == "sidecar":  # the Service selects the SGLang pods, which carry the exporter container
            meta = meta_for_endpoint(SGLANG_NS, "t-sglang-oom-exporter", service_labels, "metrics", SGLANG_POD,
                                     {"app.kubernetes.io/name": "sglang"}, EXPORTER_CONTAINER, "oom-metrics")  # fmt: skip
        else:
            meta = meta_for_endpoint(RELEASE_NS, "t-sglang-oom-exporter", service_labels, "metrics", EXPORTER_POD,
                                     SELECTOR, EXPORTER_CONTAINER, "metrics")  # fmt: skip
        config = service_monitor_config(monitor, sd_file)
    else:
        if mode == "sidecar":
            meta = meta_for_pod(SGLANG_NS, SGLANG_POD, {"app.kubernetes.io/name": "sglang"}, EXPORTER_CONTAINER,
                                "oom-metrics")  # fmt: skip
        else:
            meta = meta_for_pod(RELEASE_NS, EXPORTER_POD, SELECTOR, EXPORTER_CONTAINER, "metrics")
        config = pod_monitor_config(monitor, sd_file)
    sd_file.write_text(json.dumps([{"targets": [f"127.0.0.1:{port}"], "labels": meta}]))
    return config


class _Setup:
    """One mode: the chart values, the exporter process, the log the OOM goes to, and what a page must name."""

    def __init__(self, mode: str, tmp: Path, fake: FakeSGLang, api: FakeKubeApi | None, tls: tuple | None) -> None:
        self.mode = mode
        self.env: dict[str, str] = {}
        if mode == "daemonset":
            self.values: dict[str, Any] = {"serviceMonitor": {"enabled": True}}
            self.ci: tuple[str, ...] = ()
        elif mode == "daemonset-discovery":
            self.values, self.ci = {"discovery": {"enabled": True}, "podMonitor": {"enabled": True}}, ()
        elif mode == "deployment":
            self.values, self.ci = {}, ("deployment-values.yaml",)
        else:
            self.values, self.ci = {}, ("sidecar-values.yaml",)
        self.expect = {"source": SOURCE} if mode == "deployment" else {"namespace": SGLANG_NS, "pod": SGLANG_POD}
        self.who = f"source {SOURCE}" if mode == "deployment" else f"pod {SGLANG_NS}/{SGLANG_POD}"
        if mode.startswith("daemonset"):
            container = tmp / "pods" / f"{SGLANG_NS}_{SGLANG_POD}_0f3c" / "sglang"
            container.mkdir(parents=True)
            self.log = container / "0.log"
            # The container's start-up banner: what makes the exporter recognise it as SGLang and export its series.
            self.log.write_text(
                cri("[2026-03-14 22:07:01] server_args=ServerArgs(model_path='meta-llama/Llama-3.1-8B')\n")
            )
            config = f"scrape_interval: 300ms\nkubernetes:\n  logs_root: {tmp / 'pods'}\n"
            if mode == "daemonset-discovery":
                assert api is not None
                assert tls is not None
                cert, _, token = tls
                sa = tmp / "serviceaccount"
                sa.mkdir()
                (sa / "token").write_text(token.read_text())
                (sa / "ca.crt").write_bytes(cert.read_bytes())
                config += f"  discover_targets: {{enabled: true, interval: 1s, service_account_dir: {sa}}}\n"
                port = int(fake.url.rsplit(":", 1)[1])
                api.pods = [
                    pod(SGLANG_NS, SGLANG_POD, "127.0.0.1", annotations={"sglang-oom-exporter/port": str(port)})
                ]
                self.env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api.port),
                            "NODE_NAME": "gpu-node-1"}  # fmt: skip
            (tmp / "config.yaml").write_text(config)
            self.args = ["--config", str(tmp / "config.yaml")]
            self.text = cri
        elif mode == "deployment":
            # The chart's deployment-values.yaml config (sources with a name, a target serving one), on local paths.
            self.log = tmp / f"{SOURCE}.log"
            self.log.write_text("")
            (tmp / "config.yaml").write_text(
                f"scrape_interval: 300ms\nsources:\n  - {{name: {SOURCE}, path: {self.log}}}\n"
                f"targets:\n  - {{url: {fake.url}, source: {SOURCE}}}\n"
            )
            self.args = ["--config", str(tmp / "config.yaml")]
            self.text = str
        else:
            # The chart README's sidecar snippet: the pod's own log file and SGLang on localhost.
            self.log = tmp / "sglang.log"
            self.log.write_text("")
            self.args = [f"--sglang-url={fake.url}", "--scrape-interval", "0.3s", str(self.log)]
            self.text = str
        self.scrapes_sglang = mode != "daemonset"


MODES = ["daemonset", "daemonset-discovery", "deployment", "sidecar"]


@pytest.mark.parametrize("mode", MODES)
def test_pages_and_sglang_series_name_the_sglang_pod_or_source_never_the_exporters_pod(tmp_path, tls, mode):
    require_binaries(PROMETHEUS, ALERTMANAGER)
    assert (CHART / "Chart.yaml").exists()
    cert, key, _ = tls
    with FakeSGLang(metrics_body=KV_FULL) as fake, FakeKubeApi(cert, key) as api, WebhookReceiver() as hook:
        setup = _Setup(mode, tmp_path, fake, api, tls)
        monitor = _monitor(template(*setup.ci, values=setup.values or None))
        with (
            Daemon(setup.args, str(tmp_path / "state"), env=setup.env) as daemon,
            alerting(
                tmp_path,
                hook,
                [_fast_rules(tmp_path / "rules.yaml")],
                extra_scrape_configs=[_scrape_config(monitor, tmp_path / "targets.json", daemon.port, mode)],
            ) as (prom, am),
        ):
            _check(prom, am, setup, monitor)


def _check(prom: Prometheus, am: Alertmanager, setup: _Setup, monitor: dict) -> None:
    prom.wait_for_targets_up()
    # The source is followed (its zero series are in Prometheus) before the OOM is written: a real increase.
    wait_until(lambda: prom.query('sglang_oom_events_total{kind="prefill"}'), timeout=20, what="the zero series")
    append(setup.log, setup.text(oom_block()))
    alert = prom.wait_for_alert("SGLangPrefillOOM", state="firing", timeout=30)
    labels = alert["labels"]
    for key, value in setup.expect.items():
        assert labels[key] == value, labels
    if "pod" not in setup.expect:
        assert "pod" not in labels, labels
        assert "namespace" not in labels, labels
    assert EXPORTER_POD not in json.dumps(alert), alert
    # The exporter pod's address never splits a unit: a restarted or moved exporter pod pages the same unit.
    assert "host" not in labels, labels
    assert f"on {setup.who}, the last at " in alert["annotations"]["description"], alert["annotations"]

    # Every SGLang-side series names the SGLang pod or source.
    sglang_side = prom.query('{__name__=~"sglang_oom_.+", __name__!~"sglang_oom_exporter_.+"}')
    assert sglang_side
    for series in sglang_side:
        metric = series["metric"]
        assert EXPORTER_POD not in json.dumps({k: v for k, v in metric.items() if not k.startswith("exporter_")})
        pod_named = (metric.get("namespace"), metric.get("pod")) == (SGLANG_NS, SGLANG_POD)
        assert pod_named or metric.get("source") == SOURCE, metric
    targets = [s["metric"] for s in sglang_side if s["metric"]["__name__"] == "sglang_oom_target_up"]
    assert len(targets) == (1 if setup.scrapes_sglang else 0), targets
    for target in targets:
        for key, value in setup.expect.items():
            assert target[key] == value, target

    # The exporter's own identity: exporter_* labels, never `pod` (outside sidecar mode, where the scraped pod is
    # the SGLang pod itself).
    (up,) = wait_until(lambda: prom.query('up{job="sglang-oom-exporter"}'), timeout=10, what="the exporter's up")
    exporter = up["metric"]
    exporter_pod = SGLANG_POD if setup.mode == "sidecar" else EXPORTER_POD
    assert (exporter["exporter_pod"], exporter["exporter_container"]) == (exporter_pod, EXPORTER_CONTAINER)
    assert exporter["exporter_namespace"] == (SGLANG_NS if setup.mode == "sidecar" else RELEASE_NS)
    assert "container" not in exporter
    if setup.mode == "sidecar":
        assert (exporter["namespace"], exporter["pod"]) == (SGLANG_NS, SGLANG_POD)
    else:
        assert "pod" not in exporter
        assert "namespace" not in exporter
    assert exporter.get("service") == ("t-sglang-oom-exporter" if monitor["kind"] == "ServiceMonitor" else None)

    if setup.scrapes_sglang:
        near_full = prom.wait_for_alert("SGLangKVCacheNearFull", state="firing", timeout=30)
        for key, value in setup.expect.items():
            assert near_full["labels"][key] == value, near_full
        assert EXPORTER_POD not in json.dumps(near_full), near_full
        # Its inhibition (equal: [namespace, pod], or [source]) matches the OOM page of the same workload.
        held = am.wait_for_alert("SGLangKVCacheNearFull", state="suppressed", timeout=30)
        assert held["status"]["inhibitedBy"], held
