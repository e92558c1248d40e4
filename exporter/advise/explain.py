"""Advice in words: an enriched OomEvent -> the pool that ran out, one sentence on its numbers, one on what to
change. Pure; the one code path behind scan's text and JSON, /events, the events page, the Kubernetes Event
message and sglang_oom_last_event_info, so every output says the same thing about an event.

    numbers + pools (detect/match.py) + suggestions (rules.py) + the kind's fix --explain--> Explanation
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..catalog.vocabulary import POOL_FULL, POOL_MAMBA, POOL_SWA
from ..detect.model import OomEvent, Suggestion, format_number
from .limits import WOULD_NOT_CHANGE, num, plural, were
from .memory import MAMBA_COST, MAMBA_FIX, full_available

# How a pool that ran out is named when it is not the full KV pool; any other keeps the name the message gave.
_POOL_NAMES = {POOL_MAMBA: "mamba state pool", POOL_SWA: "SWA (sliding-window) KV pool"}


@dataclass(frozen=True, slots=True)
class Explanation:
    """What an event's outputs say about it: each text whole ("" when there is nothing to say)."""

    limiting_pool: str  # the pool that ran out as the event names it (full, swa, mamba, ...)
    what: str  # "asked for 16384 KV tokens while 6100 were available": a clause, no capital, no full stop
    advice: str  # "Suggested: --chunked-prefill-size from 16384 to 4096." or "Fix: <text>"
    fix: str  # the fix text that applies: the kind's, or the rule's when the limiting pool changes the lever; ""
    # when the event's own numbers rule out the lever it turns (a suggestion left that flag alone)

    @property
    def detail(self) -> str:
        """The sentence on the numbers of a kind's last event (the metric's `detail`)."""
        return f"The last one {self.what}." if self.what else ""

    @property
    def sentence(self) -> str:
        """The clause as a sentence of its own, for one event (scan, the page, a Kubernetes Event)."""
        return f"{self.what[:1].upper()}{self.what[1:]}." if self.what else ""

    def as_dict(self) -> dict[str, Any]:
        """Plain data for JSON (scan's events and /events)."""
        return {"limiting_pool": self.limiting_pool, "detail": self.sentence, "advice": self.advice}


def explain(event: OomEvent, kind_fix: str) -> Explanation:
    """The explanation of an enriched event; kind_fix is its kind's one-line fix (the catalog's summary)."""
    pool = event.numbers.get("limiting_pool")
    pool = pool if isinstance(pool, str) else ""
    fix = MAMBA_FIX + "." if pool == POOL_MAMBA else kind_fix
    advice = _advice(event, fix, pool)
    if any(skipped(s) and s.flag in fix for s in event.suggestions):
        fix = ""  # the kind's usual fix turns a lever this event's numbers rule out: its advice says what instead
    return Explanation(pool, _what(event, pool), advice, fix)


def skipped(s: Suggestion) -> bool:
    """Whether a suggestion leaves its flag alone because no value of it could change the failing allocation."""
    return s.suggested is None and WOULD_NOT_CHANGE in s.rule


def value_text(value: float | None) -> str:
    """A flag value in advice: an integer from 1000 up (as the alert templates print it), else as Python does."""
    if value is not None and value >= 1000:
        return f"{value:.0f}"
    return format_number(value)


def _what(event: OomEvent, pool: str) -> str:
    what = _numbers(event, pool)
    if not what or isinstance(event.numbers.get("exception"), str):
        return what  # a crash's exception: the pool's state explains nothing of it
    basis = _state(event)
    return f"{what}; {basis}" if basis else what


def _state(event: OomEvent) -> str:
    """The state the advice read, and where from: "state from the log line at T: 0 running requests"."""
    kv = event.context.get("kv")
    source = event.context.get("kv_source")
    if not isinstance(kv, dict) or not isinstance(source, str):
        return ""
    running, usage = num(kv, "running_requests"), num(kv, "token_usage")
    parts = ([plural(running, "running request")] if running is not None else []) + (
        [f"token usage {usage:.2f}"] if usage is not None else []
    )
    where = "the last scrape" if source == "scrape" else f"the {source}"
    return f"state from {where}: {', '.join(parts)}" if parts else ""


def _note(n: dict[str, Any]) -> str:
    note = n.get("shortfall_note")
    return f": {note.split(': ', 1)[-1]}" if isinstance(note, str) else ""


def _numbers(event: OomEvent, pool: str) -> str:
    n = event.numbers
    requested, available = n.get("requested_tokens"), n.get("available_tokens")
    if requested is not None and available is not None and pool and pool != POOL_FULL:
        name = _POOL_NAMES.get(pool, f"{pool} pool")
        held = "free" if pool == POOL_MAMBA else "available"
        full = full_available(event)
        tail = f" (the full KV pool had {full})" if full is not None else ""
        return (
            f"asked for {plural(requested, 'token')}; the {name} was the limit with {available} {held}{tail}{_note(n)}"
        )
    if requested is not None and available is not None:
        return f"asked for {plural(requested, 'KV token')} while {available} {were(available)} available{_note(n)}"
    if requested is not None:
        return f"asked for {plural(requested, 'KV token')}"
    slots, free = n.get("req_slots_requested"), n.get("req_slots_available")
    if slots is not None:
        return f"asked for {plural(slots, 'request slot')}" + (
            f" while {free} {were(free)} free" if free is not None else ""
        )
    if n.get("retracted_requests") is not None:
        return f"retracted {plural(n['retracted_requests'], 'running request')}"
    if isinstance(n.get("exception"), str):  # a process died of an exception no kind names (its frames decided)
        return f"died of {n['exception']}"
    return ""


def _advice(event: OomEvent, fix: str, pool: str) -> str:
    changes: dict[str, str] = {}
    for s in event.suggestions:  # the first suggestion per flag is the primary one (as the flag gauges keep it)
        if s.suggested is not None and s.flag not in changes:
            start = f" from {value_text(s.current)}" if s.current is not None else ""
            changes[s.flag] = f"{s.flag}{start} to {value_text(s.suggested)}"
    left = [s for s in event.suggestions if skipped(s) and s.flag not in changes]
    if not changes:
        # No value to give: the fix text, or, when a lever was left alone, the rule's own words, which say
        # why and what to change instead.
        return f"Fix: {left[0].rule[:1].upper()}{left[0].rule[1:]}." if left else f"Fix: {fix}"
    reasons = [f"not {s.flag}: {s.rule}" for s in left] + ([MAMBA_COST] if pool == POOL_MAMBA else [])
    return "Suggested: " + ", ".join(changes.values()) + (f" ({'; '.join(reasons)})" if reasons else "") + "."
