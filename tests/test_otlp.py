"""The OTLP/HTTP logs receiver end to end: the real `serve` process receives records from the OpenTelemetry SDK's
own OTLP/HTTP log exporter (and hand-built OTLP JSON) on loopback, and counts exactly what the same log counts when
the kubelet writes it under /var/log/pods: every golden log both ways, a retry after a 503, a restart between
batches, a duplicated batch, pods interleaved in one request, and each failure answer.
"""

from __future__ import annotations

import glob
import gzip
import os
import signal
import threading
from pathlib import Path

import pytest

from tests.support.daemon import Daemon, caught_up
from tests.support.golden import load_expected
from tests.support.helpers import free_port, wait_until
from tests.support.logs import oom_block
from tests.support.otlp import export, exporter, json_request, log_lines, pod_resource, post, records

HERE = os.path.dirname(__file__)
CASES = sorted(glob.glob(os.path.join(HERE, "data", "logs", "*.log")))
# A generic 0.5.4+ prefill OOM whose phase comes from the traceback after it: split mid-record by a restart.
TRACEBACK_CASE = os.path.join(HERE, "data", "logs", "cuda_oom_three_texts.log")
EVENTS = "sglang_oom_events_total"
pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def receiver(daemon_factory, *args: str, state_dir: str | None = None) -> tuple[Daemon, str]:
    """A serve process receiving OTLP on a free loopback port, and that receiver's base URL."""
    port = free_port()
    d = daemon_factory("--otlp-listen", f"127.0.0.1:{port}", *args, state_dir=state_dir)
    return d, f"http://127.0.0.1:{port}"


def source_series(d: Daemon) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every per-source sample of the OOM families (not the exporter's own statistics)."""
    return {
        key: v for key, v in d.metrics("sglang_oom_").items()
        if not key[0].startswith("sglang_oom_exporter_") and "pod" in dict(key[1]) and "timestamp" not in key[0]
    }  # fmt: skip


def events(d: Daemon) -> dict[tuple[tuple[str, str], ...], float]:
    """sglang_oom_events_total's non-zero samples by their labels."""
    return {labels: v for (name, labels), v in d.metrics(EVENTS).items() if name == EVENTS and v}


def expected_total(path: str) -> int:
    return sum(load_expected(path)["counts"].values())


def quiet(d: Daemon) -> float | None:
    """The loop's last pass time when nothing waits (no pending event, no busy source); else None.

    Unread bytes are not asked: one golden ends in a line without its newline, which a followed file keeps unread
    (a shipper sends such a line as a whole record once it gives up waiting for the rest)."""
    m = d.metrics("sglang_oom_exporter_pending_events", "sglang_oom_exporter_busy_sources",
                  "sglang_oom_exporter_loop_timestamp_seconds")  # fmt: skip
    idle = m[("sglang_oom_exporter_pending_events", ())] == 0 and m[("sglang_oom_exporter_busy_sources", ())] == 0
    return m[("sglang_oom_exporter_loop_timestamp_seconds", ())] if idle else None


def settled(d: Daemon, total: float | None = None) -> None:
    """Wait until the daemon counted `total` events and is quiet for a whole pass; then check the total exactly."""
    if total is not None:
        wait_until(lambda: sum(events(d).values()) >= total, what=f"{total} events", timeout=60)
    first = wait_until(lambda: quiet(d), what="quiet", timeout=60)
    wait_until(lambda: (quiet(d) or 0) > first, what="a whole quiet pass", timeout=60)
    if total is not None:
        assert sum(events(d).values()) == total


def labels(ns: str, pod: str, kind: str, container: str = "server") -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"namespace": ns, "pod": pod, "container": container, "kind": kind}.items()))


def test_every_golden_log_sent_as_records_counts_what_the_pod_log_file_counts(tmp_path, daemon_factory):
    root = tmp_path / "pods"
    pods = {}
    for path in CASES:
        pod = os.path.basename(path)[:-4].replace("_", "-")
        pods[pod] = path
        d = root / f"golden_{pod}_u1" / "server"
        d.mkdir(parents=True)
        (d / "0.log").write_bytes(open(path, "rb").read())
    files = daemon_factory("--kubernetes-logs", str(root), "--from-beginning", state_dir=str(tmp_path / "s1"))
    received, url = receiver(daemon_factory, state_dir=str(tmp_path / "s2"))
    sender = exporter(url)
    try:
        for pod, path in pods.items():
            lines = log_lines(open(path, "rb").read())
            assert sender.export(records(pod_resource("golden", pod), lines)).name == "SUCCESS", pod
    finally:
        sender.shutdown()
    wait_until(lambda: caught_up(received), what="the receiver read its spool", timeout=60)
    settled(received)
    settled(files)
    total = sum(events(files).values())
    assert total >= 100  # the goldens hold well over a hundred events that SGLang's pods show
    assert source_series(received) == source_series(files)
    assert events(received) == events(files)


def test_a_batch_refused_with_503_is_retried_by_the_sdk_and_counted_once(tmp_path, daemon_factory):
    state = tmp_path / "state"
    d, url = receiver(daemon_factory, state_dir=str(state))
    blocker = state / "otlp" / "pods" / "llm_sglang-0_u1"
    blocker.parent.mkdir(parents=True)
    blocker.write_text("a file where the pod's spool directory goes: the spool cannot write")
    lines = log_lines(open(TRACEBACK_CASE, "rb").read())
    result: list[str] = []
    sending = threading.Thread(
        target=lambda: result.append(export(url, records(pod_resource("llm", "sglang-0"), lines)))
    )
    sending.start()
    try:
        wait_until(
            lambda: (
                d.metrics("sglang_oom_exporter_otlp").get(
                    ("sglang_oom_exporter_otlp_requests_total", (("code", "503"),)), 0
                )
                >= 1
            ),
            what="a 503",
            timeout=15,
        )
        blocker.unlink()
    finally:
        sending.join(30)
    assert result == ["SUCCESS"]
    settled(d, expected_total(TRACEBACK_CASE))
    m = d.metrics("sglang_oom_exporter_otlp")
    assert m[("sglang_oom_exporter_otlp_requests_total", (("code", "200"),))] == 1
    assert m[("sglang_oom_exporter_otlp_log_records_total", (("result", "spooled"),))] == len(lines)
    assert m[("sglang_oom_exporter_otlp_request_failures_total", (("reason", "unavailable"),))] >= 1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["term", "kill"])
def test_a_restart_between_two_batches_of_one_traceback_counts_it_once(tmp_path, daemon_factory, sig):
    state = str(tmp_path / "state")
    lines = log_lines(open(TRACEBACK_CASE, "rb").read())
    half = len(lines) // 2
    resource = pod_resource("llm", "sglang-0")
    d, url = receiver(daemon_factory, state_dir=state)
    assert export(url, records(resource, lines[:half])) == "SUCCESS"
    d.stop(sig)
    d2, url2 = receiver(daemon_factory, state_dir=state)
    assert export(url2, records(resource, lines[half:], first=half)) == "SUCCESS"
    settled(d2, expected_total(TRACEBACK_CASE))
    assert open(os.path.join(state, "otlp/pods/llm_sglang-0_u1/server/0.log"), "rb").read() == b"".join(
        line + b"\n" for line in lines
    )


def test_a_duplicated_batch_is_spooled_and_counted_once(tmp_path, daemon_factory):
    d, url = receiver(daemon_factory)
    assert d.healthy() is True  # ready before any record: a receiver behind a Service must get its first request
    lines = log_lines(open(TRACEBACK_CASE, "rb").read())
    batch = records(pod_resource("llm", "sglang-0"), lines)
    assert export(url, batch) == "SUCCESS"
    assert export(url, batch) == "SUCCESS"
    assert export(url, batch[:3]) == "SUCCESS"  # a retried part of it, too
    settled(d, expected_total(TRACEBACK_CASE))
    m = d.metrics("sglang_oom_exporter_otlp")
    assert m[("sglang_oom_exporter_otlp_log_records_total", (("result", "spooled"),))] == len(lines)
    assert m[("sglang_oom_exporter_otlp_log_records_total", (("result", "duplicate"),))] == len(lines) + 3


def test_pods_interleaved_record_by_record_in_one_request_each_count_their_own(tmp_path, daemon_factory):
    d, url = receiver(daemon_factory)
    a = log_lines(open(TRACEBACK_CASE, "rb").read())
    other = os.path.join(HERE, "data", "logs", "bare_runtime_error_r4.log")
    b = log_lines(open(other, "rb").read())
    ra, rb = records(pod_resource("llm", "pod-a"), a), records(pod_resource("llm", "pod-b", uid="u2"), b)
    mixed = [r for pair in zip(ra, rb, strict=False) for r in pair] + ra[len(rb) :] + rb[len(ra) :]
    assert export(url, mixed) == "SUCCESS"
    settled(d, expected_total(TRACEBACK_CASE) + expected_total(other))
    want = {labels("llm", "pod-a", k): float(n) for k, n in load_expected(TRACEBACK_CASE)["counts"].items() if n}
    want.update({labels("llm", "pod-b", k): float(n) for k, n in load_expected(other)["counts"].items() if n})
    assert events(d) == want


def test_a_hand_built_otlp_json_request_counts_like_protobuf(tmp_path, daemon_factory):
    d, url = receiver(daemon_factory)
    lines = [line.decode() for line in log_lines(open(TRACEBACK_CASE, "rb").read())]
    resource = {"k8s.namespace.name": "llm", "k8s.pod.name": "sglang-0", "k8s.pod.uid": "u1",
                "k8s.container.name": "server"}  # fmt: skip
    status, headers, body = post(url, json_request(resource, lines), {"Content-Type": "application/json"})
    assert (status, headers["Content-Type"], body) == (200, "application/json", b"{}")
    gz = gzip.compress(json_request(resource, lines))
    status, _, _ = post(url, gz, {"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert status == 200  # the same records again, gzipped: all duplicates
    settled(d, expected_total(TRACEBACK_CASE))
    want = {labels("llm", "sglang-0", k): float(n) for k, n in load_expected(TRACEBACK_CASE)["counts"].items() if n}
    assert events(d) == want


def test_each_bad_request_gets_its_status_a_reason_and_a_counter(tmp_path, daemon_factory):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    d, url = receiver(daemon_factory, "--otlp-max-request-kib", "4", "--otlp-bearer-token-file", str(token))
    auth = {"Authorization": "Bearer s3cret"}
    pb = {**auth, "Content-Type": "application/x-protobuf"}
    js = {**auth, "Content-Type": "application/json"}
    cases = [
        (b"\xff\xff\xff\xff", pb, 400, b"malformed protobuf"),
        (b'{"resourceLogs": [', js, 400, b"malformed JSON"),
        (b'{"resourceLogs": [{"scopeLogs": 7}]}', js, 400, b"malformed OTLP JSON"),
        (b"not gzip", {**js, "Content-Encoding": "gzip"}, 400, b"malformed gzip body"),
        (gzip.compress(b" " * 100_000), {**js, "Content-Encoding": "gzip"}, 413, b"inflates past 4096 bytes"),
        (b"x" * 5000, js, 413, b"this receiver takes 4096 at most"),
        (b"{}", {**auth, "Content-Type": "text/plain"}, 415, b"unsupported content type 'text/plain'"),
        (b"{}", {**js, "Content-Encoding": "br"}, 415, b"unsupported content encoding 'br'"),
        (b"{}", {"Content-Type": "application/json"}, 401, b"unauthorized"),
        (b"{}", {"Content-Type": "application/json", "Authorization": "Bearer wrong"}, 401, b"unauthorized"),
    ]
    for body, headers, status, reason in cases:
        got, _, answer = post(url, body, headers)
        assert (got, reason in answer) == (status, True), (status, reason, answer)
    assert post(url, b"{}", js, path="/v1/traces")[0] == 404
    assert post(url, b"", auth, method="GET")[0] == 405
    got, _, answer = post(url, b"{}", js)
    assert (got, answer) == (200, b"{}")
    m = d.metrics("sglang_oom_exporter_otlp_request")
    failures = {dict(k[1])["reason"]: v for k, v in m.items() if k[0].endswith("failures_total")}
    assert failures == {"malformed": 4, "too_large": 2, "unsupported": 2, "unauthorized": 2, "not_found": 1,
                        "method": 1, "overloaded": 0, "unavailable": 0, "spool_full": 0}  # fmt: skip
    codes = {dict(k[1])["code"]: v for k, v in m.items() if k[0] == "sglang_oom_exporter_otlp_requests_total"}
    assert codes == {"200": 1, "400": 4, "401": 2, "404": 1, "405": 1, "413": 2, "415": 2}
    assert sum(events(d).values()) == 0


def _spool_bytes(state: str) -> int:
    """Every byte under the spool, as the filesystem counts a file's size."""
    root = os.path.join(state, "otlp")
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(root) for n in names)


@pytest.mark.timeout(300)
def test_a_long_run_stays_under_the_spool_cap_and_a_restart_after_rotation_counts_each_oom_once(
    tmp_path, daemon_factory
):
    state = str(tmp_path / "state")
    caps = ("--otlp-spool-source-mib", "1", "--otlp-spool-total-mib", "2", "--otlp-max-request-kib", "512")
    batches = []
    for b in range(36):  # about 3.6 MiB in all: the 1 MiB cap of the pod's spool three and a half times over
        filler = (f"[2026-03-14 22:00:00 TP0] Decode batch. #running-req: 1, #token: {4000 + b}, token usage: 0.05, "
                  "gen throughput (token/s): 41.07, #queue-req: 0").encode()  # fmt: skip
        batches.append([filler] * 700 + oom_block().encode().split(b"\n")[:-1])
    resource = pod_resource("llm", "sglang-0")
    d, url = receiver(daemon_factory, *caps, state_dir=state)
    sent = 0
    log = os.path.join(state, "otlp/pods/llm_sglang-0_u1/server/0.log")
    for i, lines in enumerate(batches):
        if i == 24:
            # Read segments were dropped by now (no file of the pod's spool starts with the first batch): a restart
            # after compaction, the last batch retried to the new process as a shipper without its 2xx would.
            assert not any(Path(p).read_bytes().startswith(batches[0][0]) for p in glob.glob(log + "*"))
            d.stop(signal.SIGKILL)
            d, url = receiver(daemon_factory, *caps, state_dir=state)
            assert export(url, records(resource, batches[i - 1], first=sent - len(batches[i - 1]))) == "SUCCESS"
        assert export(url, records(resource, lines, first=sent)) == "SUCCESS", i
        sent += len(lines)
        assert _spool_bytes(state) <= 1024 * 1024
    settled(d, len(batches))
    assert events(d) == {labels("llm", "sglang-0", "prefill"): float(len(batches))}
    m = d.metrics("sglang_oom_exporter_otlp")
    assert m[("sglang_oom_exporter_otlp_log_records_total", (("result", "duplicate"),))] == len(batches[23])
    assert m[("sglang_oom_exporter_otlp_spool_bytes", ())] == _spool_bytes(state)


def test_records_of_a_source_the_filters_leave_out_are_counted_and_not_spooled(tmp_path, daemon_factory):
    state = tmp_path / "state"
    d, url = receiver(daemon_factory, state_dir=str(state))
    lines = log_lines(open(TRACEBACK_CASE, "rb").read())
    system = records(pod_resource("kube-system", "coredns-1"), [b"a kube-system line"] * 5)
    assert export(url, system + records(pod_resource("llm", "sglang-0"), lines)) == "SUCCESS"
    settled(d, expected_total(TRACEBACK_CASE))
    assert sorted(os.listdir(state / "otlp" / "pods")) == ["llm_sglang-0_u1"]
    m = d.metrics("sglang_oom_exporter_otlp_log_records")
    assert m[("sglang_oom_exporter_otlp_log_records_total", (("result", "filtered"),))] == 5
    assert m[("sglang_oom_exporter_otlp_log_records_total", (("result", "spooled"),))] == len(lines)
