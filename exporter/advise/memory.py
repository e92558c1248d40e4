"""Advice, the GPU memory split: the static fraction (KV pool and weights versus activations), the CUDA graph
batch size, the Mamba state cache, and a pool too small for the context. Pure; rules.py names them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..catalog.vocabulary import POOL_FULL
from ..detect.model import OomEvent, Suggestion
from .limits import (
    BEYOND_EXAMPLE,
    CUDA_GRAPH_BS_GUIDE,
    MEM_FRACTION_DOWN_EXAMPLES,
    MEM_FRACTION_MAX,
    MEM_FRACTION_MIN,
    MEM_FRACTION_STEP,
    num,
    plural,
    pool_cap,
    pool_flag,
    text,
)


def _mem_fraction(event: OomEvent, args: Mapping[str, Any]) -> float | None:
    return num(event.numbers, "mem_fraction_static") or num(args, "mem_fraction_static")


def mem_fraction_up(event: OomEvent, args: Mapping[str, Any], _kv: Mapping[str, Any]) -> list[Suggestion]:
    """A higher --mem-fraction-static (the KV pool could not even be set up).

    When SGLang computed the value itself (the 2026 start-up check: "Raise --mem-fraction-static above S"),
    its number S is the suggestion, unchanged and credited to SGLang: it is arithmetic on the memory SGLang
    saw, which the exporter cannot see.
    """
    current = _mem_fraction(event, args)
    floor = num(event.numbers, "mem_fraction_floor")
    if floor is not None:
        viable = num(event.numbers, "mem_fraction_viable")
        rule = f"above {floor:g}: SGLang's own number from its start-up check (arithmetic on the GPU memory it saw"
        rule += f"; minimum viable {viable:g})" if viable is not None else ")"
        return [Suggestion("--mem-fraction-static", current, floor, rule)]
    if current is None:
        return [Suggestion("--mem-fraction-static", None, None, "raise it (the current value is unknown)")]
    # Rounded toward the current value: two decimals, never more than one step away.
    value = min(MEM_FRACTION_MAX, math.floor(round((current + MEM_FRACTION_STEP) * 100, 6)) / 100)
    if value <= current:
        rule = f"the current {current:g} is already at the most, {MEM_FRACTION_MAX}: free GPU memory instead"
        return [Suggestion("--mem-fraction-static", current, None, rule)]
    return [
        Suggestion(
            "--mem-fraction-static",
            current,
            value,
            f"{MEM_FRACTION_STEP} above the current {current:g}, at most {MEM_FRACTION_MAX}",
        )
    ]


def cuda_graph_bs(_event: OomEvent, args: Mapping[str, Any], _kv: Mapping[str, Any]) -> list[Suggestion]:
    """A smaller --cuda-graph-max-bs (capturing the graphs ran out of memory)."""
    flag = "--cuda-graph-max-bs"
    bs = num(args, "cuda_graph_max_bs")
    if not bs or bs <= 0:
        return [Suggestion(flag, bs, CUDA_GRAPH_BS_GUIDE, f"the tuning guide's {CUDA_GRAPH_BS_GUIDE}"
                           + ("" if bs is not None else " (the current value is unknown)"))]  # fmt: skip
    half = math.floor(bs / 2)
    if bs > CUDA_GRAPH_BS_GUIDE:
        value = max(CUDA_GRAPH_BS_GUIDE, half)
        return [Suggestion(flag, bs, value, f"half the current {bs:.0f}, at least the tuning guide's "
                           f"{CUDA_GRAPH_BS_GUIDE}")]  # fmt: skip
    if half < 1:
        return [Suggestion(flag, bs, None, f"the current {bs:.0f} is the smallest batch: try --disable-cuda-graph")]
    return [Suggestion(flag, bs, half, f"half the current {bs:.0f}; {BEYOND_EXAMPLE} ({CUDA_GRAPH_BS_GUIDE}): "
                       "the capture already failed at or below it")]  # fmt: skip


def mem_fraction_down(event: OomEvent, args: Mapping[str, Any], _kv: Mapping[str, Any]) -> list[Suggestion]:
    """A lower --mem-fraction-static, leaving activations room (a CUDA OOM outside the pool)."""
    current = _mem_fraction(event, args)
    if current is None:
        return [Suggestion("--mem-fraction-static", None, None, "lower it, e.g. to 0.8 or 0.7 (current unknown)")]
    low = MEM_FRACTION_DOWN_EXAMPLES[0]
    value = max(MEM_FRACTION_MIN, math.ceil(round((current - MEM_FRACTION_STEP) * 100, 6)) / 100)
    rule = f"{MEM_FRACTION_STEP} below the current {current:g}, leaving activations room; at least {MEM_FRACTION_MIN}"
    if value >= current:
        rule = f"the current {current:g} is already at the least, {MEM_FRACTION_MIN}: lower --cuda-graph-max-bs instead"
        return [Suggestion("--mem-fraction-static", current, None, rule)]
    if value < low < current:
        value, rule = low, f"the runbook's {low}, {MEM_FRACTION_STEP} or less below the current {current:g}"
    elif value < low:
        rule += f"; {BEYOND_EXAMPLE} ({low}): the current value is already at or below it and still ran out"
    return [Suggestion("--mem-fraction-static", current, value, rule)]


def mamba_cache(args: Mapping[str, Any]) -> list[Suggestion]:
    """A larger --max-mamba-cache-size."""
    current = num(args, "max_mamba_cache_size")
    if current is None or current <= 0:
        return [Suggestion("--max-mamba-cache-size", None, None, "raise it (the current value is unknown)")]
    return [
        Suggestion("--max-mamba-cache-size", current, math.ceil(current * 1.5), f"1.5 times the current {current:.0f}")
    ]


# What moving memory to the mamba state pool costs: SGLang carves it out of the same GPU memory as the full KV pool.
MAMBA_COST = "the memory comes out of the full KV pool"
MAMBA_FIX = f"Raise --max-mamba-cache-size or --mamba-full-memory-ratio so the mamba state pool has room; {MAMBA_COST}"


def mamba_pool(event: OomEvent, args: Mapping[str, Any]) -> list[Suggestion]:
    """The mamba lever for a KV allocation whose limit was the mamba state pool, never a chunk or a batch sized
    from the mamba count: that counts per-request state slots, not KV tokens."""
    free, full = event.numbers.get("available_tokens"), full_available(event)
    where = f"the mamba state pool was the limit ({free} free" + (f"; the full KV pool had {full})" if full else ")")
    size = [Suggestion(s.flag, s.current, s.suggested, f"{s.rule}: {where}; {MAMBA_COST}") for s in mamba_cache(args)]
    ratio = Suggestion("--mamba-full-memory-ratio", num(args, "mamba_full_memory_ratio"), None,
                       f"raise it when the cache size alone is not enough: {where}; {MAMBA_COST}")  # fmt: skip
    return [*size, ratio]


def full_available(event: OomEvent) -> int | None:
    """What the full KV pool had available at the event, when the message said."""
    return next((p.available for p in event.pools if p.name == POOL_FULL), None)


def pool_vs_context(args: Mapping[str, Any], kv: Mapping[str, Any]) -> list[Suggestion]:
    """A --context-length cap when the KV pool holds less than one request of the full context.

    The context is the served one: the capacity line's context_len (as context_length) or sglang:context_len,
    since /server_info's context_length is the flag (null unless set). The cap is the pool rounded down to 1024,
    or, for a pool under 1024 tokens, to whole pages (a request takes whole pages).
    """
    capacity = num(args, "max_total_num_tokens") or num(kv, "max_total_num_tokens")
    context = num(args, "context_length") or num(kv, "context_len")
    if capacity is None or context is None or capacity < 1 or capacity >= context:
        return []
    page = max(1.0, num(args, "page_size") or 1.0)
    step = 1024 if capacity >= 1024 else page
    value = int(capacity) - int(capacity) % int(step)
    if value < 1 or value >= context:
        return []
    rounded = "rounded down to 1024" if step == 1024 else ("whole pages of " + text(page) if page > 1 else "")
    cap = pool_cap(args, kv)
    grow = f"raise --max-total-tokens (it caps the pool at {text(cap)})" if cap is not None else \
        f"raise {pool_flag(args, kv)}"  # fmt: skip
    return [
        Suggestion(
            "--context-length",
            context,
            value,
            f"the KV pool holds {plural(capacity, 'token')}, less than one request of context_length "
            f"{context:.0f}: cap the context at the pool{f' ({rounded})' if rounded else ''}, or {grow}; "
            f"{BEYOND_EXAMPLE} (the runbook names no --context-length): the numbers show one full-context request "
            "cannot fit",
            "the pool itself is too small for the model's context",
        )
    ]
