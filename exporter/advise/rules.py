"""The suggestion rules: event numbers + server args + KV snapshot -> flag values. Pure.

Each rule is named in the catalog (`suggest:` of a kind or pattern; catalog.loader.SUGGEST_RULES) and
implemented here (RULES). Every suggestion states its rule with the numbers it used, so the on-call
engineer can check it. The floors below are documented in README ("Concrete suggestions"): a suggestion
never goes under them. Sources: SGLang's hyperparameter tuning guide (docs/sglang-facts.md section 8).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from ..detect.model import OomEvent, Suggestion

CHUNKED_PREFILL_FLOOR = 512  # below this, chunked prefill costs more than it saves; shrink the batch instead
RUNNING_REQUESTS_FLOOR = 1
DRAFT_TOKENS_FLOOR = 2
MEM_FRACTION_MIN, MEM_FRACTION_MAX = 0.5, 0.95
MEM_FRACTION_STEP = 0.05
POOL_HEADROOM = 0.9  # size the running batch to 90% of the pool: decode grows every request each step
FALLBACK_SHRINK = 0.75  # without numbers to size it, a quarter fewer
CONSERVATIVENESS_GUIDE = 1.3  # the tuning guide's example value
CUDA_GRAPH_BS_GUIDE = 16


Rule = Callable[[OomEvent, Mapping[str, Any], Mapping[str, Any]], list[Suggestion]]


def _rule_none(_event: OomEvent, _args: Mapping[str, Any], _kv: Mapping[str, Any]) -> list[Suggestion]:
    return []


def _rule_chunked_prefill(event: OomEvent, args: Mapping[str, Any], kv: Mapping[str, Any]) -> list[Suggestion]:
    return _prefill(event, args) + _pool_vs_context(args, kv)


def _rule_running_requests(event: OomEvent, args: Mapping[str, Any], kv: Mapping[str, Any]) -> list[Suggestion]:
    return _decode(event, args, kv) + _speculative(event, args) + _pool_vs_context(args, kv)


def _rule_prefill_or_decode(event: OomEvent, args: Mapping[str, Any], kv: Mapping[str, Any]) -> list[Suggestion]:
    # The phase is unknown: both fixes, each under its condition, prefill first (the primary in metrics).
    return (
        [_when(s, "the failure happened while scheduling a prefill") for s in _prefill(event, args)]
        + [_when(s, "the failure happened while growing the decode batch") for s in _decode(event, args, kv)]
        + _pool_vs_context(args, kv)
    )


def _rule_req_slots(event: OomEvent, args: Mapping[str, Any], kv: Mapping[str, Any]) -> list[Suggestion]:
    return _req_slots(event, args) + _pool_vs_context(args, kv)


def _rule_conservativeness(_event: OomEvent, args: Mapping[str, Any], _kv: Mapping[str, Any]) -> list[Suggestion]:
    return _retract(args)


def _rule_mamba_cache(_event: OomEvent, args: Mapping[str, Any], _kv: Mapping[str, Any]) -> list[Suggestion]:
    return _mamba(args)


def _num(mapping: Mapping[str, Any], key: str) -> float | None:
    value = mapping.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    return float(value)


def _text(value: float | None) -> str:
    return "?" if value is None else f"{value:g}"


def _when(s: Suggestion, when: str) -> Suggestion:
    return Suggestion(s.flag, s.current, s.suggested, s.rule, when)


def _pow2_at_most(n: float) -> int:
    return 1 << (int(n).bit_length() - 1) if n >= 1 else 0


def _round_requests(n: float) -> int:
    """Whole requests, a multiple of 8 from 16 up (batch sizes the CUDA graphs were captured for)."""
    n = max(RUNNING_REQUESTS_FLOOR, math.floor(n))
    return int(n - n % 8) if n >= 16 else int(n)


def _prefill(event: OomEvent, args: Mapping[str, Any]) -> list[Suggestion]:
    requested = _num(event.numbers, "requested_tokens")
    available = _num(event.numbers, "available_tokens")
    current = _num(args, "chunked_prefill_size")
    flag = "--chunked-prefill-size"
    if available is None:
        if current is not None and current > 0:
            value = max(CHUNKED_PREFILL_FLOOR, _pow2_at_most(current / 2))
            return [
                Suggestion(
                    flag,
                    current,
                    value,
                    f"half the current {current:.0f} as a power of two, at least "
                    f"{CHUNKED_PREFILL_FLOOR} (the message gave no available tokens)",
                )
            ]
        return [Suggestion(flag, current, None, "lower it, e.g. to 4096 or 2048 (no numbers in the message)")]
    fit = _pow2_at_most(available)
    value = max(CHUNKED_PREFILL_FLOOR, fit)
    rule = (
        f"the largest power of two that fits the {available:.0f} available tokens"
        + (f" (the prefill asked for {requested:.0f})" if requested is not None else "")
        + f", never below {CHUNKED_PREFILL_FLOOR}"
    )
    if current is not None and current > 0 and value >= current:
        value = max(CHUNKED_PREFILL_FLOOR, _pow2_at_most(current / 2))
        rule += f"; below the current {current:.0f}, so half of it"
    if current is not None and current <= 0:
        rule += "; chunked prefill is off (-1): turning it on bounds each prefill"
    out = [Suggestion(flag, current, value, rule)]
    if fit < CHUNKED_PREFILL_FLOOR:
        out.append(
            Suggestion(
                "--max-running-requests",
                _num(args, "max_running_requests"),
                None,
                f"only {available:.0f} tokens were free, less than the floor {CHUNKED_PREFILL_FLOOR}: "
                "the running requests fill the pool; admit fewer of them",
            )
        )
    return out


def _decode(event: OomEvent, args: Mapping[str, Any], kv: Mapping[str, Any]) -> list[Suggestion]:
    flag = "--max-running-requests"
    current = _num(args, "max_running_requests")
    running = _num(kv, "running_requests")
    used = _num(kv, "num_used_tokens") or _num(kv, "kv_used_tokens")
    capacity = _num(args, "max_total_num_tokens") or _num(kv, "max_total_num_tokens")
    if running and used and capacity:
        per_request = used / running
        value = _round_requests(POOL_HEADROOM * capacity / per_request)
        rule = (
            f"{POOL_HEADROOM:.0%} of the {capacity:.0f}-token pool over the {per_request:.0f} tokens each of the "
            f"{running:.0f} running requests held just before the failure"
        )
        if value >= running:
            value = _round_requests(running * FALLBACK_SHRINK)
            rule += f"; that does not shrink the batch, so {FALLBACK_SHRINK:.0%} of the {running:.0f} running"
        return [Suggestion(flag, current, value, rule + f", at least {RUNNING_REQUESTS_FLOOR}")]
    base, what = (current, "the current limit") if current else (running, "the requests running at the failure")
    if base:
        return [
            Suggestion(
                flag,
                current,
                _round_requests(base * FALLBACK_SHRINK),
                f"{FALLBACK_SHRINK:.0%} of {what} ({base:.0f}); no KV snapshot to size it, "
                f"at least {RUNNING_REQUESTS_FLOOR}",
            )
        ]
    return [Suggestion(flag, None, None, "lower it (neither the server args nor a KV snapshot are known)")]


def _speculative(event: OomEvent, args: Mapping[str, Any]) -> list[Suggestion]:
    drafts = _num(args, "speculative_num_draft_tokens")
    if event.subphase != "spec_verify" and not args.get("speculative_algorithm"):
        return []
    if drafts is None:
        return [
            Suggestion(
                "--speculative-num-draft-tokens",
                None,
                None,
                "speculative decoding reserves draft tokens for every request each step; use fewer",
            )
        ]
    value = max(DRAFT_TOKENS_FLOOR, math.floor(drafts / 2))
    return [
        Suggestion(
            "--speculative-num-draft-tokens",
            drafts,
            value,
            f"half the {drafts:.0f} draft tokens every request reserves per step, at least {DRAFT_TOKENS_FLOOR}",
        )
    ]


def _req_slots(event: OomEvent, args: Mapping[str, Any]) -> list[Suggestion]:
    flag = "--max-running-requests"
    current = _num(args, "max_running_requests")
    available = _num(event.numbers, "req_slots_available")
    requested = _num(event.numbers, "req_slots_requested")
    if current is None:
        return [Suggestion(flag, None, None, "set it below the number of request slots (server args unknown)")]
    shortfall = max(1.0, (requested or 1.0) - (available or 0.0))
    value = _round_requests(current - shortfall)
    rule = (
        f"the current {current:.0f} minus the {shortfall:.0f} slots that were missing "
        f"({_text(requested)} asked, {_text(available)} free)"
        f", rounded down to a multiple of 8 from 16 up, at least {RUNNING_REQUESTS_FLOOR}"
    )
    return [Suggestion(flag, current, value, rule)]


def _retract(args: Mapping[str, Any]) -> list[Suggestion]:
    current = _num(args, "schedule_conservativeness")
    base = current if current is not None else 1.0
    value = round(min(2.0, max(CONSERVATIVENESS_GUIDE, base + 0.3)), 2)
    return [
        Suggestion(
            "--schedule-conservativeness",
            current,
            value,
            f"the tuning guide's {CONSERVATIVENESS_GUIDE}, or 0.3 above the current {base:g}, at most 2.0",
            "retractions happen more than about once a minute while token usage is high",
        )
    ]


def _mem_fraction(event: OomEvent, args: Mapping[str, Any]) -> float | None:
    return _num(event.numbers, "mem_fraction_static") or _num(args, "mem_fraction_static")


def _startup(event: OomEvent, args: Mapping[str, Any], _kv: Mapping[str, Any]) -> list[Suggestion]:
    current = _mem_fraction(event, args)
    if current is None:
        return [Suggestion("--mem-fraction-static", None, None, "raise it (the current value is unknown)")]
    value = round(min(MEM_FRACTION_MAX, current + MEM_FRACTION_STEP), 2)
    return [
        Suggestion(
            "--mem-fraction-static",
            current,
            value,
            f"{MEM_FRACTION_STEP} above the current {current:g}, at most {MEM_FRACTION_MAX}",
        )
    ]


def _cuda_graph(_event: OomEvent, args: Mapping[str, Any], _kv: Mapping[str, Any]) -> list[Suggestion]:
    bs = _num(args, "cuda_graph_max_bs")
    batch = max(1, math.floor(bs / 2)) if bs else CUDA_GRAPH_BS_GUIDE
    return [
        Suggestion(
            "--cuda-graph-max-bs",
            bs,
            batch,
            f"half the current {bs:.0f}" if bs else f"the tuning guide's {CUDA_GRAPH_BS_GUIDE}",
        )
    ]


def _cuda(event: OomEvent, args: Mapping[str, Any], _kv: Mapping[str, Any]) -> list[Suggestion]:
    current = _mem_fraction(event, args)
    if current is None:
        return [Suggestion("--mem-fraction-static", None, None, "lower it, e.g. to 0.8 or 0.7 (current unknown)")]
    value = round(max(MEM_FRACTION_MIN, current - MEM_FRACTION_STEP), 2)
    return [
        Suggestion(
            "--mem-fraction-static",
            current,
            value,
            f"{MEM_FRACTION_STEP} below the current {current:g}, leaving activations room; at least {MEM_FRACTION_MIN}",
        )
    ]


def _mamba(args: Mapping[str, Any]) -> list[Suggestion]:
    current = _num(args, "max_mamba_cache_size")
    if current is None:
        return [Suggestion("--max-mamba-cache-size", None, None, "raise it (the current value is unknown)")]
    return [
        Suggestion("--max-mamba-cache-size", current, math.ceil(current * 1.5), f"1.5 times the current {current:.0f}")
    ]


def _pool_vs_context(args: Mapping[str, Any], kv: Mapping[str, Any]) -> list[Suggestion]:
    capacity = _num(args, "max_total_num_tokens") or _num(kv, "max_total_num_tokens")
    context = _num(args, "context_length")
    if capacity is None or context is None or capacity >= context:
        return []
    value = max(1024, int(capacity) - int(capacity) % 1024)
    return [
        Suggestion(
            "--context-length",
            context,
            value,
            f"the KV pool holds {capacity:.0f} tokens, less than one request of context_length "
            f"{context:.0f}: cap the context at the pool (rounded down to 1024), or raise "
            "--mem-fraction-static",
            "the pool itself is too small for the model's context",
        )
    ]


# Rule name (the catalog's `suggest:`, validated against catalog.loader.SUGGEST_RULES) -> implementation.
RULES: dict[str, Rule] = {
    "none": _rule_none,
    "chunked_prefill": _rule_chunked_prefill,
    "running_requests": _rule_running_requests,
    "prefill_or_decode": _rule_prefill_or_decode,
    "request_slots": _rule_req_slots,
    "conservativeness": _rule_conservativeness,
    "mem_fraction_up": _startup,
    "mem_fraction_down": _cuda,
    "cuda_graph_bs": _cuda_graph,
    "mamba_cache": _rule_mamba_cache,
}
