"""The one event sink of scan and serve: enrichment by the catalog's rule, counting, storing, the JSON shape."""

from __future__ import annotations

from sglang_oom_exporter.detect.model import OomEvent
from sglang_oom_exporter.events.sink import Context, EventSink, event_json
from sglang_oom_exporter.events.store import EventStore
from sglang_oom_exporter.metrics.events import EventCounts
from tests.support.helpers import CATALOG


def _event(kind: str, message: str, **numbers: object) -> OomEvent:
    return OomEvent(kind=kind, fatal=True, source="s", location="s.log:7", time=None, ranks=("TP0",),
                    message=message, excerpt="", numbers=dict(numbers))  # fmt: skip


def test_a_pattern_with_its_own_rule_overrides_the_kind_rule():
    sink = EventSink(CATALOG)
    args = Context(args={"cuda_graph_max_bs": 160, "mem_fraction_static": 0.8})
    graph = sink.enrich(_event("startup", "Capture cuda graph failed: CUDA out of memory"), args)
    pool = sink.enrich(_event("startup", "Not enough memory. Please try to increase --mem-fraction-static."), args)
    assert [(s.flag, s.current, s.suggested) for s in graph.suggestions] == [("--cuda-graph-max-bs", 160.0, 80)]
    assert [(s.flag, s.current, s.suggested) for s in pool.suggestions] == [("--mem-fraction-static", 0.8, 0.85)]
    assert graph.context == {"server_args": {"cuda_graph_max_bs": 160, "mem_fraction_static": 0.8}}


def test_record_counts_stores_and_returns_the_enriched_event():
    counts = EventCounts(CATALOG.ids, ("source",), CATALOG.retraction_kind)
    store = EventStore(4)
    sink = EventSink(CATALOG, counts=counts, store=store, wall=lambda: 1_780_000_000.0)
    event = _event("retract", "KV cache pool is full. Retract requests. #retracted_reqs: 3", retracted_requests=3)
    context = Context(args={"schedule_conservativeness": 1.0}, kv={"retracted_requests_total": 40})
    recorded = sink.record(event, ("a",), {"source": "a"}, context)
    assert recorded is not None
    assert [s.flag for s in recorded.suggestions] == ["--schedule-conservativeness"]
    assert (counts.total("retract"), sink.errors) == (1.0, 0)
    assert [(s.event, dict(s.labels)) for s in store.entries()] == [(recorded, {"source": "a"})]
    assert counts.export_state()["sources"][0]["retracted"] == 3.0  # the catalog's retraction kind


def test_a_failing_store_is_counted_and_never_raised():
    class Broken(EventStore):
        def add(self, event, labels=None):
            raise OSError("disk on fire")

    sink = EventSink(CATALOG, store=Broken())
    assert sink.record(_event("decode", "Decode out of memory."), ("a",), {"source": "a"}) is None
    assert sink.errors == 1


def test_event_json_has_the_documented_shape():
    event = EventSink(CATALOG).enrich(_event("prefill", "Prefill out of memory.", requested_tokens=10))
    data = event_json(event, CATALOG)
    assert sorted(data) == sorted([
        "kind", "title", "fatal", "time", "ranks", "source", "requested_tokens", "available_tokens", "phase",
        "subphase", "inferred", "message", "numbers", "pools", "excerpt", "remediation", "suggestions", "explanation",
        "context",
    ])  # fmt: skip
    assert (data["kind"], data["title"], data["source"], data["requested_tokens"]) == (
        "prefill",
        CATALOG.kind("prefill").title,
        "s.log:7",
        10,
    )
