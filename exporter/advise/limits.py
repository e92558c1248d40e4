"""Advice, the limits every suggestion keeps and the number helpers the sizing rules share.

The floors are documented in README ("Concrete suggestions"): a suggestion never goes under them. Sources:
SGLang's hyperparameter tuning guide (docs/sglang-facts.md section 8).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..catalog.vocabulary import POOL_FULL
from ..detect.model import OomEvent

CHUNKED_PREFILL_FLOOR = 512  # below this, chunked prefill costs more than it saves; shrink the batch instead
RUNNING_REQUESTS_FLOOR = 1
DRAFT_TOKENS_FLOOR = 2
MEM_FRACTION_MIN, MEM_FRACTION_MAX = 0.5, 0.95
MEM_FRACTION_STEP = 0.05
POOL_HEADROOM = 0.9  # size the running batch to 90% of the pool: decode grows every request each step
FALLBACK_SHRINK = 0.75  # without numbers to size it, a quarter fewer
CONSERVATIVENESS_GUIDE = 1.3  # the tuning guide's example value
CONSERVATIVENESS_MAX = 2.0
CUDA_GRAPH_BS_GUIDE = 16
# The examples the catalog's fix text gives (remediation steps; tests/test_advice_properties.py keeps them equal).
# A suggestion stays within them unless the numbers prove more is needed, and then its rule says BEYOND_EXAMPLE.
CHUNKED_PREFILL_EXAMPLES = (2048, 4096)  # "lower, for example to 4096 or 2048"
MEM_FRACTION_DOWN_EXAMPLES = (0.7, 0.8)  # "lower it, for example to 0.8 or 0.7"
BEYOND_EXAMPLE = "beyond the runbook's example"
# The words a rule uses when it leaves a flag alone because no value of it could change the failing allocation
# (a chunk at or above the tokens a prefill asked for): advise/explain.py names such a lever as skipped.
WOULD_NOT_CHANGE = "would not change the failing"
# The next lever when neither the chunk nor the running batch can be sized: a trade-off, never a fix (facts 8).
MEM_FRACTION_LEVER = "raise --mem-fraction-static if available_gpu_mem at start-up leaves room (a trade-off, not a fix)"
# Retracted requests (SGLang's own counter, 0.5.8+) before a retraction suggests a value: one or a few
# retractions are normal and never alert; without the counter a retraction suggests nothing.
RETRACTED_BEFORE_ADVICE = 10


def num(mapping: Mapping[str, Any], key: str) -> float | None:
    """A finite-or-inf number from server args, KV snapshot or event numbers; None if absent or not a number."""
    value = mapping.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    return float(value)


def pool_words(event: OomEvent) -> str:
    """' of the swa pool (the limit)' when a pool other than the full KV pool ran out, else nothing."""
    pool = event.numbers.get("limiting_pool")
    return f" of the {pool} pool (the limit)" if isinstance(pool, str) and pool and pool != POOL_FULL else ""


def text(value: float | None) -> str:
    """A number as a rule states it, "?" when unknown."""
    return "?" if value is None else f"{value:g}"


def plural(n: float, word: str) -> str:
    """A count with its noun: "1 KV token", "2 running requests", "0 request slots"."""
    return f"{text(n)} {word}" + ("" if n == 1 else "s")


def were(n: float) -> str:
    """The verb after a count: "1 was", "2 were"."""
    return "was" if n == 1 else "were"


# A pool sized by --max-total-tokens: raising the static fraction cannot grow it (the cap, not memory, sized it).
CAP_LEVER = "raise --max-total-tokens, which caps the pool at {cap} tokens (--mem-fraction-static cannot grow it)"


def pool_cap(args: Mapping[str, Any], kv: Mapping[str, Any]) -> float | None:
    """The --max-total-tokens cap when it sized the KV pool (the pool is within a page of it, or its size is
    unknown), else None: a pool smaller than the cap was sized by memory."""
    cap = num(args, "max_total_tokens")
    if cap is None or cap <= 0:
        return None
    capacity = num(args, "max_total_num_tokens") or num(kv, "max_total_num_tokens")
    page = num(args, "page_size") or 1.0
    return cap if capacity is None or capacity > cap - page else None


def memory_lever(args: Mapping[str, Any], kv: Mapping[str, Any]) -> str:
    """How to give the pool more room: the cap when --max-total-tokens sized it, else the static fraction."""
    cap = pool_cap(args, kv)
    return MEM_FRACTION_LEVER if cap is None else CAP_LEVER.format(cap=text(cap))


def pool_flag(args: Mapping[str, Any], kv: Mapping[str, Any]) -> str:
    """The flag that sizes the pool: --max-total-tokens when it capped it, else --mem-fraction-static."""
    return "--mem-fraction-static" if pool_cap(args, kv) is None else "--max-total-tokens"


def pow2_at_most(n: float) -> int:
    """The largest power of two not above n (0 below 1)."""
    return 1 << (int(n).bit_length() - 1) if n >= 1 else 0


def round_requests(n: float) -> int:
    """Whole requests, a multiple of 8 from 16 up (batch sizes the CUDA graphs were captured for)."""
    n = max(RUNNING_REQUESTS_FLOOR, math.floor(n))
    return int(n - n % 8) if n >= 16 else int(n)
