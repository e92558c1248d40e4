"""Node discovery against a fake Kubernetes API server on loopback, over TLS with a throwaway CA."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sglang_oom_exporter.config.load import ConfigError
from sglang_oom_exporter.config.model import DiscoverTargetsConfig
from sglang_oom_exporter.sources.http import LABELS, HttpError, Reason
from sglang_oom_exporter.sources.kubeapi import DiscoveryCollector, node_targets
from sglang_oom_exporter.sources.kubeclient import MAX_BODY_BYTES, REASONS, ApiClient, PodEndpoint, endpoints
from sglang_oom_exporter.sources.nodetargets import NodeTargets
from sglang_oom_exporter.sources.scrape import TargetScraper
from tests.support.app import config_from_text
from tests.support.daemon import Daemon, settle
from tests.support.fake_kubeapi import pod
from tests.support.fake_sglang import FakeSGLang
from tests.support.helpers import openssl_cert, wait_until
from tests.support.kubeapi import NODE, api_client
from tests.support.logs import append

ANNOTATION = "sglang-oom-exporter/port"


# ---------------------------------------------------------------------------------------------- the call


def test_lists_the_nodes_pods_with_the_token_and_field_selector(api, tls):
    api.pods = [pod("llm", "llama-0", "10.0.0.5"), pod("llm", "other-node", "10.0.1.9", node="gpu-node-2")]
    doc = api_client(api, tls).list_pods(NODE)
    assert [p["metadata"]["name"] for p in doc["items"]] == ["llama-0"]
    assert api.requests == [("/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-node-1&resourceVersion=0", "Bearer tok-1")]


def test_the_token_is_read_on_every_list(api, tls):
    c = api_client(api, tls)
    c.list_pods(NODE)
    tls[2].write_text("tok-2")  # kubelet rotated the projected token
    c.list_pods(NODE)
    assert [auth for _, auth in api.requests] == ["Bearer tok-1", "Bearer tok-2"]


def test_in_cluster_reads_the_service_env_and_account_dir(tmp_path):
    c = ApiClient.in_cluster({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "6443"}, str(tmp_path))
    assert (c.host, c.port, c.token_file, c.ca_file) == ("10.96.0.1", 6443, f"{tmp_path}/token", f"{tmp_path}/ca.crt")
    with pytest.raises(HttpError) as info:
        ApiClient.in_cluster({}, str(tmp_path)).list_pods(NODE)
    assert LABELS[info.value.reason].discovery == "error"
    assert "KUBERNETES_SERVICE_HOST" in info.value.detail


@pytest.mark.parametrize(
    ("mode", "reason", "detail"),
    [
        ("unauthorized", "http_status", "HTTP 401"),
        ("garbage", "bad_json", "not JSON"),
        ("not_a_list", "bad_json", "no items list"),
    ],
)
def test_bad_answers_are_errors_with_a_reason(api, tls, mode, reason, detail):
    api.mode = mode
    with pytest.raises(HttpError) as info:
        api_client(api, tls).list_pods(NODE)
    assert LABELS[info.value.reason].discovery == reason
    assert detail in info.value.detail


def test_a_runaway_answer_is_refused_unread_at_the_cap(api, tls):
    api.mode = "huge"  # 60 MiB announced
    with pytest.raises(HttpError) as info:
        api_client(api, tls).list_pods(NODE)
    assert LABELS[info.value.reason].discovery == "too_large"
    assert info.value.detail.startswith(f"the pod list of node {NODE} is over the 8 MiB cap, unread (Content-Length")


def test_a_pod_list_past_the_cap_is_refused_and_one_under_it_is_read(api, tls):
    big = {"note": "x" * (100 << 10)}  # 100 KiB of annotations a pod
    api.mode = "ok"
    api.pods = [pod("llm", f"p-{i}", f"10.0.0.{i}", annotations=big) for i in range(90)]  # about 8.8 MiB: over
    with pytest.raises(HttpError) as info:
        api_client(api, tls).list_pods(NODE)
    assert LABELS[info.value.reason].discovery == "too_large"
    assert MAX_BODY_BYTES == 8 << 20
    api.pods = api.pods[:70]  # about 7 MiB: read
    assert len(api_client(api, tls).list_pods(NODE)["items"]) == 70


def test_a_hanging_api_server_times_out(api, tls):
    api.mode = "hang"  # accepts and never answers: only the client's own 0.5 s timeout can end the call
    with pytest.raises(HttpError) as info:
        api_client(api, tls, timeout=0.5).list_pods(NODE)
    assert LABELS[info.value.reason].discovery == "timeout"


def test_tls_is_verified_against_the_ca(api, tls, tmp_path):
    other_ca, _ = openssl_cert(tmp_path, "someone-else")
    _, _, token = tls
    c = ApiClient("127.0.0.1", api.port, token_file=str(token), ca_file=str(other_ca))
    with pytest.raises(HttpError) as info:
        c.list_pods(NODE)
    assert LABELS[info.value.reason].discovery == "tls"
    assert "CERTIFICATE_VERIFY_FAILED" in info.value.detail
    assert api.requests == []  # the token never left the client


def test_missing_token_and_refused_connection(api, tls, tmp_path):
    cert, _, _ = tls
    with pytest.raises(HttpError) as info:
        ApiClient("127.0.0.1", api.port, token_file=str(tmp_path / "nope"), ca_file=str(cert)).list_pods(NODE)
    assert LABELS[info.value.reason].discovery == "no_token"
    port = api.port
    api.stop()
    with pytest.raises(HttpError) as info:
        ApiClient("127.0.0.1", port, token_file=str(tls[2]), ca_file=str(cert)).list_pods(NODE)
    assert LABELS[info.value.reason].discovery == "refused"
    api.start = lambda: api  # already stopped; the fixture's stop() is harmless


# ---------------------------------------------------------------------------------------------- the mapping


def test_endpoints_take_the_annotation_port_or_the_default():
    doc = {
        "items": [
            pod("llm", "a", "10.0.0.5"),
            pod("llm", "b", "10.0.0.6", annotations={ANNOTATION: "31000"}),
            pod("llm", "c", "10.0.0.7", annotations={ANNOTATION: "http"}),  # not a port: the default
            pod("llm", "d", "10.0.0.8", annotations={ANNOTATION: "70000"}),
            pod("llm", "pending", None),
            pod("llm", "done", "10.0.0.9", phase="Succeeded"),
            pod("llm", "v6", "fd00::7"),
            "not a pod",
        ]
    }
    found = endpoints(doc, 30000, ANNOTATION)
    assert found == {
        ("llm", "a"): PodEndpoint("llm", "a", "10.0.0.5", 30000),
        ("llm", "b"): PodEndpoint("llm", "b", "10.0.0.6", 31000),
        ("llm", "c"): PodEndpoint("llm", "c", "10.0.0.7", 30000),
        ("llm", "d"): PodEndpoint("llm", "d", "10.0.0.8", 30000),
        ("llm", "v6"): PodEndpoint("llm", "v6", "fd00::7", 30000),
    }
    assert found[("llm", "b")].url == "http://10.0.0.6:31000"
    assert found[("llm", "v6")].url == "http://[fd00::7]:30000"


def test_refresh_maps_only_followed_pods_and_follows_changes(api, tls):
    api.pods = [pod("llm", "llama-0", "10.0.0.5"), pod("kube-system", "coredns", "10.0.0.2")]
    followed = {("llm", "llama-0"), ("llm", "gone-pod")}
    targets = NodeTargets(api_client(api, tls), NODE, lambda: followed)
    assert targets.refresh_once() is True
    scraper = targets.scraper_for("llm", "llama-0")
    assert scraper is not None
    assert scraper.url == "http://10.0.0.5:30000"
    assert targets.scraper_for("kube-system", "coredns") is None  # not followed: never scraped
    assert targets.scraper_for("llm", "gone-pod") is None  # followed, but not on the node
    assert [s.url for s in targets.scrapers()] == ["http://10.0.0.5:30000"]
    # The pod restarted with a new IP: a new scraper; the old one is gone.
    api.pods = [pod("llm", "llama-0", "10.0.0.6", annotations={ANNOTATION: "31000"})]
    assert targets.refresh_once() is True
    assert targets.scraper_for("llm", "llama-0").url == "http://10.0.0.6:31000"
    assert [s.url for s in targets.scrapers()] == ["http://10.0.0.6:31000"]
    assert targets.refreshes == 2
    assert targets.errors == dict.fromkeys(REASONS, 0)


def test_failures_are_counted_and_keep_the_last_mapping(api, tls):
    api.pods = [pod("llm", "llama-0", "10.0.0.5")]
    targets = NodeTargets(api_client(api, tls, timeout=0.5), NODE, lambda: {("llm", "llama-0")})
    assert targets.refresh_once() is True
    for mode in ("unauthorized", "garbage", "garbage", "hang"):
        api.mode = mode
        assert targets.refresh_once() is False
    assert targets.scraper_for("llm", "llama-0").url == "http://10.0.0.5:30000"
    assert {k: v for k, v in targets.errors.items() if v} == {"http_status": 1, "bad_json": 2, "timeout": 1}
    assert targets.refreshes == 1
    no_node = NodeTargets(api_client(api, tls), "", lambda: set())
    assert no_node.refresh_once() is False
    assert no_node.errors["no_node_name"] == 1


def test_a_bug_in_the_followed_callback_never_escapes(api, tls):
    def broken():
        raise RuntimeError("boom")

    targets = NodeTargets(api_client(api, tls), NODE, broken)
    assert targets.refresh_once() is False
    assert targets.errors["error"] == 1


def test_collector_exports_errors_refreshes_and_targets(api, tls):
    api.pods = [pod("llm", "llama-0", "10.0.0.5")]
    targets = NodeTargets(api_client(api, tls), NODE, lambda: {("llm", "llama-0")})
    targets.refresh_once()
    api.mode = "unauthorized"
    targets.refresh_once()
    registry = CollectorRegistry()
    registry.register(DiscoveryCollector(targets))
    text = generate_latest(registry).decode()
    assert 'sglang_oom_exporter_discovery_errors_total{reason="http_status"} 1.0' in text
    assert 'sglang_oom_exporter_discovery_errors_total{reason="timeout"} 0.0' in text
    assert text.count("sglang_oom_exporter_discovery_errors_total{") == len(REASONS)
    assert "sglang_oom_exporter_discovery_refreshes_total 1.0" in text
    assert "sglang_oom_exporter_discovered_targets 1.0" in text


# ---------------------------------------------------------------------------------------------- threads


def test_started_discovery_scrapes_the_pods_sglang(api, tls):
    with FakeSGLang(metrics_body=b"# TYPE sglang:token_usage gauge\nsglang:token_usage 0.75\n") as sglang:
        port = int(sglang.url.rsplit(":", 1)[1])
        api.pods = [pod("llm", "llama-0", "127.0.0.1", annotations={ANNOTATION: str(port)})]
        targets = NodeTargets(
            api_client(api, tls), NODE, lambda: {("llm", "llama-0")}, interval=0.2, scrape_interval=0.2
        )
        targets.start()
        try:
            wait_until(lambda: (s := targets.scraper_for("llm", "llama-0")) is not None and s.up, timeout=8,
                       what="the discovered target scraped")  # fmt: skip
            scraper = targets.scraper_for("llm", "llama-0")
            assert scraper.snapshot.token_usage == 0.75
            # The pod leaves the node: its scrape thread stops with it.
            api.pods = []
            wait_until(lambda: not (targets.scrapers()), timeout=8, what="the removed pod's scraper to stop")
        finally:
            assert targets.stop() is True


def test_a_restart_gives_known_targets_their_scrape_threads_back(api, tls):
    with FakeSGLang() as sglang:
        port = int(sglang.url.rsplit(":", 1)[1])
        api.pods = [pod("llm", "llama-0", "127.0.0.1", annotations={ANNOTATION: str(port)})]
        targets = NodeTargets(
            api_client(api, tls), NODE, lambda: {("llm", "llama-0")}, interval=60, scrape_interval=0.1
        )
        targets.start()
        try:
            wait_until(lambda: (s := targets.scraper_for("llm", "llama-0")) is not None and s.up, timeout=8,
                       what="the target scraped")  # fmt: skip
            assert targets.stop() is True
            scraper = targets.scraper_for("llm", "llama-0")
            sglang.mode = "http500"
            targets.start()  # the next refresh is 60 s away: only a restarted scrape thread can see the 500
            wait_until(lambda: not (scraper.up), timeout=8, what="the known target scraped (down) after the restart")
            assert scraper.errors_total["http_status"] >= 1
        finally:
            assert targets.stop() is True


# ---------------------------------------------------------------------------------------------- configuration


def test_config_discover_targets_defaults_and_values(tmp_path):
    off = config_from_text(tmp_path, "kubernetes: {logs_root: /var/log/pods}\n")
    assert off.kubernetes.discover_targets is None
    on = config_from_text(tmp_path, "kubernetes: {logs_root: /var/log/pods, discover_targets: {enabled: true}}\n")
    assert on.kubernetes.discover_targets == DiscoverTargetsConfig()
    assert DiscoverTargetsConfig() == DiscoverTargetsConfig(
        30000, "sglang-oom-exporter/port", 30.0, "/var/run/secrets/kubernetes.io/serviceaccount"
    )
    custom = config_from_text(
        tmp_path,
        "scrape_interval: 5s\nkubernetes:\n  logs_root: /var/log/pods\n  discover_targets:\n"
        "    {enabled: true, port: 8000, port_annotation: x/port, interval: 1m, service_account_dir: /sa}\n",
    )
    assert custom.kubernetes.discover_targets == DiscoverTargetsConfig(8000, "x/port", 60.0, "/sa")
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443", "NODE_NAME": "n1"}
    targets = node_targets(
        custom.kubernetes.discover_targets,
        set,
        scrape_interval=custom.scrape_interval,
        scrape_timeout=custom.scrape_timeout,
        env=env,
    )
    assert (targets.node, targets.default_port, targets.port_annotation, targets.interval) == (
        "n1",
        8000,
        "x/port",
        60.0,
    )
    assert (targets.client.host, targets.client.token_file, targets.client.ca_file) == (
        "10.96.0.1",
        "/sa/token",
        "/sa/ca.crt",
    )
    assert targets.scrape_interval == 5.0
    disabled = config_from_text(tmp_path, "kubernetes: {logs_root: /p, discover_targets: {enabled: false, port: 1}}\n")
    assert disabled.kubernetes.discover_targets is None


@pytest.mark.parametrize(
    ("block", "problem"),
    [
        ("{enabled: true, port: 0}", "port 0 is not between 1 and 65535"),
        ("{enabled: true, interval: 30}", "is not a duration with a unit"),
        ("{enabled: true, prot: 1}", "discover_targets.prot: unknown key"),
        ("{enabled: maybe}", "'maybe' is not a boolean"),
        ("[1]", "must be a mapping"),
    ],
)
def test_config_discover_targets_problems(tmp_path, block, problem):
    with pytest.raises(ConfigError) as info:
        config_from_text(tmp_path, f"kubernetes:\n  logs_root: /var/log/pods\n  discover_targets: {block}\n")
    assert problem in str(info.value)


# ---------------------------------------------------------------------------------------------- the real daemon

SCRAPE_DATA = Path(__file__).parent / "data" / "scrape"
INFO = {"chunked_prefill_size": 16384, "max_running_requests": 256, "mem_fraction_static": 0.88,
        "context_length": 32768, "max_total_num_tokens": 61440, "version": "0.5.16"}  # fmt: skip
CRI_PREFILL = "".join(
    f"2026-03-14T22:10:01.{i:09d}Z stderr F {line}\n"
    for i, line in enumerate([
        "[2026-03-14 22:10:01 TP0] Prefill out of memory. Try to lower your batch size.",
        "Try to allocate 16384 tokens.",
        "Available tokens: 6100 (available_size=5980 + evictable_size=120)",
        "",
    ])
)  # fmt: skip


@pytest.mark.e2e
@pytest.mark.slow
def test_serve_in_node_mode_gives_pod_events_their_sglang_context(tmp_path, tls, api, monkeypatch):
    cert, _, token = tls
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text(token.read_text())
    (sa / "ca.crt").write_bytes(cert.read_bytes())
    container = tmp_path / "pods" / "llm_llama-0_0f3c" / "sglang"
    container.mkdir(parents=True)
    log = container / "0.log"
    log.write_text("")
    config = tmp_path / "config.yaml"
    config.write_text(
        f"scrape_interval: 300ms\nkubernetes:\n  logs_root: {tmp_path / 'pods'}\n"
        f"  discover_targets: {{enabled: true, interval: 1s, service_account_dir: {sa}}}\n"
    )
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(api.port))
    monkeypatch.setenv("NODE_NAME", NODE)
    with FakeSGLang(
        metrics_body=(SCRAPE_DATA / "v0.5.16-dp2.prom").read_bytes(), info_body=json.dumps(INFO).encode()
    ) as sglang:
        port = int(sglang.url.rsplit(":", 1)[1])
        api.pods = [
            pod("llm", "llama-0", "127.0.0.1", annotations={ANNOTATION: str(port)}),
            pod("llm", "not-followed", "127.0.0.2"),
        ]
        d = Daemon(["--config", str(config)], str(tmp_path / "state")).start()
        try:

            def metric(name, **labels):
                return d.metrics().get((name, tuple(sorted(labels.items()))))

            wait_until(
                lambda: metric("sglang_oom_exporter_discovered_targets") == 1.0,
                what="one discovered target",
                timeout=15.0,
            )
            # The target series name the pod they serve, so KV near-full pages name it too.
            pod_labels = {"target": sglang.url, "namespace": "llm", "pod": "llama-0"}
            wait_until(
                lambda: metric("sglang_oom_target_up", **pod_labels) == 1.0, what="the pod's SGLang up", timeout=15.0
            )
            wait_until(lambda: metric("sglang_oom_target_server_arg", **pod_labels, arg="chunked_prefill_size")
                     == 16384, what="server args", timeout=15.0)  # fmt: skip
            assert all(auth == "Bearer tok-1" for _, auth in api.requests)
            assert api.requests[0][0] == "/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-node-1&resourceVersion=0"
            append(log, CRI_PREFILL)
            settle(d, 1)
            with urllib.request.urlopen(f"http://127.0.0.1:{d.port}/events", timeout=5) as r:
                (event,) = json.loads(r.read())["events"]
            assert event["labels"] == {"namespace": "llm", "pod": "llama-0", "container": "sglang"}
            assert event["context"]["target"] == sglang.url
            assert event["context"]["server_args"]["chunked_prefill_size"] == 16384
            first = event["suggestions"][0]
            assert (first["flag"], first["current"], first["suggested"]) == ("--chunked-prefill-size", 16384, 4096)
            labels = {"kind": "prefill", "namespace": "llm", "pod": "llama-0", "container": "sglang",
                      "flag": "chunked-prefill-size"}  # fmt: skip
            assert metric("sglang_oom_suggested_flag_value", **labels) == 4096
            # The API answers 401 from now on: counted, and the mapping stays.
            api.mode = "unauthorized"
            wait_until(lambda: (metric("sglang_oom_exporter_discovery_errors_total", reason="http_status") or 0) >= 1,
                     what="a counted 401", timeout=15.0)  # fmt: skip
            assert metric("sglang_oom_exporter_discovered_targets") == 1.0
            assert d.healthy() is True
        finally:
            d.stop()


def test_a_new_followed_pod_is_listed_early_once(api, tls):
    api.pods = [pod("llm", "a", "10.0.0.5"), pod("llm", "b", "10.0.0.6")]
    followed = {("llm", "a"), ("llm", "gone")}
    targets = NodeTargets(api_client(api, tls), NODE, lambda: set(followed))
    assert targets.refresh_once() is True
    assert targets.unmapped_new() is False  # "gone" was followed at the last list: no early list for it
    followed.add(("llm", "b"))
    assert targets.unmapped_new() is True  # b appeared after the list
    assert targets.unmapped_new() is False  # ... and asks for one early list only
    assert targets.refresh_once() is True
    assert targets.scraper_for("llm", "b").url == "http://10.0.0.6:30000"
    assert targets.unmapped_new() is False


def test_started_discovery_maps_a_new_pod_before_the_interval(api, tls):
    api.pods = [pod("llm", "a", "10.0.0.5")]
    followed: set = set()
    fetched: list[str] = []

    def fetch(url, **_kwargs):  # the pod IP is not on this machine: never connect to it
        fetched.append(url)
        raise HttpError(Reason.REFUSED, "test")

    targets = NodeTargets(api_client(api, tls), NODE, lambda: set(followed), interval=600, scrape_interval=600,
                          new_scraper=lambda url: TargetScraper(url, fetch=fetch))  # fmt: skip
    targets.start()
    try:
        wait_until(lambda: not (targets.refreshes < 1), timeout=8, what="no first list")
        followed.add(("llm", "a"))  # the exporter starts following the pod's log
        wait_until(
            lambda: targets.scraper_for("llm", "a") is not None,
            timeout=8,
            what="the new pod waited for the 600 s interval",
        )
        # The mapping becomes visible a moment before the refresh is counted; with a 600 s interval the second
        # list can only be the early one for the new pod.
        wait_until(lambda: not (targets.refreshes < 2), timeout=8, what="the early list was not counted")
        assert targets.refreshes == 2
        wait_until(lambda: bool(fetched), timeout=8, what="the new target was not scraped")
        assert fetched[0] == "http://10.0.0.5:30000/metrics"
    finally:
        assert targets.stop() is True
