"""A connection whose handler thread cannot start (a memory or pids limit) gives its slot back.

The failure is injected in-process: threading.Thread.start raises for the HTTP edge's connection threads, as
CPython does when the kernel refuses a thread ("can't start new thread").
"""

from __future__ import annotations

import logging
import socket
import threading

from sglang_oom_exporter.events.store import Health
from tests.support.server import get

CONN_THREAD = "sglang-oom-http-conn"


def _refuse_connection_threads(monkeypatch, times: int) -> list[int]:
    """The next `times` connection threads fail to start; returns [how many are left to fail]."""
    left = [times]
    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        if self.name == CONN_THREAD and left[0] > 0:
            left[0] -= 1
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    return left


def _closed_unanswered(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        try:
            return s.recv(1) == b""
        except ConnectionResetError:
            return True


def test_connections_whose_thread_cannot_start_give_their_slot_back(serve, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="sglang_oom_exporter.web.httpd")
    left = _refuse_connection_threads(monkeypatch, 10)
    server = serve(health=lambda: Health(True, "following 1 log source(s)"), max_connections=4, request_timeout=1.0)
    assert [_closed_unanswered(server.port) for _ in range(10)] == [True] * 10
    assert left == [0]
    # Threads start again: every one of the 4 slots is free (was: all 4 leaked, nothing answered ever again).
    assert len(server._httpd._active) == 0
    status, _, body = get(server, "/metrics")
    assert status == 200
    assert "sglang_oom_exporter_http_thread_start_failures_total 10.0" in body.decode()
    status, _, body = get(server, "/healthz")
    assert status == 503
    assert "10 HTTP connection(s) closed unanswered: a connection thread could not start" in body.decode()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "cannot start" in r.getMessage()]
    assert len(warnings) == 1  # one per streak, not one per connection
    assert "10 such connection(s)" not in warnings[0].getMessage()  # logged at the first: 1 since the last


def test_healthz_is_ok_again_a_minute_after_the_last_failure(serve, monkeypatch):
    _refuse_connection_threads(monkeypatch, 1)
    server = serve(health=lambda: Health(True, "following 1 log source(s)"), request_timeout=1.0)
    assert _closed_unanswered(server.port)
    assert get(server, "/healthz")[0] == 503
    server._httpd.last_thread_failure -= 60.0  # a minute later, on the edge's clock
    assert get(server, "/healthz")[0] == 200
    assert server.thread_failures == 1
