"""Advice, the scheduler's limits: how much one prefill chunk, the running batch, the draft tokens and the
request slots may take, and how conservatively SGLang admits requests. Pure; rules.py combines them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..detect.model import OomEvent, Suggestion
from .limits import (
    CHUNKED_PREFILL_FLOOR,
    CONSERVATIVENESS_GUIDE,
    DRAFT_TOKENS_FLOOR,
    FALLBACK_SHRINK,
    POOL_HEADROOM,
    RUNNING_REQUESTS_FLOOR,
    num,
    pow2_at_most,
    round_requests,
    text,
)


def prefill(event: OomEvent, args: Mapping[str, Any]) -> list[Suggestion]:
    """--chunked-prefill-size sized to the tokens that were free (and fewer running requests below the floor)."""
    requested = num(event.numbers, "requested_tokens")
    available = num(event.numbers, "available_tokens")
    current = num(args, "chunked_prefill_size")
    flag = "--chunked-prefill-size"
    if available is None:
        if current is not None and current > 0:
            value = max(CHUNKED_PREFILL_FLOOR, pow2_at_most(current / 2))
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
    fit = pow2_at_most(available)
    value = max(CHUNKED_PREFILL_FLOOR, fit)
    rule = (
        f"the largest power of two that fits the {available:.0f} available tokens"
        + (f" (the prefill asked for {requested:.0f})" if requested is not None else "")
        + f", never below {CHUNKED_PREFILL_FLOOR}"
    )
    if current is not None and current > 0 and value >= current:
        value = max(CHUNKED_PREFILL_FLOOR, pow2_at_most(current / 2))
        rule += f"; below the current {current:.0f}, so half of it"
    if current is not None and current <= 0:
        rule += "; chunked prefill is off (-1): turning it on bounds each prefill"
    out = [Suggestion(flag, current, value, rule)]
    if fit < CHUNKED_PREFILL_FLOOR:
        out.append(
            Suggestion(
                "--max-running-requests",
                num(args, "max_running_requests"),
                None,
                f"only {available:.0f} tokens were free, less than the floor {CHUNKED_PREFILL_FLOOR}: "
                "the running requests fill the pool; admit fewer of them",
            )
        )
    return out


def decode(event: OomEvent, args: Mapping[str, Any], kv: Mapping[str, Any]) -> list[Suggestion]:
    """--max-running-requests sized to the pool over the tokens each running request held."""
    flag = "--max-running-requests"
    current = num(args, "max_running_requests")
    running = num(kv, "running_requests")
    used = num(kv, "num_used_tokens") or num(kv, "kv_used_tokens")
    capacity = num(args, "max_total_num_tokens") or num(kv, "max_total_num_tokens")
    if running and used and capacity:
        per_request = used / running
        value = round_requests(POOL_HEADROOM * capacity / per_request)
        rule = (
            f"{POOL_HEADROOM:.0%} of the {capacity:.0f}-token pool over the {per_request:.0f} tokens each of the "
            f"{running:.0f} running requests held just before the failure"
        )
        if value >= running:
            value = round_requests(running * FALLBACK_SHRINK)
            rule += f"; that does not shrink the batch, so {FALLBACK_SHRINK:.0%} of the {running:.0f} running"
        return [Suggestion(flag, current, value, rule + f", at least {RUNNING_REQUESTS_FLOOR}")]
    base, what = (current, "the current limit") if current else (running, "the requests running at the failure")
    if base:
        return [
            Suggestion(
                flag,
                current,
                round_requests(base * FALLBACK_SHRINK),
                f"{FALLBACK_SHRINK:.0%} of {what} ({base:.0f}); no KV snapshot to size it, "
                f"at least {RUNNING_REQUESTS_FLOOR}",
            )
        ]
    return [Suggestion(flag, None, None, "lower it (neither the server args nor a KV snapshot are known)")]


def speculative(event: OomEvent, args: Mapping[str, Any]) -> list[Suggestion]:
    """Fewer draft tokens, when speculative decoding is on."""
    drafts = num(args, "speculative_num_draft_tokens")
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


def req_slots(event: OomEvent, args: Mapping[str, Any]) -> list[Suggestion]:
    """--max-running-requests below the request slots that were missing."""
    flag = "--max-running-requests"
    current = num(args, "max_running_requests")
    available = num(event.numbers, "req_slots_available")
    requested = num(event.numbers, "req_slots_requested")
    if current is None:
        return [Suggestion(flag, None, None, "set it below the number of request slots (server args unknown)")]
    shortfall = max(1.0, (requested or 1.0) - (available or 0.0))
    value = round_requests(current - shortfall)
    rule = (
        f"the current {current:.0f} minus the {shortfall:.0f} slots that were missing "
        f"({text(requested)} asked, {text(available)} free)"
        f", rounded down to a multiple of 8 from 16 up, at least {RUNNING_REQUESTS_FLOOR}"
    )
    return [Suggestion(flag, current, value, rule)]


def retract(args: Mapping[str, Any]) -> list[Suggestion]:
    """A higher --schedule-conservativeness, so fewer requests are retracted."""
    current = num(args, "schedule_conservativeness")
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
