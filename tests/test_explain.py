"""Advice that knows the limiting pool, the same in every output of an event: scan's text and JSON, /events (the
same JSON), the events page, the Kubernetes Event message and sglang_oom_last_event_info (advise/explain.py).

Three measured cases: a hybrid (mamba) prefill whose mamba state pool ran out while the full KV pool had
millions free; a paged decode asking for fewer tokens than were available (page rounding, facts 10.9); a
1,444-token prefill that a 4,096-token chunk cannot shrink. Plus the metric's contract with the alert pages:
exact label texts, one series per source and kind, the 300-character cut, and the restart.
"""

from __future__ import annotations

from sglang_oom_exporter.catalog.vocabulary import POOL_FULL, POOL_SWA
from sglang_oom_exporter.detect.model import OomEvent, PoolState
from sglang_oom_exporter.events.sink import Context, EventSink, event_json
from sglang_oom_exporter.events.store import EventStore, Health
from sglang_oom_exporter.kubeevents.text import message_for
from sglang_oom_exporter.metrics.events import EventCounts
from sglang_oom_exporter.scan.report import format_text
from sglang_oom_exporter.scan.run import scan_paths
from sglang_oom_exporter.web.page import render_page
from tests.support.helpers import CATALOG

ARGS = {"chunked_prefill_size": 16384, "max_running_requests": 256, "max_mamba_cache_size": 512}
INFO = "sglang_oom_last_event_info"
RUNBOOK = "https://runbooks.example/sglangprefilloom.md"
PAGED = (
    "paged allocators fail on whole pages and round each request up to a page, so a real failure can ask for no "
    "more than was available"
)
MAMBA_BLOCK = (
    "Out of memory. Try to lower your batch size.\n"
    "Try to allocate 8192 tokens.\n"
    "Available full tokens: 4000000 (full_available_size=3990000 + full_evictable_size_=10000)\n"
    "Available mamba: 760 (available_size=700 + component_evictable_size_=60)\n"
)
# 0.5.16+ unified radix cache on a hybrid (mamba) model, TP=1, page size 1: the generic text, then the traceback
# whose frames say prefill (facts 1.2, 2).
MAMBA_LOG = (
    f"[2026-03-27 08:03:55] {MAMBA_BLOCK}\n"
    "[2026-03-27 08:03:55] Scheduler hit an exception: Traceback (most recent call last):\n"
    '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", line 1198, in '
    "get_new_batch_prefill\n    x()\n"
    '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/mem_cache/allocation.py", line 100, in '
    "alloc_for_extend\n    x()\n"
    '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/mem_cache/allocation.py", line 90, in '
    "alloc_token_slots\n    raise RuntimeError(msg)\n"
    f"RuntimeError: {MAMBA_BLOCK}\n\n"
)
# 0.4.5 paged decode: N below the available tokens, as paged rounding allows (facts 10.9).
PAGED_LOG = (
    "[2026-03-14 22:07:33 TP0] Decode out of memory. Try to lower your batch size.\nTry to allocate 148 tokens.\n"
    "Avaliable tokens: 2048\nself.token_to_kv_pool_allocator.available_size()=2048\n"
    "self.tree_cache.evictable_size()=0\n\n"
)
SMALL_PREFILL_LOG = (
    "[2026-03-14 22:07:33 TP0] Prefill out of memory. Try to lower your batch size.\nTry to allocate 1444 tokens.\n"
    "Available tokens: 300 (available_size=300 + evictable_size=0)\n\n"
)
MAMBA_DETAIL = (
    "The last one asked for 8192 tokens; the mamba state pool was the limit with 760 free (the full KV pool had "
    "4000000)."
)
MAMBA_ADVICE = "Suggested: --max-mamba-cache-size from 512 to 768 (the memory comes out of the full KV pool)."
PAGED_DETAIL = f"The last one asked for 148 KV tokens while 2048 were available: {PAGED}."
SMALL_ADVICE = (
    "Suggested: --max-running-requests from 256 to 192 (not --chunked-prefill-size: a 4096-token chunk would not "
    "change the failing prefill, which asked for only 1444 tokens; lower --max-running-requests instead, the running "
    "requests hold the pool)."
)


def _scan(tmp_path, text: str, args: dict | None = ARGS):
    path = tmp_path / "server.log"
    path.write_text(text)
    return scan_paths(CATALOG, [str(path)], server_args=args)


def _info(counts: EventCounts) -> list[dict[str, str]]:
    return [dict(s.labels) for m in counts.page.metrics() for s in m.samples if s.name == INFO and s.value == 1]


def _counted(*events: OomEvent, context: Context | None = None) -> EventCounts:
    counts = EventCounts(CATALOG.ids, ("source",), CATALOG.retraction_kind)
    sink = EventSink(CATALOG, counts=counts, wall=lambda: 1_780_000_000.0)
    for event in events:
        assert sink.record(event, ("server",), {"source": "server"}, context or Context(args=ARGS)) is not None
    return counts


def _event(kind: str = "prefill", **numbers: object) -> OomEvent:
    return OomEvent(kind=kind, fatal=True, source="server", location="server.log:1", time=None, ranks=(),
                    message="m", excerpt="m", numbers=dict(numbers))  # fmt: skip


def test_a_mamba_limited_prefill_names_the_mamba_pool_and_gets_the_mamba_lever_in_scan(tmp_path):
    result = _scan(tmp_path, MAMBA_LOG)
    (event,) = result.events
    data = result.to_json()["events"][0]
    assert (data["kind"], data["numbers"]["limiting_pool"], data["available_tokens"]) == ("prefill", "mamba", 760)
    assert [(s["flag"], s["current"], s["suggested"]) for s in data["suggestions"]] == [
        ("--max-mamba-cache-size", 512, 768),
        ("--mamba-full-memory-ratio", None, None),
    ]
    assert data["explanation"] == {"limiting_pool": "mamba", "detail": MAMBA_DETAIL.replace("The last one a", "A"),
                                   "advice": MAMBA_ADVICE}  # fmt: skip
    text = format_text(result).splitlines()
    assert text[3:7] == [
        "    " + MAMBA_DETAIL.replace("The last one a", "A"),
        "    fix: Raise --max-mamba-cache-size or --mamba-full-memory-ratio so the mamba state pool has room; the "
        "memory comes out of the full KV pool.",
        "    suggest: --max-mamba-cache-size 512 -> 768  (1.5 times the current 512: the mamba state pool was the "
        "limit (760 free; the full KV pool had 4000000); the memory comes out of the full KV pool)",
        f"    advice: {MAMBA_ADVICE}",
    ]
    assert "chunked-prefill-size" not in format_text(result)
    assert _info(_counted(event)) == [
        {"source": "server", "kind": "prefill", "limiting_pool": "mamba", "detail": MAMBA_DETAIL,
         "advice": MAMBA_ADVICE}
    ]  # fmt: skip


def test_a_mamba_limited_prefill_without_server_args_gives_the_mamba_fix_with_its_cost(tmp_path):
    (event,) = _scan(tmp_path, MAMBA_LOG, None).events
    assert [(s.flag, s.suggested) for s in event.suggestions] == [
        ("--max-mamba-cache-size", None), ("--mamba-full-memory-ratio", None)]  # fmt: skip
    (info,) = _info(_counted(event, context=Context()))
    assert info["advice"] == (
        "Fix: Raise --max-mamba-cache-size or --mamba-full-memory-ratio so the mamba state pool has room; the memory "
        "comes out of the full KV pool."
    )


def test_the_page_and_the_kubernetes_event_say_the_same_of_a_mamba_limited_prefill(tmp_path):
    (event,) = _scan(tmp_path, MAMBA_LOG).events
    message = message_for(CATALOG, event, RUNBOOK)
    assert message == (
        f"{CATALOG.kind('prefill').title}: asked for 8192 tokens; the mamba state pool was the limit with 760 free "
        f"(the full KV pool had 4000000). {MAMBA_ADVICE} {RUNBOOK}"
    )
    store = EventStore(10)
    store.add(event, {"source": "server"}, 1.0)
    page = render_page(store.entries(), CATALOG, Health(True, ""), store.capacity)
    assert page.count('<p class="detail">Asked for 8192 tokens; the mamba state pool was the limit with 760 free '
                      "(the full KV pool had 4000000).</p>") == 1  # fmt: skip
    assert page.count("so the mamba state pool has room; the memory comes out of the full KV pool.") == 1


def test_a_paged_decode_asking_for_less_than_was_available_says_why(tmp_path):
    result = _scan(tmp_path, PAGED_LOG)
    (event,) = result.events
    assert event_json(event, CATALOG)["explanation"] == {
        "limiting_pool": "full", "detail": PAGED_DETAIL.replace("The last one a", "A"),
        "advice": "Suggested: --max-running-requests from 256 to 192."}  # fmt: skip
    (info,) = _info(_counted(event))
    assert (info["detail"], info["limiting_pool"]) == (PAGED_DETAIL, "full")
    assert f"    {PAGED_DETAIL.replace('The last one a', 'A')}" in format_text(result).splitlines()
    assert message_for(CATALOG, event, RUNBOOK).startswith(
        f"{CATALOG.kind('decode').title}: asked for 148 KV tokens while 2048 were available: {PAGED}. Suggested: "
    )


def test_a_prefill_a_smaller_chunk_cannot_shrink_gets_the_running_requests_with_the_reason(tmp_path):
    result = _scan(tmp_path, SMALL_PREFILL_LOG)
    (event,) = result.events
    assert [(s.flag, s.current, s.suggested) for s in event.suggestions] == [
        ("--chunked-prefill-size", 16384, None), ("--max-running-requests", 256, 192)]  # fmt: skip
    (info,) = _info(_counted(event))
    assert info == {"source": "server", "kind": "prefill", "limiting_pool": "full",
                    "detail": "The last one asked for 1444 KV tokens while 300 were available.",
                    "advice": SMALL_ADVICE}  # fmt: skip
    text = format_text(result)
    assert "suggest: --chunked-prefill-size" not in text
    # scan's text: the usual fix (lower --chunked-prefill-size) is ruled out by these numbers, so no fix line says
    # it; the levers are one line each, and the advice, which would repeat them, is left out.
    assert [line.split(":")[0] for line in text.splitlines()[3:7]] == [
        "    Asked for 1444 KV tokens while 300 were available.", "    not --chunked-prefill-size",
        "    suggest", "",
    ]  # fmt: skip


def test_a_prefill_a_smaller_chunk_cannot_shrink_without_server_args_says_what_to_lower_instead(tmp_path):
    (event,) = _scan(tmp_path, SMALL_PREFILL_LOG, None).events
    (info,) = _info(_counted(event, context=Context()))
    assert info["advice"] == (
        "Fix: A 2048-token chunk would not change the failing prefill, which asked for only 1444 tokens; lower "
        "--max-running-requests instead, the running requests hold the pool."
    )


def test_the_plain_prefill_sentences_the_alert_pages_quote():
    (info,) = _info(_counted(_event(requested_tokens=16384, available_tokens=6100, limiting_pool=POOL_FULL)))
    assert info["detail"] == "The last one asked for 16384 KV tokens while 6100 were available."
    assert info["advice"] == "Suggested: --chunked-prefill-size from 16384 to 4096."


def test_several_flags_join_in_one_sentence_and_small_values_print_as_python_does():
    both = _event("unknown", requested_tokens=16384, available_tokens=6100)
    (info,) = _info(_counted(both))
    assert info["advice"] == (
        "Suggested: --chunked-prefill-size from 16384 to 4096, --max-running-requests from 256 to 192."
    )
    cuda = _counted(_event("cuda_oom"), context=Context(args={"mem_fraction_static": 0.93}))
    assert [i["advice"] for i in _info(cuda)] == ["Suggested: --mem-fraction-static from 0.93 to 0.88."]
    assert [i["detail"] for i in _info(cuda)] == [""]


def test_without_a_value_the_advice_is_the_kinds_fix():
    (info,) = _info(_counted(_event(), context=Context()))
    assert info == {"source": "server", "kind": "prefill", "limiting_pool": "", "detail": "",
                    "advice": "Fix: Lower --chunked-prefill-size (for example to 4096 or 2048) so that each prefill "
                    "asks for fewer KV slots."}  # fmt: skip


def test_an_swa_limited_decode_names_the_sliding_window_pool():
    pools = (PoolState(POOL_FULL, available=1502310), PoolState(POOL_SWA, available=96))
    event = OomEvent(kind="decode", fatal=True, source="server", location="server.log:1", time=None, ranks=(),
                     message="m", excerpt="m", pools=pools,
                     numbers={"requested_tokens": 128, "available_tokens": 96, "limiting_pool": POOL_SWA})  # fmt: skip
    (info,) = _info(_counted(event))
    assert (info["limiting_pool"], info["detail"]) == ("swa", (
        "The last one asked for 128 tokens; the SWA (sliding-window) KV pool was the limit with 96 available (the "
        "full KV pool had 1502310)."))  # fmt: skip
    prefill = OomEvent(kind="prefill", fatal=True, source="server", location="server.log:1", time=None, ranks=(),
                       message="m", excerpt="m", pools=pools,
                       numbers={"requested_tokens": 8192, "available_tokens": 3500, "limiting_pool": POOL_SWA})  # fmt: skip
    (chunk,) = EventSink(CATALOG).enrich(prefill, Context(args=ARGS)).suggestions
    assert (chunk.suggested, chunk.rule.split(",")[0]) == (
        2048, "the largest power of two that fits the 3500 available tokens of the swa pool (the limit) (the prefill "
        "asked for 8192)")  # fmt: skip


def test_one_info_series_per_source_and_kind_whatever_the_events():
    counts = _counted(
        _event(requested_tokens=16384, available_tokens=6100),
        _event(requested_tokens=9000, available_tokens=5000),
        _event("decode", requested_tokens=96, available_tokens=40),
        _event(requested_tokens=12000, available_tokens=3000),
    )
    assert sorted((i["kind"], i["detail"]) for i in _info(counts)) == [
        ("decode", "The last one asked for 96 KV tokens while 40 were available."),
        ("prefill", "The last one asked for 12000 KV tokens while 3000 were available."),
    ]
    counts.drop(("server",))
    assert _info(counts) == []


def test_a_long_text_is_cut_with_an_ellipsis():
    counts = EventCounts(CATALOG.ids, ("source",), CATALOG.retraction_kind)
    counts.record(("server",), _event(), 1.0, {"limiting_pool": "full", "detail": "x" * 500, "advice": "y" * 299})
    (info,) = _info(counts)
    assert (len(info["detail"]), info["detail"][-2:], info["advice"]) == (299, "x…", "y" * 299)


def test_the_info_series_comes_back_from_the_saved_last_events():
    before = _counted(_event(requested_tokens=16384, available_tokens=6100))
    saved = before.export_last()
    after = EventCounts(CATALOG.ids, ("source",), CATALOG.retraction_kind)
    after.restore_last(saved)
    assert _info(after) == _info(before) != []
    # A state file written before the series existed: the other gauges come back, the info series waits.
    old = [{k: v for k, v in entry.items() if k not in ("limiting_pool", "detail", "advice")} for entry in saved]
    older = EventCounts(CATALOG.ids, ("source",), CATALOG.retraction_kind)
    older.restore_last(old)
    assert _info(older) == []
    assert older.export_last() == old
