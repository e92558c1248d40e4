"""Hostile HTTP clients: slowloris sockets, scrape bursts, odd methods, oversized heads, and what the page reveals.

Every server listens on 127.0.0.1 port 0; every loop is bounded by a deadline or a count.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import ssl
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from sglang_oom_exporter.web.httpd import EVICT_AFTER, LISTEN_BACKLOG, MAX_CONNECTIONS, MAX_HEAD_BYTES
from sglang_oom_exporter.web.webconfig import WebConfig
from tests.support.daemon import settle
from tests.support.helpers import openssl_cert, wait_until
from tests.support.logs import oom_block
from tests.support.server import get, slow_heads


def _active(server) -> int:
    return len(server._httpd._active)


@pytest.mark.slow
def test_scrapes_get_through_200_slowloris_sockets(serve):
    server = serve()  # the shipped limits: 64 connections, a 10 s head deadline
    socks = slow_heads(server.port, 200, b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    try:
        wait_until(lambda: _active(server) == MAX_CONNECTIONS, what="every slot held by a slow head", timeout=15.0)
        time.sleep(EVICT_AFTER)  # the slow heads must be older than the eviction age; nothing to poll for
        # Each scrape gets a slot by evicting a slow head: waiting for their 10 s head deadline instead would
        # outlast get()'s 5 s timeout and fail the scrape.
        statuses = [get(server, "/metrics")[0] for _ in range(40)]
        assert statuses == [200] * 40
        assert server._httpd.evicted >= 40
    finally:
        for s in socks:
            s.close()


@pytest.mark.slow
def test_a_burst_of_300_concurrent_scrapes_all_succeed(serve):
    server = serve()
    assert server._httpd.request_queue_size == LISTEN_BACKLOG
    barrier = threading.Barrier(300, timeout=30)

    def scrape(_i: int) -> int:
        barrier.wait()
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        try:
            conn.request("GET", "/metrics")
            response = conn.getresponse()
            response.read()
            return response.status
        except OSError as exc:
            return -1 if not isinstance(exc, TimeoutError) else -2
        finally:
            conn.close()

    with ThreadPoolExecutor(max_workers=300) as pool:
        statuses = list(pool.map(scrape, range(300)))
    assert statuses.count(200) == 300, {s: statuses.count(s) for s in set(statuses)}


def test_at_the_cap_a_young_head_is_not_evicted_and_the_new_connection_waits(serve):
    server = serve(max_connections=1, request_timeout=5)
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as holder:
        holder.sendall(b"GET /healthz HTTP/1.0\r\n")  # holds the only slot, younger than EVICT_AFTER
        wait_until(lambda: _active(server) == 1, what="the holder's thread", timeout=15.0)
        waiting = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        with waiting:
            waiting.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            holder.sendall(b"\r\n")  # the holder completes in time and is served
            assert holder.recv(64).startswith(b"HTTP/1.0 200")
            assert waiting.recv(64).startswith(b"HTTP/1.0 200")  # then the waiting one gets the slot
    assert server._httpd.evicted == 0


# Methods, paths and sizes


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT", "PROPFIND"])
@pytest.mark.parametrize("path", ["/", "/metrics", "/healthz", "/events", "/events?limit=1"])
def test_only_get_and_head_are_served_on_known_paths(serve, method, path):
    status, headers, body = get(serve(), path, method=method)
    assert (status, headers["Allow"], body) == (405, "GET, HEAD", b"method not allowed\n")


@pytest.mark.parametrize("method", ["GET", "HEAD", "POST", "DELETE"])
@pytest.mark.parametrize(
    "path", ["/metricsx", "/../../etc/passwd", "//etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "/state.json", "/env"]
)
def test_unknown_paths_are_404_whatever_the_method(serve, method, path):
    status, _, body = get(serve(), path, method=method)
    assert status == 404
    assert b"root:" not in body


def test_an_oversized_request_line_gets_431(serve):
    server = serve()
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as client:
        client.sendall(b"GET /" + b"a" * (MAX_HEAD_BYTES + 10) + b" HTTP/1.0\r\n\r\n")
        assert client.recv(64).startswith(b"HTTP/1.0 431")


def test_too_many_headers_get_431(serve):
    server = serve()
    head = b"GET /metrics HTTP/1.0\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(150)) + b"\r\n"
    assert len(head) < MAX_HEAD_BYTES
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as client:
        client.sendall(head)
        assert client.recv(64).startswith(b"HTTP/1.0 431")


def test_a_silent_tls_handshake_is_evicted_at_the_cap(serve, tmp_path):
    cert, key = openssl_cert(tmp_path)
    server = serve(web_config=WebConfig(tls_cert_file=str(cert), tls_key_file=str(key)), max_connections=2)
    client = ssl.create_default_context(cafile=str(cert))
    silent = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(2)]
    try:
        wait_until(lambda: _active(server) == 2, what="both slots held by silent handshakes", timeout=15.0)
        time.sleep(EVICT_AFTER)  # older than the eviction age; nothing to poll for
        assert get(server, "/healthz", context=client)[0] == 200
        assert server._httpd.evicted == 1
    finally:
        for s in silent:
            s.close()


# What the daemon reveals


@pytest.mark.e2e
@pytest.mark.slow
def test_events_page_and_metrics_reveal_only_the_configured_sources(tmp_path, daemon_factory, monkeypatch):
    canary = "canary-9f1c2e7d-do-not-leak"
    monkeypatch.setenv("SGLANG_SECRET_TOKEN", canary)  # the daemon inherits it
    logs, private = tmp_path / "logs", tmp_path / "private-dir"
    logs.mkdir()
    private.mkdir()
    (private / "other.log").write_text(oom_block())  # not configured: never read, never named
    followed = logs / "web.log"
    followed.write_text("")
    d = daemon_factory(str(followed))
    with open(followed, "a") as fh:
        fh.write(oom_block())
    settle(d, 1)
    port = d.port
    bodies = {}
    for path in ("/", "/events", "/metrics", "/healthz", "/events?limit=1000"):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", path)
        bodies[path] = conn.getresponse().read().decode()
        conn.close()
    everything = "\n".join(bodies.values())
    assert "web.log" in bodies["/events"]  # the event names its own (configured) file
    for secret in (canary, "private-dir", "other.log", str(tmp_path / "state"), sys.executable, os.getcwd()):
        assert secret not in everything, secret
    assert "SGLANG_SECRET_TOKEN" not in everything
    d.stop(signal.SIGTERM)
