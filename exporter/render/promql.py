"""Render, PromQL pieces: selectors, label lists and the exact "new events in a window" expression the alert
modules (oom_alerts.py, guard_alerts.py) build their rules from.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..config.values import parse_duration
from ..metrics.groups import GROUP_INFO
from ..metrics.names import FILE_LABELS, KUBERNETES_LABELS

# What OOM alerts group by: every source label of either scheme (a missing one is empty), so both work.
SOURCE_LABELS: tuple[str, ...] = (*KUBERNETES_LABELS, *FILE_LABELS)
# What keeps plain-file sources of different machines apart in the OOM records and pages (docs/alerts.md).
HOST = "host"
# How far back an OOM alert looks for a counter's value before its window, across an exporter outage.
OUTAGE_LOOKBACK = "1h"


DEFAULT_CLUSTER_LABEL = "cluster"


@dataclass(frozen=True, slots=True)
class Scope:
    """Where the pack's series come from and what keeps them apart: the one place that writes the job selector
    into selectors and the cluster label into `by (...)` and `on (...)` lists (kubernetes-mixin's jobSelector
    and clusterLabel). The cluster label is kept by every aggregation and vector match, so two clusters' series
    with the same namespace and pod stay apart; where the label is absent it is empty, and nothing changes."""

    job_selector: str = 'job="sglang-oom-exporter"'
    cluster: str = DEFAULT_CLUSTER_LABEL

    @classmethod
    def of(cls, pack: Mapping[str, Any]) -> Scope:
        """The scope an alert_pack names: job_selector (else job="<job>") and cluster_label."""
        selector = pack.get("job_selector") or f'job="{pack["job"]}"'
        return cls(str(selector).strip(), str(pack.get("cluster_label") or DEFAULT_CLUSTER_LABEL))

    def labels(self, *labels: str) -> str:
        """A `by (...)` or `on (...)` list: the cluster label first, then the given labels."""
        return ", ".join((self.cluster, *labels))

    def by(self, *labels: str) -> str:
        """`by (<cluster>, labels...)`."""
        return f"by ({self.labels(*labels)})"

    def on(self, *labels: str) -> str:
        """`on (<cluster>, labels...)`."""
        return f"on ({self.labels(*labels)})"

    def sel(self, metric: str, **matchers: str) -> str:
        """A selector of the pack's job plus `=` matchers: up{job="x", kind="y"}."""
        return sel(metric, self.job_selector, **matchers)

    def template_label(self) -> str:
        """The cluster label as alert templates read it."""
        return f"$labels.{self.cluster}"


# How rendered text (rules, dashboards) moves from one cluster label to another: the label as a word in a
# `by`/`on`/`equal` list, a matcher or a legend, and as an alert template's $labels field. RE2 and Python read
# these patterns alike, so the Helm chart applies the same two (files/render-defaults.yaml) with
# regexReplaceAll; tests/test_overrides.py proves that the result equals a render with cluster_label set.


def cluster_patterns(label: str) -> dict[str, str]:
    """The two patterns that find `label` in rendered text; group 1 (and 2) are kept around the new label."""
    name = re.escape(label)
    return {"word": rf"([^\w$-]){name}([,)\]=}}])", "template": rf"\$labels\.{name}(\W)"}


def relabel_cluster(text: str, label: str, rendered: str = DEFAULT_CLUSTER_LABEL) -> str:
    """Text rendered with the cluster label `rendered`, moved to `label`."""
    if label == rendered:
        return text
    patterns = cluster_patterns(rendered)
    text = re.sub(patterns["word"], lambda m: f"{m.group(1)}{label}{m.group(2)}", text)
    return re.sub(patterns["template"], lambda m: f"$labels.{label}{m.group(1)}", text)


def sel(metric: str, *raw: str, **matchers: str) -> str:
    """A series selector: raw matcher texts, then `=` matchers: sel("up", 'job=~"x.*"', kind="y")."""
    inner = ", ".join([*raw, *(f'{k}="{v}"' for k, v in matchers.items())])
    return f"{metric}{{{inner}}}"


def label_list(*labels: str) -> str:
    """Labels as a `by (...)` clause lists them."""
    return ", ".join(labels)


def exact_increase(series: str, window: str, recent: str | None = None) -> str:
    """Per-series count of new events in the window, as an exact integer (increase() extrapolates: one event
    seen by a 5 s scrape reads 1.53). Three branches, the first that has a value wins:

    1. the value now minus the last one before the window, up to OUTAGE_LOOKBACK back, where the counter did
       not go down: exact, and across an exporter outage longer than the window too (with --state-dir its
       counters continue, so an OOM logged while it was down still counts);
    2. where it went down (an exporter restarted without its state): the count since the reset plus what the
       window saw before it (its highest value minus the value before the window); exact for one reset while
       the new count stays below the old one, which is how a restarted exporter's counters look;
    3. a series with no sample before the window (a new source): its value, where it was first seen at 0 (every
       event since came in the window) or where `recent` says its last event is in the window (a new pod whose
       first log lines held the OOM, counted before the first scrape). Without the first condition, counters
       that come back after a longer outage with their old counts would count again.
    """
    before = f"last_over_time({series}[{OUTAGE_LOOKBACK}] offset {window})"
    born = f"({series} unless {before})"
    if recent:
        born = f"(\n  {born}\n  and\n  (min_over_time({series}[{window}]) == 0 or {recent})\n)"
    return (
        f"({series} - {before} >= 0)\nor\n"
        f"({series} + clamp_min(max_over_time({series}[{window}]) - {before}, 0))\nor\n"
        f"{born}"
    )


def recent_event(scope: Scope, window: str, kind: str | None = None) -> str:
    """True where the last event (of the kind, if given) is younger than the window."""
    matchers = {"kind": kind} if kind else {}
    last = scope.sel("sglang_oom_last_event_timestamp_seconds", **matchers)
    return f"(time() - {last}) < {int(parse_duration(window))}"


def with_host(expr: str) -> str:
    """expr's series with a `host` label that keeps one plain-file source name on two machines two units: the
    scrape's own `host` label where it sets one, else its `instance`. Empty for a pod's series and for an
    exporter pod's (the chart's monitors label it exporter_pod): a DaemonSet or Deployment pod that restarts or
    moves gets a new instance, and its pods' and sources' units must not split in two. The temporary
    `host_instance` label keeps the series apart until the caller's `by (...)` drops it.
    """
    joined = f'label_join(\n{indent(expr)},\n"host_instance", ";", "host", "instance")'
    own = f'label_replace(\n{indent(joined)},\n"host", "$1", "host_instance", ";(.*)")'
    return f'label_replace(label_replace(\n{indent(own)},\n"host", "", "pod", ".+"), "host", "", "exporter_pod", ".+")'


def per_group(scope: Scope, expr: str, *keep: str, info: str = "", sources: str = "") -> str:
    """expr (series with the source labels and `keep`) with the pods of one multi-node server counted once.

    A pod that sglang_oom_serving_group_info puts in a group (metrics/groups.py) trades its pod and container
    labels for the group's: its values are summed per worker index (the same member of a group recreated with
    new pod names adds up) and the maximum over the members is the group's, since every member logs the same
    OOM. A pod in no group, and a plain file's `source`, keep their own labels and value: the join's right side
    holds them too (`sources`, any series of theirs, default sglang_oom_fatal_events_total), so expr is written
    once and a source the map does not know is never dropped (docs/multi-node.md). `info` is the map's selector
    (default: the scope's job).
    """
    info = info or scope.sel(GROUP_INFO)
    sources = sources or scope.sel("sglang_oom_fatal_events_total")
    pod = scope.on("namespace", "pod")
    units = (
        f"max {scope.by('namespace', 'pod', 'group', 'worker_index')} ({info})\n"
        f"or\n(group {scope.by('namespace', 'pod')} ({sources}) unless {pod} {info})"
    )
    joined = f"(\n{indent(expr)}\n)\n* {pod} group_left (group, worker_index)\n(\n{indent(units)}\n)"
    # label_replace must keep every label set apart: a group's pods of one worker index (recreated under new
    # names) would collide once pod and container go, so both are copied out first (and summed away below).
    copied = f'label_replace(label_replace(\n{indent(joined)},\n"member_pod", "$1", "pod", "(.*)"),'
    copied += ' "member_container", "$1", "container", "(.*)")'
    drop = '"pod", "", "group", ".+"), "container", "", "group", ".+")'
    relabelled = f"label_replace(label_replace(\n{indent(copied)},\n{drop}"
    return (
        f"max {scope.by(*SOURCE_LABELS, 'group', *keep)} (\n"
        f"  sum {scope.by(*SOURCE_LABELS, 'group', 'worker_index', *keep)} (\n"
        f"{indent(relabelled, '    ')}\n  )\n)\n"
    )


def indent(text: str, by: str = "  ") -> str:
    """Indent every non-empty line."""
    return "\n".join(by + line if line else line for line in text.splitlines())


def fmt(value: float) -> str:
    """A threshold as PromQL and people write it (1, 0.1, 0.98)."""
    return f"{value:g}"
