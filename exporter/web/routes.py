"""The HTTP edge's routes: /metrics, /healthz, /events, the HTML page and the runbooks (/runbooks/), as plain
request -> Response.

server.py owns the sockets, threads, TLS and auth; this module only turns a path and headers into bytes.
"""

from __future__ import annotations

import gzip
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

from ..catalog import Catalog
from ..events.sink import event_json
from ..events.store import EventStore, Health
from ..metrics.exposition import PageRegistry, join_gzip, join_plain
from .page import render_page
from .runbooks import INDEX, RunbookPages

if TYPE_CHECKING:
    from email.message import Message

_LOG = logging.getLogger(__name__)

DEFAULT_LIMIT = 100  # events per /events response or page, unless ?limit= says otherwise
MAX_LIMIT = 1000
_ERROR_LOG_INTERVAL = 60.0
_NO_LABELS: Mapping[str, str] = MappingProxyType({})
OPENMETRICS = "application/openmetrics-text"
_PAGE_CSP = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"


@dataclass(frozen=True, slots=True)
class Response:
    """One HTTP response: status, content type, body and extra headers."""

    status: int
    content_type: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)


class BadRequestError(Exception):
    """A query the client must fix; its text is the 400 body."""


class Routes:
    """The answers of the exporter's HTTP edge; thread-safe (one call per request thread)."""

    def __init__(
        self, *, registry: CollectorRegistry, catalog: Catalog, events: EventStore, health: Callable[[], Health]
    ) -> None:
        self._registry = registry
        self.catalog = catalog  # replaced on a reload
        self._events = events
        self._health = health
        self._error_lock = threading.Lock()
        self._last_error_log = -_ERROR_LOG_INTERVAL
        self._errors_suppressed = 0
        self._runbooks = RunbookPages()

    def respond(self, path: str, headers: Message) -> Response:
        """The response to a GET of path (auth is checked by the caller)."""
        url = urlsplit(path)
        route = _ROUTES.get(url.path)
        if route is None and not is_route(url.path):
            return text_response(404, "not found; try /, /metrics, /events, /healthz or /runbooks/\n")
        try:
            if route is None:
                return self._runbook(url.path)
            return route(self, parse_qs(url.query), headers)
        except BadRequestError as exc:
            return text_response(400, f"{exc}\n")
        except Exception:
            self.log_failure(f"{url.path} failed")
            return text_response(500, "internal error; see the exporter's log\n")

    def log_failure(self, what: str) -> None:
        """Log the current exception, at most once a minute (a broken collector must not flood the log)."""
        with self._error_lock:
            now = time.monotonic()
            if now - self._last_error_log < _ERROR_LOG_INTERVAL:
                self._errors_suppressed += 1
                return
            suppressed, self._errors_suppressed, self._last_error_log = self._errors_suppressed, 0, now
        _LOG.exception("%s suppressed_since_last=%d", what, suppressed)

    def _metrics(self, query: dict[str, list[str]], headers: Message) -> Response:
        encoder, content_type = choose_encoder(headers.get("Accept", ""))
        gzipped = gzip_accepted(headers.get("Accept-Encoding", ""))
        names = query.get("name[]")
        if isinstance(self._registry, PageRegistry):
            # The cached page: no lock the loop holds, no walk over the sources; gzip reuses cached segments.
            parts = self._registry.render(content_type.startswith(OPENMETRICS), names)
            if gzipped:
                return Response(200, content_type, join_gzip(parts), {"Content-Encoding": "gzip"})
            return Response(200, content_type, join_plain(parts))
        registry: Any = self._registry
        if names is not None:
            registry = registry.restricted_registry(names)
        body = encoder(registry)
        if gzipped:
            return Response(200, content_type, gzip.compress(body), {"Content-Encoding": "gzip"})
        return Response(200, content_type, body)

    def _healthz(self, query: dict[str, list[str]], headers: Message) -> Response:
        try:
            health = self._health()
        except Exception as exc:
            self.log_failure("health check raised")
            health = Health(False, f"health check failed: {exc}")
        if health.ok:
            return text_response(200, f"ok: {health.reason}\n" if health.reason else "ok\n")
        return text_response(503, f"{health.reason or 'unhealthy'}\n")

    def _events_json(self, query: dict[str, list[str]], headers: Message) -> Response:
        items = [
            {**event_json(s.event, self.catalog), "labels": dict(s.labels), "seen": s.seen, "restored": s.restored}
            for s in self._events.entries(_limit(query))
        ]
        body = json.dumps({"events": items}, default=str).encode()
        return Response(200, "application/json", body)

    def _page(self, query: dict[str, list[str]], headers: Message) -> Response:
        try:
            health = self._health()
        except Exception as exc:
            health = Health(False, f"health check failed: {exc}")
        page = render_page(self._events.entries(_limit(query)), self.catalog, health, self._events.capacity)
        return Response(200, "text/html; charset=utf-8", page.encode(), {"Content-Security-Policy": _PAGE_CSP})

    def _runbook(self, path: str) -> Response:
        """/runbooks/ (the index, also as README.md) and /runbooks/<alert>.md, as HTML."""
        if path == RUNBOOKS:
            # Relative to /runbooks, "runbooks/" is /runbooks/ also behind a path prefix (kubectl proxy).
            return text_response(301, "see runbooks/\n", {"Location": "runbooks/"})
        name = path.removeprefix(RUNBOOKS + "/") or INDEX
        page = None if "/" in name else self._runbooks.page(self.catalog, name)
        if page is None:
            return text_response(404, "no such runbook; the index is /runbooks/\n")
        return Response(200, "text/html; charset=utf-8", page.encode(), {"Content-Security-Policy": _PAGE_CSP})


RUNBOOKS = "/runbooks"  # with everything under it

_ROUTES: dict[str, Callable[[Routes, dict[str, list[str]], Message], Response]] = {
    "/": Routes._page,
    "/metrics": Routes._metrics,
    "/healthz": Routes._healthz,
    "/events": Routes._events_json,
}
ROUTE_PATHS = frozenset(_ROUTES)  # the paths served (GET and HEAD only), besides RUNBOOKS and below


def is_route(path: str) -> bool:
    """Whether a path is served (with GET and HEAD only)."""
    return path in ROUTE_PATHS or path == RUNBOOKS or path.startswith(RUNBOOKS + "/")


def text_response(status: int, text: str, headers: Mapping[str, str] = _NO_LABELS) -> Response:
    """A plain-text response."""
    return Response(status, "text/plain; charset=utf-8", text.encode(), headers)


def _limit(query: dict[str, list[str]]) -> int:
    values = query.get("limit")
    if not values:
        return DEFAULT_LIMIT
    value = values[-1]
    if not (value.isascii() and value.isdigit()):
        raise BadRequestError(f"limit must be a whole number from 0 to {MAX_LIMIT}")
    return MAX_LIMIT if len(value) > len(str(MAX_LIMIT)) else min(int(value), MAX_LIMIT)
