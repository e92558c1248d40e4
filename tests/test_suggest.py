"""Concrete suggestions: one row per rule, with the inputs and the exact number expected."""

from __future__ import annotations

import pytest

from sglang_oom_exporter.advise.rules import RULES
from sglang_oom_exporter.advise.suggest import suggest
from sglang_oom_exporter.catalog.vocabulary import SUGGEST_RULES
from sglang_oom_exporter.detect.model import OomEvent
from tests.support.helpers import CATALOG


def _event(kind: str, subphase: str | None = None, message: str = "m", **numbers: object) -> OomEvent:
    return OomEvent(kind=kind, fatal=True, source="s", location="s:1", time=None, ranks=(), message=message,
                    excerpt="", subphase=subphase, numbers=dict(numbers))  # fmt: skip


CASES = [
    # (case id, event, server args, kv snapshot, [(flag, current, suggested)])
    ("prefill-fits-4096", _event("prefill", requested_tokens=16384, available_tokens=6100),
     {"chunked_prefill_size": 16384}, {}, [("--chunked-prefill-size", 16384, 4096)]),
    ("prefill-below-floor", _event("prefill", requested_tokens=8192, available_tokens=300),
     {"chunked_prefill_size": 8192, "max_running_requests": 128}, {},
     [("--chunked-prefill-size", 8192, 4096), ("--max-running-requests", 128, None)]),
    # 100 free tokens are too few to size a chunk from; the runbook's 4096, not 16384 -> 512.
    ("prefill-100-available", _event("prefill", requested_tokens=16384, available_tokens=100),
     {"chunked_prefill_size": 16384}, {},
     [("--chunked-prefill-size", 16384, 4096), ("--max-running-requests", None, None)]),
    ("prefill-fits-1024-proven", _event("prefill", requested_tokens=4096, available_tokens=1500),
     {"chunked_prefill_size": 4096}, {}, [("--chunked-prefill-size", 4096, 1024)]),
    ("prefill-fit-not-below-current", _event("prefill", requested_tokens=12000, available_tokens=9000),
     {"chunked_prefill_size": 8192}, {}, [("--chunked-prefill-size", 8192, 4096)]),
    ("prefill-no-numbers", _event("prefill"), {"chunked_prefill_size": 8192}, {},
     [("--chunked-prefill-size", 8192, 4096)]),
    ("prefill-chunking-off", _event("prefill", requested_tokens=30000, available_tokens=20000),
     {"chunked_prefill_size": -1}, {}, [("--chunked-prefill-size", -1, 16384)]),
    ("decode-sized-from-kv", _event("decode", requested_tokens=64, available_tokens=10),
     {"max_running_requests": 256, "max_total_num_tokens": 61440}, {"running_requests": 64, "num_used_tokens": 60000},
     [("--max-running-requests", 256, 56)]),
    ("decode-no-kv", _event("decode", requested_tokens=64, available_tokens=10), {"max_running_requests": 256}, {},
     [("--max-running-requests", 256, 192)]),
    ("decode-spec-verify", _event("decode", subphase="spec_verify"),
     {"max_running_requests": 32, "speculative_algorithm": "EAGLE", "speculative_num_draft_tokens": 8}, {},
     [("--max-running-requests", 32, 24), ("--speculative-num-draft-tokens", 8, 4)]),
    ("req-slots-0-free-at-512", _event("req_slots", req_slots_available=0, req_slots_requested=3),
     {"max_running_requests": 512}, {}, [("--max-running-requests", 512, 504)]),
    ("req-slots-unknown-limit", _event("req_slots", req_slots_available=0, req_slots_requested=3), {}, {},
     [("--max-running-requests", None, None)]),
    ("cuda-oom", _event("cuda_oom"), {"mem_fraction_static": 0.88}, {}, [("--mem-fraction-static", 0.88, 0.83)]),
    ("startup-from-message", _event("startup", mem_fraction_static=0.62), {}, {},
     [("--mem-fraction-static", 0.62, 0.67)]),
    ("startup-cuda-graph", _event("startup", message="Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB."), {"cuda_graph_max_bs": 160},
     {}, [("--cuda-graph-max-bs", 160, 80)]),
    ("pool-smaller-than-context", _event("prefill", requested_tokens=70000, available_tokens=61000),
     {"chunked_prefill_size": 8192, "max_total_num_tokens": 61440, "context_length": 131072}, {},
     [("--chunked-prefill-size", 8192, 4096), ("--context-length", 131072, 61440)]),
    # One retraction (no count of many) suggests nothing; never a made-up current value.
    ("retract-one", _event("retract"), {}, {}, []),
    ("retract-one-known-current", _event("retract"), {"schedule_conservativeness": 1.0}, {"retracted_requests_total": 2},
     []),
    ("retract-many-current-unknown", _event("retract"), {}, {"retracted_requests_total": 40},
     [("--schedule-conservativeness", None, 1.3)]),
    ("retract-raised", _event("retract"), {"schedule_conservativeness": 1.4}, {"retracted_requests_total": 40},
     [("--schedule-conservativeness", 1.4, 1.7)]),
    ("mamba", _event("mamba"), {"max_mamba_cache_size": 100}, {}, [("--max-mamba-cache-size", 100, 150)]),
    ("memory-leak-has-no-number", _event("memory_leak"), {"max_running_requests": 8}, {}, []),
]  # fmt: skip


def by_catalog(event: OomEvent, args: dict, kv: dict | None = None):
    """Suggestions by the rule the shipped catalog gives the event's kind (or the pattern it matched)."""
    return suggest(event, CATALOG.kind(event.kind).suggest_rule(event.message), args, kv)


def test_every_rule_the_loader_accepts_is_implemented_and_no_other():
    assert sorted(RULES) == sorted(SUGGEST_RULES)


@pytest.mark.parametrize(("event", "args", "kv", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_suggestion_table(event, args, kv, expected):
    got = by_catalog(event, args, kv)
    assert [(s.flag, s.current, s.suggested) for s in got] == expected
    for s in got:
        assert s.rule  # every suggestion says how it was computed


def test_rules_name_their_inputs():
    (s,) = by_catalog(_event("prefill", requested_tokens=16384, available_tokens=6100), {"chunked_prefill_size": 16384})
    assert "6100 available tokens" in s.rule
    assert "16384" in s.rule
    assert "never below 512" in s.rule


def test_too_few_free_tokens_say_so_instead_of_an_extreme_chunk():
    chunk, running = by_catalog(_event("prefill", requested_tokens=16384, available_tokens=100),
                                {"chunked_prefill_size": 16384})  # fmt: skip
    assert chunk.rule == (
        "half the current 16384 as a power of two, at most the runbook's 4096 "
        "(only 100 KV tokens were free, too few to size a prefill chunk from)"
    )
    assert "admit fewer" in running.rule


def test_an_unknown_current_value_is_never_printed_as_a_number():
    (s,) = by_catalog(_event("retract"), {}, {"retracted_requests_total": 40})
    assert s.rule == "the tuning guide's 1.3 (SGLang has retracted 40 requests; the current value is unknown)"
    (s,) = by_catalog(_event("prefill", requested_tokens=16384, available_tokens=100), {})[:1]
    assert s.rule.endswith("the current value is unknown)")
    assert s.suggested is None


def test_unknown_phase_gives_both_fixes_with_their_condition():
    got = by_catalog(_event("unknown", requested_tokens=96, available_tokens=40),
                     {"chunked_prefill_size": 8192, "max_running_requests": 64})  # fmt: skip
    # A 96-token prefill: the runbook's 4096 chunk would not change it, so the prefill side lowers the running
    # batch too, with its reason (advise/scheduler.py prefill).
    assert [(s.flag, s.current, s.suggested) for s in got] == [
        ("--chunked-prefill-size", 8192, None),
        ("--max-running-requests", 64, 48),
        ("--max-running-requests", 64, 48),
    ]
    assert got[0].rule == (
        "a 4096-token chunk would not change the failing prefill, which asked for only 96 tokens (at most the floor "
        "512); lower --max-running-requests instead, the running requests hold the pool"
    )
    assert [s.when.rsplit(" ", 2)[-2:] for s in got] == [["a", "prefill"], ["a", "prefill"], ["decode", "batch"]]


def test_scan_of_one_benign_retraction_without_server_args_suggests_nothing(tmp_path):
    # Measured: `--schedule-conservativeness 1.3` and "0.3 above the current 1" while nothing was known.
    import json
    import subprocess
    import sys

    log = tmp_path / "server.log"
    log.write_text(
        "[2026-03-14 22:09:01 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 1, "
        "#new_token_ratio: 0.4000 -> 0.5000\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_oom_exporter", "scan", "--format", "json", str(log)],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    (event,) = json.loads(proc.stdout)["events"]
    assert (event["kind"], event["suggestions"]) == ("retract", [])
    assert "current 1" not in proc.stdout
