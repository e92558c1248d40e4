"""The Prometheus scrape config the Prometheus Operator generates from a ServiceMonitor or a PodMonitor, for
end-to-end label tests without Kubernetes.

A transcription of prometheus-operator's pkg/prometheus/promcfg.go (generateServiceMonitorConfig,
generatePodMonitorConfig, initRelabelings, generateRunningFilter, generateRelabelConfig and the sharding
relabelings of appendShardingRelabelingWithLabel, read at commit 6adcebc5076c of 2026-08-08), for the fields
this chart's monitors use: selector.matchLabels, one endpoint with `port`, `path`, `honorLabels`,
`relabelings`, and `jobLabel`. Two substitutions, both outside the relabeling:

- kubernetes_sd_configs -> file_sd_configs: a test writes the targets with the `__meta_kubernetes_*` labels
  the Kubernetes SD would attach (meta_for_endpoint / meta_for_pod), so the relabeling runs on the same input;
- scrape_interval and scrape_timeout are the test's (1s), not the monitor's 30s.

Sharding: one shard, so `$(SHARD)` (the operator's config reloader substitutes it) is "0".
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_UNSAFE = re.compile(r"[^a-zA-Z0-9_]")


def sanitize(name: str) -> str:
    """The operator's sanitizeLabelName: every character outside [a-zA-Z0-9_] becomes `_`."""
    return _UNSAFE.sub("_", name)


def _user_relabelings(relabelings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """generateRelabelConfig: the CRD's camelCase fields in Prometheus form, action lower-cased."""
    out = []
    for c in relabelings:
        r: dict[str, Any] = {}
        if c.get("sourceLabels"):
            r["source_labels"] = list(c["sourceLabels"])
        if "separator" in c:
            r["separator"] = c["separator"]
        if c.get("targetLabel"):
            r["target_label"] = c["targetLabel"]
        if c.get("regex"):
            r["regex"] = c["regex"]
        if c.get("modulus"):
            r["modulus"] = c["modulus"]
        if "replacement" in c:
            r["replacement"] = c["replacement"]
        if c.get("action"):
            r["action"] = str(c["action"]).lower()
        out.append(r)
    return out


def _sharding() -> list[dict[str, Any]]:
    return [
        {"source_labels": ["__address__", "__tmp_hash"], "target_label": "__tmp_hash", "regex": "(.+);",
         "replacement": "$1", "action": "replace"},
        {"source_labels": ["__tmp_hash"], "target_label": "__tmp_hash", "modulus": 1, "action": "hashmod"},
        {"source_labels": ["__tmp_hash", "__tmp_disable_sharding"], "regex": "0;|.+;.+", "action": "keep"},
    ]  # fmt: skip


_RUNNING = {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"}


def service_monitor_config(sm: dict[str, Any], sd_file: Path, interval: str = "1s") -> dict[str, Any]:
    """generateServiceMonitorConfig for endpoint 0 (role endpoints), targets from sd_file."""
    meta, spec = sm["metadata"], sm["spec"]
    (ep,) = spec["endpoints"]
    r: list[dict[str, Any]] = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
    for k in sorted(spec["selector"].get("matchLabels", {})):
        r.append({"action": "keep", "source_labels": [f"__meta_kubernetes_service_label_{sanitize(k)}",
                                                     f"__meta_kubernetes_service_labelpresent_{sanitize(k)}"],
                  "regex": f"({spec['selector']['matchLabels'][k]});true"})  # fmt: skip
    r.append({"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": ep["port"]})
    target = ["__meta_kubernetes_endpoint_address_target_kind", "__meta_kubernetes_endpoint_address_target_name"]
    r += [
        {"source_labels": target, "separator": ";", "regex": "Node;(.*)", "replacement": "${1}", "target_label": "node"},
        {"source_labels": target, "separator": ";", "regex": "Pod;(.*)", "replacement": "${1}", "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        _RUNNING,
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"},
    ]  # fmt: skip
    if spec.get("jobLabel"):
        r.append({"source_labels": [f"__meta_kubernetes_service_label_{sanitize(spec['jobLabel'])}"],
                  "target_label": "job", "regex": "(.+)", "replacement": "${1}"})  # fmt: skip
    r.append({"target_label": "endpoint", "replacement": ep["port"]})
    r += _user_relabelings(ep.get("relabelings", []))
    r += _sharding()
    return _config(f"serviceMonitor/{meta['namespace']}/{meta['name']}/0", ep, r, sd_file, interval)


def pod_monitor_config(pm: dict[str, Any], sd_file: Path, interval: str = "1s") -> dict[str, Any]:
    """generatePodMonitorConfig for endpoint 0 (role pod), targets from sd_file."""
    meta, spec = pm["metadata"], pm["spec"]
    (ep,) = spec["podMetricsEndpoints"]
    r: list[dict[str, Any]] = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}, _RUNNING]
    for k in sorted(spec["selector"].get("matchLabels", {})):
        r.append({"action": "keep", "source_labels": [f"__meta_kubernetes_pod_label_{sanitize(k)}",
                                                     f"__meta_kubernetes_pod_labelpresent_{sanitize(k)}"],
                  "regex": f"({spec['selector']['matchLabels'][k]});true"})  # fmt: skip
    r += [
        {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": ep["port"]},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"},
    ]
    if spec.get("jobLabel"):
        r.append({"source_labels": [f"__meta_kubernetes_pod_label_{sanitize(spec['jobLabel'])}"],
                  "target_label": "job", "regex": "(.+)", "replacement": "${1}"})  # fmt: skip
    r.append({"target_label": "endpoint", "replacement": ep["port"]})
    r += _user_relabelings(ep.get("relabelings", []))
    r += _sharding()
    return _config(f"podMonitor/{meta['namespace']}/{meta['name']}/0", ep, r, sd_file, interval)


def _config(
    name: str, ep: dict[str, Any], relabel: list[dict[str, Any]], sd_file: Path, interval: str
) -> dict[str, Any]:
    return {
        "job_name": name,
        "honor_labels": bool(ep.get("honorLabels", False)),
        "honor_timestamps": True,
        "file_sd_configs": [{"files": [str(sd_file)], "refresh_interval": "1s"}],
        "scrape_interval": interval,
        "scrape_timeout": interval,
        "metrics_path": ep.get("path", "/metrics"),
        "relabel_configs": relabel,
    }


def _pod_meta(namespace: str, pod: str, labels: dict[str, str], container: str, port_name: str) -> dict[str, str]:
    meta = {
        "__meta_kubernetes_namespace": namespace,
        "__meta_kubernetes_pod_name": pod,
        "__meta_kubernetes_pod_phase": "Running",
        "__meta_kubernetes_pod_ready": "true",
        "__meta_kubernetes_pod_container_name": container,
        "__meta_kubernetes_pod_container_port_name": port_name,
        "__meta_kubernetes_pod_container_port_protocol": "TCP",
        "__meta_kubernetes_pod_node_name": "gpu-node-1",
    }
    for k, v in labels.items():
        meta[f"__meta_kubernetes_pod_label_{sanitize(k)}"] = v
        meta[f"__meta_kubernetes_pod_labelpresent_{sanitize(k)}"] = "true"
    return meta


def meta_for_endpoint(namespace: str, service: str, service_labels: dict[str, str], port_name: str, pod: str,
                      pod_labels: dict[str, str], container: str, container_port_name: str) -> dict[str, str]:  # fmt: skip
    """What the `endpoints` role attaches to the target of a Service port backed by a pod's container port."""
    meta = _pod_meta(namespace, pod, pod_labels, container, container_port_name)
    meta |= {
        "__meta_kubernetes_service_name": service,
        "__meta_kubernetes_endpoints_name": service,
        "__meta_kubernetes_endpoint_port_name": port_name,
        "__meta_kubernetes_endpoint_port_protocol": "TCP",
        "__meta_kubernetes_endpoint_ready": "true",
        "__meta_kubernetes_endpoint_address_target_kind": "Pod",
        "__meta_kubernetes_endpoint_address_target_name": pod,
    }
    for k, v in service_labels.items():
        meta[f"__meta_kubernetes_service_label_{sanitize(k)}"] = v
        meta[f"__meta_kubernetes_service_labelpresent_{sanitize(k)}"] = "true"
    return meta


def meta_for_pod(
    namespace: str, pod: str, pod_labels: dict[str, str], container: str, port_name: str
) -> dict[str, str]:
    """What the `pod` role attaches to the target of one container port."""
    return _pod_meta(namespace, pod, pod_labels, container, port_name)
