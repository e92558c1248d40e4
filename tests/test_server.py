"""The HTTP edge: EventStore, every route, basic auth, TLS, and the limits that protect the server's threads.

Servers listen on 127.0.0.1 port 0 and are stopped by the fixture, so the thread-leak guard sees them go.
"""

from __future__ import annotations

import base64
import html
import http.client
import json
import re
import shutil
import socket
import ssl
import subprocess
import threading

import pytest
from prometheus_client import Counter

from sglang_oom_exporter.config.values import parse_listen
from sglang_oom_exporter.detect.model import OomEvent, PoolState, Suggestion
from sglang_oom_exporter.events.sink import event_json
from sglang_oom_exporter.events.store import EventStore, Health
from sglang_oom_exporter.web.httpd import MAX_HEAD_BYTES
from sglang_oom_exporter.web.listen import resolve
from sglang_oom_exporter.web.otlp import OtlpServer
from sglang_oom_exporter.web.page import render_page
from sglang_oom_exporter.web.routes import MAX_LIMIT, ROUTE_PATHS
from sglang_oom_exporter.web.server import ExporterServer
from sglang_oom_exporter.web.webconfig import WebConfig
from tests.support.helpers import openssl_cert, wait_until
from tests.support.server import get

HOSTILE = "<script>document.title='pwned'</script>"
CHROMIUM = "/usr/bin/chromium"
# --no-sandbox: tests may run as root, where Chromium's sandbox refuses to start.
CHROMIUM_HEADLESS = (
    CHROMIUM,
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-dev-shm-usage",
)


def event(n=1, kind="prefill", **fields):
    """An OomEvent numbered n (its line number, message and time say which)."""
    values = {
        "kind": kind,
        "fatal": True,
        "source": "web",
        "location": f"/var/log/sglang/server.log:{n}",
        "time": f"2026-03-14T22:07:{n % 60:02d}",
        "ranks": ("TP0", "TP1"),
        "message": f"Prefill out of memory. Try to lower your batch size. #{n}",
        "excerpt": f"[2026-03-14 22:07:33 TP0] Prefill out of memory. #{n}",
        "numbers": {"requested_tokens": 5000 + n, "available_tokens": 3000},
    }
    values.update(fields)
    return OomEvent(**values)


# EventStore


def test_event_store_keeps_the_newest_first_and_drops_the_oldest():
    store = EventStore(capacity=3)
    for n in range(1, 6):
        store.add(event(n))
    assert [int(e.location.rsplit(":", 1)[1]) for e in store.recent()] == [5, 4, 3]
    assert [int(e.location.rsplit(":", 1)[1]) for e in store.recent(2)] == [5, 4]
    assert len(store) == 3


def test_event_store_copies_labels():
    store = EventStore()
    labels = {"namespace": "llm", "pod": "sglang-0"}
    store.add(event(), labels)
    labels["pod"] = "changed"
    assert dict(store.entries()[0].labels) == {"namespace": "llm", "pod": "sglang-0"}
    store.add(event(2))
    assert dict(store.entries()[0].labels) == {}


def test_event_store_takes_concurrent_adds():
    store = EventStore(capacity=50)
    threads = [threading.Thread(target=lambda: [store.add(event(n)) for n in range(500)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(store) == 50


def test_event_store_rejects_zero_capacity():
    with pytest.raises(ValueError, match="capacity"):
        EventStore(capacity=0)


# Routes


def test_metrics_exposes_the_registry(serve):
    status, headers, body = get(serve(), "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert 'sglang_oom_events_total{kind="prefill",source="web"} 3.0' in body.decode()


def test_metrics_honours_name_filters(serve, registry):
    Counter("other", "Another counter.", registry=registry).inc()
    status, _, body = get(serve(), "/metrics?name[]=other_total")
    assert status == 200
    assert "other_total 1.0" in body.decode()
    assert "sglang_oom_events_total" not in body.decode()


def test_metrics_speaks_openmetrics_when_asked(serve):
    accept = "application/openmetrics-text; version=1.0.0; charset=utf-8"
    status, headers, body = get(serve(), "/metrics", {"Accept": accept})
    assert status == 200
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.decode().endswith("# EOF\n")


def test_metrics_gzips_when_accepted(serve):
    import gzip

    status, headers, body = get(serve(), "/metrics", {"Accept-Encoding": "gzip"})
    assert status == 200
    assert headers["Content-Encoding"] == "gzip"
    assert b"sglang_oom_events_total" in gzip.decompress(body)


def test_a_failing_collector_is_a_500_and_the_server_goes_on(serve, registry, caplog):
    class Broken:
        def collect(self):
            raise OSError("snapshot unreadable")

    registry.register(Broken())
    server = serve()
    for _ in range(3):
        status, _, body = get(server, "/metrics")
        assert (status, body) == (500, b"internal error; see the exporter's log\n")
    assert get(server, "/healthz")[0] == 200
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1, "failures are logged at most once a minute"
    assert "snapshot unreadable" in errors[0].exc_text


def test_healthz_ok(serve):
    status, headers, body = get(serve(), "/healthz")
    assert (status, body) == (200, b"ok\n")
    assert headers["Content-Type"] == "text/plain; charset=utf-8"


def test_healthz_unhealthy_gives_the_reason(serve):
    server = serve(health=lambda: Health(False, "no source read for 120s: /var/log/sglang/*.log"))
    status, headers, body = get(server, "/healthz")
    assert (status, body) == (503, b"no source read for 120s: /var/log/sglang/*.log\n")
    assert headers["Content-Type"] == "text/plain; charset=utf-8"


def test_healthz_is_503_when_the_check_raises(serve):
    def broken():
        raise RuntimeError("state lock poisoned")

    status, _, body = get(serve(health=broken), "/healthz")
    assert (status, body) == (503, b"health check failed: state lock poisoned\n")


def test_events_are_newest_first_with_labels_and_remediation(serve, catalog):
    store = EventStore()
    for n in range(1, 4):
        store.add(event(n), {"pod": f"sglang-{n}"}, seen=1_780_000_000.0 + n)
    status, headers, body = get(serve(events=store), "/events?limit=2")
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    events = json.loads(body)["events"]
    expected = [
        {**event_json(event(n), catalog), "labels": {"pod": f"sglang-{n}"}, "seen": 1_780_000_000.0 + n,
         "restored": False}
        for n in (3, 2)
    ]  # fmt: skip
    assert expected == events
    assert events[0]["remediation"]["steps"][0]["flag"] == "--chunked-prefill-size"


def test_events_default_limit_and_cap(serve):
    store = EventStore(capacity=MAX_LIMIT + 50)
    for n in range(MAX_LIMIT + 50):
        store.add(event(n, kind="retract", fatal=False, numbers={"retracted_requests": 2}))
    server = serve(events=store)
    assert len(json.loads(get(server, "/events")[2])["events"]) == 100
    assert len(json.loads(get(server, "/events?limit=100000")[2])["events"]) == MAX_LIMIT
    assert len(json.loads(get(server, "/events?limit=" + "9" * 5000)[2])["events"]) == MAX_LIMIT
    assert json.loads(get(server, "/events?limit=0")[2]) == {"events": []}


@pytest.mark.parametrize("query", ["limit=-1", "limit=ten", "limit=1.5", "limit=%C2%B2"])
def test_events_bad_limit_is_400(serve, query):
    status, _, body = get(serve(), f"/events?{query}")
    assert (status, body) == (400, b"limit must be a whole number from 0 to 1000\n")


def test_page_shows_kind_numbers_and_remediation(serve, catalog):
    store = EventStore()
    store.add(event(7), {"namespace": "llm", "pod": "sglang-0"})
    pools = (PoolState("full", total=90000, available=12, evictable=0),)
    store.add(event(8, kind="decode", phase="decode", pools=pools, numbers={"retracted_requests": 4}))
    status, headers, body = get(serve(events=store), "/")
    page = body.decode()
    assert status == 200
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    prefill = catalog.kind("prefill")
    assert prefill.title in page
    assert catalog.kind("decode").title in page
    assert "requested_tokens: 5007" in page
    assert "available_tokens: 3000" in page
    assert "retracted_requests: 4" in page
    assert "pool full: total=90000 available=12 evictable=0" in page
    assert "/var/log/sglang/server.log:7" in page
    assert "pod=sglang-0" in page
    assert "TP0 TP1" in page
    assert prefill.summary in page
    row = next(r for r in page.split('<tr class="event"') if "server.log:7" in r)
    steps = [row.index(f"<code>{s.flag}</code>") for s in prefill.steps]
    assert steps == sorted(steps), "remediation steps keep their catalog order"
    assert page.index("server.log:8") < page.index("server.log:7"), "newest first"


def test_page_leaves_unknown_values_out_and_says_what_time_zone_it_shows(serve, catalog):
    store = EventStore()
    # What the logs give: a pool the message did not size, a number it did not give, a server arg left unset.
    pools = (PoolState("full", available=12), PoolState("swa"))
    store.add(
        event(
            7,
            pools=pools,
            numbers={"requested_tokens": 5007, "available_tokens": None},
            time=None,
            context={"kv": {"usage": None, "free": 4}, "server_args": {"max_running_requests": None}},
        )
    )
    store.add(event(8), seen=1_780_000_008.0)
    store.add(event(9, time="2026-03-14T22:07:09Z"))
    status, _, body = get(serve(events=store), "/")
    page = body.decode()
    assert status == 200
    assert "None" not in page
    assert "pool full: available=12<" in page
    assert "pool swa: no sizes given" in page
    assert "available_tokens" not in page.split('id="event-3"')[1]
    assert "<b>kv</b>: free=4" in page
    assert "server_args" not in page
    rows = page.split('<tr class="event"')[1:]
    assert [r.count("as logged, no zone") for r in rows] == [0, 1, 0]
    assert "2026-03-14T22:07:09Z" in rows[0]
    assert "the log line gave no time" in rows[2]
    assert "counted 2026-05-28 20:26:48 UTC" in rows[1]
    # What to change comes first: the suggestions and the kind's fix before the event's own text.
    prefill = catalog.kind("prefill")
    assert rows[1].index(prefill.summary) < rows[1].index(prefill.title) < rows[1].index("server.log:8")


def test_page_marks_restored_events(serve):
    store = EventStore()
    store.add(event(1), seen=1_780_000_001.0)
    fresh = EventStore()
    fresh.restore_state(store.export_state())
    fresh.add(event(2), seen=1_780_000_002.0)
    page = get(serve(events=fresh), "/")[2].decode()
    rows = page.split('<tr class="event"')[1:]
    assert ["restored from the state file" in r for r in rows] == [False, True]
    assert "(1 restored from the state file" in page


def test_page_escapes_log_text(serve):
    store = EventStore()
    store.add(event(message=HOSTILE, excerpt=HOSTILE, location=f"{HOSTILE}:1"), {"pod": HOSTILE})
    status, headers, body = get(serve(events=store), "/")
    page = body.decode()
    assert status == 200
    assert "<script" not in page
    assert "&lt;script&gt;document.title=&#x27;pwned&#x27;&lt;/script&gt;" in page
    assert "default-src 'none'" in headers["Content-Security-Policy"]


def test_page_without_events(serve):
    status, _, body = get(serve(health=lambda: Health(False, "no log files match")), "/")
    assert status == 200
    assert b"No OOM events recorded." in body
    assert b"unhealthy: no log files match" in body


def test_render_page_is_a_pure_function(catalog):
    store = EventStore()
    store.add(event(3))
    page = render_page(store.entries(), catalog, Health(True, ""), store.capacity)
    assert page.count('<tr class="event"') == 1


def test_unknown_path_is_404(serve):
    status, headers, _ = get(serve(), "/metrics/extra")
    assert status == 404
    assert headers["Content-Type"] == "text/plain; charset=utf-8"


def test_head_has_headers_but_no_body(serve):
    status, headers, body = get(serve(), "/healthz", method="HEAD")
    assert (status, body) == (200, b"")
    assert headers["Content-Length"] == "3"


def test_other_methods_are_not_served(serve):
    status, headers, _ = get(serve(), "/metrics", method="POST")
    assert (status, headers["Allow"]) == (405, "GET, HEAD")


# Limits that keep slow or hostile clients from pinning threads


def test_a_silent_client_is_disconnected_after_the_timeout(serve):
    server = serve(request_timeout=0.3)
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as client:
        client.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # the head never ends
        assert client.recv(1024) == b""  # closed by the server (the client would wait 5 s, then raise)


def test_a_dripping_client_is_disconnected_at_the_deadline(serve):
    server = serve(request_timeout=0.5)
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as client:
        client.sendall(b"GET /metrics HTTP/1.1\r\n")
        client.settimeout(0.1)
        dripped = 0

        def closed() -> bool:
            nonlocal dripped
            try:
                return client.recv(1024) == b""
            except TimeoutError:
                client.sendall(b"X")  # a byte per 100 ms: each read succeeds, the head never completes
                dripped += 1
                return False
            except ConnectionError:
                return True

        wait_until(closed, timeout=8.0, what="the server to close the dripping connection", interval=0)
        assert dripped >= 2  # reads kept succeeding: the request's own deadline closed it, not a read timeout


def test_an_oversized_head_gets_431(serve):
    server = serve()
    status, _, _ = get(server, "/metrics", {f"X-Filler-{i}": "y" * 1000 for i in range(MAX_HEAD_BYTES // 1000 + 2)})
    assert status == 431


def test_a_connection_past_the_cap_waits_at_most_the_request_timeout(serve):
    server = serve(max_connections=1, request_timeout=0.5)
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as holder:
        holder.sendall(b"GET / HTTP/1.0\r\n")  # holds the only slot until its head deadline
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as late:
            # The holder is younger than the eviction age and no slot frees within the request timeout.
            assert late.recv(1024) == b""
        assert holder.recv(64) == b""  # then the holder's own head deadline passes


def test_stop_closes_open_connections_and_is_idempotent(registry, catalog):
    server = ExporterServer(
        ("127.0.0.1", 0),
        registry=registry,
        catalog=catalog,
        events=EventStore(),
        health=lambda: Health(True, ""),
        request_timeout=30,
    )
    with pytest.raises(RuntimeError, match="not started"):
        _ = server.port
    server.start()
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as idle:
        idle.sendall(b"GET /")
        assert get(server, "/healthz")[0] == 200  # accepted after `idle`, so `idle` has its thread by now
        server.stop()
        assert idle.recv(1024) == b""  # closed by stop(), not by the 30 s request timeout (the recv waits 5 s)
    server.stop()


@pytest.mark.parametrize(
    ("text", "expected"),
    [("127.0.0.1:9780", ("127.0.0.1", 9780)), (":9780", ("", 9780)), ("[::1]:9780", ("::1", 9780))],
)
def test_parse_listen(text, expected):
    assert expected == parse_listen(text)


@pytest.mark.parametrize("text", ["9780", "host:", "host:http", "host:70000"])
def test_parse_listen_rejects(text):
    with pytest.raises(ValueError, match="is not HOST:PORT"):
        parse_listen(text)


@pytest.mark.parametrize(
    ("text", "family", "address"),
    [
        (":9780", socket.AF_INET, ("0.0.0.0", 9780)),  # noqa: S104 - what ":port" means: every IPv4 interface
        ("127.0.0.1:9780", socket.AF_INET, ("127.0.0.1", 9780)),
        ("localhost:9780", socket.AF_INET, ("127.0.0.1", 9780)),  # a host name, through getaddrinfo
        ("[::1]:9780", socket.AF_INET6, ("::1", 9780, 0, 0)),
        ("[::]:9780", socket.AF_INET6, ("::", 9780, 0, 0)),
    ],
)
def test_a_listen_address_resolves_through_getaddrinfo(text, family, address):
    assert resolve(*parse_listen(text)) == (family, address)


@pytest.mark.parametrize("text", ["[::1]:0", "localhost:0"])
def test_both_servers_listen_on_an_ipv6_literal_and_a_host_name(registry, catalog, text):
    """The HTTP edge and the OTLP receiver bind through one function (web/listen.py)."""
    edge = ExporterServer(parse_listen(text), registry=registry, catalog=catalog, events=EventStore(),
                          health=lambda: Health(True, ""))  # fmt: skip
    otlp = OtlpServer(parse_listen(text), _NoReceiver())
    edge.start()
    try:
        otlp.start()
        try:
            host = "::1" if text.startswith("[") else "127.0.0.1"
            for port, path, want in ((edge.port, "/healthz", 200), (otlp.port, "/v1/logs", 405)):
                conn = http.client.HTTPConnection(host, port, timeout=5)
                try:
                    conn.request("GET", path)
                    assert conn.getresponse().status == want
                finally:
                    conn.close()
        finally:
            otlp.stop()
    finally:
        edge.stop()


class _NoReceiver:
    def accept(self, batch):  # pragma: no cover - a GET never reaches the receiver
        raise AssertionError("a GET was accepted")


# Basic auth and TLS


def test_basic_auth(serve):
    bcrypt = pytest.importorskip("bcrypt", reason="basic auth needs the bcrypt package")
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$")
    server = serve(web_config=WebConfig(basic_auth_users={"prometheus": hashed}))

    def auth(user, password):
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}

    status, headers, _ = get(server, "/metrics")
    assert status == 401
    assert headers["WWW-Authenticate"] == 'Basic realm="sglang-oom-exporter"'
    assert get(server, "/metrics", auth("prometheus", "wrong"))[0] == 401
    assert get(server, "/metrics", auth("nobody", "s3cret"))[0] == 401
    assert get(server, "/metrics", auth("prometheus", "s3cret"))[0] == 200
    assert get(server, "/events", auth("prometheus", "s3cret"))[0] == 200


@pytest.mark.parametrize("path", [*sorted(ROUTE_PATHS), "/events?limit=1", "/no-such-route"])
def test_basic_auth_guards_every_route_not_only_metrics(serve, path):
    # Auth is checked before a route is looked up, so a route added later (/runbooks, say) inherits it:
    # the parametrisation comes from the served routes themselves.
    bcrypt = pytest.importorskip("bcrypt", reason="basic auth needs the bcrypt package")
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$")
    server = serve(web_config=WebConfig(basic_auth_users={"prometheus": hashed}))
    good = {"Authorization": "Basic " + base64.b64encode(b"prometheus:s3cret").decode()}
    for method in ("GET", "HEAD"):
        status, headers, body = get(server, path, method=method)
        assert (status, headers["WWW-Authenticate"]) == (401, 'Basic realm="sglang-oom-exporter"')
        assert body in (b"", b"unauthorized\n")
    assert get(server, path, good)[0] == (404 if path == "/no-such-route" else 200)


def test_start_fails_when_the_certificate_is_gone(registry, catalog, tmp_path):
    config = WebConfig(tls_cert_file=str(tmp_path / "gone.crt"), tls_key_file=str(tmp_path / "gone.key"))
    server = ExporterServer(
        ("127.0.0.1", 0),
        registry=registry,
        catalog=catalog,
        events=EventStore(),
        health=lambda: Health(True, ""),
        web_config=config,
    )
    with pytest.raises(FileNotFoundError):
        server.start()
    server.stop()


def test_tls_round_trip(serve, tmp_path):
    cert, key = openssl_cert(tmp_path)
    server = serve(web_config=WebConfig(tls_cert_file=str(cert), tls_key_file=str(key)))
    assert server.url.startswith("https://")
    client = ssl.create_default_context(cafile=str(cert))
    status, _, body = get(server, "/healthz", context=client)
    assert (status, body) == (200, b"ok\n")
    with pytest.raises(ssl.SSLError):
        get(server, "/healthz", context=ssl.create_default_context())  # not trusting the test cert
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as plain:
        plain.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")  # plain HTTP on the TLS port: refused, nothing served
        try:
            reply = plain.recv(1024)
        except ConnectionResetError:  # the server closed with the plain request unread
            reply = b""
        assert b"200" not in reply
    assert get(server, "/healthz", context=client)[0] == 200


def test_tls_requires_a_client_certificate_when_configured(serve, tmp_path):
    cert, key = openssl_cert(tmp_path)
    client_cert, client_key = openssl_cert(tmp_path, "client")
    config = WebConfig(
        tls_cert_file=str(cert),
        tls_key_file=str(key),
        tls_client_ca_file=str(client_cert),
        client_auth_type="RequireAndVerifyClientCert",
    )
    server = serve(web_config=config)
    anonymous = ssl.create_default_context(cafile=str(cert))
    with pytest.raises((ssl.SSLError, ConnectionError)):
        get(server, "/healthz", context=anonymous)
    identified = ssl.create_default_context(cafile=str(cert))
    identified.load_cert_chain(str(client_cert), str(client_key))
    assert get(server, "/healthz", context=identified)[0] == 200


# A real browser


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason=f"{CHROMIUM} is missing (Debian package chromium)")
def test_chromium_renders_the_event_table(serve, catalog, tmp_path):
    store = EventStore()
    store.add(event(1), {"pod": "sglang-0"})
    store.add(event(2, kind="decode", message=HOSTILE))
    server = serve(events=store)
    result = subprocess.run(
        [*CHROMIUM_HEADLESS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", f"{server.url}/"],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    dom = result.stdout
    assert result.returncode == 0, result.stderr[-2000:]
    assert dom.count('<tr class="event"') == 2
    assert catalog.kind("decode").title in dom
    assert "requested_tokens: 5001" in dom
    assert "<title>SGLang OOM events</title>" in dom, "the hostile message ran no script"
    assert "&lt;script&gt;" in dom


PHONE_WIDTH = 390  # px: an iPhone 12-15's portrait viewport


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason=f"{CHROMIUM} is missing (Debian package chromium)")
def test_the_events_page_fits_a_phone_screen(catalog, tmp_path):
    store = EventStore()
    pod = "llama-3-70b-instruct-decode-7c9f8b6d5-x2k4q"
    long_path = f"/var/log/pods/inference-production_{pod}_0b1c2d3e-4f5a-6b7c-8d9e-0f1a2b3c4d5e/sglang/0.log:12345"
    suggestion = Suggestion("--chunked-prefill-size", 16384, 4096, "the largest power of two that fits the 6100 tokens")
    store.add(event(1, location=long_path, ranks=("TP0", "TP1", "TP2", "TP3"), suggestions=(suggestion,)),
              {"namespace": "inference-production", "pod": pod, "container": "sglang"})  # fmt: skip
    store.add(event(2, kind="decode", message=HOSTILE))
    page = render_page(store.entries(), catalog, Health(True, ""), store.capacity)
    # The page in an iframe exactly a phone wide (headless Chromium keeps its window at least 500 px); the
    # frame's own width is the viewport its media queries see. The outer page writes what it measured.
    measure = (
        "<script>document.getElementById('phone').addEventListener('load',()=>{"
        "const root=document.getElementById('phone').contentDocument.documentElement;"
        "const out=document.createElement('p');out.id='measured';"
        "out.textContent=root.scrollWidth+' '+root.clientWidth+' '+root.querySelectorAll('tr.event').length;"
        "document.body.appendChild(out);});</script>"
    )
    wrapper = tmp_path / "phone.html"
    wrapper.write_text(
        f"<!DOCTYPE html><html><body style='margin:0'><iframe id='phone' style='width:{PHONE_WIDTH}px;"
        f'height:844px;border:0\' srcdoc="{html.escape(page, quote=True)}"></iframe>{measure}</body></html>'
    )
    argv = [*CHROMIUM_HEADLESS, "--disable-background-networking", f"--user-data-dir={tmp_path / 'profile'}"]
    result = subprocess.run([*argv, "--dump-dom", wrapper.as_uri()], capture_output=True, text=True, timeout=90,
                            check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    (measured,) = re.findall(r'<p id="measured">(\d+) (\d+) (\d+)</p>', result.stdout)
    scroll_width, client_width, events = map(int, measured)
    assert events == 2
    assert 0 < client_width <= PHONE_WIDTH
    assert scroll_width <= PHONE_WIDTH, f"the page is {scroll_width} px wide on a {PHONE_WIDTH} px screen"
    # And a picture of it at that width, to look at (tmp_path keeps it).
    shot = tmp_path / "phone.png"
    page_file = tmp_path / "page.html"
    page_file.write_text(page)
    result = subprocess.run([*argv, f"--window-size={PHONE_WIDTH},1600", f"--screenshot={shot}", page_file.as_uri()],
                            capture_output=True, text=True, timeout=90, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(png[16:20], "big") == PHONE_WIDTH
