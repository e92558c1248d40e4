"""The example Alertmanager config's inhibitions keep clusters apart: a real Alertmanager running
alerts/alertmanager.example.yml gets, through its API, an OOM page for llm/sglang-0 in cluster us-east and a
retraction warning and a KV near-full warning for llm/sglang-0 in each of us-east and eu-west. The us-east
warnings are inhibited by the page; the eu-west ones, the same namespace and pod in another cluster, stay
active. A page without a cluster label inhibits a warning without one, as before (one Prometheus).
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from sglang_oom_exporter.render.alerts import ALERTMANAGER_PATH
from sglang_oom_exporter.render.alertspec import NEAR_FULL, RETRACTIONS_HIGH
from tests.support.helpers import wait_until
from tests.support.promstack import ALERTMANAGER, Alertmanager, require_binaries

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
POD = {"namespace": "llm", "pod": "sglang-0", "container": "sglang"}


def _post(am: Alertmanager, alerts: list[dict[str, str]]) -> None:
    body = json.dumps([{"labels": labels} for labels in alerts]).encode()
    request = urllib.request.Request(f"{am.url}/api/v2/alerts", data=body, method="POST",  # noqa: S310 - loopback
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=5) as r:  # noqa: S310 - loopback
        assert r.status == 200


def test_a_page_in_one_cluster_inhibits_that_clusters_warnings_only(tmp_path):
    require_binaries(ALERTMANAGER)
    config = (ROOT / ALERTMANAGER_PATH).read_text()
    page = {"alertname": "SGLangPrefillOOM", "severity": "critical", "kind": "prefill", **POD}
    alerts = [{**page, "cluster": "us-east"}, {**page, "namespace": "solo"}]
    for cluster in ("us-east", "eu-west"):
        alerts += [
            {"alertname": RETRACTIONS_HIGH, "severity": "warning", "cluster": cluster, **POD},
            {"alertname": NEAR_FULL, "severity": "warning", "cluster": cluster, "namespace": "llm", "pod": "sglang-0",
             "instance": "10.0.0.7:9877", "target": "http://10.1.0.5:30000"},
        ]  # fmt: skip
    # one Prometheus, no cluster label: the page inhibits its own pod's warning as before
    alerts.append({"alertname": RETRACTIONS_HIGH, "severity": "warning", **POD, "namespace": "solo"})
    with Alertmanager(tmp_path / "am", config) as am:
        _post(am, alerts)

        def states() -> dict[tuple[str, str, str], str] | None:
            got = {(a["labels"]["alertname"], a["labels"].get("cluster", ""), a["labels"]["namespace"]):
                   a["status"]["state"] for a in am.alerts()}  # fmt: skip
            return got if len(got) == len(alerts) and "unprocessed" not in got.values() else None

        got = wait_until(states, timeout=15, what="the alerts processed")
        assert got == {
            ("SGLangPrefillOOM", "us-east", "llm"): "active",
            ("SGLangPrefillOOM", "", "solo"): "active",
            (RETRACTIONS_HIGH, "us-east", "llm"): "suppressed",
            (NEAR_FULL, "us-east", "llm"): "suppressed",
            (RETRACTIONS_HIGH, "eu-west", "llm"): "active",
            (NEAR_FULL, "eu-west", "llm"): "active",
            (RETRACTIONS_HIGH, "", "solo"): "suppressed",
        }
