"""OomEvent + server args + KV snapshot -> concrete flag values. Pure; runs after dedupe, in the event sink.

The sink asks the catalog which rule an event's kind (or matched pattern) uses; the rules are in rules.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..detect.model import OomEvent, Suggestion
from .rules import RULES


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
    return replace(event, suggestions=suggest(event, rule, args, kv), context=context)


def suggest(
    event: OomEvent, rule: str, args: Mapping[str, Any] | None = None, kv: Mapping[str, Any] | None = None
) -> tuple[Suggestion, ...]:
    """Concrete flag changes for one event by the catalog's rule for it (OomKind.suggest_rule); may be empty."""
    return tuple(RULES[rule](event, args or {}, kv or {}))
