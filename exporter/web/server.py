"""The HTTP edge, the last box of the pipeline: /metrics, /healthz, /events and a small HTML page.

    OomEvent -> EventStore (bounded ring) -> /events (JSON), / (HTML)
    registry (metrics/)                   -> /metrics
    health callable (app.py)              -> /healthz

Nothing here reads logs or counts events; app.py passes in the registry, the store and the health callable and
starts and stops the server. Each connection carries one request (HTTP/1.0) on its own daemon thread. The
request head is capped in bytes and in time and the number of open connections is capped, so slow or hostile
clients cannot pin threads. Log text is untrusted input: the page escapes all of it and allows no scripts.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import logging
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import MappingProxyType
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

from .. import __version__
from ..catalog.loader import Catalog
from ..daemon.sink import event_json
from ..daemon.store import EventStore, Health
from ..sources.http import DeadlineReader
from ..web.page import render_page
from ..web.webconfig import BasicAuth, WebConfig

if TYPE_CHECKING:
    from email.message import Message


_LOG = logging.getLogger(__name__)

DEFAULT_LIMIT = 100  # events per /events response or page, unless ?limit= says otherwise
MAX_LIMIT = 1000
REQUEST_TIMEOUT = 10.0  # seconds for the TLS handshake plus the request head, and again for the response
MAX_HEAD_BYTES = 16 * 1024  # request line plus headers; a GET needs a few hundred bytes
MAX_CONNECTIONS = 64  # open connections; more are closed at once instead of starting threads
_ERROR_LOG_INTERVAL = 60.0
_NO_LABELS: Mapping[str, str] = MappingProxyType({})
_PAGE_CSP = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


@dataclass(frozen=True, slots=True)
class _Response:
    status: int
    content_type: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)


class _BadRequestError(Exception):
    """A query the client must fix; its text is the 400 body."""


class _HeadTooLargeError(Exception):
    """The request line and headers went past MAX_HEAD_BYTES."""


class ExporterServer:
    """Serves the routes from a background thread; start() binds, stop() closes and joins everything."""

    def __init__(
        self,
        address: tuple[str, int],
        *,
        registry: CollectorRegistry,
        catalog: Catalog,
        events: EventStore,
        health: Callable[[], Health],
        web_config: WebConfig | None = None,
        request_timeout: float = REQUEST_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self._address = address
        self._registry = registry
        self._catalog = catalog
        self._events = events
        self._health = health
        self._web_config = web_config or WebConfig()
        users = web_config.basic_auth_users if web_config is not None else {}
        self.auth = BasicAuth(users) if users else None
        self.request_timeout = request_timeout
        self._max_connections = max_connections
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._error_lock = threading.Lock()
        self._last_error_log = -_ERROR_LOG_INTERVAL
        self._errors_suppressed = 0

    def set_catalog(self, catalog: Catalog) -> None:
        """A reloaded catalog: titles and remediations of new kinds show on /events and the page."""
        self._catalog = catalog

    @property
    def port(self) -> int:
        """The bound port (useful when started with port 0)."""
        if self._httpd is None:
            raise RuntimeError("the server is not started")
        return self._httpd.server_port

    @property
    def url(self) -> str:
        """The base URL the server answers on."""
        host = self._address[0] or "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        return f"{'https' if self._web_config.tls_enabled else 'http'}://{host}:{self.port}"

    def start(self) -> None:
        """Load TLS files and bind (OSError if either fails), then serve from a daemon thread."""
        if self._httpd is not None:
            raise RuntimeError("the server is already started")
        ssl_context = self._web_config.ssl_context()
        httpd = _HTTPServer(self._address, self, ssl_context, self._max_connections)
        self._httpd = httpd
        # serve_forever notices shutdown() only between polls: 0.1 s keeps stop() quick at ten idle wake-ups a second.
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="sglang-oom-http", daemon=True
        )
        self._thread.start()
        _LOG.debug("serving url=%s basic_auth=%s", self.url, self.auth is not None)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting, close open connections and join every thread; safe to call twice."""
        httpd, thread = self._httpd, self._thread
        if httpd is None or thread is None:
            return
        httpd.shutdown()
        httpd.server_close()
        httpd.close_connections(timeout)
        thread.join(timeout)
        self._httpd = self._thread = None

    def respond(self, path: str, headers: Message) -> _Response:
        """The response to a GET of path (auth is checked by the caller)."""
        url = urlsplit(path)
        route = _ROUTES.get(url.path)
        if route is None:
            return _text(404, "not found; try /, /metrics, /events or /healthz\n")
        try:
            return route(self, parse_qs(url.query), headers)
        except _BadRequestError as exc:
            return _text(400, f"{exc}\n")
        except Exception:
            self.log_failure(f"{url.path} failed")
            return _text(500, "internal error; see the exporter's log\n")

    def log_failure(self, what: str) -> None:
        """Log the current exception, at most once a minute (a broken collector must not flood the log)."""
        with self._error_lock:
            now = time.monotonic()
            if now - self._last_error_log < _ERROR_LOG_INTERVAL:
                self._errors_suppressed += 1
                return
            suppressed, self._errors_suppressed, self._last_error_log = self._errors_suppressed, 0, now
        _LOG.exception("%s suppressed_since_last=%d", what, suppressed)

    def _metrics(self, query: dict[str, list[str]], headers: Message) -> _Response:
        encoder, content_type = choose_encoder(headers.get("Accept", ""))
        registry: Any = self._registry
        if "name[]" in query:
            registry = registry.restricted_registry(query["name[]"])
        body = encoder(registry)
        if gzip_accepted(headers.get("Accept-Encoding", "")):
            return _Response(200, content_type, gzip.compress(body), {"Content-Encoding": "gzip"})
        return _Response(200, content_type, body)

    def _healthz(self, query: dict[str, list[str]], headers: Message) -> _Response:
        try:
            health = self._health()
        except Exception as exc:
            self.log_failure("health check raised")
            health = Health(False, f"health check failed: {exc}")
        return _text(200, "ok\n") if health.ok else _text(503, f"{health.reason or 'unhealthy'}\n")

    def _events_json(self, query: dict[str, list[str]], headers: Message) -> _Response:
        items = [
            {**event_json(s.event, self._catalog), "labels": dict(s.labels)}
            for s in self._events.entries(_limit(query))
        ]
        body = json.dumps({"events": items}, default=str).encode()
        return _Response(200, "application/json", body)

    def _page(self, query: dict[str, list[str]], headers: Message) -> _Response:
        try:
            health = self._health()
        except Exception as exc:
            health = Health(False, f"health check failed: {exc}")
        page = render_page(self._events.entries(_limit(query)), self._catalog, health, self._events.capacity)
        return _Response(200, "text/html; charset=utf-8", page.encode(), {"Content-Security-Policy": _PAGE_CSP})


_ROUTES: dict[str, Callable[[ExporterServer, dict[str, list[str]], Message], _Response]] = {
    "/": ExporterServer._page,
    "/metrics": ExporterServer._metrics,
    "/healthz": ExporterServer._healthz,
    "/events": ExporterServer._events_json,
}


def _text(status: int, text: str, headers: Mapping[str, str] = _NO_LABELS) -> _Response:
    return _Response(status, "text/plain; charset=utf-8", text.encode(), headers)


def _limit(query: dict[str, list[str]]) -> int:
    values = query.get("limit")
    if not values:
        return DEFAULT_LIMIT
    value = values[-1]
    if not (value.isascii() and value.isdigit()):
        raise _BadRequestError(f"limit must be a whole number from 0 to {MAX_LIMIT}")
    return MAX_LIMIT if len(value) > len(str(MAX_LIMIT)) else min(int(value), MAX_LIMIT)


class _Handler(BaseHTTPRequestHandler):
    """One request per connection: the head under a deadline, then one route's response."""

    server: _HTTPServer
    protocol_version = "HTTP/1.0"
    server_version = f"sglang-oom-exporter/{__version__}"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the plain makefile() reader: unclosed, it would keep the socket's fd open
        deadline = time.monotonic() + self.server.app.request_timeout
        # The head gets one deadline and a byte budget, so a client dripping a byte at a time cannot pin a thread.
        head = DeadlineReader(self.connection, deadline, budget=MAX_HEAD_BYTES, too_large=_HeadTooLargeError())
        self.rfile = io.BufferedReader(head)
        self.requestline, self.request_version, self.command = "", "HTTP/1.0", ""

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        except _HeadTooLargeError:
            self.close_connection = True
            self.send_error(431, "request head too large")

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
            response = _text(401, "unauthorized\n", {"WWW-Authenticate": f'Basic realm="{BasicAuth.realm}"'})
        else:
            response = app.respond(self.path, self.headers)
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


class _HTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with a connection cap, TLS per connection, and connections it can close on stop."""

    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], app: ExporterServer, ssl_context: ssl.SSLContext | None, max_connections: int
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.app = app
        self.ssl_context = ssl_context
        self._slots = threading.BoundedSemaphore(max_connections)
        self._active: dict[threading.Thread, socket.socket] = {}
        self._active_lock = threading.Lock()
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks up the host's FQDN, a DNS query that can stall startup for seconds.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            _LOG.debug("client=%s closed: %d connections open", client_address, len(self._active))
            self.shutdown_request(request)
            return
        thread = threading.Thread(
            target=self._serve_connection, args=(request, client_address), name="sglang-oom-http-conn", daemon=True
        )
        with self._active_lock:
            self._active[thread] = request
        thread.start()

    def _serve_connection(self, request: socket.socket, client_address: Any) -> None:
        try:
            self.process_request_thread(request, client_address)
        finally:
            with self._active_lock:
                self._active.pop(threading.current_thread(), None)
            self._slots.release()

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(self.app.request_timeout)
        if self.ssl_context is None:
            _Handler(request, client_address, self)
            return
        # The handshake runs here, on the connection's own thread under its timeout, not in the accept loop
        # where one silent client would stall every other. wrap_socket detaches `request`: close the TLS one.
        conn = self.ssl_context.wrap_socket(request, server_side=True)
        with self._active_lock:
            self._active[threading.current_thread()] = conn
        try:
            _Handler(conn, client_address, self)
        finally:
            self.shutdown_request(conn)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Resets, timeouts and failed handshakes are the client's business; the default prints a traceback.
        _LOG.debug("client=%s connection failed", client_address, exc_info=True)

    def close_connections(self, timeout: float) -> None:
        """Shut down open connections so their threads end, then join them."""
        with self._active_lock:
            active = dict(self._active)
        for sock in active.values():
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + timeout
        for thread in active:
            thread.join(max(deadline - time.monotonic(), 0))
