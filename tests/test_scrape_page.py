"""/metrics from the cached page: a scrape never waits for the loop, the cached bytes equal a fresh render after
every kind of change, gzip is one valid member, and what one source costs in series, exactly.

The loop is driven by hand (Loop.step with an injected clock); "mid-slice" is a LogSource.poll that blocks,
holding the source set's lock as a real 32 MiB read slice does, until the test lets it go.
"""

from __future__ import annotations

import gzip
import http.client
import shutil
import subprocess
import sys
import threading
import zlib
from email.message import Message

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import parser as text_parser
from prometheus_client.openmetrics import parser as openmetrics_parser
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from sglang_oom_exporter.config.model import Config
from sglang_oom_exporter.daemon.app import App
from sglang_oom_exporter.daemon.logsource import LogSource
from sglang_oom_exporter.daemon.loop import SWITCH_INTERVAL
from sglang_oom_exporter.daemon.sourceset import add_stats
from sglang_oom_exporter.detect.model import OomEvent
from sglang_oom_exporter.events.store import EventStore, Health
from sglang_oom_exporter.metrics.collector import ExporterCollector
from sglang_oom_exporter.metrics.events import EventCounts, fatal_kinds
from sglang_oom_exporter.metrics.exposition import CHUNK_SERIES, PageRegistry, join_gzip, join_plain
from sglang_oom_exporter.metrics.sources import SourceStats
from sglang_oom_exporter.web.routes import Routes
from sglang_oom_exporter.web.server import ExporterServer
from tests.support.helpers import CATALOG, Clock

OPENMETRICS = "application/openmetrics-text;version=1.0.0"


def _app(tmp_path) -> tuple[App, Clock]:
    clock = Clock()
    config = Config(paths=(str(tmp_path / "*.log"),), state_dir=str(tmp_path / "state"), sweep_interval=1.0,
                    discover_interval=5.0, state_interval=5.0, traceback_wait=1.0)  # fmt: skip
    return App(config, CATALOG, clock=clock, wall=clock), clock


def _steps(app: App, clock: Clock, n: int = 4) -> None:
    for _ in range(n):
        app.loop.step()
        clock.now += 0.5


def _event(kind: str, fatal: bool = True, suggestions: tuple = (), **numbers: object) -> OomEvent:
    return OomEvent(kind=kind, fatal=fatal, source="s", location="s.log:1", time=None, ranks=("TP0",), message="m",
                    excerpt="m", numbers=dict(numbers), suggestions=suggestions)  # fmt: skip


def _headers(**values: str) -> Message:
    msg = Message()
    for k, v in values.items():
        msg[k.replace("_", "-")] = v
    return msg


def _series(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


# --- a scrape never waits for the loop --------------------------------------------------------------------
def test_a_scrape_and_a_probe_answer_while_the_loop_is_mid_slice(tmp_path, monkeypatch):
    log = tmp_path / "a.log"
    log.write_text("")
    app, clock = _app(tmp_path)
    _steps(app, clock)
    registry = PageRegistry()
    registry.register(app.collector())
    server = ExporterServer(("127.0.0.1", 0), registry=registry, catalog=CATALOG, events=EventStore(10),
                            health=app.loop.health)  # fmt: skip
    in_slice, release = threading.Event(), threading.Event()
    real_poll = LogSource.poll

    def slow_poll(self: LogSource, now: float, budget: int | None = None) -> bool:
        in_slice.set()
        assert release.wait(15), "the test never let the slice go"
        return real_poll(self, now, budget)

    monkeypatch.setattr(LogSource, "poll", slow_poll)
    log.write_text("one line\n")
    app.loop.mark_changed(None)  # look at every file on the next pass
    stepper = threading.Thread(target=app.loop.step, name="test-loop")
    server.start()
    try:
        stepper.start()
        assert in_slice.wait(10), "the loop never reached the read"
        assert app.sources.held_elsewhere()  # the loop holds the lock through its slice
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        body = resp.read().decode()
        conn.close()
        assert resp.status == 200
        assert 'sglang_oom_exporter_file_lag_bytes{source="a"} 0.0' in body
        assert stepper.is_alive()  # answered while the slice was still running
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        conn.request("GET", "/healthz")  # a liveness probe does not wait for the slice either
        resp = conn.getresponse()
        assert (resp.status, resp.read()) == (200, b"ok: following 1 log source(s)\n")
        conn.close()
        assert stepper.is_alive()
    finally:
        release.set()
        stepper.join(10)
        server.stop()
    assert not stepper.is_alive()


# --- the cached page equals a fresh render ------------------------------------------------------------------


def _fresh(collector: ExporterCollector, openmetrics: bool) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_openmetrics(registry) if openmetrics else generate_latest(registry)


def _assert_page_is_fresh(counts: EventCounts, collector: ExporterCollector) -> None:
    registry = PageRegistry()
    registry.register(collector)
    for openmetrics in (False, True):
        parts = registry.render(openmetrics)
        assert join_plain(parts) == _fresh(collector, openmetrics)
        gz = join_gzip(parts)
        inflater = zlib.decompressobj(zlib.MAX_WBITS | 16)
        assert inflater.decompress(gz) == join_plain(parts)
        assert inflater.eof
        assert inflater.unused_data == b""  # one gzip member: every client reads all of it


def test_the_cached_page_equals_a_fresh_render_after_each_kind_of_change():
    counts = EventCounts(CATALOG.ids, ("source",), CATALOG.retraction_kind, fatal_kinds=fatal_kinds(CATALOG))
    collector = ExporterCollector(counts, lambda: {"pending_events": 2.0, "state_saves_total": 1.0})
    check = lambda: _assert_page_is_fresh(counts, collector)  # noqa: E731
    check()  # empty
    counts.ensure(("a",))
    check()  # a new source: zero series
    counts.ensure(('we"ird\\name\n',))
    check()  # label escaping
    counts.record(("a",), _event("prefill", requested_tokens=16384, available_tokens=6100), 1000.0)
    check()  # a fatal event with numbers
    counts.record(("a",), _event("decode", fatal=False), 1001.0)
    check()  # a non-fatal one, without numbers
    retract = CATALOG.retraction_kind or ""
    counts.record(("b",), _event(retract, fatal=False, retracted_requests=3), 1002.0)
    check()  # the retraction counter, on a source first seen with its event
    counts.sources.update("/l/a.log", SourceStats(("a",), files=1, bytes_read=100, lines_read=3, last_read=5.0))
    check()
    counts.sources.update("/l/a.log", SourceStats(("a",), files=1, bytes_read=40, lines_read=1, lag_bytes=7))
    check()  # a restarted source (smaller counts): the totals grow by the new values, never down
    counts.sources.update("/l/a.1.log", SourceStats(("a",), files=1, read_errors=2, last_read=9.0))
    check()  # a second file of the same source
    counts.sources.remove("/l/a.log")
    check()
    counts.drop(("b",))
    check()  # a retired source
    counts.set_kinds((*CATALOG.ids, "new_kind"), CATALOG.retraction_kind, ("new_kind",))
    check()  # a reloaded catalog
    saved = counts.export_state()
    again = EventCounts(CATALOG.ids, ("source",), CATALOG.retraction_kind, fatal_kinds=fatal_kinds(CATALOG))
    again.restore_state(saved)
    _assert_page_is_fresh(again, ExporterCollector(again))  # restored from the state file
    for i in range(CHUNK_SERIES + 3):
        counts.ensure((f"s{i}",))
    check()  # families over more than one chunk
    counts.drop(("s5",))
    counts.record((f"s{CHUNK_SERIES}",), _event("prefill"), 1003.0)
    check()


def test_a_scrape_without_changes_reencodes_nothing():
    counts = EventCounts(CATALOG.ids, ("source",), CATALOG.retraction_kind, fatal_kinds=fatal_kinds(CATALOG))
    for i in range(2000):
        counts.ensure((f"s{i}",))
        counts.sources.update(f"/l/{i}.log", SourceStats((f"s{i}",), files=1))
    first, second = counts.page.parts(False), counts.page.parts(False)
    assert len(first) == len(second)
    assert all(a is b for a, b in zip(first, second, strict=True))  # the same cached objects: nothing re-joined
    counts.record(("s7",), _event("prefill"), 1.0)
    third = counts.page.parts(False)
    new = [p for p in third if not any(p is q for q in second)]
    # One chunk each of events and fatal events re-encoded, and the first last-event timestamp's chunk.
    assert len(new) == 3
    assert len(third) == len(second) + 1


def test_the_name_filter_and_the_openmetrics_head():
    counts = EventCounts(CATALOG.ids, ("source",), CATALOG.retraction_kind, fatal_kinds=fatal_kinds(CATALOG))
    counts.ensure(("a",))
    registry = PageRegistry()
    registry.register(ExporterCollector(counts))
    routes = Routes(registry=registry, catalog=CATALOG, events=EventStore(1), health=lambda: Health(True))
    text = routes.respond("/metrics?name[]=sglang_oom_events_total", _headers()).body.decode()
    assert {line.split("{")[0] for line in _series(text)} == {"sglang_oom_events_total"}
    assert len(_series(text)) == len(CATALOG.ids)
    om = routes.respond("/metrics", _headers(Accept=OPENMETRICS, Accept_Encoding="gzip"))
    assert om.headers["Content-Encoding"] == "gzip"
    assert om.content_type.startswith("application/openmetrics-text")
    body = gzip.decompress(om.body).decode()
    assert "# TYPE sglang_oom_events counter\n" in body
    assert body.endswith("# EOF\n")
    assert body.count("# EOF") == 1


# --- what a source costs ----------------------------------------------------------------------------------


def test_series_per_source_exactly(tmp_path):
    app, clock = _app(tmp_path)
    (tmp_path / "a.log").write_text("")
    _steps(app, clock)
    registry = PageRegistry()
    registry.register(app.collector())

    def page() -> str:
        return join_plain(registry.render(False)).decode()

    one = _series(page())
    per_source = [line for line in one if 'source="a"' in line]
    # Every kind's events (each has an alert), the kinds that can be fatal, the retraction and non-memory crash
    # counters, then the source's lag and read errors. The default catalog: 10 + 9 + 2 + 2.
    assert len(per_source) == len(CATALOG.ids) + len(fatal_kinds(CATALOG)) + 2 + 2 == 23
    (tmp_path / "b.log").write_text("")
    (tmp_path / "c.log").write_text("")
    app.loop.request_discover()
    _steps(app, clock, 12)
    three = _series(page())
    assert len(three) - len(one) == 2 * 23  # nothing else grows with the number of files
    with open(tmp_path / "b.log", "a") as fh:
        fh.write("a line\n")
    app.loop.mark_changed({str(tmp_path)})
    _steps(app, clock)
    after_read = _series(page())
    assert len(after_read) == len(three) + 1  # b's last-read timestamp, once it has read something
    assert "sglang_oom_exporter_lines_read_total 1.0" in after_read


# --- what the loop publishes equals what the source set holds ---------------------------------------------


def _published(app: App) -> dict[str, dict]:
    """The page's read statistics: per source (lag, errors, last read) and the exporter-wide totals."""
    metrics = {m.name: m for m in app.counts.page.metrics()}
    per = {
        name: {s.labels["source"]: s.value for s in metrics[f"sglang_oom_exporter_{name}"].samples}
        for name in ("file_lag_bytes", "read_errors", "last_read_timestamp_seconds")
    }
    totals = {
        name: metrics[f"sglang_oom_exporter_{name}"].samples[0].value
        for name in ("read_bytes", "lines_read", "records", "matched_records", "files_watched")
    }
    return {"per": per, "totals": totals}


def _held(app: App) -> dict[str, dict]:
    """The same numbers summed from the source set itself, under its lock, per label set."""
    with app.sources.locked():
        merged: dict[tuple[str, ...], SourceStats] = {}
        for source in app.sources.followed():
            add_stats(merged.setdefault(source.labels, SourceStats(source.labels)), source)
    stats = list(merged.values())
    per = {
        "file_lag_bytes": {s.labels[0]: s.lag_bytes for s in stats},
        "read_errors": {s.labels[0]: s.read_errors for s in stats},
        "last_read_timestamp_seconds": {s.labels[0]: s.last_read for s in stats if s.last_read is not None},
    }
    totals = {
        "read_bytes": sum(s.bytes_read for s in stats), "lines_read": sum(s.lines_read for s in stats),
        "records": sum(s.records for s in stats), "matched_records": sum(s.matched_records for s in stats),
        "files_watched": sum(s.files for s in stats),
    }  # fmt: skip
    return {"per": per, "totals": totals}


BLOCK = (
    "[2026-03-14 22:07:{s:02d} TP0] Decode out of memory. Try to lower your batch size.\nTry to allocate 8 tokens.\n\n"
)


def test_published_statistics_equal_the_source_sets_after_each_kind_of_change(tmp_path):
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text("")
    b.write_text("")
    app, clock = _app(tmp_path)
    _steps(app, clock)
    assert _published(app) == _held(app)  # two quiet files
    with open(a, "a") as fh:
        fh.write("line one\nline two\n" + BLOCK.format(s=1))
    _steps(app, clock, 6)  # read by a sweep (no file event is handed over)
    assert _published(app) == _held(app)
    assert _published(app)["totals"]["lines_read"] == 5
    a.rename(tmp_path / "a.log.1")
    a.write_text("after the rotation\n")
    _steps(app, clock, 6)
    assert _published(app) == _held(app)  # the rotated file drained, the new one read
    b.write_text("a long line that will be cut away by the truncation below\n" * 5)
    _steps(app, clock, 4)
    assert _published(app) == _held(app)
    b.write_text(BLOCK.format(s=2))  # truncated (copytruncate-style), then written again
    _steps(app, clock, 8)
    assert _published(app) == _held(app)
    assert app.counts.total() == 2
    resets = {s.labels["reason"]: s.value for m in app.counts.page.metrics()
              if m.name == "sglang_oom_exporter_file_resets" for s in m.samples}  # fmt: skip
    assert resets == {"rotated": 1.0, "truncated": 1.0, "recreated": 0.0, "deleted": 0.0}
    before = _published(app)["totals"]
    assert app.reload(app.config, CATALOG) == "applied"  # every file source rebuilt: its counts start again
    _steps(app, clock, 4)
    after = _published(app)["totals"]
    assert after == before  # the totals neither go down nor count the rebuilt sources twice
    assert _published(app)["per"] == _held(app)["per"]
    with open(b, "a") as fh:
        fh.write("one more\n")
    _steps(app, clock, 4)
    assert _published(app)["totals"]["lines_read"] == before["lines_read"] + 1


def _busy_page_registry() -> PageRegistry:
    counts = EventCounts(CATALOG.ids, ("namespace", "pod", "container"), CATALOG.retraction_kind,
                         fatal_kinds=fatal_kinds(CATALOG))  # fmt: skip
    for i in range(3):
        counts.ensure(("llm", f"sglang-{i}", 'c"\\x'))
    counts.record(("llm", "sglang-1", 'c"\\x'), _event("prefill", requested_tokens=9, available_tokens=1), 5.0)
    counts.sources.update("/l/0", SourceStats(("llm", "sglang-0", 'c"\\x'), files=1, bytes_read=9, last_read=2.0))
    registry = PageRegistry()
    registry.register(ExporterCollector(counts, lambda: {"pending_events": 1.0, "source_errors_total": 0.0}))
    return registry


@pytest.mark.e2e
@pytest.mark.needs_promtool
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) is not installed")
def test_promtool_accepts_the_cached_page():
    page = join_plain(_busy_page_registry().render(False))
    proc = subprocess.run(["promtool", "check", "metrics"], input=page, capture_output=True, timeout=60, check=False)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b"")


def test_the_openmetrics_page_parses_strictly_to_the_same_samples_as_the_text_page():
    registry = _busy_page_registry()
    om = join_plain(registry.render(True)).decode()
    text = join_plain(registry.render(False)).decode()
    om_samples = {(s.name, tuple(sorted(s.labels.items())), s.value)
                  for f in openmetrics_parser.text_string_to_metric_families(om) for s in f.samples}  # fmt: skip
    text_samples = {(s.name, tuple(sorted(s.labels.items())), s.value)
                    for f in text_parser.text_string_to_metric_families(text) for s in f.samples}  # fmt: skip
    assert om_samples == text_samples
    assert len(om_samples) == len(_series(text))


def test_the_running_loop_hands_the_gil_over_every_millisecond_and_restores_it(tmp_path):
    app, _clock = _app(tmp_path)
    seen: list[float] = []

    class Probe:
        def start(self) -> None:
            seen.append(sys.getswitchinterval())

        def stop(self) -> None:
            seen.append(sys.getswitchinterval())

    before = sys.getswitchinterval()
    stop = threading.Event()
    stop.set()  # run() starts the services, primes the files, and stops at once
    app.loop.run(stop, services=[Probe()])
    assert seen == [min(before, SWITCH_INTERVAL)] * 2
    assert sys.getswitchinterval() == before
