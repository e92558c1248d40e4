"""The real daemon against a real SGLang 0.5.23 (tests/support/live_sglang.py): exact counts, kinds and numbers for
each scenario, and the mirrored sglang_oom_target_* gauges equal to the server's own /metrics while it is up.

`make live-sglang` runs these alone; `make all` (CI) runs them with the rest. The first run installs SGLang into a
cached virtualenv (4-7 minutes); each scenario then starts one server (20-90 s) and stops it. Where SGLang
cannot be installed they skip with the reason, except under CI=true, where they fail.
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import live_sglang
from tests.support.daemon import Daemon, settle
from tests.support.helpers import once_per_run, wait_until

# One scenario: install wait (another worker may be installing) + start under load + run + teardown.
pytestmark = [pytest.mark.live_sglang, pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2400)]

# SGLang's /metrics family -> the daemon's mirrored sglang_oom_target_* name (exporter/metrics/collector.py).
MIRRORED = {
    "token_usage": "token_usage", "num_used_tokens": "used_tokens", "max_total_num_tokens": "max_total_tokens",
    "kv_available_tokens": "kv_available_tokens", "kv_evictable_tokens": "kv_evictable_tokens",
    "kv_used_tokens": "kv_used_tokens", "num_running_reqs": "running_requests", "num_queue_reqs": "queued_requests",
    "new_token_ratio": "new_token_ratio", "num_retracted_reqs": "retracted_requests_last_step",
}  # fmt: skip
GENERIC = "Out of memory. Try to lower your batch size."


def _install() -> dict[str, str]:
    try:
        return {"python": str(live_sglang.install())}
    except live_sglang.UnavailableError as exc:
        return {"unavailable": str(exc)}


@pytest.fixture(scope="session")
def sglang_python() -> Path:
    """The live virtualenv's Python, installed once per run for every worker; skip (CI: fail) with the reason."""
    got = once_per_run(f"live_sglang_{live_sglang.pins_hash()}", _install)
    if "unavailable" in got:
        reason = f"SGLang {live_sglang.RELEASE} cannot be installed here: {got['unavailable']}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    return Path(got["python"])


@pytest.fixture
def live(sglang_python: Path, daemon_factory: Callable[..., Daemon], tmp_path: Path) -> Live:
    return Live(sglang_python, daemon_factory, tmp_path)


class Live:
    """A daemon following one SGLang log file and scraping that server's port, and the scenarios run into it."""

    def __init__(self, python: Path, daemon_factory: Callable[..., Daemon], tmp_path: Path) -> None:
        self.python = python
        self.log = tmp_path / "sglang.log"
        self.log.touch()
        self.port = live_sglang.free_port()
        self.daemon = daemon_factory(str(self.log), "--sglang-url", f"http://127.0.0.1:{self.port}",
                                     "--scrape-interval", "0.5s")  # fmt: skip
        self.mirrored: list[dict[str, float]] = []

    def run(self, name: str) -> live_sglang.Recording:
        # SGLang's exit can leave its last line unended (nanobind's reference-leak warning, "...refleaks.html"): the
        # daemon holds it until its end comes, and is caught up meanwhile (tests/test_reliability_files.py).
        return live_sglang.run(self.python, live_sglang.SCENARIOS[name], self.log, self.port, self.check_mirror)

    def check_mirror(self, server: live_sglang.Server) -> None:
        """While the server is up and idle: the daemon's mirrored gauges equal the server's /metrics, read back to
        back (SGLang moves its gauges only when it logs stats, so an idle server's page holds still)."""
        last: list[tuple[dict[str, float], dict[str, float]]] = []

        def equal() -> bool:
            real = {MIRRORED[k]: v for k, v in sglang_values(server.metrics()).items() if k in MIRRORED}
            ours = target_values(self.daemon)
            last[:] = [(real, ours)]
            return bool(ours.get("up") == 1 and set(real) == set(MIRRORED.values()) and
                        {k: ours.get(k) for k in real} == real)  # fmt: skip

        try:
            wait_until(equal, timeout=60.0, what="the mirrored gauges to equal the server's /metrics")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: real {last} != mirrored") from None
        self.mirrored.append(last[0][0])

    def check_mirror_gone(self) -> None:
        """After the server is gone (crashed or stopped): the daemon's /metrics has no mirrored gauge of it left, only
        sglang_oom_target_up 0, so no panel shows the dead server's numbers as live."""
        last: list[dict[str, float]] = []

        def gone() -> bool:
            last[:] = [target_values(self.daemon)]
            return last[0] == {"up": 0.0}

        try:
            wait_until(gone, timeout=30.0, what="the dead server's mirrored gauges gone")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: still {last}") from None

    def events(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.daemon.port}/events", timeout=5) as r:
            return list(json.loads(r.read())["events"])

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def sglang_values(page: bytes) -> dict[str, float]:
    """The single-sample `sglang:` gauges of a real /metrics page, by name without the prefix."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(page.decode()):
        if family.name.startswith("sglang:") and family.type == "gauge" and len(family.samples) == 1:
            out[family.name.removeprefix("sglang:")] = family.samples[0].value
    return out


def target_values(daemon: Daemon) -> dict[str, float]:
    """The daemon's sglang_oom_target_up and mirrored gauges (MIRRORED), by name without the prefix; one target, so
    one sample each."""
    wanted = {f"sglang_oom_target_{name}" for name in ("up", *MIRRORED.values())}
    samples = [(name, v) for (name, _), v in daemon.metrics("sglang_oom_target_").items() if name in wanted]
    out = {name.removeprefix("sglang_oom_target_"): v for name, v in samples}
    assert len(out) == len(samples), f"more than one sample per name: {samples}"
    return out


def all_counts(daemon: Daemon) -> dict[str, float]:
    return {dict(labels)["kind"]: v for (name, labels), v in daemon.metrics("sglang_oom_events_total").items()
            if name == "sglang_oom_events_total" and v}  # fmt: skip


def one_fatal(live: Live, kind: str, message: str) -> dict[str, Any]:
    """The daemon counted exactly one event, of this kind, fatal, with SGLang's own first line as its message."""
    settle(live.daemon, 1, kind)
    assert all_counts(live.daemon) == {kind: 1}
    (event,) = live.events()
    assert (event["kind"], event["fatal"], event["message"]) == (kind, True, message)
    return event


def concrete(event: dict[str, Any], page_size: int) -> list[tuple[str, float | None, float | None]]:
    """The advice is the server's own: its args from its log (the banner and capacity line; /server_info only fills
    in), the state from its last usage line, a value computed from them, never the value already in use, and a
    --context-length sized to the 256-token pool (capped by --max-total-tokens) against the served 4096."""
    ctx = event["context"]
    assert ctx["server_args_source"] == "log, then /server_info"
    assert "server_args_differ" not in ctx, ctx
    args = ctx["server_args"]
    assert (args["max_total_tokens"], args["max_total_num_tokens"], args["context_length"]) == (256, 256, 4096)
    assert (args["chunked_prefill_size"], args["max_running_requests"], args["page_size"]) == (4096, 8, page_size)
    assert ctx["kv_source"].startswith("log line at ")
    assert "; state from the log line at " in event["explanation"]["detail"]
    changes = [(s["flag"], s["current"], s["suggested"]) for s in event["suggestions"]]
    assert ("--context-length", 4096, 256) in changes
    assert all(new != now for _, now, new in changes if new is not None)
    assert "the running requests hold the pool" not in json.dumps([event["suggestions"], event["explanation"]])
    return changes


def test_generic_oom_at_page_size_1_then_a_restart_into_the_same_file(live):
    """Page size 1 raises the generic text; the traceback's prefill frames name the phase. The restarted server
    appends to the same file and fails the same way: a second event, not a lost or a doubled one."""
    rec = live.run("generic")
    assert rec.exit_codes != [0], rec
    assert all("error" in r for r in rec.results), rec
    event = one_fatal(live, "prefill", GENERIC)
    assert (event["phase"], event["inferred"]) == ("prefill", False)
    assert (event["requested_tokens"], event["available_tokens"]) == (120, 256)
    assert event["pools"] == [{"pool": "full", "total": None, "available": 256, "evictable": 0, "free": 256}]
    assert concrete(event, 1) == [("--chunked-prefill-size", 4096, None), ("--max-running-requests", 8, None),
                                  ("--context-length", 4096, 256)]  # fmt: skip
    assert "no shortfall at page size 1" in event["explanation"]["detail"]

    live.check_mirror_gone()  # the crashed server's gauges left /metrics; the restart's check_mirror brings them back
    rec = live.run("generic")
    assert rec.exit_codes != [0], rec
    settle(live.daemon, 2, "prefill")
    assert all_counts(live.daemon) == {"prefill": 2}
    assert [(e["requested_tokens"], e["available_tokens"]) for e in live.events()] == [(120, 256)] * 2
    for again in live.events():  # the restarted run's own banner and usage line
        concrete(again, 1)
    # Two runs in one file, each logging its text once with the prefix (and once more in its traceback).
    assert len(re.findall(r"^\[[\d :-]+\] Out of memory\. Try to lower your batch size\.$", live.log_text(), re.M)) == 2
    assert [m["max_total_tokens"] for m in live.mirrored] == [256, 256]


def test_prefill_oom_at_page_size_16(live):
    rec = live.run("prefill")
    event = one_fatal(live, "prefill", "Prefill out of memory. Try to lower your batch size.")
    assert (event["phase"], event["inferred"], event["requested_tokens"]) == ("prefill", False, 120)
    assert event["available_tokens"] == 256
    assert rec.exit_codes != [0], rec  # the OOM crashed the server
    live.check_mirror_gone()
    assert concrete(event, 16) == [("--chunked-prefill-size", 4096, None), ("--max-running-requests", 8, None),
                                   ("--context-length", 4096, 256)]  # fmt: skip
    assert "round each request up to a page" in event["explanation"]["detail"]  # page size 16: rounding applies


def test_decode_oom_at_page_size_16(live):
    live.run("decode")
    event = one_fatal(live, "decode", "Decode out of memory. Try to lower your batch size.")
    assert (event["phase"], event["inferred"]) == ("decode", False)
    # One more token for the one request; its 20 prompt and 9 decoded tokens hold two 16-token pages of 256.
    assert (event["requested_tokens"], event["available_tokens"]) == (1, 224)
    assert concrete(event, 16) == [("--max-running-requests", 8, None), ("--context-length", 4096, 256)]


def test_req_slots_oom(live):
    """Six concurrent requests; the injected fault refuses a batch of three or more request slots. How many were
    asked for and free depends on how the six arrived: the event's numbers are SGLang's own, read off its line."""
    live.run("req_slots")
    first = re.search(
        r"alloc_req_slots runs out of memory\..*available_size\(\)=(\d+), num_reqs=(\d+), ", live.log_text()
    )
    assert first is not None, live.log_text()[-3000:]
    event = one_fatal(live, "req_slots", first.group(0))
    assert int(first.group(2)) >= 3
    assert event["numbers"] == {"req_slots_available": int(first.group(1)), "req_slots_requested": int(first.group(2))}
    free, asked = int(first.group(1)), int(first.group(2))
    limit = 6 if free >= asked else max(1, 8 - (asked - free))  # no shortfall: 75% of 8; else 8 minus the missing
    assert concrete(event, 1) == [("--max-running-requests", 8, limit), ("--context-length", 4096, 256)]
    assert ("missing" in event["suggestions"][0]["rule"]) is (free < asked)


def test_real_retraction(live):
    """No injection: 8 requests outgrow the pool while decoding and SGLang retracts some. Each retraction line is one
    event, with its own count of retracted requests; nothing fatal."""
    rec = live.run("retract")
    assert rec.exit_codes == [0], rec
    retracted = [int(n) for n in live_sglang.RETRACT_LINE.findall(live.log_text())]
    assert retracted, "the scenario made SGLang retract nothing"
    settle(live.daemon, len(retracted), "retract")
    assert all_counts(live.daemon) == {"retract": len(retracted)}
    events = live.events()
    assert [e["fatal"] for e in events] == [False] * len(retracted)
    assert sorted(e["numbers"]["retracted_requests"] for e in events) == sorted(retracted)


def test_graceful_stop_under_load_counts_nothing(live):
    rec = live.run("graceful")
    assert rec.exit_codes == [0], rec
    text = live.log_text()
    assert live_sglang.DECODE_LINE.search(text), "stopped before any decode ran"
    settle(live.daemon, 0, "prefill")
    assert all_counts(live.daemon) == {}
    assert live.events() == []
