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
