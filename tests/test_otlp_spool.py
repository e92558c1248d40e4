"""The OTLP receiver's parts in this process: a record's source and identity (sources/otlp.py), the spool's commit,
dedupe and crash recovery (sources/otlpspool.py), and the endpoint's overload answer (web/otlp.py)."""

from __future__ import annotations

import base64
import os
import threading

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from sglang_oom_exporter.sources import otlpspool
from sglang_oom_exporter.sources.otlp import JSON, body_text, lines, spool_path
from sglang_oom_exporter.sources.otlpspool import Line, Spool
from sglang_oom_exporter.web.otlp import OtlpServer
from tests.support.app import run_app, started_app
from tests.support.logs import BLOCK
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
    assert again.stats.recovered_bytes == len(b"half a batch\n")
    assert (tmp_path / "files/a.log").read_bytes() == b"one\n"
    assert (tmp_path / "files/a.log.ids").read_bytes() == (b"31" * 16) + b"\n=4 1\n"
    assert again.append({"files/a.log": [Line(b"half a batch\n", b"2" * 16)]}) == (1, 0, [])


def test_the_identity_file_is_compacted_to_the_window(tmp_path, monkeypatch):
    monkeypatch.setattr(otlpspool, "DEDUPE_WINDOW", 4)
    spool = Spool(str(tmp_path))
    for i in range(20):
        spool.append({"files/a.log": [Line(b"%d\n" % i, i.to_bytes(16, "big"))]})
    rows = (tmp_path / "files/a.log.ids").read_bytes().splitlines()
    assert len([r for r in rows if not r.startswith(b"=")]) <= 4 * 4
    assert rows[-1].split()[0] == b"=%d" % os.path.getsize(tmp_path / "files/a.log")
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
    assert spool.stats.rotations >= 10
    assert spool.stats.dropped_segments == spool.stats.rotations
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
    spool = Spool(str(tmp_path), otlpspool.Limits(source_bytes=64 * 1024, total_bytes=20 * 1024))
    spool.append(_batch("files/a.log", 60, 0))
    before = _disk(tmp_path)
    with pytest.raises(otlpspool.SpoolFullError, match=r"its cap of 20480 \(--otlp-spool-total-mib\)"):
        spool.append({**_batch("files/b.log", 60, 100), **_batch("files/a.log", 1, 60)})
    assert _disk(tmp_path) == before
    assert not (tmp_path / "files/b.log").exists()


def test_a_restart_after_a_rotation_cut_short_resumes_the_new_log(tmp_path):
    limits = otlpspool.Limits(source_bytes=64 * 1024)
    spool = Spool(str(tmp_path), limits)
    rel = "files/a.log"
    spool.append(_batch(rel, 250, 0))  # past the segment size (16 KiB)
    spool.consumed(_saved_at(spool, rel))
    # A crash after the rename and before the "=0" mark: the log is gone, its .ids says its old size.
    os.rename(tmp_path / rel, tmp_path / "files/a.log.20261205-160000")
    again = Spool(str(tmp_path), limits)
    again.recover()
    assert again.stats.recovered_bytes == 0
    assert again.append(_batch(rel, 2, 249)) == (1, 1, [str(tmp_path / rel)])
    assert (tmp_path / rel).read_bytes() == _batch(rel, 1, 250)[rel][0].data
    assert (
        (tmp_path / "files/a.log.ids")
        .read_bytes()
        .endswith(
            b"\n=0 0\n"
            + (250).to_bytes(16, "big").hex().encode()
            + b"\n=%d 1\n" % len(_batch(rel, 1, 250)[rel][0].data)
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
    assert spool.stats.removed_sources == 1
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


# --------------------------------------------------------------------------- caps that count what the disk holds


def _blocks(root) -> tuple[int, int]:
    """(bytes of blocks, inodes) of everything under the spool root, the root included, as the filesystem says."""
    blocks, inodes = os.stat(root).st_blocks * 512, 1
    for d, dirs, names in os.walk(root):
        for n in dirs + names:
            blocks += os.stat(os.path.join(d, n)).st_blocks * 512
            inodes += 1
    return blocks, inodes


def test_the_total_cap_counts_disk_blocks_so_many_small_sources_cannot_pass_it(tmp_path):
    # Each source takes at least a block for its log and one for its .ids file, however short its lines: bytes
    # would count 60 of them as 4 KiB while they take 480 KiB of the volume.
    cap = 64 * 1024
    spool = Spool(str(tmp_path), otlpspool.Limits(source_bytes=cap, total_bytes=cap))
    refused = 0
    for n in range(60):
        try:
            spool.append(_batch(f"pods/llm_p{n}_u{n}/srv/0.log", 1, n))
        except otlpspool.SpoolFullError:
            refused += 1
    assert refused >= 50
    assert spool.full == refused
    use = spool.use()
    assert (use.disk_bytes, use.inodes) == _blocks(tmp_path)
    assert use.disk_bytes <= cap
    assert use.sources == 60 - refused


def test_a_new_source_past_the_cap_on_sources_is_refused_whole_and_counted(tmp_path):
    now = [1000.0]
    spool = Spool(str(tmp_path), otlpspool.Limits(sources=3, retention=60), wall=lambda: now[0])
    spool.append({**_batch("files/a.log", 2, 0), **_batch("files/b.log", 2, 10), **_batch("files/c.log", 2, 20)})
    with pytest.raises(otlpspool.SpoolSourcesError, match=r"holds 3 sources; 1 new ones would pass its cap of 3"):
        spool.append({**_batch("files/a.log", 1, 2), **_batch("files/d.log", 1, 30)})
    assert not (tmp_path / "files/d.log").exists()
    assert (tmp_path / "files/a.log").read_bytes() == b"".join(
        x.data for x in _batch("files/a.log", 2, 0)["files/a.log"]
    )
    assert spool.stats.refused_sources == 1
    assert spool.append(_batch("files/a.log", 1, 2)) == (1, 0, [])  # a known source is never refused for it
    # A source idle for the retention and read to its end is removed: room for a new one.
    now[0] += 60
    spool.consumed(_saved_at(spool, "files/b.log"))
    assert spool.append(_batch("files/d.log", 1, 30)) == (1, 0, [str(tmp_path / "files/d.log")])
    assert spool.use().sources == 3


def test_lines_read_but_kept_never_refuse_a_batch_and_a_retry_of_them_is_still_a_duplicate(tmp_path):
    # Many sources, each read to its end below its rotation size: what they hold was read, so it takes no room
    # from unread lines. The logs read to their end are deleted when the disk needs the room.
    tmp_path.joinpath("state").mkdir()
    app, clock = started_app(tmp_path, otlp_listen="127.0.0.1:0", paths=(), otlp_spool_source_mib=1,
                             otlp_spool_total_mib=2)  # fmt: skip
    assert app.receiver is not None
    spool = app.receiver.spool
    filler = (
        b"[2026-03-14 22:00:00 TP0] Decode batch. #running-req: 1, #token: 4000, token usage: 0.05, #queue-req: 0\n"
    )
    batches = []
    for n in range(16):  # 16 sources of 200 KiB: the 2 MiB cap one and a half times over, each read at once
        rel = f"pods/llm_sglang-{n}_u{n}/server/0.log"
        data = [filler] * 1900 + BLOCK.format(s=n).encode().splitlines(keepends=True)
        batches.append({rel: [Line(d, (n * 10_000 + i).to_bytes(16, "big")) for i, d in enumerate(data)]})
        assert app.receiver.accept(batches[-1]).written == len(data)
        run_app(app, clock, 3.0)
        app.keeper.save()
        assert _blocks(spool.root)[0] <= 2 * 1024 * 1024
    assert app.counts.total("decode") == 16
    assert spool.full == 0
    assert spool.stats.reclaimed_logs >= 4
    # The shipper resends the first batch (a lost 2xx): its log is gone, its identities are not.
    assert app.receiver.accept(batches[0]).duplicates == len(batches[0]["pods/llm_sglang-0_u0/server/0.log"])
    assert app.receiver.accept({"pods/llm_sglang-0_u0/server/0.log": [Line(BLOCK.format(s=30).encode(), b"n" * 16)]})
    run_app(app, clock, 3.0)
    assert app.counts.total("decode") == 17


def test_a_log_read_in_part_is_rotated_for_room_and_its_segment_goes_at_the_next_save(tmp_path):
    cap = 160 * 1024
    spool = Spool(str(tmp_path), otlpspool.Limits(source_bytes=cap, total_bytes=cap))
    a, b = "files/a.log", "files/b.log"
    spool.append(_batch(a, 1500, 0))  # about 100 KiB in one batch
    spool.consumed(_saved_at(spool, a, offset=64 * 1024))  # read in part
    assert spool.stats.rotations == 0
    with pytest.raises(otlpspool.SpoolFullError, match=r"lines not read yet or not saved as read"):
        spool.append(_batch(b, 1000, 10_000))  # no room yet: a's read part waits in its segment for a save
    assert spool.stats.rotations == 1
    assert not (tmp_path / b).exists()
    (segment,) = [p for p in os.listdir(tmp_path / "files") if p.startswith("a.log.2")]
    spool.consumed(_saved_at(spool, a))  # the reader drained the segment and opened the new log
    assert not (tmp_path / "files" / segment).exists()
    assert spool.append(_batch(b, 1000, 10_000))[0] == 1000
    assert spool.use().disk_bytes == _blocks(tmp_path)[0] <= cap


def test_the_spools_recoveries_errors_and_refusals_are_exported_and_logged(tmp_path, caplog, monkeypatch):
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from sglang_oom_exporter.daemon.receiver import SpoolCollector

    Spool(str(tmp_path)).append(_batch("files/a.log", 2, 0))
    with open(tmp_path / "files/a.log", "ab") as fh:
        fh.write(b"never committed\n")
    spool = Spool(str(tmp_path), otlpspool.Limits(sources=1))
    spool.recover()
    with pytest.raises(otlpspool.SpoolSourcesError):
        spool.append(_batch("files/b.log", 1, 5))

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(otlpspool.SpoolError, match="cannot write"):
        spool.append(_batch("files/a.log", 1, 9))
    monkeypatch.undo()
    registry = CollectorRegistry()
    registry.register(SpoolCollector(spool))
    got = {s.name: s.value for f in text_string_to_metric_families(generate_latest(registry).decode())
           for s in f.samples if not s.labels or s.labels.get("cap") == "sources"}  # fmt: skip
    blocks, inodes = _blocks(tmp_path)
    p = "sglang_oom_exporter_otlp_spool"
    assert got == {f"{p}_sources": 1, f"{p}_disk_bytes": blocks, f"{p}_unread_bytes": len(b"".join(
        x.data for x in _batch("files/a.log", 2, 0)["files/a.log"])), f"{p}_inodes": inodes,
        f"{p}_recovered_bytes_total": len(b"never committed\n"), f"{p}_write_errors_total": 1,
        f"{p}_rotations_total": 0, f"{p}_dropped_segments_total": 0, f"{p}_reclaimed_logs_total": 0,
        f"{p}_removed_sources_total": 0, f"{p}_refusals_total": 1, f"{p}_dedupe_identities": 2,
        f"{p}_window_loads_total": 0}  # fmt: skip
    assert "16 bytes past the last commit cut" in caplog.text
    assert "cannot write" in caplog.text


def test_a_batch_of_new_sources_fsyncs_each_file_once_and_each_directory_once(tmp_path, monkeypatch):
    # 1,000 new services in one request were 4,000 fsyncs (a log, an .ids file and two directories each).
    spool = Spool(str(tmp_path / "otlp"))
    calls: list[int] = []
    fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), fsync(fd))[1])
    batch = {f"files/svc-{i}.log": [Line(b"a line\n", i.to_bytes(16, "big"))] for i in range(100)}
    written, _, new = spool.append(batch)
    assert (written, len(new)) == (100, 100)
    assert len(calls) == 2 * 100 + 2  # each log and .ids file, then files/ and the spool root once


def test_a_scrape_never_waits_for_a_batch_being_written(tmp_path, monkeypatch):
    # A request of 1,000 new sources holds the spool for its fsyncs; /metrics stopped answering meanwhile.
    spool = Spool(str(tmp_path))
    spool.append(_batch("files/a.log", 3, 0))
    before = _disk(tmp_path)
    inside, release = threading.Event(), threading.Event()
    fsync = os.fsync

    def slow(fd: int) -> None:
        inside.set()
        release.wait(60)
        fsync(fd)

    monkeypatch.setattr(os, "fsync", slow)
    writer = threading.Thread(target=spool.append, args=(_batch("files/a.log", 3, 3),))
    writer.start()
    try:
        assert inside.wait(30)
        got: list[otlpspool.SpoolUse] = []
        scraper = threading.Thread(target=lambda: got.append(spool.use()), daemon=True)
        scraper.start()
        scraper.join(30)  # a hang guard: the old spool waited here until the batch was on disk
        assert [(u.sources, u.file_bytes) for u in got] == [(1, before)]
    finally:
        release.set()
        writer.join(30)
    assert spool.use().file_bytes == _disk(tmp_path)
