"""The SGLang endpoint scraper: era fixtures, server info, every bad endpoint, history and the loop."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import yaml

from sglang_oom_exporter.sources.http import LABELS, HttpError, Reason
from sglang_oom_exporter.sources.scrape import REASONS, ScrapeLoop, TargetScraper, fetch
from sglang_oom_exporter.sources.sglang_metrics import KvSnapshot, parse_metrics, parse_server_info
from tests.support.fake_sglang import FakeSGLang
from tests.support.helpers import wait_until

DATA = Path(__file__).parent / "data" / "scrape"
ERAS = sorted(p.stem for p in DATA.glob("*.prom"))
INFOS = sorted(p.stem for p in DATA.glob("server_info_*.json"))
TIMEOUT = 1.0  # short, so the bad-endpoint tests stay fast
CAP = 1 << 20


def _body(era: str) -> bytes:
    return (DATA / f"{era}.prom").read_bytes()


@pytest.fixture
def fake():
    server = FakeSGLang(metrics_body=_body("v0.5.6"), info_body=(DATA / "server_info_new.json").read_bytes())
    server.start()
    yield server
    server.stop()


def test_at_least_six_eras_have_fixtures():
    assert len(ERAS) >= 6
    assert all((DATA / f"{era}.expected.yaml").exists() for era in ERAS)


@pytest.mark.parametrize("era", ERAS)
def test_fixture_snapshot(era):
    expected = yaml.safe_load((DATA / f"{era}.expected.yaml").read_text())
    snapshot = parse_metrics(_body(era), "http://sglang:30000", 1000.0)
    got = snapshot.as_dict()
    assert (got.pop("target"), got.pop("time")) == ("http://sglang:30000", 1000.0)
    assert expected == got


@pytest.mark.parametrize("case", INFOS)
def test_server_info_fixture(case):
    expected = yaml.safe_load((DATA / f"{case}.expected.yaml").read_text())
    info = parse_server_info((DATA / f"{case}.json").read_bytes())
    assert expected["raw_keys"] == info.raw_keys
    assert expected["args"] == dict(info.args)


def test_server_info_internal_states_do_not_override_top_level():
    info = parse_server_info(b'{"max_total_num_tokens": 10, "internal_states": [{"max_total_num_tokens": 99}]}')
    assert dict(info.args) == {"max_total_num_tokens": 10}


@pytest.mark.parametrize("body", [b"<html></html>", b"not json", b"[1, 2]", b'"text"', b"\xff\xfe\x00"])
def test_server_info_bad_json(body):
    with pytest.raises(HttpError) as err:
        parse_server_info(body)
    assert LABELS[err.value.reason].server_info == "bad_json"


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"<!DOCTYPE html><html><body>502</body></html>", id="html"),
        pytest.param(b"  \n<html>\n<title>login</title>", id="html-indented"),
        pytest.param(b'{"detail": "Not Found"}', id="json"),
        pytest.param(b"# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.0\n", id="no-sglang"),
        pytest.param(b"", id="empty"),
        pytest.param(b'sglang:token_usage{model_name="m" 0.5\n', id="bad-labels"),
        pytest.param(b"sglang:token_usage 0.5\nsglang:num_used_tok", id="cut-mid-line"),
        pytest.param(b"sglang:token_usage \xff\n", id="not-utf8"),
    ],
)
def test_parse_metrics_not_metrics(body):
    with pytest.raises(HttpError) as err:
        parse_metrics(body, "t", 0.0)
    assert LABELS[err.value.reason].scrape == "not_metrics"


def test_parse_metrics_counter_needs_total_sample_and_skips_nan():
    body = (
        b"# TYPE sglang:num_aborted_requests counter\nsglang:num_aborted_requests_total 7.0\n"
        b"sglang:token_usage NaN\nsglang:new_token_ratio 0.5\n"
    )
    assert parse_metrics(body, "t", 0.0).as_dict() == {
        "target": "t", "time": 0.0, "aborted_requests_total": 7.0, "new_token_ratio": 0.5
    }  # fmt: skip


def test_fetch_ok_and_chunked(fake):
    assert fetch(f"{fake.url}/metrics", timeout=TIMEOUT, max_bytes=CAP) == _body("v0.5.6")
    fake.chunked = True
    assert fetch(f"{fake.url}/metrics", timeout=TIMEOUT, max_bytes=CAP) == _body("v0.5.6")


@pytest.mark.parametrize("chunked", [False, True])
def test_fetch_cap_is_exact(fake, chunked):
    fake.chunked = chunked
    size = len(_body("v0.5.6"))
    assert len(fetch(f"{fake.url}/metrics", timeout=TIMEOUT, max_bytes=size)) == size
    with pytest.raises(HttpError) as err:
        fetch(f"{fake.url}/metrics", timeout=TIMEOUT, max_bytes=size - 1)
    assert LABELS[err.value.reason].scrape == "too_large"


@pytest.mark.parametrize("url", ["ftp://x/metrics", "http:///metrics", "http://x:99999/metrics", "http://x/a\r\nX: y"])
def test_fetch_rejects_bad_urls(url):
    with pytest.raises(HttpError) as err:
        fetch(url, timeout=TIMEOUT, max_bytes=CAP)
    assert LABELS[err.value.reason].scrape == "error"


def test_fetch_404_carries_status(fake):
    with pytest.raises(HttpError) as err:
        fetch(f"{fake.url}/nothing", timeout=TIMEOUT, max_bytes=CAP)
    assert (LABELS[err.value.reason].scrape, err.value.status) == ("http_status", 404)


BAD_MODES = [
    ("refuse", "refused"),
    ("hang", "timeout"),
    ("http500", "http_status"),
    ("html", "not_metrics"),
    ("truncated", "truncated"),
    ("huge", "too_large"),
    ("huge_declared", "too_large"),
    ("slow_drip", "timeout"),
    ("slow_headers", "timeout"),
]


def _set_mode(fake: FakeSGLang, mode: str) -> None:
    if mode == "refuse":
        fake.stop()  # nothing listens on the port any more: connect() is refused
    elif mode == "huge_declared":
        fake.mode, fake.huge_declares_length = "huge", True
    else:
        fake.mode = mode


@pytest.mark.parametrize(("mode", "reason"), BAD_MODES)
def test_bad_endpoint_fetch_and_parse(fake, mode, reason):
    _set_mode(fake, mode)
    with pytest.raises(HttpError) as err:
        parse_metrics(fetch(f"{fake.url}/metrics", timeout=TIMEOUT, max_bytes=CAP), "t", 0.0)
    assert LABELS[err.value.reason].scrape == reason  # "timeout" for the three that never finish: the deadline fired


@pytest.mark.parametrize(("mode", "reason"), BAD_MODES)
def test_bad_endpoint_sets_target_down(fake, mode, reason):
    scraper = TargetScraper(fake.url, timeout=TIMEOUT, max_bytes=CAP)
    scraper.scrape_once()
    assert scraper.up
    _set_mode(fake, mode)
    scraper.scrape_once()
    assert not scraper.up
    assert scraper.last_error.startswith(f"{reason}: ")
    assert scraper.errors_total == {r: int(r == reason) for r in REASONS}
    assert scraper.snapshot is not None, "the last good snapshot is kept"


def test_slow_drip_gives_up_at_the_deadline(fake):
    fake.mode = "slow_drip"
    fake.drip_seconds = 0.2  # five bytes per second: urllib's per-read timeout would never fire
    started = time.monotonic()
    with pytest.raises(HttpError) as err:
        fetch(f"{fake.url}/metrics", timeout=TIMEOUT, max_bytes=CAP)
    # Every read returns within 0.2 s, so only the whole fetch's deadline can time it out (the body would take
    # minutes), and not before that deadline. How soon after it the error comes is the machine's, not asserted.
    assert LABELS[err.value.reason].scrape == "timeout"
    assert time.monotonic() - started >= TIMEOUT - 0.05
    assert len(fake.metrics_body) * fake.drip_seconds > 60 * TIMEOUT


def test_unexpected_fetch_exception_is_an_error():
    def broken(url, *, timeout, max_bytes):
        raise RuntimeError("boom")

    scraper = TargetScraper("http://x", fetch=broken)
    scraper.scrape_once()
    assert (scraper.up, scraper.last_error) == (False, "error: RuntimeError: boom")


def test_server_info_new_path(fake):
    scraper = TargetScraper(fake.url, timeout=TIMEOUT)
    scraper.scrape_once()
    assert scraper.up
    assert scraper.server_info is not None
    assert scraper.server_info.args["version"] == "0.5.16"
    assert fake.requests == ["/metrics", "/server_info"]


def test_server_info_falls_back_to_get_server_info(fake):
    fake.info_path = "/get_server_info"
    fake.info_body = (DATA / "server_info_old_flat.json").read_bytes()
    now = [1000.0]
    scraper = TargetScraper(fake.url, timeout=TIMEOUT, clock=lambda: now[0], info_every=60.0)
    scraper.scrape_once()
    assert scraper.server_info is not None
    assert scraper.server_info.args["version"] == "0.4.0"
    assert fake.requests == ["/metrics", "/server_info", "/get_server_info"]
    scraper.scrape_once()  # not due yet
    now[0] += 60.0
    scraper.scrape_once()  # due: straight to the path that answered
    assert fake.requests[3:] == ["/metrics", "/metrics", "/get_server_info"]
    assert scraper.info_errors_total == dict.fromkeys(REASONS, 0)


def test_server_info_absent_is_tolerated(fake):
    fake.info_path = None
    scraper = TargetScraper(fake.url, timeout=TIMEOUT)
    scraper.scrape_once()
    assert scraper.up
    assert scraper.server_info is None
    assert scraper.info_errors_total["http_status"] == 1
    assert scraper.errors_total == dict.fromkeys(REASONS, 0)


def test_server_info_bad_json_keeps_target_up(fake):
    fake.info_body = b"<html>oops</html>"
    scraper = TargetScraper(fake.url, timeout=TIMEOUT)
    scraper.scrape_once()
    assert scraper.up
    assert scraper.info_errors_total["bad_json"] == 1


def test_restart_refreshes_server_info(fake):
    now = [0.0]
    scraper = TargetScraper(fake.url, timeout=TIMEOUT, clock=lambda: now[0], info_every=3600.0)
    scraper.scrape_once()
    fake.mode = "http500"
    scraper.scrape_once()
    fake.mode = "ok"
    fake.info_body = (DATA / "server_info_states_only.json").read_bytes()
    now[0] = 10.0
    scraper.scrape_once()  # back up: info fetched again although not due
    assert scraper.server_info is not None
    assert scraper.server_info.args["version"] == "0.5.23"


def _scripted(bodies):
    """A fetch that serves the next body for /metrics (an exception is raised) and 404s the info paths."""
    queue = list(bodies)

    def fake_fetch(url, *, timeout, max_bytes):
        if not url.endswith("/metrics"):
            raise HttpError(Reason.HTTP_STATUS, "HTTP 404", 404)
        item = queue.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    return fake_fetch


def test_snapshot_before_and_history():
    body = b"sglang:token_usage %.1f\n"
    bodies = [body % 0.1, body % 0.2, HttpError(Reason.TIMEOUT, "slow"), body % 0.4]
    now = [100.0]
    scraper = TargetScraper("http://t", fetch=_scripted(bodies), clock=lambda: now[0], history=8)
    for t in (100.0, 110.0, 120.0, 130.0):
        now[0] = t
        scraper.scrape_once()
    assert [(s.time, s.token_usage) for s in scraper.history] == [(100.0, 0.1), (110.0, 0.2), (130.0, 0.4)]
    assert scraper.snapshot_before(99.9) is None
    assert scraper.snapshot_before(100.0) == KvSnapshot("http://t", 100.0, token_usage=0.1)
    assert scraper.snapshot_before(125.0) == KvSnapshot("http://t", 110.0, token_usage=0.2)
    assert scraper.snapshot_before(1e9) == scraper.snapshot


def test_history_is_bounded():
    scraper = TargetScraper("http://t", fetch=_scripted([b"sglang:token_usage 0.5\n"] * 5), history=3)
    for _ in range(5):
        scraper.scrape_once()
    assert len(scraper.history) == 3


def test_loop_hanging_target_does_not_delay_the_good_one():
    good = FakeSGLang(metrics_body=_body("v0.4.8")).start()
    bad = FakeSGLang().start()
    bad.mode = "hang"  # until stop(): with its 60 s timeout, the bad target's first scrape is in flight throughout
    good_scraper = TargetScraper(good.url, timeout=10.0)  # a loaded machine never makes a good scrape an error
    bad_scraper = TargetScraper(bad.url, timeout=60.0)
    scraping_threads: set[int] = set()
    for scraper in (good_scraper, bad_scraper):
        scraper.scrape_once = _recording_thread(scraper.scrape_once, scraping_threads)  # type: ignore[method-assign]
    loop = ScrapeLoop([bad_scraper, good_scraper], interval=0.05)
    try:
        loop.start()
        wait_until(lambda: len(good_scraper.history) >= 5, timeout=15.0, what="five scrapes of the good target")
        # Five good scrapes while the hanging one has not returned: the good target never waited for it.
        assert bad.requests == ["/metrics"]
        assert (bad_scraper.snapshot, sum(bad_scraper.errors_total.values())) == (None, 0)
        assert threading.get_ident() not in scraping_threads, "start() must not scrape in the caller's thread"
        assert good_scraper.up
        assert good_scraper.snapshot is not None
        assert good_scraper.snapshot.aborted_requests_total == 9.0
        bad.stop()  # the hanging request ends unanswered, and later ones are refused
        wait_until(lambda: sum(bad_scraper.errors_total.values()) >= 1, timeout=15.0, what="the bad target's error")
        assert not bad_scraper.up
    finally:
        stopped = loop.stop()  # joins every thread within its own bound, or says it could not
        good.stop()
        bad.stop()
    assert stopped


def _recording_thread(scrape_once, threads: set[int]):
    """scrape_once, noting the thread each call runs in."""

    def wrapped(stop=None):
        threads.add(threading.get_ident())
        return scrape_once(stop)

    return wrapped


def test_loop_rejects_bad_interval():
    with pytest.raises(ValueError, match="positive"):
        ScrapeLoop([], interval=0)


def test_loop_start_twice_is_an_error():
    loop = ScrapeLoop([TargetScraper("http://t", fetch=_scripted([]))], interval=60)
    try:
        loop.start()
        with pytest.raises(RuntimeError):
            loop.start()
    finally:
        assert loop.stop()


def test_parse_metrics_prefers_the_colon_spelling_when_a_body_has_both():
    # A page that carries both spellings of one series (a federation, a proxy that adds the escaped copy) must
    # not count the tokens twice; a name only in the escaped spelling is still read.
    body = (
        b'sglang:num_used_tokens{tp_rank="0"} 100.0\nsglang_num_used_tokens{tp_rank="0"} 100.0\n'
        b'sglang_num_queue_reqs{tp_rank="0"} 4.0\n'
    )
    assert parse_metrics(body, "t", 0.0).as_dict() == {
        "target": "t", "time": 0.0, "num_used_tokens": 100.0, "queued_requests": 4.0
    }  # fmt: skip


def test_parse_metrics_never_reads_the_exporters_own_page_as_sglangs():
    body = b"# TYPE sglang_oom_target_token_usage gauge\nsglang_oom_target_token_usage 0.99\n"
    with pytest.raises(HttpError) as err:
        parse_metrics(body, "t", 0.0)
    assert LABELS[err.value.reason].scrape == "not_metrics"


def test_parse_metrics_joins_several_engine_types_in_a_fixed_order():
    body = b'sglang:token_usage{engine_type="prefill"} 0.2\nsglang:token_usage{engine_type="decode"} 0.3\n'
    assert parse_metrics(body, "t", 0.0).engine_type == "decode+prefill"


@pytest.mark.parametrize("prefix", [b"sglang:", b"sglang_"])
def test_hicache_dropped_tokens_count_only_the_host_pressure_reason(prefix):
    # SGLang 0.5.23 puts a second reason in the family: tokens evicted before their eager write-through reached
    # host memory. The mirror is "dropped for lack of host memory": only host_pressure, summed over pools.
    labels = b'cache_type="UnifiedRadixCache",dp_rank="0",pp_rank="0",tp_rank="0"'
    body = b"".join(
        prefix + b"hicache_dropped_tokens_total{" + labels + b',pool="' + pool + b'",reason="' + reason + b'"} '
        + value + b"\n"
        for pool, reason, value in ((b"kv", b"host_pressure", b"300.0"), (b"swa", b"host_pressure", b"20.0"),
                                    (b"kv", b"write_through_unbacked_eviction", b"5000.0"))
    )  # fmt: skip
    assert parse_metrics(body, "t", 0.0).hicache_dropped_tokens_total == 320.0
    only_write_through = b"\n".join(line for line in body.split(b"\n") if b"write_through" in line) + b"\n"
    assert parse_metrics(only_write_through, "t", 0.0).hicache_dropped_tokens_total is None


@pytest.mark.parametrize(("era", "some"), [
    ("main-2026-08-pd-decode-hicache",
     {"graph_memory_gb": 2.3, "startup_available_gpu_memory_gb": 5.87, "hicache_dropped_tokens_total": 2560.0}),
    ("v0.5.23-pd-decode-hicache",
     {"prealloc_full_token_usage": 0.14, "hicache_dropped_tokens_total": 1024.0,
      "hicache_unbacked_evicted_tokens_total": 7168.0, "storage_prefetch_host_capacity_tokens_total": 8192.0}),
])  # fmt: skip
def test_the_newer_series_read_alike_under_both_spellings(era, some):
    colon = _body(era)
    escaped = colon.replace(b"sglang:", b"sglang_")
    assert b"sglang:" not in escaped
    want = parse_metrics(colon, "t", 1.0).as_dict()
    assert parse_metrics(escaped, "t", 1.0).as_dict() == want
    assert {k: want[k] for k in some} == some
