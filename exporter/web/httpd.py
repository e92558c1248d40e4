"""The HTTP edge's sockets: one thread per connection, a capped request head, a connection cap with eviction.

server.py (ExporterServer) starts and stops this; routes.py answers the requests. Each connection carries one
request (HTTP/1.0) on its own daemon thread. The request head is capped in bytes and in time and the number of
open connections is capped, so slow or hostile clients cannot pin threads. At the cap, a new connection evicts
the oldest one still sending its head after EVICT_AFTER seconds (a slowloris socket), or waits in the listen
backlog for a free slot. Only GET and HEAD are served (405 for other methods on a known path, 404 elsewhere).
"""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from .. import __version__
from ..sources.http import DeadlineReader
from .listen import ListeningServer
from .routes import Response, is_route, text_response
from .webconfig import BasicAuth

if TYPE_CHECKING:
    from email.message import Message

_LOG = logging.getLogger(__name__)

REQUEST_TIMEOUT = 10.0  # seconds for the TLS handshake plus the request head, and again for the response
MAX_HEAD_BYTES = 16 * 1024  # request line plus headers; a GET needs a few hundred bytes
MAX_CONNECTIONS = 64  # open connections (one thread each); past it, evict a slow head or wait for a slot
EVICT_AFTER = 1.0  # seconds a connection may take over its head before a new one at the cap may evict it
LISTEN_BACKLOG = 1024  # connections the kernel queues while every slot is busy (Python's default is 5)
THREAD_FAILURE_LOG_EVERY = 60.0  # seconds between WARNINGs while connection threads keep failing to start
ALLOWED_METHODS = ("GET", "HEAD")


class Timed(Protocol):
    """What the connection cap needs of the server: how long a connection may take over its request head."""

    request_timeout: float


class App(Timed, Protocol):
    """What the metrics port's connection threads need of the server: its timeout, its auth and its routes."""

    auth: BasicAuth | None

    def respond(self, path: str, headers: Message) -> Response: ...


@dataclass(slots=True)
class _Conn:
    """One open connection: its socket, when it was accepted, and whether its request head is in."""

    sock: socket.socket
    accepted: float
    head_done: bool = False


class HeadTooLargeError(Exception):
    """The request line and headers went past MAX_HEAD_BYTES."""


class Handler(BaseHTTPRequestHandler):
    """One request per connection: the head under a deadline, then one route's response."""

    server: HTTPServer
    protocol_version = "HTTP/1.0"
    server_version = f"sglang-oom-exporter/{__version__}"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the plain makefile() reader: unclosed, it would keep the socket's fd open
        deadline = time.monotonic() + self.server.app.request_timeout
        # The head gets one deadline and a byte budget, so a client dripping a byte at a time cannot pin a thread.
        head = DeadlineReader(self.connection, deadline, budget=MAX_HEAD_BYTES, too_large=HeadTooLargeError())
        self.rfile = io.BufferedReader(head)
        self.requestline, self.request_version, self.command = "", "HTTP/1.0", ""

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except HeadTooLargeError:
            self.close_connection = True
            self.send_error(431, "request head too large")

    def parse_request(self) -> bool:
        """Parse the head; then mark the connection busy (not evictable) and refuse methods other than GET/HEAD."""
        if not super().parse_request():
            return False
        self.server.head_done()
        if self.command not in ALLOWED_METHODS:
            known = is_route(urlsplit(self.path).path)
            status, text = (405, "method not allowed\n") if known else (404, "not found\n")
            self._send(text_response(status, text, {"Allow": ", ".join(ALLOWED_METHODS)}), head=False)
            return False
        return True

    def do_GET(self) -> None:
        """Serve a route."""
        self._serve(head=False)

    def do_HEAD(self) -> None:
        """Serve a route's headers only."""
        self._serve(head=True)

    def _serve(self, *, head: bool) -> None:
        self.connection.settimeout(self.server.app.request_timeout)  # sendall: a bound on the whole response
        app = self.server.app
        if app.auth is not None and not app.auth.check(self.headers.get("Authorization")):
            response = text_response(401, "unauthorized\n", {"WWW-Authenticate": f'Basic realm="{BasicAuth.realm}"'})
        else:
            response = app.respond(self.path, self.headers)
        self._send(response, head=head)

    def _send(self, response: Response, *, head: bool) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.end_headers()
        if not head:
            self.wfile.write(response.body)

    def log_message(self, format: str, *args: Any) -> None:
        """Requests and client errors go to DEBUG: never one line per request at INFO."""
        _LOG.debug("client=%s %s", self.address_string(), format % args)


class HTTPServer(ListeningServer):
    """ThreadingHTTPServer with a connection cap, TLS per connection, and connections it can close on stop.

    Both ports are one of these: the metrics port with Handler, the OTLP port (otlp.py) with its own handler,
    which reads each head of a kept-alive connection under HeadReader's deadline and budget as Handler does.
    """

    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(
        self,
        address: tuple[str, int],
        app: Any,
        ssl_context: ssl.SSLContext | None,
        max_connections: int,
        handler: type[BaseHTTPRequestHandler] = Handler,
    ) -> None:
        self.app = app
        self._slots = threading.BoundedSemaphore(max_connections)
        self._active: dict[threading.Thread, _Conn] = {}
        self._active_lock = threading.Lock()
        self.closing = threading.Event()
        self.evicted = 0  # slow heads closed to make room (read by tests)
        self.thread_failures = 0  # connections closed unanswered: their thread could not start
        self.last_thread_failure: float | None = None  # time.monotonic() of the last one
        self._failures_logged = (0, float("-inf"))  # (thread_failures, when) at the last WARNING
        super().__init__(address, handler, ssl_context)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._take_slot():
            _LOG.debug("client=%s closed: %d connections open", client_address, len(self._active))
            self.shutdown_request(request)
            return
        thread = threading.Thread(
            target=self._serve_connection, args=(request, client_address), name="sglang-oom-http-conn", daemon=True
        )
        with self._active_lock:
            self._active[thread] = _Conn(request, time.monotonic())
        try:
            thread.start()
        except (RuntimeError, MemoryError) as exc:
            # "can't start new thread" (a memory, pids or threads limit): the slot must come back, or after
            # max_connections of these nothing is ever answered again. This one connection goes unanswered.
            with self._active_lock:
                self._active.pop(thread, None)
            self._slots.release()
            self._thread_failed(client_address, exc)
            self.shutdown_request(request)

    def _thread_failed(self, client_address: Any, exc: BaseException) -> None:
        """Count a connection thread that could not start; a WARNING per streak, then one a minute at most."""
        now = time.monotonic()
        self.thread_failures += 1
        self.last_thread_failure = now
        logged, when = self._failures_logged
        if now - when >= THREAD_FAILURE_LOG_EVERY:
            _LOG.warning(
                "client=%s closed unanswered: cannot start a connection thread (%s); %d such connection(s) "
                "since the last warning (sglang_oom_exporter_http_thread_start_failures_total)",
                client_address, exc, self.thread_failures - logged,
            )  # fmt: skip
            self._failures_logged = (self.thread_failures, now)

    def _take_slot(self) -> bool:
        """A free slot: at once, by evicting the slowest head past EVICT_AFTER, or by waiting for one.

        The accept loop waits here while every slot serves a request in time; new connections queue in the
        listen backlog meanwhile. Every head ends within the request timeout, so the wait is bounded.
        """
        deadline = time.monotonic() + self.app.request_timeout
        while not self._slots.acquire(blocking=False):
            self._evict_slow_head()
            if self._slots.acquire(timeout=0.05):
                break
            if self.closing.is_set() or time.monotonic() >= deadline:
                return False
        return True

    def _evict_slow_head(self) -> None:
        """Shut down the connection that has spent longest on its head, if past EVICT_AFTER: its thread ends."""
        cutoff = time.monotonic() - EVICT_AFTER
        with self._active_lock:
            slow = [c for c in self._active.values() if not c.head_done and c.accepted <= cutoff]
            victim = min(slow, key=lambda c: c.accepted, default=None)
            if victim is not None:
                victim.head_done = True  # evicted once: its slot comes back when its thread ends
        if victim is not None:
            self.evicted += 1
            with contextlib.suppress(OSError):
                victim.sock.shutdown(socket.SHUT_RDWR)

    def head_started(self) -> None:
        """The calling connection waits on its client (the next head of a kept-alive connection, or the rest of a
        refused body): evictable again, from now."""
        with self._active_lock:
            conn = self._active.get(threading.current_thread())
            if conn is not None:
                conn.head_done, conn.accepted = False, time.monotonic()

    def head_done(self) -> None:
        """The calling connection's request head is in: it is being served, never evicted."""
        with self._active_lock:
            conn = self._active.get(threading.current_thread())
            if conn is not None:
                conn.head_done = True

    def _serve_connection(self, request: socket.socket, client_address: Any) -> None:
        try:
            self.process_request_thread(request, client_address)
        finally:
            with self._active_lock:
                self._active.pop(threading.current_thread(), None)
            self._slots.release()

    def connection_timeout(self) -> float:
        """The request timeout: the TLS handshake plus the request head, and again for the response."""
        return float(self.app.request_timeout)

    def tls_wrapped(self, conn: ssl.SSLSocket) -> None:
        """Before the handshake: a silent one is evicted through the TLS socket."""
        with self._active_lock:
            record = self._active.get(threading.current_thread())
            if record is not None:
                record.sock = conn

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Resets, timeouts and failed handshakes are the client's business; the default prints a traceback.
        _LOG.debug("client=%s connection failed", client_address, exc_info=True)

    def close_connections(self, timeout: float) -> None:
        """Shut down open connections so their threads end, then join them."""
        with self._active_lock:
            active = dict(self._active)
        for conn in active.values():
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + timeout
        for thread in active:
            if thread.ident is not None:  # recorded just before its start(): not started yet (or never)
                thread.join(max(deadline - time.monotonic(), 0))
