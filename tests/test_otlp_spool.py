"""The OTLP receiver's parts in this process: a record's source and identity (sources/otlp.py), the spool's commit,
dedupe and crash recovery (sources/otlpspool.py), and the endpoint's overload answer (web/otlp.py)."""

from __future__ import annotations

import base64
import os

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from sglang_oom_exporter.sources import otlpspool
from sglang_oom_exporter.sources.otlp import JSON, body_text, lines, spool_path
from sglang_oom_exporter.sources.otlpspool import Line, Spool
from sglang_oom_exporter.web.otlp import OtlpServer
from tests.support.otlp import post
from tests.support.otlp import proto_request as _request

POD = {"k8s.namespace.name": "llm", "k8s.pod.name": "sglang-0", "k8s.pod.uid": "9f1c", "k8s.container.name": "srv",
       "k8s.container.restart_count": "2"}  # fmt: skip


def test_a_source_is_named_by_its_pod_else_its_kubelet_path_else_its_file_else_its_service():
    assert spool_path(POD) == "pods/llm_sglang-0_9f1c/srv/2.log"
    kubelet = {"log.file.path": "/var/log/pods/llm_sglang-1_77ab/server/3.log"}
    assert spool_path(kubelet) == "pods/llm_sglang-1_77ab/server/3.log"
    path = {"log.file.path": "/var/log/sglang/server.log"}
    assert spool_path(path) == "files/path=%2Fvar%2Flog%2Fsglang%2Fserver.log.log"
    assert spool_path({"service.name": "sglang"}) == "files/sglang.log"
    assert spool_path({"k8s.pod.name": "../../etc", "service.name": "a/../b_c"}) == "files/a%2F..%2Fb%5Fc.log"
    assert spool_path({}) == "files/unnamed=.log"


def test_a_structured_body_gives_its_log_key_and_a_repeated_line_keeps_both_copies():
    body = AnyValue()
    body.kvlist_value.values.extend([KeyValue(key="stream", value=AnyValue(string_value="stderr")),
                                     KeyValue(key="log", value=AnyValue(string_value="the line"))])  # fmt: skip
    assert body_text(body) == "the line"
    got = lines(_request(POD, ["same", "same", "other\n"]))
    assert [x.data for x in got["pods/llm_sglang-0_9f1c/srv/2.log"]] == [b"same\n", b"same\n", b"other\n"]
    identities = [x.identity for x in got["pods/llm_sglang-0_9f1c/srv/2.log"]]
    assert len(set(identities)) == 3
    assert identities == [
        x.identity for x in lines(_request(POD, ["same", "same", "other\n"]))["pods/llm_sglang-0_9f1c/srv/2.log"]
    ]


def test_the_spool_writes_a_retried_line_once_and_remembers_it_after_a_restart(tmp_path):
    spool = Spool(str(tmp_path))
    batch = {"files/a.log": [Line(b"one\n", b"1" * 16), Line(b"two\n", b"2" * 16)]}
    assert spool.append(batch) == (2, 0, [str(tmp_path / "files/a.log")])
    assert spool.append(batch) == (0, 2, [])
    again = Spool(str(tmp_path))
    again.recover()
    assert again.append({"files/a.log": [Line(b"two\n", b"2" * 16), Line(b"three\n", b"3" * 16)]}) == (1, 1, [])
    assert (tmp_path / "files/a.log").read_bytes() == b"one\ntwo\nthree\n"


def test_recovery_cuts_a_batch_that_was_written_but_never_committed(tmp_path):
    spool = Spool(str(tmp_path))
    spool.append({"files/a.log": [Line(b"one\n", b"1" * 16)]})
    with open(tmp_path / "files/a.log", "ab") as fh:  # a crash between the log's write and the commit mark
        fh.write(b"half a batch\n")
    with open(tmp_path / "files/a.log.ids", "ab") as fh:
        fh.write(b"32" * 16 + b"\n=99")  # an identity without its mark, and a torn mark
    again = Spool(str(tmp_path))
    again.recover()
    assert again.recovered_bytes == len(b"half a batch\n")
    assert (tmp_path / "files/a.log").read_bytes() == b"one\n"
    assert (tmp_path / "files/a.log.ids").read_bytes() == (b"31" * 16) + b"\n=4\n"
    assert again.append({"files/a.log": [Line(b"half a batch\n", b"2" * 16)]}) == (1, 0, [])


def test_the_identity_file_is_compacted_to_the_window(tmp_path, monkeypatch):
    monkeypatch.setattr(otlpspool, "DEDUPE_WINDOW", 4)
    spool = Spool(str(tmp_path))
    for i in range(20):
        spool.append({"files/a.log": [Line(b"%d\n" % i, i.to_bytes(16, "big"))]})
    rows = (tmp_path / "files/a.log.ids").read_bytes().splitlines()
    assert len([r for r in rows if not r.startswith(b"=")]) <= 4 * 4
    assert rows[-1] == b"=%d" % os.path.getsize(tmp_path / "files/a.log")
    again = Spool(str(tmp_path))
    again.recover()
    assert again.append({"files/a.log": [Line(b"19\n", (19).to_bytes(16, "big"))]}) == (0, 1, [])


class _Refuses:
    def accept(self, batch):  # pragma: no cover - never reached: the slots are full
        raise AssertionError("accepted while overloaded")


def test_a_request_past_the_in_flight_limit_gets_429_and_retry_after():
    server = OtlpServer(("127.0.0.1", 0), _Refuses(), max_in_flight=0)  # every slot taken
    server.start()
    try:
        status, headers, body = post(f"http://127.0.0.1:{server.port}", b"{}", {"Content-Type": JSON})
        assert (status, headers["Retry-After"]) == (429, "1")
        assert b"requests in flight" in body
        assert server.stats.failures == {"overloaded": 1}
    finally:
        server.stop()


# --------------------------------------------------------------------------------------- a bounded spool on disk


def _disk(root) -> int:
    """Every byte under the spool root, as the filesystem counts a file's size."""
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(root) for n in names)


def _saved_at(spool: Spool, rel: str, offset: int | None = None) -> dict:
    """A state save's `files` entry naming the live log of rel at offset (its end by default), as a reader
    that has read it so far writes it."""
    st = os.stat(spool.path(rel))
    end = st.st_size if offset is None else offset
    return {spool.path(rel): {"position": {"dev": st.st_dev, "ino": st.st_ino, "offset": end}}}


def _batch(rel: str, n: int, first: int) -> dict[str, list[Line]]:
    return {rel: [Line(b"line %06d of the run, padded to look like a log line ...........\n" % i,
                       i.to_bytes(16, "big")) for i in range(first, first + n)]}  # fmt: skip


def test_a_long_run_keeps_the_spool_under_its_cap_to_the_byte_and_drops_only_what_was_read(tmp_path):
    cap = 64 * 1024
    spool = Spool(str(tmp_path), otlpspool.Limits(source_bytes=cap, total_bytes=2 * cap))
    rel = "pods/llm_sglang-0_u1/srv/0.log"
    sent = 0
    for _ in range(200):  # 200 batches of 20 lines: about twelve times the cap, read as fast as written
        spool.append(_batch(rel, 20, sent))
        sent += 20
        spool.consumed(_saved_at(spool, rel))
        assert _disk(tmp_path) == spool.disk_bytes() <= cap
    assert spool.rotations >= 10
    assert spool.dropped_segments == spool.rotations
    assert spool.full == 0

    # The reader stops (no durable save names the live log any more): the spool fills to the cap and then
    # refuses, keeping every line it took since the last save.
    unread = b""
    refused = None
    for _ in range(100):
        batch = _batch(rel, 20, sent)
        try:
            spool.append(batch)
        except otlpspool.SpoolFullError as exc:
            refused = str(exc)
            break
        unread += b"".join(line.data for line in batch[rel])
        sent += 20
        assert _disk(tmp_path) == spool.disk_bytes() <= cap
    assert refused is not None
    assert "per source" in refused
    assert spool.full == 1
    segments = sorted(p for p in os.listdir(os.path.dirname(spool.path(rel))) if p.startswith("0.log.2"))
    held = b"".join((tmp_path / "pods/llm_sglang-0_u1/srv" / s).read_bytes() for s in segments)
    assert (held + (tmp_path / rel).read_bytes()).endswith(unread)
    # The reader catches up: room again.
    spool.consumed(_saved_at(spool, rel))
    spool.append(_batch(rel, 20, sent))
    assert _disk(tmp_path) == spool.disk_bytes() <= cap


def test_the_total_cap_refuses_a_new_source_and_nothing_is_written(tmp_path):
    spool = Spool(str(tmp_path), otlpspool.Limits(source_bytes=64 * 1024, total_bytes=8 * 1024))
    spool.append(_batch("files/a.log", 60, 0))
    before = _disk(tmp_path)
    with pytest.raises(otlpspool.SpoolFullError, match=r"its cap of 8192 \(--otlp-spool-total-mib\)"):
        spool.append({**_batch("files/b.log", 60, 100), **_batch("files/a.log", 1, 60)})
    assert _disk(tmp_path) == before
    assert not (tmp_path / "files/b.log").exists()


def test_a_restart_after_a_rotation_cut_short_resumes_the_new_log(tmp_path):
    spool = Spool(str(tmp_path), otlpspool.Limits(source_bytes=4096))
    rel = "files/a.log"
    spool.append(_batch(rel, 20, 0))  # past the segment size (1024)
    spool.consumed(_saved_at(spool, rel))
    # A crash after the rename and before the "=0" mark: the log is gone, its .ids says its old size.
    os.rename(tmp_path / rel, tmp_path / "files/a.log.20261205-160000")
    again = Spool(str(tmp_path), otlpspool.Limits(source_bytes=4096))
    again.recover()
    assert again.recovered_bytes == 0
    assert again.append(_batch(rel, 2, 19)) == (1, 1, [str(tmp_path / rel)])
    assert (tmp_path / rel).read_bytes() == _batch(rel, 1, 20)[rel][0].data
    assert (
        (tmp_path / "files/a.log.ids")
        .read_bytes()
        .endswith(
            b"\n=0\n" + (20).to_bytes(16, "big").hex().encode() + b"\n=%d\n" % len(_batch(rel, 1, 20)[rel][0].data)
        )
    )


def test_a_source_idle_for_the_retention_and_read_to_its_end_is_removed(tmp_path):
    now = [1000.0]
    spool = Spool(str(tmp_path), otlpspool.Limits(retention=600), wall=lambda: now[0])
    gone, live = "pods/llm_gone-0_u1/srv/0.log", "pods/llm_live-0_u2/srv/0.log"
    spool.append({**_batch(gone, 3, 0), **_batch(live, 3, 10)})
    now[0] += 599
    spool.append(_batch(live, 1, 13))
    spool.consumed({**_saved_at(spool, gone), **_saved_at(spool, live)})
    assert (tmp_path / gone).exists()  # not idle for the retention yet
    now[0] += 1
    spool.consumed({**_saved_at(spool, gone, offset=10), **_saved_at(spool, live)})
    assert (tmp_path / gone).exists()  # idle, but not read to its end
    spool.consumed({**_saved_at(spool, gone), **_saved_at(spool, live)})
    assert not (tmp_path / "pods/llm_gone-0_u1").exists()
    assert (tmp_path / live).exists()
    assert spool.removed_sources == 1
    assert spool.disk_bytes() == _disk(tmp_path)


class _Keeps:
    def __init__(self) -> None:
        self.batches: list = []

    def accept(self, batch):
        self.batches.append(batch)


def test_the_web_configs_tls_and_basic_auth_guard_the_otlp_port_for_the_sdk_exporter(tmp_path, monkeypatch):
    bcrypt = pytest.importorskip("bcrypt", reason="basic auth needs the bcrypt package")
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter

    from sglang_oom_exporter.web.webconfig import load_web_config
    from tests.support.helpers import openssl_cert
    from tests.support.otlp import pod_resource, records

    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):  # requests takes these over the exporter's own CA file
        monkeypatch.delenv(name, raising=False)
    cert, key = openssl_cert(tmp_path)
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()
    path = tmp_path / "web-config.yml"
    path.write_text(
        f"tls_server_config: {{cert_file: {cert}, key_file: {key}}}\nbasic_auth_users: {{agent: {hashed}}}\n"
    )
    kept = _Keeps()
    server = OtlpServer(("127.0.0.1", 0), kept, web_config=load_web_config(str(path)))
    server.start()
    batch = records(pod_resource("llm", "sglang-0"), [b"one", b"two"])
    url = f"https://127.0.0.1:{server.port}/v1/logs"

    def send(password: str) -> str:
        token = base64.b64encode(f"agent:{password}".encode()).decode()
        sender = OTLPLogExporter(endpoint=url, certificate_file=str(cert), timeout=10,
                                 headers={"Authorization": f"Basic {token}"})  # fmt: skip
        try:
            return str(sender.export(batch).name)
        finally:
            sender.shutdown()

    try:
        assert send("wrong") == "FAILURE"
        assert send("s3cret") == "SUCCESS"
        assert [[x.data for x in b["pods/llm_sglang-0_u1/server/0.log"]] for b in kept.batches] == [
            [b"one\n", b"two\n"]
        ]
        # Plain HTTP on the TLS port gets no answer the shipper could take for a 200 (the TLS side closes the
        # connection; under load the client may still be writing its request then: a broken pipe).
        with pytest.raises(OSError, match=r"Connection reset|Remote end closed|EOF|timed out|Broken pipe"):
            post(f"http://127.0.0.1:{server.port}", b"{}", {"Content-Type": JSON})
        assert server.stats.failures == {"unauthorized": 1}
        assert server.stats.requests == {"401": 1, "200": 1}
    finally:
        server.stop()
