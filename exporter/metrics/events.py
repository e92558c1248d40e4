"""The counters the exporter owns (events per kind and source, non-memory crashes per source), restored from the state
file, kept as cached families.

Zero series: every kind's `events_total` (each kind has an alert, and `rate()`/`increase()` miss a series born at
its first event), and `fatal_events_total` only for the kinds that can be fatal (a kind the catalog calls non-fatal
in every pattern never moves it); `retracted_requests_total` when the catalog has a retraction kind, and
`crashes_total` when it has a crash entry. A non-memory crash (the catalog's `crash`) counts there and never in
`events_total` or `fatal_events_total`, which count OOMs; its last event has the same last-event gauges as a kind.
Any other series appears with its first non-zero value.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..catalog import Catalog
from ..detect.model import OomEvent
from ..sources import saved
from .exposition import Family, Page
from .names import NAMESPACE, Labels
from .sources import SourceTable

log = logging.getLogger(__name__)


def fatal_kinds(catalog: Catalog) -> tuple[str, ...]:
    """Kinds whose events can be fatal: the kind's default, or any of its patterns, says so."""
    return tuple(k.id for k in catalog.kinds if k.fatal != "false" or any(p.fatal for p in k.patterns))


def crash_kind(catalog: Catalog) -> str | None:
    """The id of the catalog's non-memory crash (counted in crashes_total), if it has one."""
    return catalog.crash.id if catalog.crash is not None else None


# sglang_oom_last_event_info's text labels, in label order, and how long each may be (a label is no place for
# an essay: a longer text ends in an ellipsis).
INFO_LABELS = ("limiting_pool", "detail", "advice")
INFO_LABEL_LIMIT = 299


@dataclass(slots=True)
class _Last:
    timestamp: float
    requested: float | None
    available: float | None
    info: tuple[str, ...] | None = None  # INFO_LABELS' values; None: the event gave none (an old state file)


# The event families in page order: key -> (name after the namespace, type, help, label set).
_FAMILIES = {
    "events": ("events", "counter", "SGLang OOM events seen in the logs, one per server-level failure.", "kind"),
    "fatal": ("fatal_events", "counter", "SGLang OOM events that crashed the server (or its scheduler).", "kind"),
    "retracted": ("retracted_requests", "counter",
                  "Requests retracted by KV-cache-full retractions (counted once per event, not per rank).", "source"),
    "crashes": ("crashes", "counter",
                "SGLang processes that died of an exception that is no memory failure (its last line on /events).",
                "source"),
    "last_ts": ("last_event_timestamp_seconds", "gauge", "When the exporter saw the last event of a kind.", "kind"),
    "last_req": ("last_event_requested_tokens", "gauge", "Tokens the last failed allocation asked for.", "kind"),
    "last_avail": ("last_event_available_tokens", "gauge",
                   "Tokens available (free + evictable) in the pool that ran out, at the last event.", "kind"),
    "last_info": ("last_event_info", "gauge",
                  "Always 1: the last event of a kind in words, the pool that ran out, its numbers and the advice "
                  "(the same text as scan and /events).", "info"),
    "suggested": ("suggested_flag_value", "gauge",
                  "The value the last event of a kind suggests for an SGLang flag (flag without its leading dashes).",
                  "flag"),
    "current": ("current_flag_value", "gauge", "The flag's value on the server when that event happened.", "flag"),
}  # fmt: skip


class EventCounts:
    """The counters the exporter owns, keyed by source label values; thread-safe (the page's lock)."""

    def __init__(
        self,
        kinds: Sequence[str],
        label_names: Sequence[str],
        retraction_kind: str | None = None,
        *,
        fatal_kinds: Iterable[str] | None = None,
        page: Page | None = None,
        crash_kind: str | None = None,
    ) -> None:
        self.kinds = tuple(kinds)
        self.crash_kind = crash_kind  # the catalog's non-memory crash: its own counter, never an OOM kind's
        self.fatal_kinds = frozenset(self.kinds if fatal_kinds is None else fatal_kinds)
        self.label_names = tuple(label_names)
        self.retraction_kind = retraction_kind  # the catalog's: its events' retracted_requests are summed
        self.page = page if page is not None else Page()
        self._lock = self.page.lock
        self._events: dict[Labels, dict[str, float]] = {}
        self._fatal: dict[Labels, dict[str, float]] = {}
        self._retracted: dict[Labels, float] = {}
        self._crashes: dict[Labels, float] = {}
        self._last: dict[tuple[Labels, str], _Last] = {}
        self._flags: dict[tuple[Labels, str, str], tuple[float | None, float]] = {}
        self._sum: float | None = 0.0  # total() over every source and kind (None: recount); the keeper asks each pass
        by = {"kind": ["kind", *self.label_names], "source": list(self.label_names)}
        by["flag"] = [*by["kind"], "flag"]
        by["info"] = [*by["kind"], *INFO_LABELS]
        fams = {attr: self.page.family(f"{NAMESPACE}_{name}", typ, doc, by[labels])
                for attr, (name, typ, doc, labels) in _FAMILIES.items()}  # fmt: skip
        self._f_events, self._f_fatal, self._f_retracted = fams["events"], fams["fatal"], fams["retracted"]
        self._f_crashes = fams["crashes"]
        self._f_last_ts, self._f_last_req, self._f_last_avail = fams["last_ts"], fams["last_req"], fams["last_avail"]
        self._f_suggested, self._f_current = fams["suggested"], fams["current"]
        self._f_last_info = fams["last_info"]
        self.sources = SourceTable(self.page, self.label_names)  # the read statistics, after the event families

    # --- writes ------------------------------------------------------------------------------

    def ensure(self, labels: Labels) -> None:
        """Zero-initialise this source's series (see the module docstring), so increase() sees its first event."""
        with self._lock:
            self._ensure(labels)

    def _ensure(self, labels: Labels) -> None:
        if labels not in self._events:
            self._events[labels] = dict.fromkeys(self.kinds, 0.0)
            self._fatal[labels] = dict.fromkeys(self.kinds, 0.0)
            self._retracted[labels] = 0.0
            self._crashes[labels] = 0.0
            self._show_source(labels)

    def _show_source(self, labels: Labels) -> None:
        """(Re)write a source's counter series from the dictionaries: zero series only where they are kept."""
        for kind, value in self._events[labels].items():
            _show(self._f_events, (kind, *labels), value, zero=kind in self.kinds)
        for kind, value in self._fatal[labels].items():
            _show(self._f_fatal, (kind, *labels), value, zero=kind in self.kinds and kind in self.fatal_kinds)
        _show(self._f_retracted, labels, self._retracted[labels], zero=self.retraction_kind is not None)
        _show(self._f_crashes, labels, self._crashes[labels], zero=self.crash_kind is not None)

    def record(self, labels: Labels, event: OomEvent, wall_time: float, info: Mapping[str, str] | None = None) -> None:
        """Count one event; info is its INFO_LABELS in words (events/sink.py), for sglang_oom_last_event_info."""
        n = event.numbers
        with self._lock:
            self._ensure(labels)
            if self._sum is not None:
                self._sum += 1
            if event.kind == self.crash_kind:
                self._crashes[labels] += 1
                self._f_crashes.set(labels, self._crashes[labels])
            else:
                self._events[labels][event.kind] = self._events[labels].get(event.kind, 0.0) + 1
                self._f_events.set((event.kind, *labels), self._events[labels][event.kind])
            if event.fatal and event.kind != self.crash_kind:
                self._fatal[labels][event.kind] = self._fatal[labels].get(event.kind, 0.0) + 1
                self._f_fatal.set((event.kind, *labels), self._fatal[labels][event.kind])
            if event.kind == self.retraction_kind:
                self._retracted[labels] += float(n.get("retracted_requests", 0) or 0)
                self._f_retracted.set(labels, self._retracted[labels])
            requested, available = n.get("requested_tokens"), n.get("available_tokens")
            last = _Last(
                wall_time,
                float(requested) if isinstance(requested, int | float) else None,
                float(available) if isinstance(available, int | float) else None,
                None if info is None else tuple(_label_text(info.get(k, "")) for k in INFO_LABELS),
            )
            self._show_last(labels, event.kind, last)
            for s in event.suggestions:
                if s.suggested is not None:
                    # The first suggestion per flag is the primary one (an unknown phase lists prefill first).
                    key = (labels, event.kind, s.flag.lstrip("-"))
                    if key not in self._flags or s is event.suggestions[0]:
                        self._flags[key] = (s.current, s.suggested)
                        flag_key = (event.kind, *labels, key[2])
                        self._f_suggested.set(flag_key, s.suggested)
                        _show(self._f_current, flag_key, s.current)

    def set_kinds(
        self,
        kinds: Sequence[str],
        retraction_kind: str | None,
        fatal_kinds: Iterable[str] | None = None,
        crash_kind: str | None = None,
    ) -> None:
        """A reloaded catalog: new kinds start at zero for every source; counts of dropped kinds are kept."""
        with self._lock:
            self.kinds = tuple(kinds)
            self.crash_kind = crash_kind
            self.fatal_kinds = frozenset(self.kinds if fatal_kinds is None else fatal_kinds)
            self.retraction_kind = retraction_kind
            for labels in self._events:
                for per in (self._events[labels], self._fatal[labels]):
                    for kind in self.kinds:
                        per.setdefault(kind, 0.0)
                self._show_source(labels)

    def drop(self, labels: Labels) -> None:
        """Forget a source whose logs are gone (after the retention), with every series it had."""
        with self._lock:
            self._sum = None
            for kind in (*self._events.pop(labels, {}), *self._fatal.pop(labels, {})):
                self._f_events.discard((kind, *labels))
                self._f_fatal.discard((kind, *labels))
            self._retracted.pop(labels, None)
            self._f_retracted.discard(labels)
            self._crashes.pop(labels, None)
            self._f_crashes.discard(labels)
            for key in [k for k in self._last if k[0] == labels]:
                old = self._last.pop(key)
                for fam in (self._f_last_ts, self._f_last_req, self._f_last_avail):
                    fam.discard((key[1], *labels))
                if old.info is not None:
                    self._f_last_info.discard((key[1], *labels, *old.info))
            for fkey in [k for k in self._flags if k[0] == labels]:
                del self._flags[fkey]
                for fam in (self._f_suggested, self._f_current):
                    fam.discard((fkey[1], *labels, fkey[2]))

    # --- reads -------------------------------------------------------------------------------

    def known(self) -> list[Labels]:
        """Label values of every source with series."""
        with self._lock:
            return list(self._events)

    def total(self, kind: str | None = None) -> float:
        """Sum over sources (all kinds and the crashes, or one kind or the crash)."""
        with self._lock:
            if kind is None and self._sum is not None:
                return self._sum
            total = sum(v for per in self._events.values() for k, v in per.items() if kind is None or k == kind)
            if kind is None or kind == self.crash_kind:
                total += sum(self._crashes.values())
            if kind is None:
                self._sum = total
            return total

    def export_state(self) -> dict[str, Any]:
        """Counter values as plain data for the state file."""
        with self._lock:
            return {
                "label_names": list(self.label_names),
                "sources": [
                    {"labels": list(labels), "events": dict(self._events[labels]), "fatal": dict(self._fatal[labels]),
                     "retracted": self._retracted[labels], "crashes": self._crashes[labels]}
                    for labels in self._events
                ],
            }  # fmt: skip

    def restore_state(self, raw: Mapping[str, Any]) -> int:
        """Continue from saved values; the number of sources' entries set aside as malformed (each checked by type
        and range: a count is a JSON number from 0 to 2^53, never the string "NaN"). ValueError, nothing restored,
        when the whole is malformed or saved under other label names."""
        try:
            if tuple(raw["label_names"]) != self.label_names:
                raise ValueError(f"saved with labels {raw['label_names']}, now {list(self.label_names)}")
            entries = saved.array(raw["sources"], "counters.sources")
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"bad counter state: {exc!r}") from exc
        restored, bad = [], 0
        for entry in entries:
            try:
                restored.append(self._restored(entry))
            except ValueError as exc:
                bad += 1
                log.warning("state: one source's counters set aside (they start again from 0): %s", exc)
        with self._lock:
            self._sum = None
            for labels, events, fatal, retracted, crashes in restored:
                self._ensure(labels)
                self._events[labels].update(events)
                self._fatal[labels].update(fatal)
                self._retracted[labels] = retracted
                self._crashes[labels] = crashes
                self._show_source(labels)
        return bad

    def _restored(self, raw: object) -> tuple[Labels, dict[str, float], dict[str, float], float, float]:
        """One source's saved counters, checked; ValueError naming the first bad field."""
        entry = saved.obj(raw, "counters.sources[]")
        labels = tuple(saved.text(v, "labels[]") for v in saved.array(entry.get("labels"), "labels"))
        if len(labels) != len(self.label_names):
            raise ValueError(f"labels {list(labels)} are not {len(self.label_names)} values")
        # A kind this build does not know (a downgrade) keeps its count: shown while not zero, as after a reload.
        events, fatal = (
            {saved.text(k, key): saved.count(v, f"{key}.{k}") for k, v in saved.obj(entry.get(key), key).items()}
            for key in ("events", "fatal")
        )
        # A state file from before the crash counter has no "crashes": 0, like a new source.
        crashes = saved.count(entry.get("crashes", 0), "crashes")
        return labels, events, fatal, saved.count(entry.get("retracted"), "retracted"), crashes

    def export_last(self) -> list[dict[str, Any]]:
        """Each source and kind's last event (time seen, requested and available tokens) for the state file."""
        with self._lock:
            return [
                {"labels": list(labels), "kind": kind, "timestamp": last.timestamp, "requested": last.requested,
                 "available": last.available, **_info_state(last.info)}
                for (labels, kind), last in self._last.items()
            ]  # fmt: skip

    def restore_last(self, raw: object) -> int:
        """Put the saved last events back (their gauges too), unless one newer was counted already; the number of
        entries set aside as malformed (each checked by type and range). ValueError, nothing restored, when raw is
        not a list."""
        restored, bad = [], 0
        for entry in saved.array(raw, "recent.last"):
            try:
                restored.append(self._restored_last(entry))
            except ValueError as exc:
                bad += 1
                log.warning("state: one last-event entry set aside: %s", exc)
        with self._lock:
            for labels, kind, last in restored:
                key = (labels, kind)
                if key in self._last and self._last[key].timestamp >= last.timestamp:
                    continue
                self._show_last(labels, kind, last)
        return bad

    def _restored_last(self, raw: object) -> tuple[Labels, str, _Last]:
        entry = saved.obj(raw, "recent.last[]")
        labels = tuple(saved.text(v, "labels[]") for v in saved.array(entry.get("labels"), "labels"))
        if len(labels) != len(self.label_names):
            raise ValueError(f"labels {list(labels)} are not {len(self.label_names)} values")
        # A state file written before the info series has no texts: that series waits for the next event.
        info = tuple(_label_text(saved.text(entry.get(k), k)) for k in INFO_LABELS) if INFO_LABELS[0] in entry else None
        last = _Last(saved.timestamp(entry.get("timestamp"), "timestamp"),
                     saved.optional(saved.count, entry.get("requested"), "requested"),
                     saved.optional(saved.count, entry.get("available"), "available"), info)  # fmt: skip
        return labels, saved.text(entry.get("kind"), "kind"), last

    def _show_last(self, labels: Labels, kind: str, last: _Last) -> None:
        """Make `last` the kind's last event: its gauges, and its one info series (the previous one removed)."""
        old = self._last.get((labels, kind))
        self._last[(labels, kind)] = last
        kind_key = (kind, *labels)
        self._f_last_ts.set(kind_key, last.timestamp)
        _show(self._f_last_req, kind_key, last.requested)
        _show(self._f_last_avail, kind_key, last.available)
        if old is not None and old.info is not None and old.info != last.info:
            self._f_last_info.discard((*kind_key, *old.info))
        if last.info is not None:
            self._f_last_info.set((*kind_key, *last.info), 1.0)


def _info_state(info: tuple[str, ...] | None) -> dict[str, str]:
    """The info series' texts as the state file keeps them beside the last event (none: nothing)."""
    return {} if info is None else dict(zip(INFO_LABELS, info, strict=True))


def _label_text(text: str) -> str:
    """A text label within INFO_LABEL_LIMIT characters, ending in an ellipsis when cut."""
    return text if len(text) <= INFO_LABEL_LIMIT else text[: INFO_LABEL_LIMIT - 1].rstrip() + "…"


def _show(fam: Family, key: tuple[str, ...], value: float | None, *, zero: bool = False) -> None:
    """Set a series, or leave it out when it has no value (or is zero and not a kept zero series)."""
    if value is None or (value == 0 and not zero and not fam.has(key)):
        if value is None:
            fam.discard(key)
        return
    fam.set(key, value)
