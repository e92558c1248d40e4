"""The event sink: the one place every OomEvent goes after dedupe, for `scan` and `serve` alike.

    OomEvent --enrich (KV context + catalog's suggestion rule, excerpt redacted)--> counters (metrics/) + EventStore
                                                             \\--> event_json(): scan JSON and /events
    explanation(): the limiting pool, numbers and advice in words, the same for the counters' info series,
    event_json, scan's text, the page and the Kubernetes Event message

`scan` enriches with the server args it was given and keeps the events; `serve` enriches with the
scraped endpoint's last snapshot, counts and stores, and hands each live event (not one read from history)
to the Kubernetes Events poster when that is on. A failure here is counted, never raised into the loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..advise.explain import Explanation, explain
from ..advise.suggest import with_suggestions
from ..catalog import Catalog
from ..detect.model import OomEvent
from ..detect.serverlog import state_of
from .redact import redact_excerpt, redact_line

if TYPE_CHECKING:  # `scan` imports this module and needs neither: prometheus_client costs 60-80 ms of start-up
    from ..metrics.events import EventCounts
    from .store import EventStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Context:
    """What the server looked like when an event happened: its args, its KV snapshot, its URL."""

    args: Mapping[str, Any] | None = None
    kv: Mapping[str, Any] | None = None
    target: str | None = None


NO_CONTEXT = Context()


class EventSink:
    """Enriches, counts and stores events; counts and store are optional (scan keeps events itself)."""

    def __init__(
        self,
        catalog: Catalog,
        *,
        counts: EventCounts | None = None,
        store: EventStore | None = None,
        wall: Callable[[], float] = time.time,
        on_live: Callable[[OomEvent, Mapping[str, str]], None] | None = None,
    ) -> None:
        self.catalog = catalog
        self.counts = counts
        self.store = store
        self._wall = wall
        self._on_live = on_live  # after counting: e.g. the Kubernetes Events poster's offer (never blocks)
        self.errors = 0

    def enrich(self, event: OomEvent, context: Context = NO_CONTEXT) -> OomEvent:
        """The event with its suggestions, by the rule the catalog gives its kind (or matched pattern), and its
        message and excerpt without request text (redact.py): what /events, the page and scan show."""
        rule = self.catalog.kind(event.kind).suggest_rule(event.message)
        numbers = event.numbers
        if isinstance(numbers.get("exception"), str):  # an exception's text may quote a request, as a message may
            numbers = {**numbers, "exception": redact_line(numbers["exception"])}
        event = replace(
            event, message=redact_line(event.message), excerpt=redact_excerpt(event.excerpt), numbers=numbers
        )
        context, extra = with_log(event, context)
        return with_suggestions(event, rule, context.args, context.kv, context.target, extra)

    def record(
        self,
        event: OomEvent,
        labels: tuple[str, ...],
        label_map: Mapping[str, str],
        context: Context = NO_CONTEXT,
        *,
        live: bool = True,
    ) -> OomEvent | None:
        """Enrich, count and store one event; None (and errors += 1) when that failed.

        live is False for an event read from history (existing files read from their start on a first run):
        counted like any other, but no Kubernetes Event.
        """
        try:
            event = self.enrich(event, context)
            now = self._wall()
            if self.counts is not None:
                told = explanation(event, self.catalog)
                info = {"limiting_pool": told.limiting_pool, "detail": told.detail, "advice": told.advice}
                self.counts.record(labels, event, now, info)
            if self.store is not None:
                self.store.add(event, label_map, now)
            if live and self._on_live is not None:
                self._on_live(event, label_map)
        except Exception:  # a sink failure must never kill the loop or lose the rest
            self.errors += 1
            log.exception("cannot record event kind=%s source=%s", event.kind, event.location)
            return None
        # Fatal events are rare and matter; retraction ticks can come every few seconds, so they stay at DEBUG.
        level = logging.WARNING if event.fatal else logging.DEBUG
        log.log(
            level, "oom event kind=%s fatal=%s location=%s ranks=%s requested=%s available=%s",
            event.kind, event.fatal, event.location, ",".join(event.ranks) or "-",
            event.numbers.get("requested_tokens"), event.numbers.get("available_tokens"),
        )  # fmt: skip
        return event


def with_log(event: OomEvent, context: Context) -> tuple[Context, dict[str, Any]]:
    """The context with what the event's own log said about its server (detect/serverlog.py), and the notes on it.

    Server args: the log's values win over the endpoint's /server_info (or scan's --server-args file) key by key,
    which fills what the log lacks. The log's lines are the failing run's own, written by the process that
    failed; /server_info answers for whatever process listens now (after a crash, the restarted one), and it gives
    the flags as set (context_length is null unless set, 0.5.23) where the capacity line gives the values the
    scheduler resolved (context_len=4096). Keys both give with different values are listed (`server_args_differ`).
    The state: the last usage line of the run before the failure (SGLang logs one before each prefill batch and
    every few decode steps) over the scrape, whose gauges SGLang updates only when it logs stats; `kv_source`
    says which it was.
    """
    log = event.server
    extra: dict[str, Any] = {}
    if log is None:
        if context.kv:
            extra["kv_source"] = "scrape"
        return context, extra
    args: dict[str, Any] | None = dict(context.args) if context.args else None
    logged = log.server_args()
    if logged:
        if args:
            differ = {k: {"log": v, "server_info": args[k]} for k, v in logged.items()
                      if args.get(k) is not None and args[k] != v}  # fmt: skip
            if differ:
                extra["server_args_differ"] = differ
        args = {**(args or {}), **logged}
        extra["server_args_source"] = "log" if not context.args else "log, then /server_info"
    elif context.args:
        extra["server_args_source"] = "/server_info"
    kv: dict[str, Any] | None = dict(context.kv) if context.kv else None
    state = state_of(log)
    if state is not None:
        at = state.pop("at", None)
        state.pop("batch", None)
        state.pop("new_tokens", None)
        kv = {**(kv or {}), **state}
        extra["kv_source"] = f"log line at {at}" if at else "log line"
    elif kv:
        extra["kv_source"] = "scrape"
    return Context(args, kv, context.target), extra


def explanation(event: OomEvent, catalog: Catalog) -> Explanation:
    """The limiting pool, the numbers and the advice in words (advise/explain.py), for every output of an event."""
    return explain(event, catalog.kind(event.kind).summary)


def event_json(event: OomEvent, catalog: Catalog) -> dict[str, Any]:
    """One event as plain data: the documented shape of scan's JSON events and of /events."""
    n = event.numbers
    kind = catalog.kind(event.kind)
    return {
        "kind": event.kind,
        "title": kind.title,
        "fatal": event.fatal,
        "time": event.time,
        "ranks": list(event.ranks),
        "source": event.location,
        "requested_tokens": n.get("requested_tokens"),
        "available_tokens": n.get("available_tokens"),
        "phase": event.phase,
        "subphase": event.subphase,
        "inferred": event.inferred,
        "message": event.message,
        "numbers": dict(n),
        "pools": [p.as_dict() for p in event.pools],
        "excerpt": event.excerpt,
        "remediation": kind.remediation(),
        "suggestions": [s.as_dict() for s in event.suggestions],
        "explanation": explanation(event, catalog).as_dict(),
        "context": event.context,
    }
