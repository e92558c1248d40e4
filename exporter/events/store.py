"""The recent-events store and health value that the HTTP edge serves: the pipeline's last sink.

Sits after dedupe: the app adds every counted OomEvent with its source labels; /events and the HTML page
read the newest ones. Bounded, so a retraction flood cannot grow it. The newest SAVED_EVENTS go into the state
file (export_state/restore_state), so a restart keeps them; those come back marked `restored`.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ..detect.model import OomEvent, PoolState, Suggestion
from ..sources import saved

log = logging.getLogger(__name__)

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

    def restore_state(self, raw: object, kinds: Collection[str] | None = None) -> tuple[int, int]:
        """Put saved events back, marked restored, before any new one: (restored, set aside). Each is checked by
        type and range (sources/saved.py); a malformed one, or one of a kind not in `kinds` (a downgrade after a
        release added a kind), is set aside with a warning. ValueError (nothing restored) when raw is no list."""
        restored, bad = [], 0
        for item in saved.array(raw, "recent.events")[-self.capacity :]:
            try:
                stored = _restored(item)
                if kinds is not None and stored.event.kind not in kinds:
                    raise ValueError(f"kind {stored.event.kind!r} is not one this build knows")
            except ValueError as exc:
                bad += 1
                log.warning("state: one recent event set aside: %s", exc)
                continue
            restored.append(stored)
        with self._lock:
            live = list(self._ring)
            self._ring.clear()
            self._ring.extend(restored)
            self._ring.extend(live)
        return len(restored), bad


def _saved(stored: StoredEvent) -> dict[str, Any]:
    e = stored.event
    return {
        "kind": e.kind, "fatal": e.fatal, "source": e.source, "location": e.location, "time": e.time,
        "ranks": list(e.ranks), "message": e.message, "excerpt": e.excerpt, "phase": e.phase,
        "subphase": e.subphase, "inferred": e.inferred, "numbers": dict(e.numbers),
        "pools": [p.as_dict() for p in e.pools], "context": e.context,
        "suggestions": [s.as_dict() for s in e.suggestions], "labels": dict(stored.labels), "seen": stored.seen,
    }  # fmt: skip


def _scalar(value: object, what: str) -> object:
    """A JSON value a context can hold: a string, a finite number, true/false or null (no nesting)."""
    if value is None or isinstance(value, str | bool):
        return value
    return saved.number(value, what, -math.inf, math.inf)


def _scalars(value: object, what: str) -> dict[str, Any]:
    return {saved.text(k, what): _scalar(v, f"{what}.{k}") for k, v in saved.obj(value, what).items()}


def _context(value: object) -> dict[str, Any]:
    """An event's context (events/sink.py, daemon/targets.py): "kv" and "server_args" objects of scalars, "target"
    the scraped URL; a key a later build adds, a scalar or an object of scalars."""
    out: dict[str, Any] = {}
    for key, part in saved.obj(value, "context").items():
        where = f"context.{saved.text(key, 'context')}"
        if key in ("kv", "server_args"):
            out[key] = saved.optional(_scalars, part, where)
        elif key == "target":
            out[key] = saved.optional(saved.text, part, where)
        else:
            out[key] = _scalars(part, where) if isinstance(part, dict) else _scalar(part, where)
    return out


_POOL_FIELDS = ("total", "available", "evictable", "free", "protected", "session_held", "uncached", "counted", "cached")


def _pool(raw: object) -> PoolState:
    p = saved.obj(raw, "pools[]")
    sizes = (saved.optional(saved.integer, p.get(k), f"pools[].{k}") for k in _POOL_FIELDS)
    return PoolState(saved.text(p.get("pool"), "pools[].pool"), *sizes)


def _suggestion(raw: object) -> Suggestion:
    s = saved.obj(raw, "suggestions[]")
    current, suggested = (
        saved.optional(saved.number, s.get(k), f"suggestions[].{k}") for k in ("current", "suggested")
    )
    return Suggestion(saved.text(s.get("flag"), "suggestions[].flag"), current, suggested,
                      saved.text(s.get("rule"), "suggestions[].rule"),
                      saved.text(s.get("when") or "", "suggestions[].when"))  # fmt: skip


def _restored(raw: object) -> StoredEvent:
    """One saved event, every field checked by type and range; ValueError naming the first bad one."""
    item = saved.obj(raw, "recent.events[]")
    text, opt_text = saved.text, functools.partial(saved.optional, saved.text)
    numbers = {text(k, "numbers"): saved.optional(saved.number, v, f"numbers.{k}")
               for k, v in saved.obj(item.get("numbers"), "numbers").items()}  # fmt: skip
    event = OomEvent(
        kind=text(item.get("kind"), "kind"), fatal=saved.flag(item.get("fatal"), "fatal"),
        source=text(item.get("source"), "source"), location=text(item.get("location"), "location"),
        time=opt_text(item.get("time"), "time"),
        ranks=tuple(text(r, "ranks[]") for r in saved.array(item.get("ranks"), "ranks")),
        message=text(item.get("message"), "message"), excerpt=text(item.get("excerpt"), "excerpt"),
        phase=opt_text(item.get("phase"), "phase"), subphase=opt_text(item.get("subphase"), "subphase"),
        inferred=saved.flag(item.get("inferred"), "inferred"), numbers=numbers,
        pools=tuple(_pool(p) for p in saved.array(item.get("pools"), "pools")),
        context=_context(item.get("context")),
        suggestions=tuple(_suggestion(s) for s in saved.array(item.get("suggestions"), "suggestions")),
    )  # fmt: skip
    labels = saved.texts(item.get("labels"), "labels")
    seen = saved.optional(saved.timestamp, item.get("seen"), "seen")
    return StoredEvent(event, MappingProxyType(dict(labels)), seen, restored=True)
