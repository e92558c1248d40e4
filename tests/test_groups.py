"""Serving groups of multi-node SGLang servers (metrics/groups.py): which followed pods form one LeaderWorkerSet
group, from LWS's pod labels (node discovery) or, for SGLang's LWS container names only, from the pod names."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from sglang_oom_exporter.metrics.collector import ExporterCollector
from sglang_oom_exporter.metrics.events import EventCounts
from sglang_oom_exporter.metrics.groups import (
    LWS_GROUP,
    LWS_NAME,
    LWS_WORKER,
    group_family,
    group_from_labels,
    group_from_name,
)
from sglang_oom_exporter.sources.kubeclient import lws_labels
from sglang_oom_exporter.sources.nodetargets import NodeTargets
from tests.support.fake_kubeapi import pod
from tests.support.kubeapi import NODE, api_client

LEADER = {LWS_NAME: "sglang", LWS_GROUP: "0", LWS_WORKER: "0"}
WORKER = {LWS_NAME: "sglang", LWS_GROUP: "0", LWS_WORKER: "1"}


def test_names_count_only_for_sglangs_lws_container_names():
    assert group_from_name("sglang-0", "sglang-leader") == ("sglang-0", "0")
    assert group_from_name("sglang-0-1", "sglang-worker") == ("sglang-0", "1")
    assert group_from_name("llama-70b-3-12", "sglang-worker") == ("llama-70b-3", "12")
    # A plain StatefulSet (or anything else): its names alone say nothing about groups.
    assert group_from_name("sglang-0", "sglang") is None
    assert group_from_name("sglang-0-1", "sglang") is None
    # The right container name on a name outside the scheme: no guess.
    assert group_from_name("sglang-abcde", "sglang-leader") is None
    assert group_from_name("sglang-0", "sglang-worker") is None


def test_labels_win_and_need_a_name_and_a_numeric_group_index():
    assert group_from_labels("x", LEADER) == ("sglang-0", "0")
    assert group_from_labels("x", WORKER) == ("sglang-0", "1")
    # LWS without the worker-index label (older releases): the worker index from the name, else the leader's.
    assert group_from_labels("sglang-0-2", {LWS_NAME: "sglang", LWS_GROUP: "0"}) == ("sglang-0", "2")
    assert group_from_labels("sglang-0", {LWS_NAME: "sglang", LWS_GROUP: "0"}) == ("sglang-0", "0")
    assert group_from_labels("x", {LWS_NAME: "sglang", LWS_GROUP: "zero"}) is None
    assert group_from_labels("x", {LWS_GROUP: "0"}) is None
    assert group_from_labels("x", {}) is None
    assert group_from_labels("x", None) is None


def test_the_info_family_lists_group_pods_only_labels_first():
    sources = [
        {"namespace": "llm", "pod": "sglang-0", "container": "sglang-leader"},
        {"namespace": "llm", "pod": "sglang-0-1", "container": "sglang-worker"},
        {"namespace": "llm", "pod": "plain-0", "container": "sglang"},  # a StatefulSet pod: no group
        {"namespace": "llm", "pod": "renamed", "container": "main"},  # LWS labels from discovery
        {"source": "server"},  # a plain file
    ]
    labels = {("llm", "renamed"): {LWS_NAME: "big", LWS_GROUP: "3", LWS_WORKER: "2"}}
    family = group_family(sources, lambda ns, p: labels.get((ns, p)))
    assert family is not None
    assert [(s.labels, s.value) for s in family.samples] == [
        ({"namespace": "llm", "pod": "renamed", "group": "big-3", "worker_index": "2"}, 1.0),
        ({"namespace": "llm", "pod": "sglang-0", "group": "sglang-0", "worker_index": "0"}, 1.0),
        ({"namespace": "llm", "pod": "sglang-0-1", "group": "sglang-0", "worker_index": "1"}, 1.0),
    ]
    assert group_family(sources[2:3], lambda _ns, _p: None) is None


def test_the_collector_serves_the_family_on_metrics():
    counts = EventCounts(["prefill"], ("namespace", "pod", "container"), None)
    sources = [{"namespace": "llm", "pod": "sglang-0", "container": "sglang-leader"}]
    registry = CollectorRegistry()
    registry.register(ExporterCollector(counts, groups=lambda: group_family(sources, lambda _ns, _p: None)))
    page = generate_latest(registry).decode()
    assert 'sglang_oom_serving_group_info{group="sglang-0",namespace="llm",pod="sglang-0",worker_index="0"} 1.0' in page
    assert page.count("sglang_oom_serving_group_info{") == 1


def test_discovery_reads_lws_labels_and_keeps_them_while_the_pod_is_followed(api, tls):
    api.pods = [
        pod("llm", "sglang-0", "10.0.0.5", labels={**LEADER, "app": "x"}),
        pod("llm", "sglang-0-1", "10.0.0.6", labels=WORKER),
        pod("llm", "plain-0", "10.0.0.7", labels={"app": "plain"}),
        pod("llm", "unfollowed-0", "10.0.0.8", labels=LEADER),
    ]
    assert lws_labels({"items": api.pods}) == {("llm", "sglang-0"): LEADER, ("llm", "sglang-0-1"): WORKER,
                                                ("llm", "unfollowed-0"): LEADER}  # fmt: skip
    followed = {("llm", "sglang-0"), ("llm", "sglang-0-1"), ("llm", "plain-0")}
    targets = NodeTargets(api_client(api, tls), NODE, lambda: followed)
    assert targets.refresh_once() is True
    assert targets.pod_labels("llm", "sglang-0") == LEADER
    assert targets.pod_labels("llm", "sglang-0-1") == WORKER
    assert targets.pod_labels("llm", "plain-0") is None
    assert targets.pod_labels("llm", "unfollowed-0") is None
    # The group is recreated: the API no longer lists the worker, whose logs are still read; once they are
    # no longer followed its labels go too.
    api.pods = api.pods[:1]
    assert targets.refresh_once() is True
    assert targets.pod_labels("llm", "sglang-0-1") == WORKER
    followed.discard(("llm", "sglang-0-1"))
    assert targets.refresh_once() is True
    assert targets.pod_labels("llm", "sglang-0-1") is None
    assert targets.pod_labels("llm", "sglang-0") == LEADER
