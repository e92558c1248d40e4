"""The OTLP receiver's edge: identities that never merge, every gzip member, bounded decoding, admission before the
body, and the metrics port's hardening (connection cap, slow heads evicted, head deadline) on the OTLP port.

Unit tests call OtlpServer.handle() and sources/otlp directly; the socket tests listen on 127.0.0.1 port 0 and
bound every wait by a deadline.
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence

import pytest
import yaml
from google.protobuf import json_format
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs

from sglang_oom_exporter.sources.otlp import JSON, MAX_RECORDS, PROTOBUF, decode, lines, spool_path
from sglang_oom_exporter.sources.otlpspool import Line
from sglang_oom_exporter.web.httpd import EVICT_AFTER
from sglang_oom_exporter.web.otlp import OtlpServer, in_flight_budget
from tests.support.helm import CHART
from tests.support.helpers import free_port, wait_until
from tests.support.logs import oom_block
from tests.support.otlp import attributes as _kv
from tests.support.otlp import post
from tests.support.otlp import proto_request as _request
from tests.support.server import slow_heads

POD = {"k8s.namespace.name": "llm", "k8s.pod.name": "sglang-0", "k8s.pod.uid": "9f1c", "k8s.container.name": "srv"}


class _Kept:
    """A receiver that keeps every batch it is handed."""

    def __init__(self) -> None:
        self.batches: list[Mapping[str, Sequence[Line]]] = []

    def accept(self, batch: Mapping[str, Sequence[Line]]) -> None:
        self.batches.append(batch)


def _handle(body: bytes, kind: str = PROTOBUF, encoding: str | None = None, **kw) -> tuple[int, bytes, _Kept]:
    kept = _Kept()
    server = OtlpServer(("127.0.0.1", 0), kept, **kw)
    status, answer, _ = server.handle(body, kind, encoding)
    return status, answer, kept


# ------------------------------------------------------------------------------------------------ identities


def test_names_that_sanitising_merged_each_get_a_spool_file_of_their_own():
    long_a, long_b = "x" * 199 + "a", "x" * 199 + "b"  # equal in their first 199 characters
    names = [
        {"service.name": "a_b"}, {"service.name": "a-b"}, {"service.name": "a\u2010b"},
        {"log.file.path": "/var/log/a_b.log"}, {"log.file.path": "/var/log/a/b.log"},
        {"service.name": "var-log-a-b.log"}, {"service.name": "/var/log/a_b.log"},
        {"log.file.path": "var/log/a_b.log"}, {"service.name": "unnamed"}, {},
        {"service.name": long_a}, {"service.name": long_b},
        {**POD, "k8s.namespace.name": "a_b"}, {**POD, "k8s.namespace.name": "a-b"},
        {**POD, "k8s.container.name": "a_b"}, {**POD, "k8s.container.name": "a-b"},
        {**POD, "k8s.pod.name": "p_q", "k8s.pod.uid": "u"}, {**POD, "k8s.pod.name": "p", "k8s.pod.uid": "q_u"},
        {**POD, "k8s.container.name": ".."}, {**POD, "k8s.container.name": "%2E%2E"},
    ]  # fmt: skip
    paths = [spool_path(n) for n in names]
    assert len(set(paths)) == len(names), paths
    assert all(".." not in p.split("/") for p in paths)
    # Kubernetes names need no escaping: a pod's spool path is the kubelet's, as before.
    assert spool_path({**POD, "k8s.container.restart_count": "2"}) == "pods/llm_sglang-0_9f1c/srv/2.log"
    assert spool_path({"service.name": "sglang"}) == "files/sglang.log"


def test_host_name_keeps_two_hosts_files_apart_and_not_a_pods():
    one = spool_path({"log.file.path": "/var/log/sglang/server.log", "host.name": "node-a"})
    two = spool_path({"log.file.path": "/var/log/sglang/server.log", "host.name": "node-b"})
    assert (one, two) == ("files/path=%2Fvar%2Flog%2Fsglang%2Fserver.log@node-a.log",
                          "files/path=%2Fvar%2Flog%2Fsglang%2Fserver.log@node-b.log")  # fmt: skip
    assert spool_path({"service.name": "sglang", "host.name": "node-a"}) == "files/sglang@node-a.log"
    assert spool_path({**POD, "host.name": "node-a"}) == "pods/llm_sglang-0_9f1c/srv/0.log"
    # The same line at the same time from two hosts: two sources, one line each.
    batch = ExportLogsServiceRequest()
    for host in ("node-a", "node-b"):
        batch.MergeFrom(_request({"log.file.path": "/var/log/sglang/server.log", "host.name": host}, ["OOM"]))
    got = lines(batch)
    assert sorted((p, len(v)) for p, v in got.items()) == [(one, 1), (two, 1)]


@pytest.mark.parametrize(
    ("attrs", "reason"),
    [
        ({**POD, "k8s.container.restart_count": "\u00b2"}, b"k8s.container.restart_count '\xc2\xb2' is not"),
        ({**POD, "k8s.container.restart_count": "9" * 5000}, b"k8s.container.restart_count '9999"),
        ({**POD, "k8s.container.restart_count": "-1"}, b"k8s.container.restart_count '-1' is not"),
        ({**POD, "k8s.pod.name": "p" * 253, "k8s.pod.uid": "u" * 36}, b"name a source of 294 bytes"),
        ({**POD, "k8s.container.name": "c" * 256}, b"k8s.container.name name a source of 256 bytes"),
        ({"service.name": "s" * 201}, b"service.name and host.name name a source of 201 bytes"),
        ({"service.name": "\u00e9" * 67}, b"name a source of 402 bytes"),
    ],
)
def test_a_bad_restart_count_or_a_name_too_long_for_a_file_gets_400_and_nothing_is_spooled(attrs, reason):
    status, answer, kept = _handle(_request(attrs, ["line"]).SerializeToString())
    assert (status, reason in answer, kept.batches) == (400, True, [])


def test_a_kubelet_path_with_a_non_ascii_restart_is_a_file_path_not_a_crash():
    path = "/var/log/pods/llm_p_u/c/\u00b2.log"
    assert spool_path({"log.file.path": path}) == "files/path=%2Fvar%2Flog%2Fpods%2Fllm%5Fp%5Fu%2Fc%2F%C2%B2.log.log"
    status, _, kept = _handle(_request({"log.file.path": "/var/log/pods/llm_p_u/c/" + "9" * 5000 + ".log"},
                                       ["x"]).SerializeToString())  # fmt: skip
    assert (status, kept.batches) == (400, [])


# ----------------------------------------------------------------------------------------------- gzip and JSON


def test_every_gzip_member_is_read_and_trailing_garbage_is_refused():
    a = _request(POD, ["first member"]).SerializeToString()
    b = _request(POD, ["second member"], t=6).SerializeToString()
    status, _, kept = _handle(gzip.compress(a) + gzip.compress(b), encoding="gzip")
    assert status == 200
    assert [x.data for x in kept.batches[0]["pods/llm_sglang-0_9f1c/srv/0.log"]] == [b"first member\n",
                                                                                  b"second member\n"]  # fmt: skip
    status, answer, kept = _handle(gzip.compress(a) + b"garbage", encoding="gzip")
    assert (status, kept.batches) == (400, [])
    assert b"malformed gzip body: 7 bytes after the last gzip member" in answer
    status, answer, _ = _handle(gzip.compress(a) + gzip.compress(b)[:-3], encoding="gzip")
    assert (status, b"malformed gzip body" in answer) == (400, True)
    # The inflation cap counts every member: two of 3,000 bytes pass a cap of 4,096 together.
    pad = gzip.compress(b" " * 3000)
    status, answer, _ = _handle(pad + pad, JSON, "gzip", max_request_bytes=4096)
    assert (status, b"inflates past 4096 bytes" in answer) == (413, True)


def test_json_nested_past_the_recursion_limit_gets_400():
    deep = b'{"resourceLogs": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    status, answer, kept = _handle(deep, JSON, max_request_bytes=1 << 20)
    assert (status, kept.batches) == (400, [])
    assert b"nested too deeply" in answer
    deep = json.dumps({"resourceLogs": [{"resource": {"attributes": []}}]}).encode()
    assert _handle(deep, JSON)[0] == 200


# --------------------------------------------------------------------------------------------- bounded decoding


def _tiny_records(n: int) -> bytes:
    """A request of one resource and n empty records (two bytes each on the wire)."""
    scope = b"\x12\x00" * n
    resource_logs = b"\x12" + _varint(len(scope)) + scope
    return b"\x0a" + _varint(len(resource_logs)) + resource_logs


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def test_a_request_of_more_records_than_the_cap_gets_413_before_they_are_made():
    status, answer, kept = _handle(_tiny_records(MAX_RECORDS + 1))
    assert (status, kept.batches) == (413, [])
    assert f"more than {MAX_RECORDS} log records".encode() in answer
    status, _, kept = _handle(_tiny_records(MAX_RECORDS))
    assert status == 200
    assert sum(len(v) for v in kept.batches[0].values()) == MAX_RECORDS


def test_the_walk_gives_what_a_whole_parse_gives_across_chunks():
    request = ExportLogsServiceRequest()
    for i in range(3):
        rl = _request({**POD, "k8s.pod.name": f"p{i}"}, [f"line {j} " + "x" * 200 for j in range(3000)], t=i)
        rl.resource_logs[0].scope_logs.append(ScopeLogs(log_records=[LogRecord(body=AnyValue(string_value="z"))]))
        request.MergeFrom(rl)
    body = request.SerializeToString()
    walked = lines(decode(body, PROTOBUF, None, len(body)))
    assert walked == lines(request)
    assert sorted((p, len(v)) for p, v in walked.items()) == [(f"pods/llm_p{i}_9f1c/srv/0.log", 3001)
                                                               for i in range(3)]  # fmt: skip


def test_a_malformed_record_inside_a_chunk_is_400():
    good = _request(POD, ["a"]).SerializeToString()
    broken = good[:-1] + b"\xff"  # the record's body string is cut: its last byte is no longer UTF-8 text
    assert _handle(broken)[0] == 400
    assert _handle(b"\x0b\x00")[0] == 400  # a group: OTLP never sends one


def test_a_resource_of_100000_attributes_is_read_once_not_per_record():
    rl = ResourceLogs()
    rl.resource.attributes.extend(_kv({f"k{i}": "v" for i in range(100_000)}))
    rl.resource.attributes.extend(_kv({"service.name": "sglang"}))
    records = [LogRecord(time_unix_nano=i, body=AnyValue(string_value="l")) for i in range(50_000)]
    for record in records:
        record.attributes.append(KeyValue(key="a", value=AnyValue(int_value=1)))
    rl.scope_logs.extend([ScopeLogs(log_records=records[:25_000]), ScopeLogs(log_records=records[25_000:])])
    body = ExportLogsServiceRequest(resource_logs=[rl]).SerializeToString()
    status, _, kept = _handle(body, max_request_bytes=len(body))
    assert status == 200
    assert {p: len(v) for p, v in kept.batches[0].items()} == {"files/sglang.log": 50_000}


def test_the_budget_holds_the_largest_request_whatever_the_size_cap():
    assert in_flight_budget(8 * 1024 * 1024) == 96 * 1024 * 1024
    big = 100_000 * 1024  # otlp_max_request_kib's highest value
    body = _request(POD, ["x" * 100]).SerializeToString()
    server = OtlpServer(("127.0.0.1", 0), _Kept(), max_request_bytes=big)
    assert server.budget.total == in_flight_budget(big) > 4 * big + MAX_RECORDS * 600
    held = server.admit(big, PROTOBUF)  # a body of the largest size is admitted, not refused with 413
    assert not isinstance(held, tuple)
    held.release()
    assert server.handle(body, PROTOBUF, None)[0] == 200


def test_a_request_the_memory_budget_cannot_hold_gets_413_and_one_it_cannot_hold_now_gets_429():
    body = _request(POD, ["x" * 1000] * 100).SerializeToString()
    status, answer, _ = _handle(body, max_in_flight_bytes=len(body) + 1000)
    assert (status, b"send smaller batches" in answer) == (413, True)
    server = OtlpServer(("127.0.0.1", 0), _Kept(), max_in_flight_bytes=1_000_000)
    held = server.admit(700_000, PROTOBUF)
    status, answer, _ = server.handle(body, PROTOBUF, None)
    assert (status, b"too many bytes of requests in flight" in answer) == (429, True)
    held.release()  # type: ignore[union-attr]
    assert server.handle(body, PROTOBUF, None)[0] == 200
    assert server.budget.used == 0
    assert server.stats.failures == {"overloaded": 1}


# --------------------------------------------------------------------------------------- the port, on sockets


class _Blocks(_Kept):
    """Holds every batch until released: a request in flight for as long as a test needs."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.go = threading.Event()

    def accept(self, batch: Mapping[str, Sequence[Line]]) -> None:
        self.entered.set()
        self.go.wait(30)
        super().accept(batch)


def _head(port: int, size: int, extra: bytes = b"") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"POST /v1/logs HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
              b"Content-Length: %d\r\n\r\n" % size + extra)  # fmt: skip
    return s


def _status(s: socket.socket) -> int:
    head = b""
    while b"\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            return -1
        head += chunk
    return int(head.split()[1])


def test_a_body_past_the_bytes_in_flight_is_refused_before_it_is_read():
    blocks = _Blocks()
    body = _request(POD, ["x" * 100]).SerializeToString()
    server = OtlpServer(("127.0.0.1", 0), blocks, max_in_flight_bytes=4 * 1024 * 1024)
    server.start()
    try:
        first = threading.Thread(target=post, args=(f"http://127.0.0.1:{server.port}", body,
                                                    {"Content-Type": PROTOBUF}), daemon=True)  # fmt: skip
        first.start()
        assert blocks.entered.wait(30)
        # 4 MiB announced, not one byte of it sent: answered at once, not after waiting for the body.
        s = _head(server.port, 4 * 1024 * 1024)
        try:
            assert _status(s) == 429
        finally:
            s.close()
        blocks.go.set()
        first.join(30)
        assert server.stats.requests == {"200": 1, "429": 1}
        assert server.stats.bytes == len(body)  # the refused body was never read for decoding
        assert server.budget.used == 0
    finally:
        blocks.go.set()
        server.stop()


def test_a_client_dripping_its_head_or_body_loses_its_connection_at_the_deadline():
    server = OtlpServer(("127.0.0.1", 0), _Kept(), request_timeout=1.0)
    server.start()
    try:
        head = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        body = _head(server.port, 1000, b"x")
        closed: dict[str, float] = {}
        start = time.monotonic()

        def drip() -> bool:  # a byte every 0.2 s, until the server closes the socket
            for name, s in (("head", head), ("body", body)):
                if name in closed:
                    continue
                try:
                    s.sendall(b"x")
                    s.settimeout(0.2)
                    if s.recv(4096) == b"":
                        closed[name] = time.monotonic() - start
                except TimeoutError:
                    pass
                except OSError:
                    closed[name] = time.monotonic() - start
            return len(closed) == 2

        wait_until(drip, what="both dripping connections closed", timeout=30, interval=0.0)
        assert server.budget.used == 0
    finally:
        head.close()
        body.close()
        server.stop()


def test_refused_bodies_sent_slowly_are_evicted_at_the_cap_for_an_honest_request():
    server = OtlpServer(("127.0.0.1", 0), _Kept(), max_connections=4, max_in_flight_bytes=1024 * 1024)
    server.start()
    slow = []
    try:
        for _ in range(4):  # 2 MiB announced, past the budget: refused, and the body only starts to come
            slow.append(_head(server.port, 2 * 1024 * 1024, b"x"))
        wait_until(lambda: server.stats.failures.get("too_large") == 4, what="four bodies refused", timeout=30)
        time.sleep(EVICT_AFTER)  # the refused connections must be older than the eviction age; nothing to poll for
        body = _request(POD, ["honest"]).SerializeToString()
        assert post(f"http://127.0.0.1:{server.port}", body, {"Content-Type": PROTOBUF})[0] == 200
        assert server.httpd is not None
        assert server.httpd.evicted >= 1
    finally:
        for s in slow:
            s.close()
        server.stop()


@pytest.mark.e2e
@pytest.mark.slow
def test_400_slow_connections_leave_metrics_healthz_and_honest_otlp_answering(tmp_path, daemon_factory):
    port = free_port()
    d = daemon_factory("--otlp-listen", f"127.0.0.1:{port}")
    socks = slow_heads(port, 400, b"POST /v1/logs HTTP/1.1\r\nHost: x\r\nX-Slow: ", timeout=10)
    try:
        url = f"http://127.0.0.1:{port}"
        lines_ = oom_block().splitlines()
        body = _request(POD, lines_).SerializeToString()
        got = wait_until(lambda: post(url, body, {"Content-Type": PROTOBUF})[0] == 200 or None,
                         what="an honest request answered 200", timeout=60)  # fmt: skip
        assert got
        assert d.healthy() is True
        wait_until(lambda: d.total("prefill") == 1, what="the OOM counted", timeout=60)
        threads = int(next(x.split()[1] for x in open(f"/proc/{d.proc.pid}/status") if x.startswith("Threads:")))
        assert threads <= 64 + 64 + 32, threads  # each port's connection cap, and the daemon's own threads
        m = d.metrics("sglang_oom_exporter_otlp_")
        assert m[("sglang_oom_exporter_otlp_connections_evicted_total", ())] >= 400 - 64  # queued behind the cap
        assert m[("sglang_oom_exporter_otlp_inflight_bytes", ())] == 0
        assert m[("sglang_oom_exporter_otlp_thread_start_failures_total", ())] == 0
    finally:
        for s in socks:
            s.close()


@pytest.mark.e2e
def test_the_same_oom_at_the_same_second_from_two_hosts_counts_twice(daemon_factory):
    port = free_port()
    d = daemon_factory("--otlp-listen", f"127.0.0.1:{port}")
    block = oom_block().splitlines()  # one text, one timestamp, the same record times: only the host differs
    for host in ("node-a", "node-b"):
        body = _request({"log.file.path": "/var/log/sglang/server.log", "host.name": host}, block).SerializeToString()
        assert post(f"http://127.0.0.1:{port}", body, {"Content-Type": PROTOBUF})[0] == 200
    wait_until(lambda: d.total("prefill") >= 2, what="both OOMs counted", timeout=60)
    counted = {dict(k[1])["container"]: v for k, v in d.metrics("sglang_oom_events_total").items() if v}
    assert counted == {"/var/log/sglang/server.log@node-a": 1.0, "/var/log/sglang/server.log@node-b": 1.0}


# ------------------------------------------------------------------------------------------- memory at the defaults


SHAPES = ("full", "gzip", "json", "tiny", "big")


def _worst_requests(tag: str) -> list[tuple[bytes, dict[str, str], int]]:
    """The largest legal requests at the defaults, as (body, headers, records): 65,536 records filling 8 MiB
    (protobuf, gzip and JSON), 65,536 empty records, and eight records of 1 MiB; all to one source (whose window
    of 65,536 identities they fill: docs/otlp.md)."""
    limit, n = 8 * 1024 * 1024, MAX_RECORDS
    out = []
    for k, shape in enumerate(SHAPES):
        resource = {"service.name": tag}
        count, size = (8, (1 << 20) - 64) if shape == "big" else (n, 0 if shape == "tiny" else limit // n - 60)
        request = _request(resource, [])
        records = request.resource_logs[0].scope_logs[0].log_records
        first = k * 1_000_000 + 1  # each request's records new to the source (none is a retried copy)
        records.extend(
            LogRecord(time_unix_nano=first + i, body=AnyValue(string_value="x" * size)) for i in range(count)
        )
        if shape == "json":
            body = json.dumps(json_format.MessageToDict(request)).encode()
            headers = {"Content-Type": JSON}
        else:
            body = request.SerializeToString()
            headers = {"Content-Type": PROTOBUF}
            if shape == "gzip":
                body = gzip.compress(body, 1)
                headers["Content-Encoding"] = "gzip"
        assert len(body) <= limit, (shape, len(body))
        out.append((body, headers, count))
    return out


def _chart_memory_limit() -> int:
    values = yaml.safe_load(open(os.path.join(CHART, "values.yaml"), encoding="utf-8"))
    text = values["receiver"]["memoryLimit"]
    assert text.endswith("Mi"), text
    return int(text[:-2]) * 1024 * 1024


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(900)  # a hang guard: 24 busy sources, then 40 of the largest requests, on 2 loaded cores
def test_the_worst_legal_requests_at_the_defaults_stay_under_the_charts_memory_limit(daemon_factory):
    port = free_port()
    d = daemon_factory("--otlp-listen", f"127.0.0.1:{port}")
    # First 24 busy sources, each window full (65,536 empty records): past the 16 windows memory holds, whatever
    # the number of sources (the windows took 10 MiB of RSS each, for every source, before their budget).
    tiny = SHAPES.index("tiny")
    for j in range(24):
        body, headers, _ = _worst_requests(f"busy{j}")[tiny]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        try:
            conn.request("POST", "/v1/logs", body, headers)
            response = conn.getresponse()
            response.read()
            assert response.status == 200, (j, response.status)
        finally:
            conn.close()
    held = d.metrics("sglang_oom_exporter_otlp_spool_dedupe_identities")
    assert held == {("sglang_oom_exporter_otlp_spool_dedupe_identities", ()): 16 * 65536}
    bodies = {i: _worst_requests(f"s{i}") for i in range(8)}  # MAX_IN_FLIGHT shippers at once
    codes: dict[int, list[int]] = {i: [] for i in bodies}

    def ship(i: int) -> None:  # as a shipper does: retry 429 until 200
        for body, headers, _ in bodies[i]:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)  # 8 requests share 2 cores
                try:
                    conn.request("POST", "/v1/logs", body, headers)
                    response = conn.getresponse()
                    response.read()
                    status = response.status
                finally:
                    conn.close()
                codes[i].append(status)
                if status != 429:
                    break
                time.sleep(0.3 + 0.1 * i)  # a shipper's backoff (Retry-After: 1), not a synchronisation

    threads = [threading.Thread(target=ship, args=(i,)) for i in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert [c[-1] for c in codes.values()] == [200] * 8
    assert all(set(c) <= {200, 429} for c in codes.values()), codes
    spooled = d.metrics("sglang_oom_exporter_otlp_log_records")[
        ("sglang_oom_exporter_otlp_log_records_total", (("result", "spooled"),))
    ]
    assert spooled == 24 * MAX_RECORDS + 8 * sum(count for _, _, count in bodies[0])
    peak = int(next(x.split()[1] for x in open(f"/proc/{d.proc.pid}/status") if x.startswith("VmHWM:"))) * 1024
    assert peak < _chart_memory_limit(), (peak, _chart_memory_limit())  # 298 MiB measured, under 384 MiB
