"""The HTTP edge as the server tests drive it: ExporterServers on 127.0.0.1 port 0 (`serve`, stopped after the
test so the thread-leak guard sees them go), a registry standing in for the exporter's, `get`, one request, and
`slow_heads`, slowloris clients for any of the exporter's listeners (metrics or OTLP).
"""

from __future__ import annotations

import contextlib
import http.client
import socket

import pytest
from prometheus_client import CollectorRegistry, Counter

from sglang_oom_exporter.catalog.loader import load_catalog
from sglang_oom_exporter.events.store import EventStore, Health
from sglang_oom_exporter.web.server import ExporterServer


@pytest.fixture(scope="module")
def catalog():
    """The packaged catalog, loaded once per module."""
    return load_catalog()


@pytest.fixture
def registry():
    """A fresh registry with one counter sample, standing in for metrics.py."""
    reg = CollectorRegistry()
    Counter("sglang_oom_events", "OOM events.", ["kind", "source"], registry=reg).labels("prefill", "web").inc(3)
    return reg


@pytest.fixture
def serve(registry, catalog):
    """Start ExporterServers on 127.0.0.1:0 and stop every one after the test."""
    started: list[ExporterServer] = []

    def start(events=None, health=lambda: Health(True, ""), **kwargs):
        server = ExporterServer(
            ("127.0.0.1", 0),
            registry=registry,
            catalog=catalog,
            events=events if events is not None else EventStore(),
            health=health,
            **kwargs,
        )
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def get(server, path, headers=None, *, context=None, method="GET"):
    """One request; returns (status, headers, body)."""
    if context is None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", server.port, timeout=5, context=context)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.headers, response.read()
    finally:
        conn.close()


def slow_heads(port: int, n: int, start: bytes, *, timeout: float = 5.0) -> list[socket.socket]:
    """n connections to 127.0.0.1:port that each send `start`, the beginning of a request head, and then nothing
    (slowloris clients holding connection slots). The caller closes them; on a failure the opened ones are closed."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
            socks.append(s)
            s.sendall(start)
    except BaseException:
        for s in socks:
            with contextlib.suppress(OSError):
                s.close()
        raise
    return socks
