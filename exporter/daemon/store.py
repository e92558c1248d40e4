"""The recent-events store and health value that the HTTP edge serves: the pipeline's last sink.

Sits after dedupe: the app adds every counted OomEvent with its source labels; /events and the HTML page
read the newest ones. Bounded, so a retraction flood cannot grow it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from ..detect.model import OomEvent

DEFAULT_CAPACITY = 200  # events kept by an EventStore
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


class EventStore:
    """A bounded, thread-safe ring of the most recent events; the pipeline's sink for the HTTP edge."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"EventStore capacity must be at least 1, not {capacity}")
        self.capacity = capacity
        self._ring: deque[StoredEvent] = deque(maxlen=capacity)
        self._lock = threading.Lock()

    def add(self, event: OomEvent, labels: Mapping[str, str] = _NO_LABELS) -> None:
        """Keep an event, dropping the oldest when full."""
        stored = StoredEvent(event, MappingProxyType(dict(labels)))
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
