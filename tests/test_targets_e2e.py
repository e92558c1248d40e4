"""End to end: the real daemon scraping a fake SGLang over loopback, and OOM events carrying context
and concrete suggestions. target_up flips with the endpoint, and a hanging endpoint does not slow tailing.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request

import pytest

from tests.support.daemon import Daemon, settle
from tests.support.fake_sglang import FakeSGLang
from tests.support.helpers import wait_until
from tests.support.logs import PREFILL, append
from tests.support.sglang_data import INFO, METRICS

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HERE = os.path.dirname(__file__)


@pytest.fixture
def fake():
    server = FakeSGLang()
    server.metrics_body = METRICS
    server.info_body = json.dumps(INFO).encode()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def daemon(tmp_path, fake):
    log = tmp_path / "server.log"
    log.write_text("")
    d = Daemon(["--sglang-url", fake.url, "--scrape-interval", "0.3s", "--scrape-timeout", "1s", str(log)],
               str(tmp_path / "state"))  # fmt: skip
    d.start()
    yield d, log
    if d.proc is not None and d.proc.poll() is None:
        d.stop()


def _metric(d: Daemon, name: str, **labels: str) -> float | None:
    return d.metrics().get((name, tuple(sorted(labels.items()))))


def test_event_carries_kv_context_server_args_and_a_concrete_suggestion(daemon, fake):
    d, log = daemon
    wait_until(lambda: _metric(d, "sglang_oom_target_up", target=fake.url) == 1.0, what="target up", timeout=15.0)
    wait_until(lambda: _metric(d, "sglang_oom_target_server_arg", target=fake.url, arg="chunked_prefill_size") == 16384,
             what="server args", timeout=15.0)  # fmt: skip
    append(log, PREFILL.format(s=1))
    settle(d, 1)
    with urllib.request.urlopen(f"http://127.0.0.1:{d.port}/events", timeout=5) as r:
        (event,) = json.loads(r.read())["events"]
    assert event["context"]["target"] == fake.url
    assert event["context"]["server_args"]["chunked_prefill_size"] == 16384
    assert event["context"]["kv"], "the KV snapshot before the event"
    first = event["suggestions"][0]
    assert (first["flag"], first["current"], first["suggested"]) == ("--chunked-prefill-size", 16384, 4096)
    labels = {"kind": "prefill", "source": "server", "flag": "chunked-prefill-size"}
    assert _metric(d, "sglang_oom_suggested_flag_value", **labels) == 4096
    assert _metric(d, "sglang_oom_current_flag_value", **labels) == 16384
    with urllib.request.urlopen(f"http://127.0.0.1:{d.port}/", timeout=5) as r:
        page = r.read().decode()
    assert "<code>--chunked-prefill-size</code> 16384 &rarr; 4096" in page


def test_target_up_flips_with_the_endpoint_and_says_why(daemon, fake):
    d, _ = daemon
    wait_until(lambda: _metric(d, "sglang_oom_target_up", target=fake.url) == 1.0, what="target up", timeout=15.0)
    fake.mode = "http500"
    wait_until(lambda: _metric(d, "sglang_oom_target_up", target=fake.url) == 0.0, what="target down", timeout=15.0)
    assert _metric(d, "sglang_oom_target_scrape_errors_total", target=fake.url, reason="http_status") >= 1
    fake.mode = "html"
    wait_until(lambda: (_metric(d, "sglang_oom_target_scrape_errors_total", target=fake.url, reason="not_metrics")
                      or 0) >= 1, what="not_metrics", timeout=15.0)  # fmt: skip
    assert _metric(d, "sglang_oom_target_up", target=fake.url) == 0.0
    fake.mode = "ok"
    wait_until(lambda: _metric(d, "sglang_oom_target_up", target=fake.url) == 1.0, what="target up again", timeout=15.0)


def test_a_hanging_endpoint_does_not_slow_log_tailing(daemon, fake):
    d, log = daemon
    wait_until(lambda: _metric(d, "sglang_oom_target_up", target=fake.url) == 1.0, what="target up", timeout=15.0)
    fake.mode = "hang"
    wait_until(lambda: (_metric(d, "sglang_oom_target_scrape_errors_total", target=fake.url, reason="timeout")
                      or 0) >= 1, what="a timed-out scrape", timeout=15.0)  # fmt: skip
    started = time.monotonic()
    append(log, PREFILL.format(s=2))
    wait_until(lambda: d.total() == 1, what="the event while the target hangs", timeout=15.0)
    elapsed = time.monotonic() - started
    # Counted while the target still hangs: the scrape runs in its own thread and the tailing never waits for
    # it. How fast is measured where speed is the point: bench/bench_latency.py --hanging-target.
    assert _metric(d, "sglang_oom_target_up", target=fake.url) == 0.0
    assert d.total() == 1
    print(f"\nlatency with a hanging target: {elapsed:.2f}s")


ERAS = ["v0.3.6.prom", "v0.4.8.prom", "v0.4.10.prom", "v0.5.6.prom", "v0.5.16-dp2.prom", "v0.5.23-hybrid.prom",
        "v0.5.16-openmetrics-escaped.prom", "main-2026-engine-metrics-escaped.prom"]  # fmt: skip


@pytest.fixture(scope="module")
def era_daemon(tmp_path_factory):
    """One daemon scraping one fake SGLang per era, shared by the era tests: each reads only the series of its
    own target (the URL is the target label), so they stay independent while paying for one daemon start."""
    tmp = tmp_path_factory.mktemp("eras")
    fakes = {}
    try:
        for era in ERAS:
            body = open(os.path.join(HERE, "data", "scrape", era), "rb").read()
            fakes[era] = FakeSGLang(metrics_body=body, info_body=json.dumps(INFO).encode()).start()
        log = tmp / "server.log"
        log.write_text("")
        urls = [arg for fake in fakes.values() for arg in ("--sglang-url", fake.url)]
        d = Daemon([*urls, "--scrape-interval", "0.3s", str(log)], str(tmp / "state")).start()
        try:
            yield d, fakes
        finally:
            d.stop()
    finally:
        for fake in fakes.values():
            fake.stop()


@pytest.mark.parametrize("era", ERAS)
def test_every_era_of_metrics_is_mirrored(era_daemon, era):
    d, fakes = era_daemon
    fake = fakes[era]
    import yaml

    expected = yaml.safe_load(open(os.path.join(HERE, "data", "scrape", era[:-5] + ".expected.yaml")))
    from sglang_oom_exporter.metrics.collector import TARGET_VALUES

    wait_until(lambda: _metric(d, "sglang_oom_target_up", target=fake.url) == 1.0, what="target up", timeout=15.0)
    # Mirrored values carry SGLang's engine_type when the era gives one, and no such label otherwise.
    labels = {"target": fake.url, **({"engine_type": expected["engine_type"]} if "engine_type" in expected else {})}
    values = {k: v for k, v in expected.items() if k != "engine_type"}
    assert "token_usage" in values
    for key, want in values.items():
        name, typ, _ = TARGET_VALUES[key]
        got = _metric(d, f"sglang_oom_target_{name}{'_total' if typ == 'counter' else ''}", **labels)
        assert got == pytest.approx(want), (key, got)


HEALTH = {"sglang_oom_target_up", "sglang_oom_target_scrape_duration_seconds",
          "sglang_oom_target_last_success_timestamp_seconds", "sglang_oom_target_scrape_errors_total",
          "sglang_oom_target_server_info_errors_total"}  # fmt: skip


def test_a_dead_servers_mirrored_series_leave_the_page_and_return_with_it(tmp_path):
    """A stand-in serving a real SGLang 0.5.23's recorded /metrics and /server_info dies (its port refuses): from the
    first failed scrape on, the daemon's /metrics keeps only the target's health (up 0, errors, the last success's
    time), none of the dead server's numbers. A server on the same port brings them back, equal to before."""
    data = os.path.join(HERE, "data", "scrape")
    body = open(os.path.join(data, "v0.5.23-live-prefill.prom"), "rb").read()
    info = open(os.path.join(data, "server_info_live_0_5_23_prefill.json"), "rb").read()
    fake = FakeSGLang(metrics_body=body, info_body=info).start()
    log = tmp_path / "server.log"
    log.write_text("")
    d = Daemon(["--sglang-url", fake.url, "--scrape-interval", "0.3s", "--scrape-timeout", "1s", str(log)],
               str(tmp_path / "state")).start()  # fmt: skip

    def target() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {k: v for k, v in d.metrics("sglang_oom_target_").items() if dict(k[1]).get("target") == fake.url}

    def mirrored() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {k: v for k, v in target().items() if k[0] not in HEALTH}

    try:
        # The server args come with the first good scrape's /server_info, the values with its /metrics.
        wait_until(lambda: _metric(d, "sglang_oom_target_server_arg", target=fake.url, arg="page_size") == 16,
                   what="the live server's values", timeout=15.0)  # fmt: skip
        alive = mirrored()
        unified = {"target": fake.url, "engine_type": "unified"}
        assert alive[("sglang_oom_target_max_total_tokens", tuple(sorted(unified.items())))] == 256.0
        assert alive[("sglang_oom_target_running_requests", tuple(sorted(unified.items())))] == 0.0
        assert len(alive) >= 10, alive
        succeeded = _metric(d, "sglang_oom_target_last_success_timestamp_seconds", target=fake.url)
        assert succeeded is not None
        assert abs(succeeded - time.time()) < 60

        fake.stop()  # the server dies: connections to its port are refused
        wait_until(lambda: _metric(d, "sglang_oom_target_up", target=fake.url) == 0.0, what="target down",
                   timeout=15.0)  # fmt: skip
        died = time.time()
        page = target()
        assert {k: v for k, v in page.items() if k[0] not in HEALTH} == {}
        assert {k[0] for k in page} == HEALTH
        assert page[("sglang_oom_target_scrape_errors_total", (("reason", "refused"), ("target", fake.url)))] >= 1
        last = page[("sglang_oom_target_last_success_timestamp_seconds", (("target", fake.url),))]
        assert succeeded <= last <= died

        back = FakeSGLang(metrics_body=body, info_body=info, port=fake.port).start()
        try:
            wait_until(lambda: mirrored() == alive, what="the values back with the server", timeout=15.0)
            assert _metric(d, "sglang_oom_target_up", target=fake.url) == 1.0
            assert _metric(d, "sglang_oom_target_last_success_timestamp_seconds", target=fake.url) > died
        finally:
            back.stop()
    finally:
        d.stop()
        fake.stop()
