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
from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from ..catalog.loader import Catalog
from ..daemon.store import EventStore, Health
from .httpd import EVICT_AFTER, LISTEN_BACKLOG, MAX_CONNECTIONS, MAX_HEAD_BYTES, REQUEST_TIMEOUT, HTTPServer
from .routes import DEFAULT_LIMIT, MAX_LIMIT, Response, Routes
from .webconfig import BasicAuth, WebConfig

if TYPE_CHECKING:
    from email.message import Message


_LOG = logging.getLogger(__name__)
__all__ = [  # tests and serve import these
    "DEFAULT_LIMIT", "EVICT_AFTER", "LISTEN_BACKLOG", "MAX_CONNECTIONS", "MAX_HEAD_BYTES", "MAX_LIMIT",
    "ExporterServer",
]  # fmt: skip


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
        self.routes = Routes(registry=registry, catalog=catalog, events=events, health=health)
        self._web_config = web_config or WebConfig()
        users = web_config.basic_auth_users if web_config is not None else {}
        self.auth = BasicAuth(users) if users else None
        self.request_timeout = request_timeout
        self._max_connections = max_connections
        self._httpd: HTTPServer | None = None
        self._thread: threading.Thread | None = None

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
