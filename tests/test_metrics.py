"""Metrics: zero-initialisation, counting, restore, retention, and the exposition promtool accepts."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from typing import ClassVar

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from sglang_oom_exporter import __version__
from sglang_oom_exporter.detect.model import OomEvent
from sglang_oom_exporter.events.sink import Context, EventSink
from sglang_oom_exporter.metrics.collector import ExporterCollector
from sglang_oom_exporter.metrics.events import EventCounts, crash_kind, fatal_kinds
from sglang_oom_exporter.metrics.sources import SourceStats
from sglang_oom_exporter.sources.scrape import REASONS as SCRAPE_REASONS
from tests.support.helpers import CATALOG

HERE = os.path.dirname(__file__)
GOLDEN = os.path.join(HERE, "data", "exposition", "basic.prom")


def _event(kind: str, fatal: bool = True, **numbers: object) -> OomEvent:
    return OomEvent(kind=kind, fatal=fatal, source="s", location="s.log:1", time=None, ranks=("TP0",), message="m",
                    excerpt="m", numbers=dict(numbers))  # fmt: skip


class FakeTarget:
    url = "http://127.0.0.1:30000"
    up = True
    duration = 0.25
    last_success = 1_780_000_000.0
    errors_total: ClassVar[dict[str, int]] = {"timeout": 2}
    info_errors_total: ClassVar[dict[str, int]] = {"bad_json": 1}

    def snapshot_values(self):
        return {"token_usage": 0.97, "max_total_num_tokens": 61440.0, "retracted_requests_total": 12.0, "time": 5.0}

    def snapshot_labels(self):
        return {}

    def server_args(self):
        return {"chunked_prefill_size": 16384, "model_path": "m", "speculative_algorithm": None}


class DecodeTarget(FakeTarget):
    """A 2026 PD decode server: engine_type and the pre-allocation gauges."""

    url = "http://10.0.0.5:30000"

    def snapshot_values(self):
        return {"kv_available_tokens": 52000.0, "kv_evictable_tokens": 17000.0, "pending_prealloc_token_usage": 0.06,
                "decode_prealloc_queue_requests": 7.0, "retracted_requests_total": 35.0}  # fmt: skip

    def snapshot_labels(self):
        return {"engine_type": "decode", "model_name": "not kept"}


def _registry(counts: EventCounts, stats: list[SourceStats], targets: list | None = None) -> CollectorRegistry:
    for i, s in enumerate(stats):
        counts.sources.update(f"/logs/{i}.log", s)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExporterCollector(counts, lambda: {"state_saves_total": 3.0, "pending_events": 0.0},
                                        lambda: targets or []))  # fmt: skip
    return registry


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_every_kind_is_zero_before_the_first_event():
    counts = EventCounts(CATALOG.ids, ("source",), CATALOG.retraction_kind, fatal_kinds=fatal_kinds(CATALOG))
    counts.ensure(("sglang-0",))
    registry = _registry(counts, [])
    for kind in CATALOG.ids:
        assert _sample(registry, "sglang_oom_events_total", kind=kind, source="sglang-0") == 0.0


def test_events_fatal_events_retractions_and_last_numbers():
    counts = EventCounts(CATALOG.ids, ("source",), CATALOG.retraction_kind, fatal_kinds=fatal_kinds(CATALOG))
    counts.record(("a",), _event("prefill", requested_tokens=16384, available_tokens=6100), 1000.0)
    counts.record(("a",), _event("decode", fatal=False), 1001.0)
    counts.record(("a",), _event("retract", fatal=False, retracted_requests=3), 1002.0)
    counts.record(("a",), _event("retract", fatal=False, retracted_requests=2), 1003.0)
    registry = _registry(counts, [])
    assert _sample(registry, "sglang_oom_events_total", kind="prefill", source="a") == 1.0
    assert _sample(registry, "sglang_oom_events_total", kind="decode", source="a") == 1.0
    assert _sample(registry, "sglang_oom_fatal_events_total", kind="decode", source="a") == 0.0
    assert _sample(registry, "sglang_oom_events_total", kind="retract", source="a") == 2.0
    assert _sample(registry, "sglang_oom_retracted_requests_total", source="a") == 5.0
    assert _sample(registry, "sglang_oom_last_event_requested_tokens", kind="prefill", source="a") == 16384.0
    assert _sample(registry, "sglang_oom_last_event_available_tokens", kind="prefill", source="a") == 6100.0
    assert _sample(registry, "sglang_oom_last_event_timestamp_seconds", kind="retract", source="a") == 1003.0


def test_a_non_memory_crash_counts_in_its_own_series_never_as_an_oom_and_survives_a_restore():
    crash = CATALOG.crash.id
    made = lambda: EventCounts(CATALOG.ids, ("source",), CATALOG.retraction_kind,  # noqa: E731
                               fatal_kinds=fatal_kinds(CATALOG), crash_kind=crash_kind(CATALOG))  # fmt: skip
    counts = made()
    counts.ensure(("b",))
    sink = EventSink(CATALOG, counts=counts, wall=lambda: 1000.0)
    line = "ValueError: bad request GenerateReqInput(text='my secret prompt')"
    sink.record(_event(crash, exception=line), ("a",), {"source": "a"})
    sink.record(_event("prefill"), ("a",), {"source": "a"})
    registry = _registry(counts, [])
    assert _sample(registry, "sglang_oom_crashes_total", source="a") == 1.0
    assert _sample(registry, "sglang_oom_crashes_total", source="b") == 0.0  # zero before the first crash
    assert _sample(registry, "sglang_oom_events_total", kind=crash, source="a") is None
    assert _sample(registry, "sglang_oom_fatal_events_total", kind=crash, source="a") is None
    assert _sample(registry, "sglang_oom_events_total", kind="prefill", source="a") == 1.0
    assert _sample(registry, "sglang_oom_fatal_events_total", kind="prefill", source="a") == 1.0
    assert _sample(registry, "sglang_oom_last_event_timestamp_seconds", kind=crash, source="a") == 1000.0
    detail = "The last one died of ValueError: bad request GenerateReqInput(<request text redacted>."
    info = [s for m in registry.collect() if m.name == "sglang_oom_last_event_info" for s in m.samples]
    assert [s.labels["detail"] for s in info if s.labels["kind"] == crash] == [detail]
    assert counts.total() == 2.0
    assert counts.total(crash) == 1.0
    again = made()
    again.restore_state(counts.export_state())
    assert again.total(crash) == 1.0
    assert again.total("prefill") == 1.0


def test_restore_continues_from_saved_values_and_rejects_garbage():
    counts = EventCounts(CATALOG.ids, ("source",), CATALOG.retraction_kind, fatal_kinds=fatal_kinds(CATALOG))
    counts.record(("a",), _event("prefill"), 1.0)
    saved = counts.export_state()
    again = EventCounts(CATALOG.ids, ("source",), CATALOG.retraction_kind, fatal_kinds=fatal_kinds(CATALOG))
    again.restore_state(saved)
    again.record(("a",), _event("prefill"), 2.0)
    assert again.total("prefill") == 2.0
    for bad in ({}, {"label_names": ["pod"], "sources": []}, {"label_names": ["source"], "sources": "a"}):
        with pytest.raises(ValueError, match=r"labels|bad|not an array"):
            EventCounts(
                CATALOG.ids, ("source",), CATALOG.retraction_kind, fatal_kinds=fatal_kinds(CATALOG)
            ).restore_state(bad)
    # A malformed source's entry is set aside (counted by the caller); the others are restored.
    good = saved["sources"][0]
    for entry in ({"labels": 1}, {**good, "events": {"prefill": -1}}, {**good, "events": {"prefill": "NaN"}},
                  {**good, "retracted": "1e400"}, {**good, "labels": ["a", "b"]}):  # fmt: skip
        counts = EventCounts(CATALOG.ids, ("source",), CATALOG.retraction_kind, fatal_kinds=fatal_kinds(CATALOG))
        assert counts.restore_state({"label_names": ["source"], "sources": [entry, {**good, "labels": ["b"]}]}) == 1
        assert counts.known() == [("b",)]
        assert counts.total("prefill") == 1.0


def test_target_values_and_suggested_flags():
    counts = EventCounts(CATALOG.ids, ("source",), CATALOG.retraction_kind, fatal_kinds=fatal_kinds(CATALOG))
    event = EventSink(CATALOG).enrich(_event("prefill", requested_tokens=16384, available_tokens=6100),
                                      Context(args={"chunked_prefill_size": 16384}))  # fmt: skip
    counts.record(("a",), event, 1.0)
    registry = _registry(counts, [], [FakeTarget()])
    flag = {"kind": "prefill", "source": "a", "flag": "chunked-prefill-size"}
    assert _sample(registry, "sglang_oom_suggested_flag_value", **flag) == 4096.0
    assert _sample(registry, "sglang_oom_current_flag_value", **flag) == 16384.0
    target = {"target": FakeTarget.url}
    assert _sample(registry, "sglang_oom_target_up", **target) == 1.0
    assert _sample(registry, "sglang_oom_target_last_success_timestamp_seconds", **target) == 1_780_000_000.0
    assert _sample(registry, "sglang_oom_target_token_usage", **target) == 0.97
    assert _sample(registry, "sglang_oom_target_retracted_requests_total", **target) == 12.0
    assert _sample(registry, "sglang_oom_target_scrape_errors_total", reason="timeout", **target) == 2.0
    assert _sample(registry, "sglang_oom_target_server_info_errors_total", reason="bad_json", **target) == 1.0
    assert _sample(registry, "sglang_oom_target_server_info_errors_total", reason="timeout", **target) == 0.0
    assert _sample(registry, "sglang_oom_target_server_arg", arg="chunked_prefill_size", **target) == 16384.0
    assert _sample(registry, "sglang_oom_target_server_arg", arg="model_path", **target) is None


class DownTarget(FakeTarget):
    """FakeTarget whose last scrape failed: it still holds the last good snapshot and server args."""

    up = False


def test_a_down_targets_mirrored_values_and_args_are_left_out_its_health_stays():
    counts = EventCounts(CATALOG.ids, ("source",), CATALOG.retraction_kind, fatal_kinds=fatal_kinds(CATALOG))
    registry = _registry(counts, [], [DownTarget()])
    target = {"target": DownTarget.url}
    got = {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "target"))): s.value
           for m in registry.collect() for s in m.samples if s.labels.get("target") == DownTarget.url}  # fmt: skip
    assert got == {
        ("sglang_oom_target_up", ()): 0.0,
        ("sglang_oom_target_scrape_duration_seconds", ()): 0.25,
        ("sglang_oom_target_last_success_timestamp_seconds", ()): 1_780_000_000.0,
        **{("sglang_oom_target_scrape_errors_total", (("reason", r),)): 2.0 if r == "timeout" else 0.0
           for r in SCRAPE_REASONS},
        **{("sglang_oom_target_server_info_errors_total", (("reason", r),)): 1.0 if r == "bad_json" else 0.0
           for r in SCRAPE_REASONS},
    }  # fmt: skip
    assert _sample(registry, "sglang_oom_target_token_usage", **target) is None


def test_a_scraped_target_loses_its_mirrored_values_at_the_first_failed_scrape_and_gets_them_back():
    """The real scraper: good, refused (the server died), good again; the clock is the last success's time."""
    from pathlib import Path

    from sglang_oom_exporter.sources.http import HttpError, Reason
    from sglang_oom_exporter.sources.scrape import TargetScraper

    body = (Path(HERE) / "data" / "scrape" / "v0.5.23-live-prefill.prom").read_bytes()
    info = (Path(HERE) / "data" / "scrape" / "server_info_live_0_5_23_prefill.json").read_bytes()
    now = [1_780_000_000.0]
    dead = [False]

    def fetch(url: str, **_: object) -> bytes:
        if dead[0]:
            raise HttpError(Reason.REFUSED, "connection refused")
        return body if url.endswith("/metrics") else info

    scraper = TargetScraper("http://127.0.0.1:30000", fetch=fetch, clock=lambda: now[0])
    counts = EventCounts(CATALOG.ids, ("source",), CATALOG.retraction_kind, fatal_kinds=fatal_kinds(CATALOG))
    registry = _registry(counts, [], [scraper])
    target = {"target": scraper.url}

    def mirrored() -> dict[tuple[str, str], float]:
        return {(s.name, s.labels.get("arg", "")): s.value for m in registry.collect() for s in m.samples
                if s.labels.get("target") == scraper.url and s.name not in HEALTH}  # fmt: skip

    scraper.scrape_once()
    alive = mirrored()
    assert alive[("sglang_oom_target_max_total_tokens", "")] == 256.0
    assert alive[("sglang_oom_target_server_arg", "chunked_prefill_size")] == 4096.0
    assert _sample(registry, "sglang_oom_target_up", **target) == 1.0
    now[0] += 15
    dead[0] = True
    scraper.scrape_once()
    assert mirrored() == {}
    assert _sample(registry, "sglang_oom_target_up", **target) == 0.0
    assert _sample(registry, "sglang_oom_target_last_success_timestamp_seconds", **target) == 1_780_000_000.0
    assert _sample(registry, "sglang_oom_target_scrape_errors_total", reason="refused", **target) == 1.0
    now[0] += 15
    dead[0] = False
    scraper.scrape_once()
    assert mirrored() == alive
    assert _sample(registry, "sglang_oom_target_last_success_timestamp_seconds", **target) == 1_780_000_030.0


HEALTH = {"sglang_oom_target_up", "sglang_oom_target_scrape_duration_seconds",
          "sglang_oom_target_last_success_timestamp_seconds", "sglang_oom_target_scrape_errors_total",
          "sglang_oom_target_server_info_errors_total"}  # fmt: skip


def test_dropped_source_loses_its_series():
    counts = EventCounts(CATALOG.ids, ("source",), CATALOG.retraction_kind, fatal_kinds=fatal_kinds(CATALOG))
    counts.ensure(("gone",))
    counts.ensure(("kept",))
    counts.drop(("gone",))
    registry = _registry(counts, [])
    assert _sample(registry, "sglang_oom_events_total", kind="prefill", source="gone") is None
    assert _sample(registry, "sglang_oom_events_total", kind="prefill", source="kept") == 0.0


def _exposition() -> str:
    counts = EventCounts(
        CATALOG.ids, ("namespace", "pod", "container"), CATALOG.retraction_kind, fatal_kinds=fatal_kinds(CATALOG),
        crash_kind=crash_kind(CATALOG),
    )  # fmt: skip
    labels = ("llm", "sglang-0", "sglang")
    counts.ensure(labels)
    event = _event("decode", requested_tokens=96, available_tokens=40)
    sink = EventSink(CATALOG, counts=counts, wall=lambda: 1_780_000_000.0)
    sink.record(event, labels, dict(zip(counts.label_names, labels, strict=True)),
                Context(args={"max_running_requests": 256}))  # fmt: skip
    stats = SourceStats(labels, files=2, bytes_read=9467, lines_read=125, records=4, matched_records=2, lag_bytes=0,
                        last_read=1_780_000_000.0)  # fmt: skip
    stats.resets["rotated"] = 1
    text = generate_latest(_registry(counts, [stats], [FakeTarget()])).decode()
    return text.replace(f'python_version="{platform.python_version()}"', 'python_version="X"').replace(
        f'version="{__version__}"', 'version="V"'
    )


def test_exposition_matches_the_golden_file():
    text = _exposition()
    if os.environ.get("UPDATE_GOLDEN"):
        with open(GOLDEN, "w") as fh:
            fh.write(text)
    with open(GOLDEN) as fh:
        assert text == fh.read()


@pytest.mark.e2e
@pytest.mark.needs_promtool
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) is not installed")
def test_promtool_accepts_the_exposition():
    proc = subprocess.run(["promtool", "check", "metrics"], input=_exposition(), capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "", proc.stdout
    assert proc.stderr.strip() == "", proc.stderr


def test_target_values_keep_sglangs_engine_type_only_when_it_was_given():
    counts = EventCounts(CATALOG.ids, ("source",), CATALOG.retraction_kind, fatal_kinds=fatal_kinds(CATALOG))
    registry = _registry(counts, [], [FakeTarget(), DecodeTarget()])
    decode = {"target": DecodeTarget.url, "engine_type": "decode"}
    assert _sample(registry, "sglang_oom_target_pending_prealloc_token_usage", **decode) == 0.06
    assert _sample(registry, "sglang_oom_target_decode_prealloc_queue_requests", **decode) == 7.0
    assert _sample(registry, "sglang_oom_target_kv_available_tokens", **decode) == 52000.0
    assert _sample(registry, "sglang_oom_target_kv_evictable_tokens", **decode) == 17000.0
    assert _sample(registry, "sglang_oom_target_retracted_requests_total", **decode) == 35.0
    assert _sample(registry, "sglang_oom_target_up", target=DecodeTarget.url) == 1.0  # health keeps its labels
    # the older server gave no engine_type: its series have no such label at all
    assert _sample(registry, "sglang_oom_target_token_usage", target=FakeTarget.url) == 0.97
    names = {s.name for m in registry.collect() for s in m.samples if s.labels.get("target") == FakeTarget.url}
    assert "sglang_oom_target_token_usage" in names
    assert all("engine_type" not in s.labels for m in registry.collect() for s in m.samples
               if s.labels.get("target") == FakeTarget.url)  # fmt: skip


def test_the_0_5_23_series_are_mirrored_from_a_scraped_page_with_their_reasons_apart():
    from pathlib import Path

    from sglang_oom_exporter.sources.scrape import TargetScraper

    body = (Path(HERE) / "data" / "scrape" / "v0.5.23-pd-decode-hicache.prom").read_bytes()
    scraper = TargetScraper("http://10.0.0.7:30000", fetch=lambda url, **_: body, info_every=1e9)
    scraper.scrape_once()
    counts = EventCounts(CATALOG.ids, ("source",), CATALOG.retraction_kind, fatal_kinds=fatal_kinds(CATALOG))
    registry = _registry(counts, [], [scraper])
    decode = {"target": scraper.url, "engine_type": "decode"}
    got = {name: _sample(registry, f"sglang_oom_target_{name}", **decode) for name in (
        "prealloc_full_token_usage", "prealloc_swa_token_usage", "decode_host_receive_queue_requests",
        "decode_deferred_kv_release_requests", "hicache_dropped_tokens_total", "hicache_unbacked_evicted_tokens_total",
        "storage_prefetch_host_capacity_tokens_total", "storage_prefetch_device_capacity_tokens_total",
        "hicache_host_mamba_used_states")}  # fmt: skip
    assert got == {
        "prealloc_full_token_usage": 0.14, "prealloc_swa_token_usage": 0.07, "decode_host_receive_queue_requests": 4.0,
        "decode_deferred_kv_release_requests": 2.0, "hicache_dropped_tokens_total": 1024.0,
        "hicache_unbacked_evicted_tokens_total": 7168.0, "storage_prefetch_host_capacity_tokens_total": 8192.0,
        "storage_prefetch_device_capacity_tokens_total": 2048.0, "hicache_host_mamba_used_states": None,
    }  # fmt: skip
