"""End to end: one incident, one page. The real daemon on a /var/log/pods tree, a real Prometheus evaluating the
committed rules, and a real Alertmanager running alerts/alertmanager.example.yml (its webhooks pointed at this
test, 1s waits) deliver what on-call receives.

    pods/llm_sglang-0_*/sglang/0.log     prefill OOM; decode and req_slots OOMs seconds later
    pods/llm_sglang-0_*/sglang/1.log     the container's next run: prefill OOM again
    pods/llm_other-0_*/sglang/0.log      another pod: one prefill OOM, its own incident
    pods/llm_lws-0_*/sglang-leader/...   one multi-node (LeaderWorkerSet) server: its leader and worker pods
    pods/llm_lws-0-1_*/sglang-worker/... each log the same decode OOM, one incident for the group

What is asserted is what the pager sees: one Alertmanager group key per incident (PagerDuty's dedup_key,
Opsgenie's alias) and exactly one notification each: the example's pager group_wait (10s; the test's root route
waits 1s) holds a burst's alerts, found by one or two 1s evaluations, into the first notification, which is sent
no sooner than group_wait after the burst; the crash-looping pod's incident lists every kind it hit with its
exact count; nothing reaches the ticket receiver.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from sglang_oom_exporter.config.values import parse_duration
from sglang_oom_exporter.render.alerts import PAGE_GROUP_WAIT, RULES_PATH
from tests.support.daemon import Daemon
from tests.support.helpers import wait_until
from tests.support.logs import append, cri, oom_block
from tests.support.promstack import (
    ALERTMANAGER,
    PROMETHEUS,
    Alertmanager,
    WebhookReceiver,
    alerting,
    require_binaries,
    rfc3339_seconds,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
BANNER = "[2026-03-14 22:00:00] server_args=ServerArgs(model_path='Qwen/Qwen2.5-7B', mem_fraction_static=0.88)\n"
REQ_SLOTS = (
    "[2026-03-14 22:07:41 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    '  File "/usr/local/lib/python3.10/dist-packages/sglang/srt/managers/schedule_batch.py", line 842, in alloc_req_slots\n'
    "    raise RuntimeError(\n"
    "RuntimeError: alloc_req_slots runs out of memory. Please set a smaller number for `--max-running-requests`. "
    "self.req_to_token_pool.available_size()=0, num_reqs=3, \n\n"
)
UID = "5f0c2a91"
# When the last OOM was, as a page says it: true at every repeat of the notification.
AT = r", the last at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \+0000 UTC(?:: asked for \d+ [^.]*)?\. "  # then its numbers


def _container(root: Path, namespace: str, pod: str, container: str) -> Path:
    path = root / f"{namespace}_{pod}_{UID}" / container
    path.mkdir(parents=True)
    return path


def _incidents(hook: WebhookReceiver) -> dict[str, list[dict]]:
    """The pager's notifications by Alertmanager group key, oldest first."""
    out: dict[str, list[dict]] = {}
    for note in hook.snapshot():
        if note["_path"] == "/pager":
            out.setdefault(note["groupKey"], []).append(note)
    return out


def _firing(note: dict) -> dict[str, dict]:
    """alertname -> the alert, of one notification's firing alerts."""
    return {a["labels"]["alertname"]: a for a in note["alerts"] if a["status"] == "firing"}


def test_one_crash_looping_pod_is_one_page_another_pod_and_a_group_are_one_each(tmp_path):
    require_binaries(PROMETHEUS, ALERTMANAGER)
    root = tmp_path / "pods"
    sglang = _container(root, "llm", "sglang-0", "sglang")
    other = _container(root, "llm", "other-0", "sglang")
    leader = _container(root, "llm", "lws-0", "sglang-leader")
    worker = _container(root, "llm", "lws-0-1", "sglang-worker")
    for path in (sglang, other, leader, worker):
        (path / "0.log").write_text(cri(BANNER))
    with (
        WebhookReceiver() as hook,
        Daemon(["--kubernetes-logs", str(root)], str(tmp_path / "state")) as daemon,
        alerting(tmp_path, hook, [ROOT / RULES_PATH], targets=[f"127.0.0.1:{daemon.port}"]) as (prom, am),
    ):
        prom.wait_for_targets_up()
        wait_until(lambda: prom.query_value("sum(sglang_oom_exporter_sglang_sources)") == 4, timeout=20,
                   what="the four SGLang containers in Prometheus")  # fmt: skip

        # The crash-looping pod: prefill, decode and req_slots OOMs in one burst; another pod; one LWS group.
        burst = time.monotonic()
        append(sglang / "0.log", cri(oom_block(kind="Prefill") + oom_block(kind="Decode") + REQ_SLOTS))
        append(other / "0.log", cri(oom_block(kind="Prefill")))
        decode = oom_block(kind="Decode")
        append(leader / "0.log", cri(decode))
        append(worker / "0.log", cri(decode))

        def crash_looping() -> list[dict] | None:
            notes = _incidents(hook).get(_key(hook, "pod", "sglang-0"))
            return notes if notes and len(_firing(notes[-1])) == 4 else None

        wait_until(lambda: len(_incidents(hook)) == 3 and crash_looping(), timeout=90,
                   what="three incidents at the pager, the crash-looping pod's with its four alerts")  # fmt: skip
        notes = hook.snapshot()
        first_page = min(t for n, t in zip(notes, hook.received_at, strict=True) if n["_path"] == "/pager")
        # The container's next run (1.log) fails the same way: the same incident, its counts move on.
        (sglang / "1.log").write_text(cri(BANNER + oom_block(kind="Prefill")))
        wait_until(lambda: "2 fatal prefill OOMs" in _am_text(am, "SGLangPrefillOOM", "sglang-0")
                   and "prefill 2" in _am_text(am, "SGLangOOMCrashLoop", "sglang-0"),
                   timeout=30, what="the second prefill in Alertmanager")  # fmt: skip
        seen_at = time.time()
        wait_until(lambda: all(g["lastEvaluation"] and rfc3339_seconds(g["lastEvaluation"]) > seen_at + 3 for g in prom.rule_groups()),
                   timeout=15, what="three rule evaluations after it")  # fmt: skip
        incidents = _incidents(hook)
        texts = {name: _am_text(am, name, "sglang-0") for name in _firing(crash_looping()[-1])}  # type: ignore[index]
        group_text = _am_text(am, "SGLangDecodeOOM", "", group="lws-0")
        other_text = _am_text(am, "SGLangPrefillOOM", "other-0")
    print("\nthe crash-looping pod's incident, as Alertmanager holds it for the pager:")
    for name, text in sorted(texts.items()):
        print(f"  {name}: {text}")
    by_unit = {tuple(sorted(notes[0]["groupLabels"].items())): notes for notes in incidents.values()}
    assert sorted(by_unit) == [
        (("group", "lws-0"), ("namespace", "llm")),
        (("namespace", "llm"), ("pod", "other-0")),
        (("namespace", "llm"), ("pod", "sglang-0")),
    ]
    # One notification per incident, all of a burst's alerts in it, then none: a new count changes no alert set.
    assert {unit: len(notes) for unit, notes in by_unit.items()} == dict.fromkeys(by_unit, 1)
    for notes in by_unit.values():
        assert notes[0]["receiver"] == "pager"
    # Held for the pager route's group_wait (the test's root route would send after 1s).
    print(f"\nburst -> first page: {first_page - burst:.1f}s (group_wait {PAGE_GROUP_WAIT})")
    assert first_page - burst >= parse_duration(PAGE_GROUP_WAIT)
    assert sorted(texts) == ["SGLangDecodeOOM", "SGLangOOMCrashLoop", "SGLangPrefillOOM", "SGLangReqSlotsOOM"]
    assert texts["SGLangOOMCrashLoop"].startswith(
        "SGLang on pod llm/sglang-0 had 4 fatal OOMs within 1h (alert at 3): decode 1, prefill 2, req_slots 1. "
    )
    assert re.match(f"2 fatal prefill OOMs on pod llm/sglang-0{AT}", texts["SGLangPrefillOOM"])
    assert re.match(f"1 fatal decode OOM on pod llm/sglang-0{AT}", texts["SGLangDecodeOOM"])
    assert re.match(f"1 fatal req_slots OOM on pod llm/sglang-0{AT}", texts["SGLangReqSlotsOOM"])
    (group_alert,) = _firing(by_unit[(("group", "lws-0"), ("namespace", "llm"))][-1]).values()
    assert group_alert["labels"] == {"alertname": "SGLangDecodeOOM", "group": "lws-0", "kind": "decode",
                                     "namespace": "llm", "severity": "critical"}  # fmt: skip
    assert re.match(f"1 fatal decode OOM on group llm/lws-0{AT}", group_text)
    assert re.match(f"1 fatal prefill OOM on pod llm/other-0{AT}", other_text)
    assert [n for n in hook.snapshot() if n["_path"] != "/pager"] == []


def _key(hook: WebhookReceiver, label: str, value: str) -> str | None:
    """The group key of the pager's incident whose group labels name `label=value`."""
    for key, notes in _incidents(hook).items():
        if notes[0]["groupLabels"].get(label) == value:
            return key
    return None


def _am_text(am: Alertmanager, alertname: str, pod: str, **labels: str) -> str:
    """The description Alertmanager holds now for the alert of that pod (a group's alert has no pod)."""
    found = [
        a["annotations"]["description"] for a in am.alerts()
        if a["labels"]["alertname"] == alertname and a["labels"].get("pod", "") == pod
        and all(a["labels"].get(k) == v for k, v in labels.items())
    ]  # fmt: skip
    assert len(found) <= 1, found
    return found[0] if found else ""


def test_two_hosts_with_one_source_name_are_two_incidents_each_naming_its_host(tmp_path):
    """Two machines without Kubernetes, each with /var/log/sglang/sglang.log read by its own plain-file
    exporter, both in one scrape job: the source is `sglang` on both. Host A's decode OOM, then host B's: two
    incidents at the pager, each naming its machine, and host B's OOM is no update of host A's."""
    require_binaries(PROMETHEUS, ALERTMANAGER)
    logs = {name: tmp_path / name / "var-log-sglang" / "sglang.log" for name in ("a", "b")}
    for log in logs.values():
        log.parent.mkdir(parents=True)
        log.write_text(BANNER)
    with (
        WebhookReceiver() as hook,
        Daemon([str(logs["a"])], str(tmp_path / "a" / "state")) as host_a,
        Daemon([str(logs["b"])], str(tmp_path / "b" / "state")) as host_b,
        alerting(
            tmp_path, hook, [ROOT / RULES_PATH], targets=[f"127.0.0.1:{host_a.port}", f"127.0.0.1:{host_b.port}"]
        ) as (prom, am),  # fmt: skip
    ):
        prom.wait_for_targets_up()
        wait_until(lambda: prom.query_value('count(sglang_oom_exporter_sglang_sources{job="sglang-oom-exporter"} == 1)') == 2,
                   timeout=20, what="both exporters following their sglang.log")  # fmt: skip
        hosts = {"a": f"127.0.0.1:{host_a.port}", "b": f"127.0.0.1:{host_b.port}"}
        append(logs["a"], oom_block(kind="Decode"))
        wait_until(lambda: _key(hook, "host", hosts["a"]), timeout=40, what="host A's page")
        append(logs["b"], oom_block(kind="Decode"))
        wait_until(lambda: _key(hook, "host", hosts["b"]), timeout=40, what="host B's page")
        texts = {name: _am_text(am, "SGLangDecodeOOM", "", host=host) for name, host in hosts.items()}
        incidents = _incidents(hook)
    assert sorted(tuple(sorted(notes[0]["groupLabels"].items())) for notes in incidents.values()) == [
        (("host", hosts["a"]), ("source", "sglang")),
        (("host", hosts["b"]), ("source", "sglang")),
    ]
    for notes in incidents.values():
        assert {tuple(sorted(_firing(n))) for n in notes} == {("SGLangDecodeOOM",)}
        assert {n["receiver"] for n in notes} == {"pager"}
    for name, host in hosts.items():
        assert re.match(f"1 fatal decode OOM on source sglang on host {re.escape(host)}{AT}", texts[name]), texts
    assert [n for n in hook.snapshot() if n["_path"] != "/pager"] == []
