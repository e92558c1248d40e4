"""OomEvent + server args + KV snapshot -> concrete flag values. Pure; runs after dedupe, in the event sink.

The sink asks the catalog which rule an event's kind (or matched pattern) uses; the rules are in rules.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..detect.match import SHORTFALL_NOTE
from ..detect.model import OomEvent, Suggestion
from .limits import num
from .rules import RULES

# A request not above what was available where nothing rounds (page size 1, from the args): the numbers show no
# shortfall, and the page rounding (detect/match.py SHORTFALL_NOTE) would explain nothing.
NO_SHORTFALL = "the numbers show no shortfall"


def with_suggestions(
    event: OomEvent,
    rule: str,
    args: Mapping[str, Any] | None,
    kv: Mapping[str, Any] | None = None,
    target: str | None = None,
    notes: Mapping[str, Any] | None = None,
) -> OomEvent:
    """The event with its concrete suggestions and the context (server args, KV state) they came from; notes
    say where each came from (`server_args_source`, `kv_source`: a log line or the scrape)."""
    context: dict[str, Any] = {}
    if target:
        context["target"] = target
    if args:
        context["server_args"] = dict(args)
    if kv:
        context["kv"] = dict(kv)
    context.update(notes or {})
    return replace(
        event, suggestions=suggest(event, rule, args, kv), context=context, numbers=_shortfall(event.numbers, args)
    )


def _shortfall(numbers: dict[str, Any], args: Mapping[str, Any] | None) -> dict[str, Any]:
    """The numbers, their shortfall note explaining page rounding only where the page size is above 1."""
    note = numbers.get("shortfall_note")
    page = num(args or {}, "page_size")
    if not isinstance(note, str) or not note.endswith(SHORTFALL_NOTE) or page != 1:
        return numbers  # a page size above 1, or unknown (a paged allocator's failure may be all the log says)
    said = note[: -len(SHORTFALL_NOTE)]  # "asked for 120, 256 available: "
    return {**numbers, "shortfall_note": f"{said}{NO_SHORTFALL} at page size 1, where nothing is rounded"}


def suggest(
    event: OomEvent, rule: str, args: Mapping[str, Any] | None = None, kv: Mapping[str, Any] | None = None
) -> tuple[Suggestion, ...]:
    """Concrete flag changes for one event by the catalog's rule for it (OomKind.suggest_rule); may be empty."""
    return tuple(RULES[rule](event, args or {}, kv or {}))
