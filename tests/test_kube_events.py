"""Kubernetes Events: the poster against a fake API server on loopback, over TLS with a throwaway CA.

The OOMs come from the real pipeline (a TP=2 crash with tracebacks from tests/data/logs); the clock of the
recorder's rate limit is injected, so nothing here waits for time to pass.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sglang_oom_exporter.config.load import ConfigError
from sglang_oom_exporter.config.model import Config, EventsConfig, KubernetesConfig
from sglang_oom_exporter.daemon.app import App
from sglang_oom_exporter.detect.model import OomEvent
from sglang_oom_exporter.events.sink import Context, EventSink
from sglang_oom_exporter.kubeevents import EventsCollector, event_poster
from sglang_oom_exporter.kubeevents.correlate import SPAM_BURST, Correlator
from sglang_oom_exporter.kubeevents.ledger import Ledger
from sglang_oom_exporter.kubeevents.poster import MAX_TRIES, RESULTS, RETRY_AFTER_CAP, EventPoster
from sglang_oom_exporter.kubeevents.text import MESSAGE_LIMIT, message_for, reason_for, runbook_url
from sglang_oom_exporter.render.options import DEFAULT_RUNBOOK_BASE_URL
from sglang_oom_exporter.sources.kubeclient import ApiClient
from tests.support.app import config_from_text
from tests.support.fake_kubeapi import pod
from tests.support.helpers import CATALOG, Clock, load_toml, openssl_cert, scan_bytes, wait_until
from tests.support.kubeapi import NODE, api_client, fake_api

ROOT = "/var/log/pods"
UID = "6f1c1a52-3b8e-4a0e-9d7e-1f2a3b4c5d6e"
POD_LOG = f"{ROOT}/llm_llama-0_{UID}/sglang/0.log"
TP2 = Path(__file__).parent / "data" / "logs" / "whole_crash_0_5_16_cri_tp2.log"
ARGS = {"chunked_prefill_size": 16384, "max_running_requests": 256, "mem_fraction_static": 0.88}


@pytest.fixture
def api(tls):
    with fake_api(tls, pods=[pod("llm", "llama-0", "10.0.0.5", uid=UID)]) as server:
        yield server


def poster(api, tls, **kwargs) -> EventPoster:
    client = api_client(api, tls, timeout=kwargs.pop("timeout", 5.0))
    kwargs.setdefault("retry_delays", ())
    return EventPoster(client, CATALOG, logs_root=ROOT, node=NODE, **kwargs)


def tp2_events(path: str = POD_LOG) -> list[OomEvent]:
    """The TP=2 crash's server-level events (retract, non-fatal decode, fatal prefill), with suggestions."""
    sink = EventSink(CATALOG)
    return [sink.enrich(e, Context(args=ARGS)) for e in scan_bytes(TP2.read_bytes(), name=path)]


def fatal(path: str = POD_LOG) -> OomEvent:
    (event,) = [e for e in tp2_events(path) if e.fatal]
    return event


def writes(api) -> list[tuple[str, str, dict]]:
    return [(m, p, b) for m, p, _, b in api.calls if m != "GET"]


def nonzero(p: EventPoster) -> dict[str, int]:
    return {k: v for k, v in p.counts().items() if v}


# ---------------------------------------------------------------------------------------------- one Event


def test_a_tp2_oom_with_tracebacks_gives_exactly_one_warning_event_on_its_pod(api, tls):
    events = tp2_events()
    assert [(e.kind, e.fatal, e.ranks) for e in events] == [
        ("retract", False, ("TP0", "TP1")), ("decode", False, ("TP0", "TP1")), ("prefill", True, ("TP0", "TP1")),
    ]  # fmt: skip
    wall = Clock()
    p = poster(api, tls, wall=wall)
    for e in events:
        p.offer(e, {"namespace": "llm", "pod": "llama-0", "container": "sglang"})
    assert p.run_pending() == 1  # the non-fatal ones are not even queued
    assert nonzero(p) == {"created": 1}
    (method, path, body), = writes(api)  # fmt: skip
    assert (method, path) == ("POST", "/api/v1/namespaces/llm/events")
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "llm", "name": "llama-0",
                                      "uid": UID, "fieldPath": "spec.containers{sglang}"}  # fmt: skip
    assert body["metadata"]["namespace"] == "llm"
    assert body["metadata"]["name"].startswith("llama-0.")
    assert (body["type"], body["reason"], body["count"]) == ("Warning", "SGLangPrefillOOM", 1)
    assert (body["reportingComponent"], body["reportingInstance"]) == ("sglang-oom-exporter", NODE)
    assert body["source"] == {"component": "sglang-oom-exporter", "host": NODE}
    assert body["firstTimestamp"] == body["lastTimestamp"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall.now))
    message = body["message"]
    (s,) = events[-1].suggestions
    assert message == (
        f"{CATALOG.kind('prefill').title}: asked for 16384 KV tokens while 9000 were available; state from the log "
        "line at 2026-03-17 06:04:40: 402 running requests, token usage 0.97 (ranks TP0, TP1). "
        f"Suggested: {s.flag} from 16384 to {s.suggested:g}. {DEFAULT_RUNBOOK_BASE_URL}/sglangprefilloom.md"
    )
    assert len(message.encode()) < 1024
    assert api.calls[0][:3] == ("GET", "/api/v1/namespaces/llm/pods/llama-0", "Bearer tok-1")
    assert all(auth == "Bearer tok-1" for _, _, auth, _ in api.calls)
    assert api.events[("llm", body["metadata"]["name"])]["count"] == 1


def test_non_fatal_kinds_get_events_only_when_configured(api, tls):
    p = poster(api, tls, nonfatal=True)
    for e in tp2_events():
        p.offer(e)
    assert p.run_pending() == 3
    reasons = [b["reason"] for _, _, b in writes(api)]
    expected = [reason_for(CATALOG, e) for e in tp2_events()]
    assert reasons == expected
    assert expected[0] == "SGLangKVCacheRetractionsHigh"  # the retraction kind's alert
    assert expected[1] == "SGLangDecodeRequestsAborted"  # the decode kind's non-fatal alert
    assert nonzero(p) == {"created": 3}


def test_a_non_memory_crash_gives_one_warning_event_that_says_what_it_died_of(api, tls):
    log = Path(__file__).parent / "data" / "logs" / "crash_non_memory_tp2_0_5_23.log"
    sink = EventSink(CATALOG)
    (event,) = [sink.enrich(e) for e in scan_bytes(log.read_bytes(), name=POD_LOG)]
    p = poster(api, tls)
    p.offer(event, {"namespace": "llm", "pod": "llama-0", "container": "sglang"})
    assert p.run_pending() == 1
    ((_, _, body),) = writes(api)
    assert (body["type"], body["reason"], body["count"]) == ("Warning", "SGLangCrashed", 1)
    assert body["message"] == (
        f"{CATALOG.crash.title}: died of RuntimeError: generation result has an uncopied auxiliary output after its "
        "device-to-host copy was scheduled (ranks TP0, TP1). "
        f"Fix: {CATALOG.crash.summary} {DEFAULT_RUNBOOK_BASE_URL}/sglangcrashed.md"
    )


def test_a_plain_file_has_no_pod_and_is_counted(api, tls):
    p = poster(api, tls)
    p.offer(fatal("/var/log/sglang/server.log"))
    assert p.run_pending() == 0
    assert nonzero(p) == {"no_pod": 1}
    assert api.calls == []


def test_the_message_stays_under_a_kilobyte_and_keeps_the_runbook(api, tls):
    event = fatal()
    long = replace(event, ranks=tuple(f"DP{i} TP{i}" for i in range(300)))
    url = runbook_url("https://runbooks.example.com/sglang", "SGLangPrefillOOM")
    message = message_for(CATALOG, long, url)
    assert len(message.encode()) <= MESSAGE_LIMIT
    assert message.endswith(f"... {url}") or message.endswith(f". {url}")
    assert url == "https://runbooks.example.com/sglang/sglangprefilloom.md"
    no_advice = replace(event, suggestions=())
    assert f"Fix: {CATALOG.kind('prefill').summary}" in message_for(CATALOG, no_advice, url)


# ---------------------------------------------------------------------------------------------- repeats


def test_ten_ooms_in_a_minute_on_one_pod_make_one_event_with_count_ten(api, tls):
    wall = Clock()
    p = poster(api, tls, wall=wall)
    base = fatal()
    for i in range(10):
        p.offer(replace(base, offset=base.offset + i, location=f"{POD_LOG}:{100 + i}"))
        wall.now += 6.0
    assert p.run_pending() == 10
    assert nonzero(p) == {"created": 1, "updated": 9}
    calls = writes(api)
    assert [m for m, _, _ in calls] == ["POST"] + ["PATCH"] * 9
    (name, stored), = api.events.items()  # fmt: skip
    assert stored["count"] == 10
    assert [b["count"] for _, _, b in calls[1:]] == list(range(2, 11))
    assert {p_ for _, p_, _ in calls[1:]} == {f"/api/v1/namespaces/llm/events/{name[1]}"}
    assert stored["lastTimestamp"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(1000.0 + 9 * 6.0))
    assert stored["firstTimestamp"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(1000.0))
    assert [m for m, _, _, _ in api.calls].count("GET") == 1  # the pod is looked up once


def test_past_the_burst_the_rate_limit_holds_until_a_token_refills_and_the_count_catches_up(api, tls):
    wall = Clock()
    p = poster(api, tls, wall=wall)
    base = fatal()
    for i in range(SPAM_BURST + 5):  # a burst within one second: the bucket's 25 tokens, then none
        p.offer(replace(base, offset=base.offset + i))
    p.run_pending()
    assert nonzero(p) == {"created": 1, "updated": SPAM_BURST - 1, "rate_limited": 5}
    assert len(writes(api)) == SPAM_BURST
    wall.now += 150.0  # refilled at 1 token per 300 s: half a token
    p.offer(replace(base, offset=base.offset + 100))
    p.run_pending()
    assert p.counts()["rate_limited"] == 6
    wall.now += 151.0  # a whole token
    p.offer(replace(base, offset=base.offset + 101))
    p.run_pending()
    (stored,) = api.events.values()
    assert stored["count"] == SPAM_BURST + 7  # every occurrence, the rate-limited ones included
    assert p.counts()["updated"] == SPAM_BURST


def test_an_expired_event_is_created_again_with_its_count(api, tls):
    p = poster(api, tls)
    base = fatal()
    p.offer(base)
    p.run_pending()
    api.events.clear()  # the API server's event TTL (1 h) ran out
    p.offer(replace(base, offset=base.offset + 1))
    p.run_pending()
    assert [m for m, _, _ in writes(api)] == ["POST", "PATCH", "POST"]
    (stored,) = api.events.values()
    assert stored["count"] == 2
    assert nonzero(p) == {"created": 2}


def test_correlator_keys_on_object_and_reason_and_limits_per_object():
    c = Correlator(burst=2, qps=1.0)
    assert c.observe("uid-a", "R1", "a.1", 0.0).action == "create"
    assert c.observe("uid-a", "R2", "a.2", 0.0).action == "create"  # another reason: another Event
    skipped = c.observe("uid-a", "R1", "a.3", 0.0)
    assert (skipped.action, skipped.name, skipped.count) == ("skip", "a.1", 2)  # one bucket per object
    assert c.observe("uid-b", "R1", "b.1", 0.0).action == "create"
    later = c.observe("uid-a", "R1", "a.4", 1.0)
    assert (later.action, later.name, later.count, later.first_timestamp) == ("patch", "a.1", 3, 0.0)


# ---------------------------------------------------------------------------------------------- never a replay


def test_an_oom_taken_before_a_restart_never_gets_a_second_event(api, tls, tmp_path):
    event = fatal()
    first = poster(api, tls, ledger=Ledger(str(tmp_path)))
    first.offer(event)
    first.run_pending()
    assert json.loads((tmp_path / "k8s-events.json").read_text())["version"] == 1
    second = poster(api, tls, ledger=Ledger(str(tmp_path)))  # a new process, the same state directory
    second.offer(event)  # counted again: it came after the last state save
    second.offer(replace(event, offset=event.offset + 500, location=f"{POD_LOG}:999"))  # a new one
    second.run_pending()
    assert nonzero(second) == {"replayed": 1, "created": 1}
    assert [m for m, _, _ in writes(api)] == ["POST", "POST"]


def test_a_corrupt_ledger_is_a_warning_and_a_fresh_start(tmp_path, caplog):
    (tmp_path / "k8s-events.json").write_text("{not json")
    with caplog.at_level(logging.WARNING):
        ledger = Ledger(str(tmp_path))
    assert ledger.errors == 1
    assert "ignoring" in caplog.text
    assert ledger.take("k") is True
    assert "k" in Ledger(str(tmp_path))


@pytest.mark.parametrize(
    ("text", "kept"),
    [("[" * 100_000 + "]" * 100_000, []), ('{"version": 1, "keys": ["a", 1, {"b": 2}, null, "c"]}', ["a", "c"])],
    ids=["nested-past-the-recursion-limit", "keys-that-are-no-string"],
)
def test_a_hostile_ledger_costs_itself_never_the_start(tmp_path, text, kept):
    (tmp_path / "k8s-events.json").write_text(text)
    ledger = Ledger(str(tmp_path))
    assert ledger.errors == 1
    assert [k for k in ("a", "c") if k in ledger] == kept
    assert "1" not in ledger


# ---------------------------------------------------------------------------------------------- failures


@pytest.mark.parametrize(
    ("mode", "result"),
    [("unauthorized", "unauthorized"), ("forbidden", "forbidden"), ("conflict", "conflict"), ("invalid", "invalid")],
)
def test_an_answer_that_refuses_the_write_is_counted_and_never_retried(api, tls, mode, result):
    api.mode = mode
    p = poster(api, tls, retry_delays=(0.0, 0.0))
    p.offer(fatal())
    p.run_pending()
    assert nonzero(p) == {result: 1}
    assert len(writes(api)) == 1


class Waits:
    """The poster's retry wait, recorded instead of waited (a settable clock: no test sleeps)."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> bool:
        self.delays.append(seconds)
        return False  # not ended by a shutdown


@pytest.mark.parametrize(("status", "after"), [(429, "1"), (500, "2"), (503, "0"), (504, "3")])
def test_a_busy_answer_with_retry_after_is_tried_again_as_client_go_does(api, tls, status, after):
    """API Priority and Fairness answers Events with 429 and Retry-After exactly when a cluster is busy."""
    api.busy = [(status, after), (status, after)]
    waits = Waits()
    p = poster(api, tls, wait=waits)
    p.offer(fatal())
    p.run_pending()
    assert nonzero(p) == {"created": 1}
    assert [m for m, _, _ in writes(api)] == ["POST", "POST", "POST"]
    assert waits.delays == [float(after), float(after)]
    assert p.retries == 2
    (stored,) = api.events.values()
    assert stored["count"] == 1


def test_busy_answers_are_tried_ten_times_in_all_then_counted(api, tls):
    api.busy = [(429, "1")] * 12
    waits = Waits()
    p = poster(api, tls, wait=waits)
    p.offer(fatal())
    p.run_pending()
    assert nonzero(p) == {"http_error": 1}
    assert len(writes(api)) == MAX_TRIES == 10  # client-go's maxRetries
    assert waits.delays == [1.0] * 9
    assert len(api.busy) == 2


def test_a_long_retry_after_is_waited_at_most_the_cap(api, tls):
    api.busy = [(429, "3600")]
    waits = Waits()
    p = poster(api, tls, wait=waits)
    p.offer(fatal())
    p.run_pending()
    assert nonzero(p) == {"created": 1}
    assert waits.delays == [RETRY_AFTER_CAP]


@pytest.mark.parametrize(("status", "after"), [(500, None), (429, None), (503, "soon"), (400, "1"), (404, "1")])
def test_an_answer_without_a_usable_retry_after_is_final(api, tls, status, after):
    api.busy = [(status, after)]
    waits = Waits()
    p = poster(api, tls, wait=waits)
    p.offer(fatal())
    p.run_pending()
    assert len(writes(api)) == 1
    assert waits.delays == []
    assert nonzero(p) == {{404: "pod_gone"}.get(status, "http_error"): 1}


def test_a_shutdown_ends_a_retry_wait(api, tls):
    api.busy = [(429, "1")] * 3
    halted = []

    def wait(seconds: float) -> bool:
        halted.append(seconds)
        return True  # stop() set the halt while the poster waited

    p = poster(api, tls, wait=wait)
    p.offer(fatal())
    p.run_pending()
    assert halted == [1.0]
    assert len(writes(api)) == 1
    assert nonzero(p) == {"http_error": 1}


def test_a_throttled_api_server_never_delays_counting(api, tls):
    """While the poster's thread waits out a Retry-After, offer() (the counting thread) only queues."""
    api.busy = [(429, "1")]
    waiting, release = threading.Event(), threading.Event()

    def wait(seconds: float) -> bool:
        waiting.set()
        release.wait(30)  # the poster holds here until the test has offered everything
        return False

    p = poster(api, tls, wait=wait)
    p.start()
    try:
        base = fatal()
        p.offer(base)
        wait_until(waiting.is_set, timeout=10, what="the poster to wait out the Retry-After")
        for i in range(1, 50):
            p.offer(replace(base, offset=base.offset + i))  # returns while the poster is held: never blocks
        assert sum(p.counts().values()) == 0
        release.set()
        wait_until(lambda: sum(p.counts().values()) == 50, timeout=30, what="every OOM handled")
    finally:
        release.set()
        assert p.stop(timeout=10) is True
    assert p.retries == 1
    assert p.counts()["created"] + p.counts()["updated"] + p.counts()["rate_limited"] == 50


def test_a_vanished_pod_is_dropped_and_counted(api, tls):
    api.pods = []
    p = poster(api, tls)
    p.offer(fatal())
    p.run_pending()
    assert nonzero(p) == {"pod_gone": 1}
    assert writes(api) == []


def test_a_replaced_pod_puts_the_event_on_its_owner(api, tls):
    owner = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "llama", "uid": "sts-uid-1"}
    api.pods = [pod("llm", "llama-0", "10.0.0.9", uid="a-new-uid", owner=owner)]  # LWS recreated the group
    p = poster(api, tls)
    p.offer(fatal())
    p.run_pending()
    assert nonzero(p) == {"owner": 1}
    ((_, _, body),) = writes(api)
    assert body["involvedObject"] == {**owner, "namespace": "llm"}
    assert body["message"].startswith(f"Pod llama-0 (uid {UID}) is gone. ")


def test_failures_are_logged_once_per_streak(api, tls, caplog):
    api.mode = "forbidden"
    p = poster(api, tls)
    base = fatal()
    with caplog.at_level(logging.DEBUG, logger="sglang_oom_exporter.kubeevents.poster"):
        for i in range(3):
            p.offer(replace(base, offset=base.offset + i))
        p.run_pending()
        api.mode = "ok"
        p.offer(replace(base, offset=base.offset + 10))
        p.run_pending()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "result=forbidden" in warnings[0].getMessage()
    assert any("writing Events again" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)
    # As client-go: the refused occurrences still count; the next one patches (404: never written) and creates.
    assert nonzero(p) == {"forbidden": 3, "created": 1}
    assert [m for m, _, _ in writes(api)] == ["POST", "PATCH", "PATCH", "PATCH", "POST"]
    (stored,) = api.events.values()
    assert stored["count"] == 4


def test_tls_is_verified_against_the_ca_and_the_token_never_leaves(api, tls, tmp_path):
    other_ca, _ = openssl_cert(tmp_path, "someone-else")
    _, _, token = tls
    client = ApiClient("127.0.0.1", api.port, token_file=str(token), ca_file=str(other_ca))
    p = EventPoster(client, CATALOG, logs_root=ROOT, node=NODE, retry_delays=())
    p.offer(fatal())
    p.run_pending()
    assert nonzero(p) == {"tls": 1}
    assert api.calls == []


def test_a_refused_connection_is_tried_three_times_then_dropped(api, tls):
    p = poster(api, tls, retry_delays=(0.0, 0.0))
    api.stop()
    p.offer(fatal())
    p.run_pending()
    assert nonzero(p) == {"unreachable": 1}
    api.start = lambda: api  # already stopped; the fixture's stop() is harmless


def test_a_hanging_api_server_never_delays_counting(api, tls):
    api.mode = "hang"
    p = poster(api, tls, timeout=0.3)
    callers: set[int] = set()
    request = p.client.request

    def recorded(*args, **kwargs):
        callers.add(threading.get_ident())
        return request(*args, **kwargs)

    p.client.request = recorded  # type: ignore[method-assign]
    p.start()
    try:
        base = fatal()
        for i in range(5):
            p.offer(replace(base, offset=base.offset + i))
        wait_until(lambda: p.counts()["timeout"] >= 1, timeout=10, what="a timeout counted")
    finally:
        assert p.stop(timeout=10) is True
    assert threading.get_ident() not in callers  # offer() only queues: the API is called from the poster's thread
    assert len(callers) == 1
    counts = p.counts()
    assert counts["timeout"] + counts["shutdown"] + counts["updated"] + counts["created"] == 5
    assert counts["timeout"] >= 1


def test_a_full_queue_drops_and_counts(api, tls):
    p = poster(api, tls, queue_size=2)
    base = fatal()
    for i in range(3):
        p.offer(replace(base, offset=base.offset + i))
    assert nonzero(p) == {"queue_full": 1}
    assert p.stop() is True  # never started: what is queued is counted as shut down
    assert nonzero(p) == {"queue_full": 1, "shutdown": 2}


def test_the_collector_zero_initialises_every_result(api, tls):
    p = poster(api, tls)
    p.offer(fatal())
    p.run_pending()
    registry = CollectorRegistry()
    registry.register(EventsCollector(p))
    text = generate_latest(registry).decode()
    assert 'sglang_oom_exporter_k8s_events_total{result="created"} 1.0' in text
    assert 'sglang_oom_exporter_k8s_events_total{result="forbidden"} 0.0' in text
    assert text.count("sglang_oom_exporter_k8s_events_total{") == len(RESULTS)


def test_the_poster_thread_posts_what_is_offered(api, tls):
    p = poster(api, tls)
    p.start()
    try:
        p.offer(fatal())
        wait_until(lambda: p.counts()["created"] >= 1, timeout=10, what="the event posted")
    finally:
        assert p.stop() is True
    assert [t.name for t in threading.enumerate() if t.name == "k8s events"] == []


# ---------------------------------------------------------------------------------------------- configuration


def test_config_events_defaults_and_values(tmp_path):
    off = config_from_text(tmp_path, "kubernetes: {logs_root: /var/log/pods}\n")
    assert off.kubernetes.events is None
    assert event_poster(off, CATALOG) is None
    on = config_from_text(tmp_path, "kubernetes: {logs_root: /var/log/pods, events: {enabled: true}}\n")
    assert on.kubernetes.events == EventsConfig("/var/run/secrets/kubernetes.io/serviceaccount", False, "")
    custom = config_from_text(
        tmp_path,
        f"state_dir: {tmp_path}/state\nkubernetes:\n  logs_root: /var/log/pods\n  events:\n"
        "    {enabled: true, service_account_dir: /sa, nonfatal: true, runbook_base_url: 'https://rb.example/x/'}\n",
    )
    assert custom.kubernetes.events == EventsConfig("/sa", True, "https://rb.example/x")
    p = event_poster(custom, CATALOG, env={"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
                                           "NODE_NAME": "n1"})  # fmt: skip
    assert (p.client.host, p.client.port, p.client.token_file, p.client.ca_file) == (
        "10.96.0.1", 443, "/sa/token", "/sa/ca.crt",
    )  # fmt: skip
    assert (p.node, p.nonfatal, p.runbook_base, p.logs_root) == ("n1", True, "https://rb.example/x", "/var/log/pods")
    assert p.ledger.path == f"{tmp_path}/state/k8s-events.json"
    disabled = config_from_text(tmp_path, "kubernetes: {logs_root: /p, events: {enabled: false, nonfatal: true}}\n")
    assert disabled.kubernetes.events is None


@pytest.mark.parametrize(
    ("block", "problem"),
    [
        ("{enabled: maybe}", "'maybe' is not a boolean"),
        ("{enabled: true, nonfatl: true}", "events.nonfatl: unknown key"),
        ("{enabled: true, runbook_base_url: ftp://x}", "is not an http(s) URL"),
        ("[1]", "must be a mapping"),
    ],
)
def test_config_events_problems(tmp_path, block, problem):
    with pytest.raises(ConfigError) as info:
        config_from_text(tmp_path, f"kubernetes:\n  logs_root: /var/log/pods\n  events: {block}\n")
    assert problem in str(info.value)


# ---------------------------------------------------------------------------------------------- the daemon's wiring


def test_the_app_offers_live_events_and_a_reload_keeps_the_events_setting(tmp_path, api, tls, monkeypatch):
    cert, _, token = tls
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text(token.read_text())
    (sa / "ca.crt").write_bytes(cert.read_bytes())
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(api.port))
    k = KubernetesConfig(str(tmp_path / "pods"), events=EventsConfig(service_account_dir=str(sa)))
    app = App(Config(kubernetes=k, state_dir=str(tmp_path / "state")), CATALOG)
    assert app.events_poster is not None
    assert app.events_poster in app.services()
    event = fatal(f"{tmp_path / 'pods'}/llm_llama-0_{UID}/sglang/0.log")
    app.sink.record(event, ("llm", "llama-0", "sglang"), {"namespace": "llm", "pod": "llama-0", "container": "sglang"})
    app.sink.record(replace(event, offset=1), ("llm", "llama-0", "sglang"), {}, live=False)  # history: no Event
    assert app.events_poster.run_pending() == 1
    assert nonzero(app.events_poster) == {"created": 1}
    assert app.events_poster.ledger.path == str(tmp_path / "state" / "k8s-events.json")
    off = Config(kubernetes=replace(k, events=None), state_dir=str(tmp_path / "state"))
    assert app.reload(off, CATALOG) == "partial"
    assert app.config.kubernetes.events == k.events


def test_every_subpackage_is_packaged():
    """pyproject lists packages by name: one missing from the list is missing from the wheel and the image."""
    root = Path(__file__).resolve().parent.parent
    listed = set(load_toml(root / "pyproject.toml")["tool"]["setuptools"]["packages"])
    found = {"sglang_oom_exporter"} | {
        f"sglang_oom_exporter.{d.name}" for d in (root / "exporter").iterdir() if (d / "__init__.py").is_file()
    }
    assert found == listed
