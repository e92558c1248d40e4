"""Advice never contradicts itself: a property test over random events, server args and KV snapshots, for
every suggestion rule and every kind (and pattern) that uses it.

For each suggestion of an event of kind K:
- direction: a flag the fix text of K says to lower is suggested below its current value (raise: above);
- within the fix text: a number at or beyond the fix text's examples for that flag in K (below "to 4096 or
  2048", above "to 1.3", more than one step of "0.85 -> 0.9"), or for a flag K's fix text does not name, only
  with the rule saying BEYOND_EXAMPLE and why;
- an unknown current value is never printed as a number ("the current 1" when nothing is known);
- a retraction suggests nothing unless SGLang's own counter shows more than a few retracted requests;
- a suggested value can change the failing allocation: a chunk size is below the tokens the failing prefill asked
  for, and, sized from the free tokens, not above what the pool that ran out had available;
- the value already in use is never suggested, and no flag whose change cannot alter the failing allocation gets
  a number: fewer running requests when the snapshot shows none running;
- no cause the numbers contradict: no "running requests hold the pool" when none ran, no missing slots when the
  free slots were enough, no "--mem-fraction-static" when --max-total-tokens capped the pool, no page rounding
  explained at page size 1, and counts agree with their nouns ("1 KV token", "1 running request");
- an event whose limiting pool is the mamba state pool (hybrid models) gets the mamba lever only: never a chunk
  size or a running-batch size, which its count (state slots, not KV tokens) must not feed. The hybrid (mamba,
  swa) and paged snapshots below are shaped as detect/match.py gives them.
The examples in advise/limits.py are the ones the catalog's text gives (checked here).
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_oom_exporter.advise import limits
from sglang_oom_exporter.advise.explain import explain
from sglang_oom_exporter.advise.rules import RULES
from sglang_oom_exporter.advise.suggest import suggest, with_suggestions
from sglang_oom_exporter.catalog import OomKind
from sglang_oom_exporter.catalog.vocabulary import POOL_FULL, POOL_MAMBA, POOL_SWA
from sglang_oom_exporter.detect.match import SHORTFALL_NOTE
from sglang_oom_exporter.detect.model import OomEvent, PoolState
from tests.support.helpers import CATALOG

pytestmark = pytest.mark.slow  # 200 examples a case, 30 cases: make all runs them, make test does not

_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?")


def _uses(rule: str) -> list[OomKind]:
    """The kinds whose events this rule advises on: by the kind's own rule or one of its patterns'."""
    return [k for k in CATALOG.kinds if k.suggest == rule or any(p.suggest == rule for p in k.patterns)]


def _steps(kind: OomKind) -> dict[str, str]:
    """flag -> action text of the kind's remediation steps (first step of a flag wins)."""
    steps: dict[str, str] = {}
    for step in kind.remediation()["steps"]:
        steps.setdefault(step["flag"], step["action"])
    return steps


def _direction(action: str) -> str | None:
    first = action.split()[0].strip(",")
    return {"lower": "lower", "raise": "raise", "set": "lower"}.get(first)


def test_every_rule_is_used_by_some_kind_or_is_none():
    assert sorted(r for r in RULES if not _uses(r)) == []


def test_limits_examples_are_the_catalogs_text():
    texts = {(k.id, flag): action for k in CATALOG.kinds for flag, action in _steps(k).items()}
    chunk = {a for (_, flag), a in texts.items() if flag == "--chunked-prefill-size" and "example" in a}
    assert chunk == {"lower, for example to 4096 or 2048"}
    assert sorted(limits.CHUNKED_PREFILL_EXAMPLES, reverse=True) == [4096, 2048]
    assert "lower it, for example to 0.8 or 0.7" in texts.values()
    assert limits.MEM_FRACTION_DOWN_EXAMPLES == (0.7, 0.8)
    assert "raise it, for example to 1.3" in texts.values()
    assert limits.CONSERVATIVENESS_GUIDE == 1.3
    assert "lower it, for example to 16" in texts.values()
    assert limits.CUDA_GRAPH_BS_GUIDE == 16


_ARGS = st.fixed_dictionaries(
    {},
    optional={
        "chunked_prefill_size": st.sampled_from([-1, 0, 256, 512, 1024, 2048, 3000, 4096, 8192, 16384, 65536]),
        "max_running_requests": st.integers(min_value=0, max_value=4096),
        "max_total_num_tokens": st.integers(min_value=0, max_value=2_000_000),
        "context_length": st.integers(min_value=0, max_value=1_000_000),
        "mem_fraction_static": st.floats(min_value=0.3, max_value=0.99),
        "cuda_graph_max_bs": st.integers(min_value=0, max_value=1024),
        "schedule_conservativeness": st.floats(min_value=0.1, max_value=3.0),
        "speculative_num_draft_tokens": st.integers(min_value=0, max_value=64),
        "speculative_algorithm": st.sampled_from(["EAGLE", "NGRAM"]),
        "max_mamba_cache_size": st.integers(min_value=0, max_value=10_000),
        "max_total_tokens": st.sampled_from([None, 256, 4096, 100_000]),
        "page_size": st.sampled_from([1, 16, 64]),
    },
)
_KV = st.fixed_dictionaries(
    {},
    optional={
        "running_requests": st.integers(min_value=0, max_value=2048) | st.sampled_from([0, 1]),
        "token_usage": st.floats(min_value=0, max_value=1),
        "context_len": st.integers(min_value=1, max_value=1_000_000),
        "num_used_tokens": st.integers(min_value=0, max_value=2_000_000),
        "max_total_num_tokens": st.integers(min_value=0, max_value=2_000_000),
        "retracted_requests_total": st.integers(min_value=0, max_value=1000),
    },
)
_NUMBERS = st.fixed_dictionaries(
    {},
    optional={
        "requested_tokens": st.integers(min_value=0, max_value=200_000),
        "available_tokens": st.integers(min_value=0, max_value=200_000),
        "req_slots_available": st.integers(min_value=0, max_value=4096) | st.sampled_from([1, 7, 8]),
        "req_slots_requested": st.integers(min_value=0, max_value=4096) | st.sampled_from([1, 4, 5]),
        "mem_fraction_static": st.floats(min_value=0.3, max_value=0.99),
    },
)


CHUNK = "--chunked-prefill-size"
MAMBA_FLAGS = {"--max-mamba-cache-size", "--mamba-full-memory-ratio"}


def _check(
    kind: OomKind, rule: str, subphase: str | None, numbers: dict, args: dict, kv: dict, pools: tuple = ()
) -> tuple:
    event = OomEvent(kind=kind.id, fatal=kind.fatal, source="s", location="s:1", time=None, ranks=(), message="m",
                     excerpt="", subphase=subphase, numbers=numbers, pools=pools)  # fmt: skip
    got = suggest(event, rule, args, kv)
    requested, available = numbers.get("requested_tokens"), numbers.get("available_tokens")
    for s in got:
        if s.flag == CHUNK and s.suggested is not None and requested is not None:
            assert s.suggested < requested, (kind.id, rule, numbers, s)  # else it cannot change the allocation
        if (
            s.flag == CHUNK
            and s.suggested is not None
            and available is not None
            and available >= limits.CHUNKED_PREFILL_FLOOR
        ):
            assert s.suggested <= available, (kind.id, rule, numbers, s)
    if numbers.get("limiting_pool") == POOL_MAMBA:
        assert {s.flag for s in got if s.suggested is not None} <= MAMBA_FLAGS, (kind.id, rule, numbers, got)
        assert {s.flag for s in got} == MAMBA_FLAGS, (kind.id, rule, got)
    _check_words(event, rule, numbers, args, kv, got)
    steps = _steps(kind)
    if kind.id == CATALOG.retraction_kind and kv.get("retracted_requests_total", 0) < limits.RETRACTED_BEFORE_ADVICE:
        assert got == ()
    for s in got:
        assert s.rule
        if s.current is None:
            # "the current 1", "current 16384" or "current ?" when nothing is known
            assert not re.search(r"current \??\d|current \?", s.rule), (rule, s)
        if s.suggested is None:
            continue
        action = steps.get(s.flag)
        if action is None:
            assert limits.BEYOND_EXAMPLE in s.rule, (kind.id, rule, s)
            continue
        direction = _direction(action)
        current = s.current
        if direction == "lower" and current is not None and current > 0:
            assert s.suggested < current, (kind.id, s)
        if direction == "raise" and current is not None:
            assert s.suggested > current, (kind.id, s)
        examples = [float(n) for n in _NUMBER.findall(action)]
        if not examples or limits.BEYOND_EXAMPLE in s.rule:
            continue
        if "->" in action:  # an example step: "raise it (e.g. 0.85 -> 0.9)"
            step = examples[1] - examples[0]
            assert current is not None, (kind.id, s)
            assert abs(s.suggested - current) <= step + 1e-9, (kind.id, s)
        elif direction == "lower":
            assert s.suggested >= min(examples), (kind.id, rule, s)
        elif direction == "raise":
            assert s.suggested <= max(examples), (kind.id, rule, s)
    return got


# A count whose noun disagrees with it: "1 KV tokens", "1 running requests", "1 slots".
_BAD_PLURAL = re.compile(r"(?<![\w.])1 (?:[\w-]+ )?(?:tokens|requests|slots|were)\b|(?<![\w.])(?:[02-9]|\d\d+) was\b")
_HOLD = ("the running requests hold the pool", "the running requests fill the pool")


def _check_words(event: OomEvent, rule: str, numbers: dict, args: dict, kv: dict, got: tuple) -> None:
    """What the advice says agrees with its own numbers (the rows of the advice table)."""
    for s in got:
        if s.suggested is not None and s.current is not None:
            assert s.suggested != s.current, (rule, s)  # never the value already in use
    words = [s.rule for s in got]
    told = explain(with_suggestions(event, rule, args, kv, None, {"kv_source": "scrape"} if kv else None), "fix")
    words += [told.what, told.advice]
    for w in words:
        assert not _BAD_PLURAL.search(w), (rule, w)
    if kv.get("running_requests") == 0:
        assert not any(h in w for w in words for h in _HOLD), (rule, words)
        if event.phase != "decode" and rule in ("chunked_prefill", "prefill_or_decode"):
            assert all(s.suggested is None for s in got if s.flag == "--max-running-requests"), (rule, got)
    free, asked = numbers.get("req_slots_available"), numbers.get("req_slots_requested")
    if free is not None and asked is not None and free >= asked:
        assert not any("missing" in w for w in words), (rule, words)
    if limits.pool_cap(args, kv) is not None:
        assert not any("raise --mem-fraction-static" in w or "see --context-length and --mem" in w for w in words)
        assert all(
            s.flag != "--mem-fraction-static" for s in got if rule not in ("mem_fraction_down", "mem_fraction_up")
        )
    if args.get("page_size") == 1:
        assert not any("round each request up to a page" in w for w in words), (rule, words)


USES = [(rule, kind) for rule in sorted(RULES) for kind in _uses(rule)]


@pytest.mark.parametrize(("rule", "kind"), USES, ids=[f"{r}-{k.id}" for r, k in USES])
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    numbers=_NUMBERS,
    args=_ARGS,
    kv=_KV,
    subphase=st.sampled_from([None, "spec_verify"]),
)
def test_advice_never_contradicts_itself(rule, kind, numbers, args, kv, subphase):
    _check(kind, rule, subphase, numbers, args, kv)


# The KV rules: the ones a hybrid or paged snapshot reaches (an event with pools is a KV allocation failure).
KV_USES = [(rule, kind) for rule, kind in USES if rule in ("chunked_prefill", "running_requests", "prefill_or_decode")]


@st.composite
def _pool_snapshot(draw) -> tuple[dict, tuple]:
    """numbers and pools as detect/match.py gives them for a hybrid (mamba, swa) or paged failure."""
    shape = draw(st.sampled_from(["mamba", "swa", "pure_swa", "paged"]))
    requested = draw(st.integers(min_value=1, max_value=200_000))
    if shape == "paged":  # paged rounding: the request is not above what was available (facts 10.9)
        available = draw(st.integers(min_value=requested, max_value=400_000))
        pools = (PoolState(POOL_FULL, available=available),)
        numbers = {"requested_tokens": requested, "available_tokens": available, "limiting_pool": POOL_FULL,
                   "shortfall_tokens": None, "shortfall_note": f"asked for {requested}, {available} available: "
                   + SHORTFALL_NOTE}  # fmt: skip
        return numbers, pools
    small = draw(st.integers(min_value=0, max_value=requested - 1)) if requested > 1 else 0
    name = POOL_MAMBA if shape == "mamba" else POOL_SWA
    pools = (PoolState(name, available=small),)
    if shape != "pure_swa":
        pools = (PoolState(POOL_FULL, available=draw(st.integers(min_value=requested, max_value=8_000_000))), *pools)
    numbers = {"requested_tokens": requested, "available_tokens": small, "limiting_pool": name,
               "shortfall_tokens": requested - small}  # fmt: skip
    return numbers, pools


_HYBRID_ARGS = st.fixed_dictionaries(
    {},
    optional={
        "chunked_prefill_size": st.sampled_from([-1, 512, 2048, 4096, 8192, 16384, 65536]),
        "max_running_requests": st.integers(min_value=0, max_value=4096),
        "max_mamba_cache_size": st.integers(min_value=0, max_value=10_000),
        "mamba_full_memory_ratio": st.floats(min_value=0.1, max_value=0.99),
        "mem_fraction_static": st.floats(min_value=0.3, max_value=0.99),
    },
)


@pytest.mark.parametrize(("rule", "kind"), KV_USES, ids=[f"{r}-{k.id}" for r, k in KV_USES])
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(snapshot=_pool_snapshot(), args=_HYBRID_ARGS, kv=_KV)
def test_hybrid_and_paged_advice_targets_the_pool_that_ran_out(rule, kind, snapshot, args, kv):
    numbers, pools = snapshot
    got = _check(kind, rule, None, numbers, args, kv, pools)
    if numbers["limiting_pool"] == POOL_MAMBA:
        mamba = numbers["available_tokens"]
        # Nothing derived from the mamba count: no number of any suggestion is a power of two fitted to it.
        assert all(s.suggested != limits.pow2_at_most(mamba) or s.flag in MAMBA_FLAGS for s in got)
        assert all("the memory comes out of the full KV pool" in s.rule for s in got)


def test_a_1444_token_prefill_never_gets_a_4096_chunk():
    """Measured: a 1,444-token prefill with 300 free and --chunked-prefill-size 16384 was told 16384 -> 4096."""
    (kind,) = (k for k in CATALOG.kinds if k.suggest == "chunked_prefill")
    got = _check(kind, "chunked_prefill", None, {"requested_tokens": 1444, "available_tokens": 300},
                 {"chunked_prefill_size": 16384, "max_running_requests": 256}, {})  # fmt: skip
    assert [(s.flag, s.current, s.suggested) for s in got] == [
        (CHUNK, 16384, None),
        ("--max-running-requests", 256, 192),
    ]
