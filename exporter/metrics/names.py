"""Metric namespace and source label names: the vocabulary every metric family shares."""

from __future__ import annotations

NAMESPACE = "sglang_oom"
SELF = f"{NAMESPACE}_exporter"
FILE_LABELS = ("source",)
KUBERNETES_LABELS = ("namespace", "pod", "container")

Labels = tuple[str, ...]


def label_names_for(kubernetes: bool) -> tuple[str, ...]:
    """Source label names: namespace/pod/container in Kubernetes mode, else one logical source name."""
    return KUBERNETES_LABELS if kubernetes else FILE_LABELS
