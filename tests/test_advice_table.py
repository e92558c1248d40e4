"""The advice the real SGLang 0.5.23 server got, row by row: what its own log and numbers show, and nothing else.

Each test is one row of the table of what the exporter said against what the server showed: a scan of each recorded
real OOM log with no endpoint and no --server-args, a pool capped by --max-total-tokens, a pool smaller than the
served context, page rounding at page size 1, a request-slot failure that shows no shortfall, counts and nouns,
and a snapshot with nothing running.
"""

from __future__ import annotations

import json
import os

import pytest

from sglang_oom_exporter.advise.explain import explain
from sglang_oom_exporter.advise.suggest import with_suggestions
from sglang_oom_exporter.detect.match import SHORTFALL_NOTE
from sglang_oom_exporter.detect.model import OomEvent
from sglang_oom_exporter.scan.run import scan_paths
from tests.support.helpers import CATALOG

LIVE = os.path.join(os.path.dirname(__file__), "data", "logs", "live_0_5_23_{}.log")


def _scan(scenario: str) -> dict:
    (event,) = json.loads(json.dumps(scan_paths(CATALOG, [LIVE.format(scenario)]).to_json()))["events"]
    return event


def _changes(event: dict) -> list[tuple[str, float | None, float | None]]:
    return [(s["flag"], s["current"], s["suggested"]) for s in event["suggestions"]]


@pytest.mark.parametrize(
    ("scenario", "changes", "advice"),
    [
        ("prefill", [("--chunked-prefill-size", 4096, None), ("--max-running-requests", 8, None),
                     ("--context-length", 4096, 256)], "Suggested: --context-length from 4096 to 256 ("),
        ("generic", [("--chunked-prefill-size", 4096, None), ("--max-running-requests", 8, None),
                     ("--context-length", 4096, 256)], "Suggested: --context-length from 4096 to 256 ("),
        ("decode", [("--max-running-requests", 8, None), ("--context-length", 4096, 256)],
         "Suggested: --context-length from 4096 to 256 ("),
        ("req_slots", [("--max-running-requests", 8, 6), ("--context-length", 4096, 256)],
         "Suggested: --max-running-requests from 8 to 6, --context-length from 4096 to 256."),
    ],
)  # fmt: skip
def test_scan_of_a_real_oom_log_alone_suggests_values_from_the_servers_own_settings(scenario, changes, advice):
    event = _scan(scenario)
    assert _changes(event) == changes
    told = event["explanation"]["advice"]
    assert told.startswith(advice)
    assert "to 4096" not in told
    assert "from 8 to 8" not in told
    said = json.dumps([event["suggestions"], event["explanation"]])
    assert "the running requests hold the pool" not in said  # the log line shows none running
    assert "log line at 2026-12-0" in event["explanation"]["detail"]  # the state quoted, and where it came from


def test_a_pool_capped_by_max_total_tokens_points_at_the_cap_not_the_static_fraction():
    event = _scan("prefill")
    rules = " ".join(s["rule"] for s in event["suggestions"])
    assert "raise --max-total-tokens, which caps the pool at 256 tokens" in rules
    assert "raise --mem-fraction-static" not in rules
    uncapped = _event({"requested_tokens": 120, "available_tokens": 256}, "prefill")
    got = with_suggestions(uncapped, "chunked_prefill", {"max_total_num_tokens": 256, "context_length": 4096,
                                                         "max_total_tokens": 100_000}, {"running_requests": 0})  # fmt: skip
    assert any("raise --mem-fraction-static" in s.rule for s in got.suggestions)  # a cap above the pool sized nothing


def _event(numbers: dict, phase: str | None, kind: str = "prefill") -> OomEvent:
    kinds = {k.phase: k.id for k in CATALOG.kinds if k.phase in ("prefill", "decode")}
    return OomEvent(kind=kinds.get(phase, kind), fatal=True, source="s", location="s:1", time=None, ranks=(),
                    message="m", excerpt="", phase=phase, numbers=numbers)  # fmt: skip


def test_a_pool_smaller_than_the_served_context_names_context_length_from_sglang_context_len():
    # serve against 0.5.23 with no log line: /server_info's context_length is null; sglang:context_len is 4096.
    event = _event({"requested_tokens": 120, "available_tokens": 256}, "decode")
    got = with_suggestions(event, "running_requests", {"context_length": None, "max_total_num_tokens": 256},
                           {"context_len": 4096, "running_requests": 3})  # fmt: skip
    assert [(s.flag, s.current, s.suggested) for s in got.suggestions if s.flag == "--context-length"] == [
        ("--context-length", 4096, 256)
    ]


@pytest.mark.parametrize(("page", "rounding"), [(1, False), (16, True), (None, True)])
def test_page_rounding_is_explained_only_where_the_page_size_is_above_1(page, rounding):
    note = f"asked for 120, 256 available: {SHORTFALL_NOTE}"
    event = _event({"requested_tokens": 120, "available_tokens": 256, "shortfall_note": note}, "prefill")
    got = with_suggestions(event, "chunked_prefill", {"page_size": page} if page else {}, {})
    told = explain(got, "fix")
    assert ("round each request up to a page" in told.what) is rounding
    assert ("round each request up to a page" in got.numbers["shortfall_note"]) is rounding
    if not rounding:
        assert told.what == (
            "asked for 120 KV tokens while 256 were available: the numbers show no shortfall at page size 1, "
            "where nothing is rounded"
        )


def test_request_slots_that_were_free_are_no_shortfall_and_counts_agree_with_their_nouns():
    event = _event({"req_slots_available": 7, "req_slots_requested": 5}, None, kind="req_slots")
    got = with_suggestions(event, "request_slots", {"max_running_requests": 8}, {})
    (slots,) = got.suggestions
    assert (slots.current, slots.suggested) == (8, 6)
    assert slots.rule == "the message shows no shortfall (5 asked, 7 free): 75% of the current 8, at least 1"
    short = with_suggestions(_event({"req_slots_available": 4, "req_slots_requested": 5}, None, kind="req_slots"),
                             "request_slots", {"max_running_requests": 8}, {})  # fmt: skip
    assert "minus the 1 slot that was missing (5 asked, 4 free)" in short.suggestions[0].rule
    one = explain(with_suggestions(_event({"requested_tokens": 1, "available_tokens": 1}, "decode"),
                                   "running_requests", {}, {"running_requests": 1}, None, {"kv_source": "scrape"}),
                  "fix")  # fmt: skip
    assert one.what.startswith("asked for 1 KV token while 1 was available")
    assert one.what.endswith("; state from the last scrape: 1 running request")
    assert "1 running request before the failure" in one.advice


def test_nothing_running_never_blames_the_running_requests():
    event = _event({"requested_tokens": 120, "available_tokens": 100}, "prefill")
    got = with_suggestions(event, "chunked_prefill", {"max_running_requests": 8, "chunked_prefill_size": 4096},
                           {"running_requests": 0})  # fmt: skip
    assert [(s.flag, s.current, s.suggested) for s in got.suggestions] == [
        ("--chunked-prefill-size", 4096, None),
        ("--max-running-requests", 8, None),
    ]
    assert got.suggestions[0].rule.endswith("no request was running before it, so the pool itself is too small for it")
    assert all("hold the pool" not in s.rule and "fill the pool" not in s.rule for s in got.suggestions)


def test_scans_text_never_gives_the_usual_fix_its_own_numbers_rule_out_nor_repeats_the_levers():
    # The real generic OOM asked for 120 of 256 free tokens with nothing running: the prefill kind's usual fix
    # ("Lower --chunked-prefill-size (for example to 4096 or 2048)") is what the server already runs and could not
    # change the failing prefill. The text gave it anyway, then "not --chunked-prefill-size", then an advice line
    # repeating both levers' reasons.
    from sglang_oom_exporter.scan.report import format_text

    lines = format_text(scan_paths(CATALOG, [LIVE.format("generic")])).splitlines()
    assert [line.split(":")[0].strip() for line in lines[1:7]] == [
        "KV cache exhausted while scheduling a prefill batch", "phase=prefill requested_tokens=120 available_tokens=256 "
        "shortfall_tokens=none (asked for 120, 256 available", "Asked for 120 KV tokens while 256 were available",
        "not --chunked-prefill-size", "not --max-running-requests", "suggest",
    ]  # fmt: skip
    assert lines[7] == ""


@pytest.mark.parametrize(("drafts", "said"), [
    (1, "1 draft token is already at or below the floor 2: "),
    (2, "2 draft tokens are already at or below the floor 2: "),
])  # fmt: skip
def test_draft_tokens_at_or_below_the_floor_are_counted_in_the_right_number(drafts, said):
    # The advice property found "the 1 draft tokens are already at the floor 2": a count below the floor said to
    # be at it, with a plural noun.
    from sglang_oom_exporter.advise.scheduler import speculative

    event = _event({}, "decode")
    (s,) = speculative(event, {"speculative_num_draft_tokens": drafts, "speculative_algorithm": "EAGLE"})
    assert (s.flag, s.current, s.suggested) == ("--speculative-num-draft-tokens", drafts, None)
    assert s.rule.startswith(said)
