"""Advice, the scheduler's limits: how much one prefill chunk, the running batch, the draft tokens and the
request slots may take, and how conservatively SGLang admits requests. Pure; rules.py combines them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..catalog.vocabulary import PHASE_SPEC_VERIFY
from ..detect.model import OomEvent, Suggestion
from .limits import (
    BEYOND_EXAMPLE,
    CHUNKED_PREFILL_EXAMPLES,
    CHUNKED_PREFILL_FLOOR,
    CONSERVATIVENESS_GUIDE,
    CONSERVATIVENESS_MAX,
    DRAFT_TOKENS_FLOOR,
    FALLBACK_SHRINK,
    POOL_HEADROOM,
    RETRACTED_BEFORE_ADVICE,
    RUNNING_REQUESTS_FLOOR,
    WOULD_NOT_CHANGE,
    memory_lever,
    num,
    plural,
    pool_flag,
    pool_words,
    pow2_at_most,
    round_requests,
    text,
    were,
)


def prefill(event: OomEvent, args: Mapping[str, Any], kv: Mapping[str, Any]) -> list[Suggestion]:
    """--chunked-prefill-size sized to the tokens that were free (and fewer running requests below the floor).

    Free tokens below the floor are too few to size a chunk from: the running requests held the pool, so the
    suggestion is the runbook's example (4096 or 2048) and the running batch is what to shrink, never an
    extreme chunk. Without numbers, half the current value, within the runbook's examples. A chunk is only
    suggested below the tokens the failing prefill asked for: one at or above it would not change that
    allocation, so the running requests (which hold the pool) are the lever then, with the reason.
    """
    out = _prefill_chunk(event, args, kv)
    requested = num(event.numbers, "requested_tokens")
    chunk = out[0]
    # A chunk with no number still names the runbook's examples: the smaller one is what it would come to.
    smallest = (
        chunk.suggested if chunk.suggested is not None or chunk.current is not None else min(CHUNKED_PREFILL_EXAMPLES)
    )
    if requested is None or smallest is None or smallest < requested:
        return out
    why = (
        f"a {smallest:.0f}-token chunk {WOULD_NOT_CHANGE} prefill, which asked for only "
        + plural(requested, "token")
        + (f" (at most the floor {CHUNKED_PREFILL_FLOOR})" if requested <= CHUNKED_PREFILL_FLOOR else "")
    )
    if num(kv, "running_requests") == 0:
        # Nothing was running: neither a smaller chunk nor fewer running requests can change this allocation.
        available = num(event.numbers, "available_tokens")
        idle = "no request was running before it" + (
            ", so the pool itself is too small for it" if available is not None and available < requested
            else ", and the numbers show no shortfall" if available is not None else ""
        )  # fmt: skip
        return [
            Suggestion(chunk.flag, chunk.current, None, f"{why}; {idle}"),
            Suggestion("--max-running-requests", num(args, "max_running_requests"), None,
                       f"no request was running before the failure: fewer running requests {WOULD_NOT_CHANGE} "
                       f"prefill; {memory_lever(args, kv)}"),
        ]  # fmt: skip
    instead = "lower --max-running-requests instead, the running requests hold the pool"
    skipped = Suggestion(chunk.flag, chunk.current, None, f"{why}; {instead}")
    lever = [
        Suggestion(s.flag, s.current, s.suggested, f"the running requests hold the pool: {s.rule}"
                   + ("" if s.suggested is not None else f"; or {memory_lever(args, kv)}"), s.when)
        for s in decode(event, args, kv)
    ]  # fmt: skip
    return [skipped, *lever]


def _prefill_chunk(event: OomEvent, args: Mapping[str, Any], kv: Mapping[str, Any]) -> list[Suggestion]:
    requested = num(event.numbers, "requested_tokens")
    available = num(event.numbers, "available_tokens")
    current = num(args, "chunked_prefill_size")
    flag = "--chunked-prefill-size"
    low, high = CHUNKED_PREFILL_EXAMPLES
    fit = pow2_at_most(available) if available is not None else 0
    of_pool = pool_words(event)
    if available is None or fit < CHUNKED_PREFILL_FLOOR:
        why = (
            "the message gave no available tokens"
            if available is None
            else f"only {plural(available, 'KV token')} {were(available)} free{of_pool}, too few to size a prefill "
            "chunk from"
        )
        out = [_prefill_by_example(flag, current, why)]
        if available is not None and num(kv, "running_requests") != 0:
            out.append(
                Suggestion(
                    "--max-running-requests",
                    num(args, "max_running_requests"),
                    None,
                    f"only {plural(available, 'token')} {were(available)} free{of_pool}, less than the floor "
                    f"{CHUNKED_PREFILL_FLOOR}: the running requests fill the pool; admit fewer of them",
                )
            )
        return out
    value = fit
    rule = (
        f"the largest power of two that fits the {available:.0f} available tokens{of_pool}"
        + (f" (the prefill asked for {requested:.0f})" if requested is not None else "")
        + f", never below {CHUNKED_PREFILL_FLOOR}"
    )
    if current is not None and current > 0 and value >= current:
        value = pow2_at_most(current / 2)
        rule += f"; below the current {current:.0f}, so half of it"
        if value < CHUNKED_PREFILL_FLOOR:
            return [Suggestion(flag, current, None, f"the current {current:.0f} is already at the floor "
                               f"{CHUNKED_PREFILL_FLOOR}: admit fewer running requests instead")]  # fmt: skip
    if current is not None and current <= 0:
        rule += "; chunked prefill is off (-1): turning it on bounds each prefill"
    if value < low:
        rule += f"; {BEYOND_EXAMPLE} ({high} or {low}): the free tokens show a smaller chunk is needed"
    return [Suggestion(flag, current, value, rule)]


def _prefill_by_example(flag: str, current: float | None, why: str) -> Suggestion:
    """The runbook's example below the current value (half of it, at most 4096), when no number sizes it."""
    low, high = CHUNKED_PREFILL_EXAMPLES
    if current is None:
        return Suggestion(flag, None, None, f"lower it, e.g. to {high} or {low} ({why}; the current value is unknown)")
    if current <= 0:
        return Suggestion(flag, current, high, f"chunked prefill is off (-1): turn it on at the runbook's {high} "
                          f"({why})")  # fmt: skip
    value = min(high, pow2_at_most(current / 2))
    if value < low:
        return Suggestion(flag, current, None, f"the current {current:.0f} is already at or below the runbook's "
                          f"examples ({high}, {low}) and {why}: admit fewer running requests instead")  # fmt: skip
    return Suggestion(flag, current, value, f"half the current {current:.0f} as a power of two, at most the "
                      f"runbook's {high} ({why})")  # fmt: skip


def decode(event: OomEvent, args: Mapping[str, Any], kv: Mapping[str, Any]) -> list[Suggestion]:
    """--max-running-requests sized to the pool over the tokens each running request held.

    Always below the requests that were running (the runbook's example) and below the current limit; one
    running request alone is too few to size a batch from, so that says so instead of a number.
    """
    flag = "--max-running-requests"
    current = num(args, "max_running_requests")
    running = num(kv, "running_requests")
    used = num(kv, "num_used_tokens") or num(kv, "kv_used_tokens")
    capacity = num(args, "max_total_num_tokens") or num(kv, "max_total_num_tokens")
    if running is not None and running < 2:
        held = f" held {used:.0f} of the {capacity:.0f}-token pool" if used and capacity else " before the failure"
        return [Suggestion(flag, current, None, f"{plural(running, 'running request')}{held}: too few to size a "
                           f"batch from, and fewer {WOULD_NOT_CHANGE} allocation; only a bigger pool or shorter "
                           f"requests can (see --context-length and {pool_flag(args, kv)})")]  # fmt: skip
    if running and used and capacity:
        per_request = used / running
        value = round_requests(POOL_HEADROOM * capacity / per_request)
        rule = (
            f"{POOL_HEADROOM:.0%} of the {capacity:.0f}-token pool over the {plural(round(per_request), 'token')} "
            f"each of the {plural(running, 'running request')} held just before the failure"
        )
        if value >= running:
            value = round_requests(running * FALLBACK_SHRINK)
            rule += f"; that does not shrink the batch, so {FALLBACK_SHRINK:.0%} of the {running:.0f} running"
        return [_below_current(flag, current, value, rule + f", at least {RUNNING_REQUESTS_FLOOR}")]
    base, what = (current, "the current limit") if current else (running, "the requests running at the failure")
    if base and not current and round_requests(base * FALLBACK_SHRINK) >= base:
        rule = (
            f"{plural(base, 'running request')} at the failure, already the fewest: the pool is small for one request"
        )
        return [Suggestion(flag, current, None, rule + f" (see --context-length and {pool_flag(args, kv)})")]
    if base:
        missing = "no KV snapshot" if running is None else "no token count in the snapshot"
        return [
            _below_current(
                flag,
                current,
                round_requests(base * FALLBACK_SHRINK),
                f"{FALLBACK_SHRINK:.0%} of {what} ({base:.0f}); {missing} to size it, "
                f"at least {RUNNING_REQUESTS_FLOOR}",
            )
        ]
    return [Suggestion(flag, None, None, "lower it (neither the server args nor a KV snapshot are known)")]


def _below_current(flag: str, current: float | None, value: int, rule: str) -> Suggestion:
    """A lower limit, or no number when the rounding or the floor leave it at or above the current one."""
    if current is None or current <= 0 or value < current:
        return Suggestion(flag, current, value, rule)
    if value > RUNNING_REQUESTS_FLOOR and current > RUNNING_REQUESTS_FLOOR:
        lower = round_requests(current * FALLBACK_SHRINK)
        if lower < current:
            return Suggestion(flag, current, lower, f"{rule}; that is not below the current {current:.0f}, so "
                              f"{FALLBACK_SHRINK:.0%} of it")  # fmt: skip
    return Suggestion(flag, current, None, f"the current {current:.0f} is already at the floor "
                      f"{RUNNING_REQUESTS_FLOOR}: the pool is too small for one request")  # fmt: skip


def speculative(event: OomEvent, args: Mapping[str, Any]) -> list[Suggestion]:
    """Fewer draft tokens, when speculative decoding is on."""
    drafts = num(args, "speculative_num_draft_tokens")
    if event.subphase != PHASE_SPEC_VERIFY and not args.get("speculative_algorithm"):
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
    if value >= drafts:
        verb = "is" if drafts == 1 else "are"
        why = f"{plural(drafts, 'draft token')} {verb} already at or below the floor {DRAFT_TOKENS_FLOOR}"
        return [Suggestion("--speculative-num-draft-tokens", drafts, None,
                           f"{why}: turn speculative decoding off if the pool stays this full")]  # fmt: skip
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
    if requested is not None and available is not None and available >= requested:
        # No shortfall in the numbers (the slots were taken between SGLang's check and its message, or the message
        # is not the allocator's): no count to subtract, so the fallback shrink, saying so.
        value = round_requests(current * FALLBACK_SHRINK)
        rule = (
            f"the message shows no shortfall ({text(requested)} asked, {text(available)} free): "
            f"{FALLBACK_SHRINK:.0%} of the current {current:.0f}, at least {RUNNING_REQUESTS_FLOOR}"
        )
        return [_below_current(flag, current, value, rule)]
    shortfall = max(1.0, (requested or 1.0) - (available or 0.0))
    value = round_requests(current - shortfall)
    rule = (
        f"the current {current:.0f} minus the {plural(shortfall, 'slot')} that {were(shortfall)} missing "
        f"({text(requested)} asked, {text(available)} free)"
        f", rounded down to a multiple of 8 from 16 up, at least {RUNNING_REQUESTS_FLOOR}"
    )
    return [_below_current(flag, current, value, rule)]


def retract(args: Mapping[str, Any], kv: Mapping[str, Any]) -> list[Suggestion]:
    """A higher --schedule-conservativeness, once the server has retracted more than a few requests.

    One retraction (or a few) is normal and suggests nothing: SGLangKVCacheRetractionsHigh measures the rate
    and its fix names the flag. The count comes from SGLang's own counter (0.5.8+); without it, nothing.
    """
    retracted = num(kv, "retracted_requests_total")
    if retracted is None or retracted < RETRACTED_BEFORE_ADVICE:
        return []
    current = num(args, "schedule_conservativeness")
    when = "retractions happen more than about once a minute while token usage is high"
    seen = f"SGLang has retracted {retracted:.0f} requests"
    if current is None:
        return [Suggestion("--schedule-conservativeness", None, CONSERVATIVENESS_GUIDE,
                           f"the tuning guide's {CONSERVATIVENESS_GUIDE} ({seen}; the current value is unknown)",
                           when)]  # fmt: skip
    if current >= CONSERVATIVENESS_MAX:
        return [Suggestion("--schedule-conservativeness", current, None,
                           f"the current {current:g} is already at the most, {CONSERVATIVENESS_MAX:g} ({seen}): "
                           "lower --max-running-requests instead", when)]  # fmt: skip
    value = round(min(CONSERVATIVENESS_MAX, max(CONSERVATIVENESS_GUIDE, current + 0.3)), 2)
    rule = f"the tuning guide's {CONSERVATIVENESS_GUIDE}, or 0.3 above the current {current:g}, at most 2.0 ({seen})"
    if value > CONSERVATIVENESS_GUIDE:
        rule += f"; {BEYOND_EXAMPLE} ({CONSERVATIVENESS_GUIDE}): the current value is already at or above it"
    return [Suggestion("--schedule-conservativeness", current, value, rule, when)]
