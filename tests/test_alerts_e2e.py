"""End to end: an SGLang OOM in a log becomes a page, through the real daemon, Prometheus and Alertmanager.

    fake SGLang (server args) <- serve (follows server.log, other.log) <- prometheus (rendered rules, 1s)
                                                        -> prometheus-alertmanager (the example config) -> webhook

The daemon follows two temporary logs (sources "server" and "other") and scrapes tests/support/fake_sglang.py for
the server's args, so an OOM carries a concrete suggestion. Prometheus loads the committed rules file and
scrapes the daemon every second under job sglang-oom-exporter; Alertmanager runs a copy of
alerts/alertmanager.example.yml whose two webhook receivers point at an http.server inside this test and
whose root route's group_wait/group_interval are 1s (Alertmanager's 30s/5m would only make the test wait); the
pager route keeps the example's own group_wait (10s), so the page is timed as a user of the example gets it. Steps:

1. a lone retraction on each source is counted, and after two rule evaluations that saw it nothing is
   pending or firing and nothing was delivered;
2. a prefill OOM block (16384 tokens asked, 6100 available, chunked_prefill_size 16384 on the server) is
   appended: SGLangPrefillOOM reaches the pager receiver with the flag, the numbers and the suggested 4096.
   The time from the append to the delivery is printed (the figure the README quotes);
3. inhibition: the rules are reloaded with a derived copy in which SGLangKVCacheRetractionsHigh fires on
   any retraction at once (for 0m, threshold 0.001 a minute; everything else unchanged, rendered from a
   catalog copy). Its alert for "other" reaches the ticket receiver; the one for "server", whose OOM page is
   firing, is held by Alertmanager as suppressed, inhibited by that page, and never delivered.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from sglang_oom_exporter.catalog import load_catalog
from sglang_oom_exporter.config.values import parse_duration
from sglang_oom_exporter.render.alerts import (
    ALERTMANAGER_PATH,
    PAGE_GROUP_WAIT,
    RULES_PATH,
    alert_pack,
    recording_rules,
    rules_file,
)
from sglang_oom_exporter.render.alertspec import RETRACTIONS_HIGH
from sglang_oom_exporter.render.options import RenderOptions
from tests.support.daemon import Daemon
from tests.support.fake_sglang import FakeSGLang
from tests.support.helpers import wait_until
from tests.support.logs import PREFILL, append
from tests.support.promstack import (
    ALERTMANAGER,
    PROMETHEUS,
    Alertmanager,
    WebhookReceiver,
    alerting,
    alertmanager_config,
    require_binaries,
    rfc3339_seconds,
)
from tests.support.sglang_data import INFO

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
RETRACTION = "[2026-03-14 22:09:0{s} TP0] KV cache pool is full. Retract requests. #retracted_reqs: 2, #new_token_ratio: 0.4000 -> 0.5000\n"
# A hang guard sized for a loaded machine on top of the pager's group_wait, which the page waits out by design.
PAGE_BOUND_SECONDS = parse_duration(PAGE_GROUP_WAIT) + 30.0
RULE_COUNT = len(alert_pack(load_catalog())) + len(recording_rules(load_catalog()))
# SGLang's own /metrics at half KV usage: the near-full warning stays quiet, so step 1 can expect no alert at all.
KV_HALF_USED = b"# TYPE sglang:token_usage gauge\nsglang:token_usage 0.5\n"


def test_config_for_the_test_is_the_example_with_local_receivers_and_short_waits():
    config = yaml.safe_load(alertmanager_config("http://127.0.0.1:1"))
    example = yaml.safe_load((ROOT / ALERTMANAGER_PATH).read_text())
    assert config["inhibit_rules"] == example["inhibit_rules"]
    assert config["route"]["routes"] == example["route"]["routes"]
    assert [r["name"] for r in config["receivers"]] == ["default", "pager", "ticket", "null"]


def _fast_retraction_rules(path: Path) -> Path:
    """The rules rendered from a catalog copy whose retraction alert fires on any retraction at once."""
    catalog = load_catalog()
    retract = catalog.kind(catalog.retraction_kind or "")
    fast = replace(retract, alert={**retract.alert, "for": "0m", "threshold_per_minute": 0.001})
    catalog = replace(catalog, kinds=tuple(fast if k.id == retract.id else k for k in catalog.kinds))
    path.write_text(rules_file(catalog, RenderOptions()))
    return path


def _delivered(hook: WebhookReceiver, receiver: str, alertname: str, **labels: str) -> list[dict]:
    return [
        a for a in hook.alerts(f"/{receiver}")
        if a["labels"].get("alertname") == alertname and all(a["labels"].get(k) == v for k, v in labels.items())
    ]  # fmt: skip


def test_an_oom_in_the_log_pages_with_its_fix_and_warnings_are_inhibited(tmp_path):
    require_binaries(PROMETHEUS, ALERTMANAGER)
    started = time.monotonic()
    server_log, other_log = tmp_path / "server.log", tmp_path / "other.log"
    server_log.write_text("")
    other_log.write_text("")
    with FakeSGLang() as fake, WebhookReceiver() as hook:
        fake.metrics_body = KV_HALF_USED
        fake.info_body = json.dumps(INFO).encode()
        args = ["--sglang-url", fake.url, "--scrape-interval", "0.3s", "--scrape-timeout", "1s", str(server_log),
                str(other_log)]  # fmt: skip
        with (
            Daemon(args, str(tmp_path / "state")) as daemon,
            alerting(tmp_path, hook, [ROOT / RULES_PATH], targets=[f"127.0.0.1:{daemon.port}"]) as (prom, am),
        ):
            _run(prom, am, hook, server_log, other_log, tmp_path)
    print(f"\nalert e2e: {time.monotonic() - started:.1f}s in all")


def _run(prom, am, hook, server_log, other_log, tmp_path) -> None:
    prom.wait_for_targets_up()
    assert prom.wait_for_rules_loaded() == RULE_COUNT
    wait_until(lambda: prom.query_value('max(sglang_oom_target_server_arg{arg="chunked_prefill_size"})') == 16384,
               timeout=15, what="the server args in Prometheus")  # fmt: skip

    # 1. A lone retraction on each source pages nothing.
    append(server_log, RETRACTION.format(s=1))
    append(other_log, RETRACTION.format(s=2))
    retractions = 'sum(sglang_oom_events_total{kind="retract"})'
    wait_until(lambda: prom.query_value(retractions) == 2, timeout=15, what="both retractions in Prometheus")
    seen_at = time.time()
    wait_until(lambda: all(g["lastEvaluation"] and rfc3339_seconds(g["lastEvaluation"]) > seen_at + 2 for g in prom.rule_groups()),
               timeout=10, what="two rule evaluations after the retractions")  # fmt: skip
    assert prom.alerts() == []
    assert hook.snapshot() == []

    # 2. A prefill OOM pages, with its fix.
    appended = time.monotonic()
    append(server_log, PREFILL.format(s=5))
    note = hook.wait_for(lambda n: n["_path"] == "/pager", timeout=PAGE_BOUND_SECONDS, what="the page")
    to_page = hook.received_at[hook.snapshot().index(note)] - appended
    print(f"\ntime to page (log append -> Alertmanager webhook): {to_page:.1f}s")
    assert to_page >= parse_duration(PAGE_GROUP_WAIT)  # held for the pager's group_wait, not the root's 1s
    (alert,) = note["alerts"]
    assert alert["status"] == "firing"
    host = prom.query("up")[0]["metric"]["instance"]  # a plain file's unit: its source on its host
    assert alert["labels"] == {"alertname": "SGLangPrefillOOM", "kind": "prefill", "source": "server",
                               "host": host, "severity": "critical"}  # fmt: skip
    ann = alert["annotations"]
    seen = prom.query_value('sglang_oom_last_event_timestamp_seconds{kind="prefill", source="server"}')
    at = time.strftime("%Y-%m-%d %H:%M:%S +0000 UTC", time.gmtime(int(seen)))  # when the OOM was, at every repeat
    assert ann["description"] == (
        f"1 fatal prefill OOM on source server on host {host}, the last at {at}: asked for 16384 KV tokens while 6100 "
        "were available. Suggested: --chunked-prefill-size from 16384 to 4096."
    )
    assert ann["runbook_url"].endswith("/docs/runbooks/sglangprefilloom.md")
    assert [n["_path"] for n in hook.snapshot()] == ["/pager"]  # nothing else fired

    # 3. Inhibition: the retraction warning of the paged source is held back, the other source's goes out.
    assert prom.reload(rule_files=[_fast_retraction_rules(tmp_path / "fast-retraction.rules.yaml")]) == RULE_COUNT
    prom.wait_for_alert(RETRACTIONS_HIGH, source="server", timeout=10)
    prom.wait_for_alert(RETRACTIONS_HIGH, source="other", timeout=10)
    wait_until(lambda: _delivered(hook, "ticket", RETRACTIONS_HIGH, source="other"), timeout=15,
               what="the other source's retraction warning at the ticket receiver")  # fmt: skip
    wait_until(lambda: _am_alert(am, RETRACTIONS_HIGH, "server"), timeout=10, what="the held warning in Alertmanager")
    held = _am_alert(am, RETRACTIONS_HIGH, "server")
    page = _am_alert(am, "SGLangPrefillOOM", "server")
    assert held["status"]["state"] == "suppressed"
    assert held["status"]["inhibitedBy"] == [page["fingerprint"]]
    assert _am_alert(am, RETRACTIONS_HIGH, "other")["status"] == {"inhibitedBy": [], "silencedBy": [],
                                                                  "state": "active"}  # fmt: skip
    # Both warnings were in Alertmanager before the other one was delivered (1s group_wait): the held one
    # would have gone out in the same flush.
    assert _delivered(hook, "ticket", RETRACTIONS_HIGH, source="server") == []
    assert _delivered(hook, "pager", RETRACTIONS_HIGH) == []


def _am_alert(am: Alertmanager, name: str, source: str) -> dict | None:
    found = [a for a in am.alerts() if a["labels"]["alertname"] == name and a["labels"].get("source") == source]
    assert len(found) <= 1, found
    return found[0] if found else None
