"""File names that are not UTF-8 (Linux names are bytes): shown escaped, the same way, in labels, /events, the
log and the page, never a crash of the exposition (sources/fsname.py). The property tests draw arbitrary bytes;
the end-to-end test puts such a file beside a followed glob's files in front of the real daemon."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import urllib.parse
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from sglang_oom_exporter.config.model import KubernetesConfig
from sglang_oom_exporter.daemon.found import source_name
from sglang_oom_exporter.daemon.health import waiting
from sglang_oom_exporter.events.store import Health
from sglang_oom_exporter.metrics.exposition import Page, join_plain
from sglang_oom_exporter.sources.discover import KubernetesFilter, discover_pods, pod_log_ref
from sglang_oom_exporter.sources.fsname import ShownFormatter, received, shown
from sglang_oom_exporter.sources.otlp import OtlpError, spool_path
from sglang_oom_exporter.sources.otlpspool import FILE_DIR
from tests.support.app import run_app, started_app
from tests.support.daemon import settle
from tests.support.logs import oom_block

# A name's bytes: anything but "/" and NUL, as a directory entry can hold, up to NAME_MAX.
names = st.binary(min_size=1, max_size=255).filter(
    lambda b: b"/" not in b and b"\0" not in b and b not in (b".", b"..")
)


def unshown(text: str) -> bytes:
    """The bytes a shown name came from, for a name without a backslash of its own (the test's inverse)."""
    out = bytearray()
    for part in re.split(r"(\\x[89a-f][0-9a-f])", text):
        out += bytes([int(part[2:], 16)]) if re.fullmatch(r"\\x[89a-f][0-9a-f]", part) else part.encode()
    return bytes(out)


@settings(max_examples=300, deadline=None)
@given(names)
def test_shown_encodes_keeps_utf8_and_reverses(raw: bytes) -> None:
    name = os.fsdecode(raw)
    text = shown(name)
    text.encode("utf-8")  # never raises: a label, a JSON answer, an Event can carry it
    try:
        assert text == raw.decode("utf-8")  # a UTF-8 name is shown as it is
    except UnicodeDecodeError:
        assert "\\x" in text
    if b"\\" not in raw:
        assert unshown(text) == raw  # each byte that is not UTF-8 is the visible \xNN: the name is recoverable


@settings(max_examples=200, deadline=None)
@given(names)
def test_a_file_label_is_valid_exposition(raw: bytes) -> None:
    path = os.path.join("/var/log/sglang", os.fsdecode(raw))
    label = source_name({}, path, set())
    page = Page()
    page.family("sglang_oom_events", "counter", "OOMs.", ("kind", "source")).set(("prefill", label), 1.0)
    text = join_plain(page.parts(False)).decode("utf-8")
    [family] = text_string_to_metric_families(text)
    assert [(s.labels, s.value) for s in family.samples] == [({"kind": "prefill", "source": label}, 1.0)]
    assert label == shown(os.fsdecode(raw.removesuffix(b".log")))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=names)
def test_pod_directory_names_are_shown(tmp_path, raw: bytes) -> None:
    container = os.fsdecode(raw.replace(b"_", b"-"))
    pod_dir = os.fsencode(tmp_path) + b"/pods-" + str(abs(hash(raw))).encode()
    directory = os.path.join(os.fsdecode(pod_dir), "ns_pod_uid", container)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "0.log")
    open(path, "wb").close()
    [ref] = discover_pods(os.fsdecode(pod_dir), KubernetesFilter(container="(?s).+"))  # any name at all
    assert (ref.namespace, ref.pod, ref.container, ref.path) == ("ns", "pod", shown(container), path)
    assert pod_log_ref(os.fsdecode(pod_dir), path) == ref
    ref.container.encode("utf-8")


def test_the_log_and_healthz_show_the_same_escape(caplog) -> None:
    name = os.fsdecode(b"/logs/caf\xe9.log")
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "cannot read path=%s", (name,), None)
    assert ShownFormatter("%(message)s").format(record) == r"cannot read path=/logs/caf\xe9.log"
    assert waiting([name]).startswith(r"waiting for /logs/caf\xe9.log to appear")


@pytest.mark.e2e
@pytest.mark.slow
def test_daemon_follows_a_file_whose_name_is_not_utf8(tmp_path, daemon_factory) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "server.log").write_text("[2026-03-14 22:00:00 TP0] started\n")
    odd = os.path.join(os.fsencode(logs), b"caf\xe9.log")
    open(odd, "wb").close()  # there before the start: the crash was at once, and at every restart
    d = daemon_factory(str(logs / "*.log"), env={"SGLANG_OOM_EXPORTER_STATE_INTERVAL": "1s"})
    label = "caf\\xe9"
    assert d.count(source=label) == 0  # its series exist, zero, on a page that parses
    with open(odd, "ab") as handle:
        handle.write(oom_block().encode())
    settle(d, 1)
    assert d.count(source=label) == 1
    assert d.count(source="server") == 0
    page = d.metrics()  # the whole page parses (prometheus_client's parser), every family
    sources = {dict(labels).get("source") for (name, labels) in page if name == "sglang_oom_exporter_file_lag_bytes"}
    assert sources == {label, "server"}
    with urllib.request.urlopen(f"http://127.0.0.1:{d.port}/events", timeout=5) as r:
        [event] = json.loads(r.read())["events"]
    assert (event["source"], event["labels"]) == (f"{logs}/caf\\xe9.log:1", {"source": label})
    with urllib.request.urlopen(f"http://127.0.0.1:{d.port}/", timeout=5) as r:
        assert f"{logs}/caf\\xe9.log:1".encode() in r.read()
    d.send(signal.SIGTERM)
    assert d.proc is not None
    assert d.proc.wait(timeout=20) == 0
    log = d.stderr()
    assert f"location={logs}/caf\\xe9.log:1" in log
    assert "\\udce9" not in log
    state = json.loads((tmp_path / "state" / "state.json").read_text())
    assert os.fsdecode(odd) in state["data"]["files"]  # the real name: it opens the file again
    # A restart keeps the count, counts nothing twice, and counts the next OOM in that file once.
    d2 = daemon_factory(str(logs / "*.log"))
    assert d2.count(source=label) == 1
    with open(odd, "ab") as handle:
        handle.write(oom_block().encode())
    settle(d2, 2)
    assert d2.count(source=label) == 2


@pytest.mark.slow
def test_scan_shows_the_name_the_same_way(tmp_path) -> None:
    odd = os.path.join(os.fsencode(tmp_path), b"caf\xe9.log")
    with open(odd, "wb") as handle:
        handle.write(oom_block().encode())
    missing = os.path.join(os.fsencode(tmp_path), b"gone\xe9.log")

    def scan(path: bytes) -> subprocess.CompletedProcess[bytes]:
        argv = [sys.executable, "-m", "sglang_oom_exporter", "scan", "--format", "json", path]
        return subprocess.run(argv, capture_output=True, timeout=60, check=False)

    report = json.loads(scan(odd).stdout)
    shown_odd = f"{tmp_path}/caf\\xe9.log"
    assert [i["path"] for i in report["inputs"]] == [shown_odd]
    assert [e["source"] for e in report["events"]] == [f"{shown_odd}:1"]
    failed = scan(missing)
    assert (
        failed.stderr.decode()
        == f"sglang-oom-exporter: cannot read {tmp_path}/gone\\xe9.log: No such file or directory\n"
    )


def test_healthz_shows_a_kubernetes_log_root_that_is_not_utf8(tmp_path) -> None:
    root = os.fsdecode(os.fsencode(tmp_path) + b"/pods\xe9")  # configured, and missing
    app, clock = started_app(tmp_path, kubernetes=KubernetesConfig(logs_root=root))
    run_app(app, clock, 1.0)
    health = app.loop.health()
    assert health == Health(False, f"the Kubernetes log root {tmp_path}/pods\\xe9 does not exist")
    health.reason.encode("utf-8")


# --- a spooled source's name as a person reads it (received) ---------------------------------------------------

# Names, and names opening with what marks a kind or a host in a shown name (where a merge would hide).
_attr = st.one_of(
    st.text(max_size=16),
    st.tuples(st.sampled_from(["/", "path=", "unnamed=", "@", "%", "%2F"]), st.text(max_size=12)).map("".join),
)


def _identity(stem: str) -> tuple[str, str, str]:
    """(log.file.path, service.name, host.name) back from a shown received name: the test's inverse of received()."""
    name, _, host = received(stem).partition("@")
    if name.startswith("/"):
        path, service = name, ""
    elif name.startswith("path="):
        path, service = name[5:], ""
    else:
        path, service = "", "" if name == "unnamed=" else name
    back = [urllib.parse.unquote(part, errors="surrogateescape") for part in (path, service, host)]
    return back[0], back[1], back[2]


@settings(max_examples=400, deadline=None)
@given(_attr, _attr, _attr)
def test_a_received_name_reads_as_its_identity_and_gives_it_back(path: str, service: str, host: str) -> None:
    try:
        rel = spool_path({"log.file.path": path, "service.name": service, "host.name": host})
    except OtlpError:
        return  # too long for a file name once escaped: refused with 400, never spooled
    if not rel.startswith(FILE_DIR + "/"):
        return  # a kubelet pod log path: a pod source, named by its labels
    stem = rel[len(FILE_DIR) + 1 : -len(".log")]
    shown_name = received(stem)
    shown_name.encode("utf-8")  # a label, a JSON answer, the page
    # One reading per identity: the identity comes back from what is shown (so two never read the same).
    assert _identity(stem) == (path, "" if path else service, host)
    plain = re.fullmatch(r"[^%@/=\x00-\x1f\x7f]*", service) is not None
    if not path and service and plain and not host:
        assert shown_name == service  # an ordinary service name reads as itself


@pytest.mark.parametrize(
    ("attrs", "shown_name"),
    [
        ({"log.file.path": "/var/log/sglang/server.log", "host.name": "node-a"}, "/var/log/sglang/server.log@node-a"),
        ({"log.file.path": "/var/log/a_b.log"}, "/var/log/a_b.log"),
        ({"log.file.path": "/var/log/a/b.log"}, "/var/log/a/b.log"),
        ({"service.name": "var-log-a-b.log"}, "var-log-a-b.log"),
        ({"service.name": "a_b"}, "a_b"),
        ({"service.name": "a\u2010b"}, "a\u2010b"),
        ({"service.name": "/var/log/a_b.log"}, "%2Fvar%2Flog%2Fa_b.log"),  # a service never reads as a path
        ({"service.name": "path=x"}, "path%3Dx"),
        ({"log.file.path": "x"}, "path=x"),  # a relative path keeps its mark
        ({"service.name": "a@b", "host.name": "c"}, "a%40b@c"),
        ({"service.name": "a", "host.name": "b@c"}, "a@b@c"),
        ({"service.name": "100%"}, "100%25"),
        ({"service.name": "line\nbreak"}, "line%0Abreak"),
        ({"host.name": "h"}, "unnamed=@h"),
    ],
)
def test_received_names_read_as_written_and_never_merge(attrs: dict[str, str], shown_name: str) -> None:
    stem = spool_path(attrs)[len(FILE_DIR) + 1 : -len(".log")]
    assert received(stem) == shown_name
