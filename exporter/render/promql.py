"""Render, PromQL pieces: selectors, label lists and the "new events in a window" expression the alert
modules (oom_alerts.py, guard_alerts.py) build their rules from.
"""

from __future__ import annotations

from ..config import parse_duration
from ..metrics import FILE_LABELS, KUBERNETES_LABELS

# What OOM alerts group by: every source label of either scheme (a missing one is empty), so both work.
SOURCE_LABELS: tuple[str, ...] = (*KUBERNETES_LABELS, *FILE_LABELS)
# How far back an OOM alert looks for a counter's value before its window, across an exporter outage.
OUTAGE_LOOKBACK = "1h"


def sel(metric: str, **matchers: str) -> str:
    """A series selector with `=` matchers: sel("up", job="x") -> up{job="x"}."""
    inner = ", ".join(f'{k}="{v}"' for k, v in matchers.items())
    return f"{metric}{{{inner}}}"


def label_list(*labels: str) -> str:
    """Labels as a `by (...)` clause lists them."""
    return ", ".join(labels)


def new_events(series: str, window: str, recent: str | None = None) -> str:
    """Per-series count of new events in the window, only where it is above zero. Three branches:

    1. `increase()`, which also bridges counter resets (an exporter restarted without its state);
    2. the value now minus the last one before the window, up to OUTAGE_LOOKBACK back: an exporter outage
       longer than the window leaves increase() one sample, but with --state-dir its counters continue, so an
       OOM logged while it was down still shows (and a counter that only re-appears with old counts does not);
    3. a series born non-zero with no earlier sample (a new pod whose first log lines hold the OOM, counted
       before the first scrape), which increase() cannot see. `recent` narrows it to series with an event in
       the window, so counters restored after a longer outage do not page again.
    """
    before = f"last_over_time({series}[{OUTAGE_LOOKBACK}] offset {window})"
    born = f"({series} > 0 unless {before})"
    if recent:
        born = f"(\n  {born}\n  and\n  {recent}\n)"
    return f"(increase({series}[{window}]) > 0)\nor\n({series} - {before} > 0)\nor\n{born}"


def recent_event(job: str, window: str, kind: str | None = None) -> str:
    """True where the last event (of the kind, if given) is younger than the window."""
    matchers = {"job": job, **({"kind": kind} if kind else {})}
    return f"(time() - {sel('sglang_oom_last_event_timestamp_seconds', **matchers)}) < {int(parse_duration(window))}"


def indent(text: str, by: str = "  ") -> str:
    """Indent every non-empty line."""
    return "\n".join(by + line if line else line for line in text.splitlines())


def fmt(value: float) -> str:
    """A threshold as PromQL and people write it (1, 0.1, 0.98)."""
    return f"{value:g}"
