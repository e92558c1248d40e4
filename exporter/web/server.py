"""The HTTP edge, the last box of the pipeline: /metrics, /healthz, /events and a small HTML page.

    OomEvent -> EventStore (bounded ring) -> /events (JSON), / (HTML)
    registry (metrics/)                   -> /metrics (the cached page; metrics/exposition.py)
    health callable (daemon/loop.py)      -> /healthz

Nothing here reads logs or counts events; serve passes in the registry, the store and the health callable,
and starts and stops the server around the daemon's loop. routes.py turns a request into a response; httpd.py
owns the sockets and the connection threads (a capped head, a connection cap that evicts slow heads, so that
Prometheus' scrape gets through 200 idle sockets and a burst of hundreds of scrapes); this module starts and
stops them, with TLS and basic auth. Log text is untrusted input: the page escapes all of it and allows no scripts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from ..catalog import Catalog
from ..events.store import EventStore, Health
from ..metrics.names import SELF
from .httpd import MAX_CONNECTIONS, REQUEST_TIMEOUT, HTTPServer
from .routes import Response, Routes
from .webconfig import BasicAuth, WebConfig

if TYPE_CHECKING:
    from email.message import Message


_LOG = logging.getLogger(__name__)
THREAD_FAILURE_HEALTH_SECONDS = 60.0  # /healthz is not ok for this long after a connection thread failed to start


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
        self._health = health
        self.routes = Routes(registry=registry, catalog=catalog, events=events, health=self.health)
        registry.register(_EdgeCollector(self))
        self._web_config = web_config or WebConfig()
        users = web_config.basic_auth_users if web_config is not None else {}
        self.auth = BasicAuth(users) if users else None
        self.request_timeout = request_timeout
        self._max_connections = max_connections
        self._httpd: HTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def thread_failures(self) -> int:
        """Connections closed unanswered because their handler thread could not start."""
        return self._httpd.thread_failures if self._httpd is not None else 0

    def health(self) -> Health:
        """The daemon's health, and not ok for a while after a connection thread could not start."""
        health = self._health()
        httpd = self._httpd
        last = httpd.last_thread_failure if httpd is not None else None
        if last is None or time.monotonic() - last >= THREAD_FAILURE_HEALTH_SECONDS:
            return health
        ago = time.monotonic() - last
        reason = (
            f"{httpd.thread_failures if httpd else 0} HTTP connection(s) closed unanswered: a connection thread "
            f"could not start {ago:.0f}s ago (memory, pids or threads limit; "
            "sglang_oom_exporter_http_thread_start_failures_total)"
        )
        return Health(False, f"{reason}; {health.reason}" if health.reason else reason)

    def set_catalog(self, catalog: Catalog) -> None:
        """A reloaded catalog: titles and remediations of new kinds show on /events and the page."""
        self.routes.catalog = catalog

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
        httpd = HTTPServer(self._address, self, ssl_context, self._max_connections)
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
        httpd.closing.set()  # an accept loop waiting for a free slot gives up at once
        httpd.shutdown()
        httpd.server_close()
        httpd.close_connections(timeout)
        thread.join(timeout)
        self._httpd = self._thread = None

    def respond(self, path: str, headers: Message) -> Response:
        """The response to a GET of path (auth is checked by the caller)."""
        return self.routes.respond(path, headers)


class _EdgeCollector(Collector):
    """The HTTP edge's own numbers, read at scrape time."""

    def __init__(self, server: ExporterServer) -> None:
        self._server = server

    def describe(self) -> Iterable[CounterMetricFamily]:
        """Nothing up front: the registry then never calls collect() at registration."""
        return []

    def collect(self) -> Iterable[CounterMetricFamily]:
        """The failed connection-thread starts."""
        yield CounterMetricFamily(
            f"{SELF}_http_thread_start_failures",
            "HTTP connections closed unanswered because their handler thread could not start (memory or pids limit).",
            value=self._server.thread_failures,
        )
