"""The counters the exporter owns (events per kind and source), restored from the state file, yielded as families."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..detect.model import OomEvent
from .names import NAMESPACE, Labels


@dataclass(slots=True)
class _Last:
    timestamp: float
    requested: float | None
    available: float | None


class EventCounts:
    """The counters the exporter owns, keyed by source label values; thread-safe."""

    def __init__(self, kinds: Sequence[str], label_names: Sequence[str], retraction_kind: str | None = None) -> None:
        self.kinds = tuple(kinds)
        self.label_names = tuple(label_names)
        self.retraction_kind = retraction_kind  # the catalog's: its events' retracted_requests are summed
        self._lock = threading.Lock()
        self._events: dict[Labels, dict[str, float]] = {}
        self._fatal: dict[Labels, dict[str, float]] = {}
        self._retracted: dict[Labels, float] = {}
        self._last: dict[tuple[Labels, str], _Last] = {}
        self._flags: dict[tuple[Labels, str, str], tuple[float | None, float]] = {}

    def ensure(self, labels: Labels) -> None:
        """Zero-initialise every kind for this source, so increase() sees its first event."""
        with self._lock:
            self._ensure(labels)

    def _ensure(self, labels: Labels) -> None:
        if labels not in self._events:
            self._events[labels] = dict.fromkeys(self.kinds, 0.0)
            self._fatal[labels] = dict.fromkeys(self.kinds, 0.0)
            self._retracted[labels] = 0.0

    def record(self, labels: Labels, event: OomEvent, wall_time: float) -> None:
        """Count one event."""
        n = event.numbers
        with self._lock:
            self._ensure(labels)
            self._events[labels][event.kind] = self._events[labels].get(event.kind, 0.0) + 1
            if event.fatal:
                self._fatal[labels][event.kind] = self._fatal[labels].get(event.kind, 0.0) + 1
            if event.kind == self.retraction_kind:
                self._retracted[labels] += float(n.get("retracted_requests", 0) or 0)
            requested, available = n.get("requested_tokens"), n.get("available_tokens")
            self._last[(labels, event.kind)] = _Last(
                wall_time,
                float(requested) if isinstance(requested, int | float) else None,
                float(available) if isinstance(available, int | float) else None,
            )
            for s in event.suggestions:
                if s.suggested is not None:
                    # The first suggestion per flag is the primary one (an unknown phase lists prefill first).
                    key = (labels, event.kind, s.flag.lstrip("-"))
                    if key not in self._flags or s is event.suggestions[0]:
                        self._flags[key] = (s.current, s.suggested)

    def set_kinds(self, kinds: Sequence[str], retraction_kind: str | None) -> None:
        """A reloaded catalog: new kinds start at zero for every source; counts of dropped kinds are kept."""
        with self._lock:
            self.kinds = tuple(kinds)
            self.retraction_kind = retraction_kind
            for per in (*self._events.values(), *self._fatal.values()):
                for kind in self.kinds:
                    per.setdefault(kind, 0.0)

    def drop(self, labels: Labels) -> None:
        """Forget a source whose logs are gone (after the retention)."""
        with self._lock:
            self._events.pop(labels, None)
            self._fatal.pop(labels, None)
            self._retracted.pop(labels, None)
            for key in [k for k in self._last if k[0] == labels]:
                del self._last[key]
            for fkey in [k for k in self._flags if k[0] == labels]:
                del self._flags[fkey]

    def known(self) -> list[Labels]:
        """Label values of every source with series."""
        with self._lock:
            return list(self._events)

    def total(self, kind: str | None = None) -> float:
        """Sum over sources (all kinds, or one)."""
        with self._lock:
            return sum(v for per in self._events.values() for k, v in per.items() if kind is None or k == kind)

    def export_state(self) -> dict[str, Any]:
        """Counter values as plain data for the state file."""
        with self._lock:
            return {
                "label_names": list(self.label_names),
                "sources": [
                    {"labels": list(labels), "events": self._events[labels], "fatal": self._fatal[labels],
                     "retracted": self._retracted[labels]}
                    for labels in self._events
                ],
            }  # fmt: skip

    def restore_state(self, raw: Mapping[str, Any]) -> None:
        """Continue from saved values; ValueError when malformed or saved under other label names."""
        try:
            if tuple(raw["label_names"]) != self.label_names:
                raise ValueError(f"saved with labels {raw['label_names']}, now {list(self.label_names)}")
            restored = []
            for entry in raw["sources"]:
                labels = tuple(str(v) for v in entry["labels"])
                events = {str(k): float(v) for k, v in dict(entry["events"]).items()}
                fatal = {str(k): float(v) for k, v in dict(entry["fatal"]).items()}
                if len(labels) != len(self.label_names) or any(v < 0 for v in (*events.values(), *fatal.values())):
                    raise ValueError(f"bad entry {entry!r}")
                restored.append((labels, events, fatal, float(entry["retracted"])))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"bad counter state: {exc!r}") from exc
        with self._lock:
            for labels, events, fatal, retracted in restored:
                self._ensure(labels)
                for kind, value in events.items():
                    self._events[labels][kind] = value
                for kind, value in fatal.items():
                    self._fatal[labels][kind] = value
                self._retracted[labels] = retracted

    def families(self) -> Iterator[Metric]:
        """The event families, from one consistent snapshot."""
        names = ["kind", *self.label_names]
        events = CounterMetricFamily(
            f"{NAMESPACE}_events", "SGLang OOM events seen in the logs, one per server-level failure.", labels=names
        )
        fatal = CounterMetricFamily(
            f"{NAMESPACE}_fatal_events", "SGLang OOM events that crashed the server (or its scheduler).", labels=names
        )
        retracted = CounterMetricFamily(
            f"{NAMESPACE}_retracted_requests",
            "Requests retracted by KV-cache-full retractions (counted once per event, not per rank).",
            labels=list(self.label_names),
        )
        last_ts = GaugeMetricFamily(
            f"{NAMESPACE}_last_event_timestamp_seconds", "When the exporter saw the last event of a kind.", labels=names
        )
        last_req = GaugeMetricFamily(
            f"{NAMESPACE}_last_event_requested_tokens", "Tokens the last failed allocation asked for.", labels=names
        )
        last_avail = GaugeMetricFamily(
            f"{NAMESPACE}_last_event_available_tokens",
            "Tokens available (free + evictable) in the pool that ran out, at the last event.",
            labels=names,
        )
        flag_names = [*names, "flag"]
        suggested = GaugeMetricFamily(
            f"{NAMESPACE}_suggested_flag_value",
            "The value the last event of a kind suggests for an SGLang flag (flag without its leading dashes).",
            labels=flag_names,
        )
        current = GaugeMetricFamily(
            f"{NAMESPACE}_current_flag_value", "The flag's value on the server when that event happened.",
            labels=flag_names,
        )  # fmt: skip
        with self._lock:
            for (labels, kind, flag), (cur, sug) in self._flags.items():
                suggested.add_metric([kind, *labels, flag], sug)
                if cur is not None:
                    current.add_metric([kind, *labels, flag], cur)
            for labels, per in self._events.items():
                for kind in self.kinds:
                    events.add_metric([kind, *labels], per.get(kind, 0.0))
                    fatal.add_metric([kind, *labels], self._fatal[labels].get(kind, 0.0))
                retracted.add_metric(list(labels), self._retracted[labels])
            for (labels, kind), last in self._last.items():
                last_ts.add_metric([kind, *labels], last.timestamp)
                if last.requested is not None:
                    last_req.add_metric([kind, *labels], last.requested)
                if last.available is not None:
                    last_avail.add_metric([kind, *labels], last.available)
        yield from (events, fatal, retracted, last_ts, last_req, last_avail, suggested, current)
