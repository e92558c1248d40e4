"""The recent-events store and health value that the HTTP edge serves: the pipeline's last sink.

Sits after dedupe: the app adds every counted OomEvent with its source labels; /events and the HTML page
read the newest ones. Bounded, so a retraction flood cannot grow it. The newest SAVED_EVENTS go into the state
file (export_state/restore_state), so a restart keeps them; those come back marked `restored`.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ..detect.model import OomEvent, PoolState, Suggestion

DEFAULT_CAPACITY = 200  # events kept by an EventStore
# Events kept in the state file: an event is at most about 3 KB of JSON (an 8-line excerpt, its context), and the
# file is rewritten soon after every counted event, so 50 bound it to about 150 KB whatever the ring's capacity.
SAVED_EVENTS = 50
_NO_LABELS: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Health:
    """What /healthz answers: ok, or not ok with a reason a human can act on."""

    ok: bool
    reason: str


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One event in the store with its extra labels (namespace, pod, ...)."""

    event: OomEvent
    labels: Mapping[str, str]
    seen: float | None = None  # when the exporter counted it (Unix seconds): the log's own time may have no zone
    restored: bool = False  # read back from the state file at start-up, not seen by this process


class EventStore:
    """A bounded, thread-safe ring of the most recent events; the pipeline's sink for the HTTP edge."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"EventStore capacity must be at least 1, not {capacity}")
        self.capacity = capacity
        self._ring: deque[StoredEvent] = deque(maxlen=capacity)
        self._lock = threading.Lock()

    def add(self, event: OomEvent, labels: Mapping[str, str] = _NO_LABELS, seen: float | None = None) -> None:
        """Keep an event, dropping the oldest when full."""
        stored = StoredEvent(event, MappingProxyType(dict(labels)), seen)
        with self._lock:
            self._ring.append(stored)

    def entries(self, limit: int | None = None) -> list[StoredEvent]:
        """Up to limit stored events with their labels, newest first."""
        with self._lock:
            items = list(self._ring)
        items.reverse()
        return items if limit is None else items[: max(limit, 0)]

    def recent(self, limit: int | None = None) -> list[OomEvent]:
        """Up to limit events, newest first."""
        return [s.event for s in self.entries(limit)]

    def __len__(self) -> int:
        with self._lock:
            return len(self._ring)

    def export_state(self, limit: int = SAVED_EVENTS) -> list[dict[str, Any]]:
        """The newest `limit` events as plain data for the state file, oldest first."""
        return [_saved(s) for s in reversed(self.entries(limit))]

    def restore_state(self, raw: object) -> int:
        """Put saved events back, marked restored, before any new one; ValueError (nothing restored) if malformed."""
        if not isinstance(raw, list):
            raise ValueError(f"saved events are {type(raw).__name__}, not a list")
        try:
            restored = [_restored(item) for item in raw[-self.capacity :]]
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"bad saved event: {exc!r}") from exc
        with self._lock:
            live = list(self._ring)
            self._ring.clear()
            self._ring.extend(restored)
            self._ring.extend(live)
        return len(restored)


def _saved(stored: StoredEvent) -> dict[str, Any]:
    e = stored.event
    return {
        "kind": e.kind, "fatal": e.fatal, "source": e.source, "location": e.location, "time": e.time,
        "ranks": list(e.ranks), "message": e.message, "excerpt": e.excerpt, "phase": e.phase,
        "subphase": e.subphase, "inferred": e.inferred, "numbers": dict(e.numbers),
        "pools": [p.as_dict() for p in e.pools], "context": e.context,
        "suggestions": [s.as_dict() for s in e.suggestions], "labels": dict(stored.labels), "seen": stored.seen,
    }  # fmt: skip


def _opt_int(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[call-overload]


def _opt_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


def _restored(item: Mapping[str, Any]) -> StoredEvent:
    pools = tuple(
        PoolState(str(p["pool"]), *(_opt_int(p.get(k)) for k in ("total", "available", "evictable", "free",
                                                                 "protected", "session_held", "uncached")))
        for p in item["pools"]
    )  # fmt: skip
    suggestions = tuple(
        Suggestion(str(s["flag"]), _opt_float(s["current"]), _opt_float(s["suggested"]), str(s["rule"]),
                   str(s.get("when") or ""))
        for s in item["suggestions"]
    )  # fmt: skip
    event = OomEvent(
        kind=str(item["kind"]), fatal=bool(item["fatal"]), source=str(item["source"]),
        location=str(item["location"]), time=_opt_str(item["time"]), ranks=tuple(str(r) for r in item["ranks"]),
        message=str(item["message"]), excerpt=str(item["excerpt"]), phase=_opt_str(item["phase"]),
        subphase=_opt_str(item["subphase"]), inferred=bool(item["inferred"]), numbers=dict(item["numbers"]),
        pools=pools, context=dict(item["context"]), suggestions=suggestions,
    )  # fmt: skip
    labels = {str(k): str(v) for k, v in dict(item["labels"]).items()}
    return StoredEvent(event, MappingProxyType(labels), _opt_float(item.get("seen")), restored=True)
