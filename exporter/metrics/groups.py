"""Which serving group a pod belongs to: one multi-node SGLang server (a LeaderWorkerSet group) runs in several
pods, and each pod's log holds its own ranks' copy of one OOM. `sglang_oom_serving_group_info` maps each
followed pod of such a group to the group, so the alerts and the dashboard's fatal tiles count the OOM once
per group (render/promql.py's `per_group`), however many pods logged it. docs/multi-node.md says why.

Two ways to know the group, the first that answers wins:

1. the pod's labels, read by node discovery: `leaderworkerset.sigs.k8s.io/name` and `…/group-index` (and
   `…/worker-index`, 0 on the leader), which LWS puts on every pod it makes;
2. the LWS naming scheme, only for containers named as in SGLang's LWS examples (`sglang-leader` in
   `<lws>-<group>`, `sglang-worker` in `<lws>-<group>-<worker>`): a plain StatefulSet's `sglang-0` with a
   container named `sglang` is never taken for a group, since its name alone cannot tell.

The values are bounded: a group name (one per server replica) and a worker index (one per node of a server).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

from prometheus_client.core import GaugeMetricFamily

from .names import NAMESPACE

GROUP_INFO = f"{NAMESPACE}_serving_group_info"
GROUP_LABELS = ("namespace", "pod", "group", "worker_index")
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER = "leaderworkerset.sigs.k8s.io/worker-index"
# Container names of SGLang's LeaderWorkerSet examples: the only case where the pod name alone is trusted.
LEADER_CONTAINERS = frozenset({"sglang-leader"})
WORKER_CONTAINERS = frozenset({"sglang-worker"})
_LEADER_NAME = re.compile(r"(?P<group>.+-\d+)")
_WORKER_NAME = re.compile(r"(?P<group>.+-\d+)-(?P<worker>\d+)")
_INDEX = re.compile(r"\d{1,6}")

Group = tuple[str, str]  # (group, worker_index)


def group_from_labels(pod: str, labels: Mapping[str, str] | None) -> Group | None:
    """(`<lws>-<group-index>`, worker index) from LWS's pod labels, or None when the pod is no LWS pod."""
    if not labels:
        return None
    name, index = labels.get(LWS_NAME, ""), labels.get(LWS_GROUP, "")
    if not name or not _INDEX.fullmatch(index):
        return None
    worker = labels.get(LWS_WORKER, "")
    if not _INDEX.fullmatch(worker):
        match = _WORKER_NAME.fullmatch(pod)
        worker = match["worker"] if match and match["group"] == f"{name}-{index}" else "0"
    return f"{name}-{index}", str(int(worker))


def group_from_name(pod: str, container: str) -> Group | None:
    """The group by LWS's naming scheme, trusted only for SGLang's LWS container names (else None)."""
    if container in LEADER_CONTAINERS and _LEADER_NAME.fullmatch(pod):
        return pod, "0"
    match = _WORKER_NAME.fullmatch(pod) if container in WORKER_CONTAINERS else None
    return (match["group"], str(int(match["worker"]))) if match else None


def group_family(
    sources: Iterable[Mapping[str, str]], pod_labels: Callable[[str, str], Mapping[str, str] | None]
) -> GaugeMetricFamily | None:
    """`sglang_oom_serving_group_info{namespace, pod, group, worker_index} 1` for every followed pod of a group.

    sources are the label maps of the sources with series (namespace, pod, container); pod_labels gives the
    pod's labels when node discovery knows them. None when no followed pod is in a group.
    """
    rows: dict[tuple[str, str], Group] = {}
    for source in sources:
        namespace, pod = source.get("namespace", ""), source.get("pod", "")
        if not (namespace and pod):
            continue
        found = group_from_labels(pod, pod_labels(namespace, pod)) or group_from_name(pod, source.get("container", ""))
        if found is not None:
            rows.setdefault((namespace, pod), found)
    if not rows:
        return None
    family = GaugeMetricFamily(
        GROUP_INFO,
        "Followed pods of a multi-node SGLang server (a LeaderWorkerSet group): its group and the pod's worker "
        "index (0: the leader). The value is always 1.",
        labels=list(GROUP_LABELS),
    )
    for (namespace, pod), (group, worker) in sorted(rows.items()):
        family.add_metric([namespace, pod, group, worker], 1.0)
    return family
