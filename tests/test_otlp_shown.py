"""What a person reads about the OTLP receiver, end to end: a real `serve --otlp-listen` fed by the OpenTelemetry
SDK's exporter names each received source as it is (the pod, the service or the file and its host) on /events, the
page and /metrics, never by the spool's internal file; and /healthz says it is receiving, where, and what came.
"""

from __future__ import annotations

import calendar
import json
import os
import re
import time
import urllib.request

import pytest
from opentelemetry.sdk.resources import Resource

from tests.support.daemon import Daemon
from tests.support.golden import load_expected
from tests.support.helpers import free_port, wait_until
from tests.support.otlp import export, log_lines, pod_resource, records

HERE = os.path.dirname(__file__)
CASE = os.path.join(HERE, "data", "logs", "cuda_oom_three_texts.log")  # three cuda_oom events, each at a known line
EVENTS = "sglang_oom_events_total"
pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def get(d: Daemon, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{d.port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def counted(d: Daemon) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: v for (name, labels), v in d.metrics(EVENTS).items() if name == EVENTS and v}


def send_three_sources(d: Daemon, url: str) -> int:
    """The case as records of a pod, of a service on a host and of a file on a host; the lines sent."""
    lines = log_lines(open(CASE, "rb").read())
    pod = pod_resource("llm", "sglang-0")
    service = Resource({"service.name": "sglang_decode", "host.name": "gpu-node-7"})
    path = Resource({"log.file.path": "/var/log/sglang/server.log", "host.name": "gpu-node-7"})
    for resource in (pod, service, path):
        assert export(url, records(resource, lines)) == "SUCCESS"
    total = 3 * load_expected(CASE)["counts"]["cuda_oom"]
    wait_until(lambda: sum(counted(d).values()) >= total, what="every source's events", timeout=60)
    return len(lines)


def receiver(daemon_factory) -> tuple[Daemon, int]:
    port = free_port()
    return daemon_factory("--otlp-listen", f"127.0.0.1:{port}"), port


def test_received_sources_are_named_as_a_person_knows_them_on_events_the_page_and_metrics(tmp_path, daemon_factory):
    d, port = receiver(daemon_factory)
    send_three_sources(d, f"http://127.0.0.1:{port}")
    expected = load_expected(CASE)
    per_source = expected["counts"]["cuda_oom"]

    # /metrics: the service and the file by their names and host, decoded (the spool file's stem is escaped).
    def series(container: str, ns: str = "", pod_name: str = "") -> tuple[tuple[str, str], ...]:
        return tuple(sorted({"namespace": ns, "pod": pod_name, "container": container, "kind": "cuda_oom"}.items()))

    assert counted(d) == {
        series("server", "llm", "sglang-0"): per_source,
        series("sglang_decode@gpu-node-7"): per_source,
        series("/var/log/sglang/server.log@gpu-node-7"): per_source,
    }

    # /events: each event's source is what it came from, at the line it was received as; its labels as /metrics.
    status, body = get(d, "/events")
    assert status == 200
    got = sorted((e["source"], tuple(sorted(e["labels"].items()))) for e in json.loads(body)["events"])
    want_lines = [e["line"] for e in expected["events"]]
    want = [(f"llm/sglang-0/server (received over OTLP, uid u1, run 0):{n}",
             (("container", "server"), ("namespace", "llm"), ("pod", "sglang-0"))) for n in want_lines]  # fmt: skip
    want += [(f"sglang_decode@gpu-node-7 (received over OTLP):{n}", (("source", "sglang_decode@gpu-node-7"),))
             for n in want_lines]  # fmt: skip
    want += [(f"/var/log/sglang/server.log@gpu-node-7 (received over OTLP):{n}",
              (("source", "/var/log/sglang/server.log@gpu-node-7"),)) for n in want_lines]  # fmt: skip
    assert got == sorted(want)

    # The page: the same names; the spool's files (its escaped names, the state directory) nowhere.
    status, page = get(d, "/")
    assert status == 200
    assert page.count("/var/log/sglang/server.log@gpu-node-7 (received over OTLP):") == per_source
    assert page.count("sglang_decode@gpu-node-7 (received over OTLP):") == per_source
    assert page.count("llm/sglang-0/server (received over OTLP, uid u1, run 0):") == per_source
    assert re.findall(r"otlp/(?:pods|files)|%2F|%5F|" + re.escape(d.state_dir), page) == []


def test_healthz_says_the_receiver_listens_and_what_it_received(tmp_path, daemon_factory):
    d, port = receiver(daemon_factory)
    # Before anything arrives: ready, receiving, on which port, and that nothing came yet.
    assert get(d, "/healthz") == (
        200,
        f"ok: receiving OTLP/HTTP logs on 127.0.0.1:{port}: nothing received yet (an agent must send to it: "
        "docs/otlp.md); following 0 log source(s)\n",
    )
    before = int(time.time())
    sent = send_three_sources(d, f"http://127.0.0.1:{port}")
    after = time.time()
    # Then: what came, from how many sources, and when the last batch was answered.
    status, text = get(d, "/healthz")
    at = re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", text)
    assert at is not None, text
    assert before <= calendar.timegm(time.strptime(at.group(), "%Y-%m-%d %H:%M:%S UTC")) <= after
    got_health = text.replace(at.group(), "<time>")
    assert (status, got_health) == (
        200,
        f"ok: receiving OTLP/HTTP logs on 127.0.0.1:{port}: {3 * sent} record(s) received from 3 source(s), "
        "the last batch at <time>; following 3 log source(s)\n",
    )
