"""The suggestion rules: event numbers + server args + KV snapshot -> flag values. Pure.

Each rule is named in the catalog (`suggest:` of a kind or pattern; catalog.vocabulary.SUGGEST_RULES) and
implemented here (RULES) from the sizing pieces in scheduler.py (prefill chunk, running batch, draft tokens,
request slots, conservativeness) and memory.py (static fraction, CUDA graphs, Mamba cache, pool versus context).
A KV rule advises on the pool that ran out: when the event names the mamba state pool as the limit, the mamba
lever replaces the chunk and batch sizing, which the mamba count (state slots, not tokens) must never feed.
Every suggestion states its rule with the numbers it used, so the on-call engineer can check it; limits.py
holds the floors it never goes under.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..catalog.vocabulary import POOL_MAMBA
from ..detect.model import OomEvent, Suggestion
from .memory import cuda_graph_bs, mamba_cache, mamba_pool, mem_fraction_down, mem_fraction_up, pool_vs_context
from .scheduler import decode, prefill, req_slots, retract, speculative

Rule = Callable[[OomEvent, Mapping[str, Any], Mapping[str, Any]], list[Suggestion]]


def _rule_none(_event: OomEvent, _args: Mapping[str, Any], _kv: Mapping[str, Any]) -> list[Suggestion]:
    return []


def _by_limiting_pool(rule: Rule) -> Rule:
    """A KV rule, unless the pool that ran out was the mamba state pool: then the mamba lever (memory.py)."""

    def kv_rule(event: OomEvent, args: Mapping[str, Any], kv: Mapping[str, Any]) -> list[Suggestion]:
        if event.numbers.get("limiting_pool") == POOL_MAMBA:
            return mamba_pool(event, args)
        return rule(event, args, kv)

    return kv_rule


def _rule_chunked_prefill(event: OomEvent, args: Mapping[str, Any], kv: Mapping[str, Any]) -> list[Suggestion]:
    return prefill(event, args, kv) + pool_vs_context(args, kv)


def _rule_running_requests(event: OomEvent, args: Mapping[str, Any], kv: Mapping[str, Any]) -> list[Suggestion]:
    return decode(event, args, kv) + speculative(event, args) + pool_vs_context(args, kv)


def _rule_prefill_or_decode(event: OomEvent, args: Mapping[str, Any], kv: Mapping[str, Any]) -> list[Suggestion]:
    # The phase is unknown: both fixes, each under its condition, prefill first (the primary in metrics).
    return (
        [_when(s, "the failure happened while scheduling a prefill") for s in prefill(event, args, kv)]
        + [_when(s, "the failure happened while growing the decode batch") for s in decode(event, args, kv)]
        + pool_vs_context(args, kv)
    )


def _rule_req_slots(event: OomEvent, args: Mapping[str, Any], kv: Mapping[str, Any]) -> list[Suggestion]:
    return req_slots(event, args) + pool_vs_context(args, kv)


def _rule_conservativeness(_event: OomEvent, args: Mapping[str, Any], kv: Mapping[str, Any]) -> list[Suggestion]:
    return retract(args, kv)


def _rule_mamba_cache(_event: OomEvent, args: Mapping[str, Any], _kv: Mapping[str, Any]) -> list[Suggestion]:
    return mamba_cache(args)


def _when(s: Suggestion, when: str) -> Suggestion:
    return Suggestion(s.flag, s.current, s.suggested, s.rule, when)


# Rule name (the catalog's `suggest:`, validated against catalog.vocabulary.SUGGEST_RULES) -> implementation.
RULES: dict[str, Rule] = {
    "none": _rule_none,
    "chunked_prefill": _by_limiting_pool(_rule_chunked_prefill),
    "running_requests": _by_limiting_pool(_rule_running_requests),
    "prefill_or_decode": _by_limiting_pool(_rule_prefill_or_decode),
    "request_slots": _rule_req_slots,
    "conservativeness": _rule_conservativeness,
    "mem_fraction_up": mem_fraction_up,
    "mem_fraction_down": mem_fraction_down,
    "cuda_graph_bs": cuda_graph_bs,
    "mamba_cache": _rule_mamba_cache,
}
