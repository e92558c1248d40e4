"""Every metric name and label of the exporter, and the collector that yields them at scrape time.

names.py (namespace, label names), events.py (the counters the exporter owns), collector.py (what a
scrape yields).

Sits at the end of the pipeline: OomEvents are recorded into EventCounts, sources report their
read statistics, and ExporterCollector turns both into families when Prometheus scrapes. A sample:

    # HELP sglang_oom_events_total SGLang OOM events seen in the logs, one per server-level failure.
    # TYPE sglang_oom_events_total counter
    sglang_oom_events_total{kind="prefill",source="sglang-0"} 1.0
    sglang_oom_events_total{kind="decode",source="sglang-0"} 0.0
    sglang_oom_exporter_files_watched 1.0

Why a collector rather than prometheus_client Counters: the event counters continue from the state
file after a restart (a Counter cannot start at a value), every kind is zero-initialised per source from
the catalog, and a source's series disappear once its logs are gone past the retention; all three are
plain dictionary operations here, and a scrape always sees one consistent snapshot.
"""

from __future__ import annotations

from .collector import SERVER_ARGS, TARGET_VALUES, ExporterCollector, SourceStats, TargetView, target_families
from .events import EventCounts
from .names import FILE_LABELS, KUBERNETES_LABELS, NAMESPACE, SELF, Labels, label_names_for

__all__ = [
    "FILE_LABELS", "KUBERNETES_LABELS", "NAMESPACE", "SELF", "SERVER_ARGS", "TARGET_VALUES", "EventCounts",
    "ExporterCollector", "Labels", "SourceStats", "TargetView", "label_names_for", "target_families",
]  # fmt: skip
