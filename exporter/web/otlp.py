"""The OTLP/HTTP logs endpoint: POST /v1/logs on a port of its own, answered as the OTLP specification says.

    shipper --POST /v1/logs--> head (httpd.HTTPServer: connection cap, slow heads evicted, head deadline)
        --> auth (web config basic auth, bearer token) --> admission (a slot, the body's bytes) --> body (capped,
        under a deadline) --> sources/otlp.decode (bounded: records counted, memory reserved before it is taken)
        --> lines by source --> accept (daemon/receiver.py: durable in the spool) --> 200 ExportLogsServiceResponse

Every answer but 200 says why and is counted by status: 400 malformed protobuf, JSON or gzip, or a source name
no file may have (with the reason, as a google.rpc.Status), 401 without the credentials, 404/405 another path or
method, 411 without a Content-Length, 413 past the size cap (before or after gzip) or the record cap, 415 another
content type or encoding, 429 with Retry-After when too many requests, or too many bytes of them, are in flight
(the shipper backs off and retries), 503 with Retry-After when the spool cannot write (disk full) or the receiver
stops. 2xx comes only after the records are on disk, so a shipper that got it may forget them, and one that did
not sends them again. A request is admitted (a slot and its body's bytes) before its body is read, and what its
decoding will take is reserved from the same budget before it is taken, so the receiver's memory is bounded by
MAX_IN_FLIGHT_BYTES however the requests are made (docs/otlp.md "Memory").
"""

from __future__ import annotations

import hmac
import io
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .. import __version__
from ..metrics.names import SELF
from ..sources.http import DeadlineReader
from ..sources.otlp import (
    JSON,
    MAX_RECORDS,
    PROTOBUF,
    RECORD_COST,
    TEXT_COPIES,
    OtlpError,
    decode,
    lines,
    media_type,
    response,
    status,
)
from ..sources.otlpspool import Line, SpoolError, SpoolFullError
from .httpd import MAX_CONNECTIONS, MAX_HEAD_BYTES, HeadTooLargeError, HTTPServer
from .webconfig import BasicAuth, WebConfig

_LOG = logging.getLogger(__name__)

PATH = "/v1/logs"
REQUEST_TIMEOUT = 30.0  # seconds for the TLS handshake and a head (an idle kept-alive connection's too)
BODY_RATE = 1024 * 1024  # bytes a second a body must come at, at least: its deadline is REQUEST_TIMEOUT + size/rate
MAX_IN_FLIGHT = 8  # requests admitted at once (reading, decoding, spooling); past it, 429 and Retry-After
MAX_IN_FLIGHT_BYTES = 96 * 1024 * 1024  # memory admitted requests may reserve in all (at least); past it, 429
DISCARD_BYTES = 64 * 1024  # a refused body is read and dropped this many bytes at a time
RETRY_AFTER_SECONDS = 1
# google.rpc.Code values for the Status body of a failure.
_INVALID_ARGUMENT, _UNAUTHENTICATED, _RESOURCE_EXHAUSTED, _UNAVAILABLE, _UNIMPLEMENTED = 3, 16, 8, 14, 12


class Accepts(Protocol):
    """What the endpoint hands the records to (daemon/receiver.Receiver)."""

    def accept(self, batch: Mapping[str, Sequence[Line]]) -> Any: ...


class OtlpStats:
    """The endpoint's counters (read at scrape time)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[str, int] = {}  # by HTTP status code
        self.failures: dict[str, int] = {}  # by reason: malformed, too_large, unsupported, unauthorized, ...
        self.bytes = 0  # request bodies read, as sent (before gzip is undone)

    def count(self, code: int, reason: str = "") -> None:
        with self.lock:
            self.requests[str(code)] = self.requests.get(str(code), 0) + 1
            if reason:
                self.failures[reason] = self.failures.get(reason, 0) + 1


_REASONS = {400: "malformed", 401: "unauthorized", 404: "not_found", 405: "method", 411: "length_required",
            413: "too_large", 415: "unsupported", 429: "overloaded", 431: "head_too_large",
            503: "unavailable"}  # fmt: skip


def in_flight_budget(max_request_bytes: int) -> int:
    """The request memory admitted at once: MAX_IN_FLIGHT_BYTES, or more when the largest request would not fit
    (its body and three copies of its text, and MAX_RECORDS records) with room for a small one beside it."""
    largest = (1 + TEXT_COPIES) * max_request_bytes + MAX_RECORDS * RECORD_COST
    return max(MAX_IN_FLIGHT_BYTES, largest + largest // 4)


class Budget:
    """Bytes that admitted requests may hold in all (bodies, inflated bodies, decoded records)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        """Reserve n bytes if they fit."""
        with self._lock:
            if self.used + n > self.total:
                return False
            self.used += n
            return True

    def give(self, n: int) -> None:
        """Give back n reserved bytes."""
        with self._lock:
            self.used -= n


class Admission:
    """One request's slot and its reservation, grown as its decoding learns what it will take."""

    def __init__(self, budget: Budget, slots: threading.BoundedSemaphore) -> None:
        self._budget, self._slots = budget, slots
        self.held = 0
        self._released = False

    def reserve(self, n: int) -> None:
        """Reserve n more bytes: OtlpError 413 when the request alone could never fit, 429 while others hold them."""
        if self.held + n > self._budget.total:
            raise OtlpError(413, f"the request would take {self.held + n} bytes of memory while decoded; the "
                                 f"receiver admits {self._budget.total} in all: send smaller batches")  # fmt: skip
        if not self._budget.take(n):
            raise OtlpError(429, "too many bytes of requests in flight; retry")
        self.held += n

    def release(self) -> None:
        """Give the slot and the bytes back (once)."""
        if not self._released:
            self._released = True
            self._budget.give(self.held)
            self._slots.release()


class OtlpServer:
    """The receiver's HTTP server: start() binds and serves from a thread, stop() closes and joins it."""

    def __init__(
        self,
        address: tuple[str, int],
        receiver: Accepts,
        *,
        web_config: WebConfig | None = None,
        bearer_token: str | None = None,
        max_request_bytes: int = 8 * 1024 * 1024,
        max_in_flight: int = MAX_IN_FLIGHT,
        max_in_flight_bytes: int | None = None,
        max_connections: int = MAX_CONNECTIONS,
        request_timeout: float = REQUEST_TIMEOUT,
    ) -> None:
        self._address = address
        self.receiver = receiver
        self._web_config = web_config or WebConfig()
        users = self._web_config.basic_auth_users
        self.auth = BasicAuth(users) if users else None
        self.bearer = bearer_token.strip().encode() if bearer_token else None
        self.max_request_bytes = max_request_bytes
        self.request_timeout = request_timeout
        self._max_connections = max_connections
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self.budget = Budget(max_in_flight_bytes or in_flight_budget(max_request_bytes))
        self.stats = OtlpStats()
        self.stopping = False
        self._httpd: HTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The bound port."""
        if self._httpd is None:
            raise RuntimeError("the OTLP receiver is not started")
        return self._httpd.server_port

    @property
    def httpd(self) -> HTTPServer | None:
        """The server once started (its connection counters: evicted, thread_failures)."""
        return self._httpd

    def start(self) -> None:
        """Load TLS files and bind (OSError if either fails), then serve from a daemon thread."""
        httpd = HTTPServer(self._address, self, self._web_config.ssl_context(), self._max_connections, _Handler)
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="sglang-oom-otlp", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Answer 503 from now on, stop accepting, close open connections and join the threads."""
        self.stopping = True
        httpd, thread = self._httpd, self._thread
        if httpd is None or thread is None:
            return
        httpd.closing.set()
        httpd.shutdown()
        httpd.server_close()
        httpd.close_connections(timeout)
        thread.join(timeout)
        self._httpd = self._thread = None

    def authorized(self, header: str | None) -> bool:
        """Basic auth from the web config and the bearer token, each when configured."""
        if self.bearer is not None:
            scheme, _, token = (header or "").partition(" ")
            return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.bearer)
        return self.auth is None or self.auth.check(header)

    def admit(self, size: int, content_type: str | None) -> Admission | tuple[int, bytes, str]:
        """Before a body of size bytes is read: a slot and its bytes reserved, or the refusal to answer (counted)."""
        kind = JSON if (content_type or "").split(";")[0].strip().lower() == JSON else PROTOBUF
        if self.stopping:
            return self._fail(503, kind, _UNAVAILABLE, "the receiver is stopping; retry")
        if not self._slots.acquire(blocking=False):
            return self._fail(429, kind, _RESOURCE_EXHAUSTED, "too many requests in flight; retry")
        admission = Admission(self.budget, self._slots)
        try:
            admission.reserve(size)
        except OtlpError as exc:
            admission.release()
            return self._fail(exc.status, kind, _RESOURCE_EXHAUSTED, exc.reason)
        return admission

    def handle(
        self,
        body: bytes,
        content_type: str | None,
        content_encoding: str | None,
        admission: Admission | None = None,
    ) -> tuple[int, bytes, str]:
        """(status, body, content type) of one POST /v1/logs whose body is read; counted. Admitted here when the
        caller did not admit it before reading the body; the admission is released either way."""
        if admission is None:
            admitted = self.admit(len(body), content_type)
            if not isinstance(admitted, Admission):
                return admitted
            admission = admitted
        kind = JSON if (content_type or "").split(";")[0].strip().lower() == JSON else PROTOBUF
        try:
            try:
                kind = media_type(content_type)
                request = decode(body, content_type, content_encoding, self.max_request_bytes, admission.reserve)
                del body  # the walked request keeps what it needs of it
                batch = lines(request)
                del request
                self.receiver.accept(batch)
            except OtlpError as exc:
                code = {415: _UNIMPLEMENTED, 429: _RESOURCE_EXHAUSTED}.get(exc.status, _INVALID_ARGUMENT)
                return self._fail(exc.status, kind, code, exc.reason)
            except SpoolFullError as exc:
                _LOG.warning("otlp: the spool is full (answered 503, the shipper retries): %s", exc)
                return self._fail(503, kind, _UNAVAILABLE, f"the spool is full: {exc}", "spool_full")
            except SpoolError as exc:
                _LOG.warning("otlp: cannot spool a request (answered 503, the shipper retries): %s", exc)
                return self._fail(503, kind, _UNAVAILABLE, f"cannot store the records: {exc}")
            self.stats.count(200)
            return 200, response(kind), kind
        finally:
            admission.release()

    def _fail(self, code: int, kind: str, rpc: int, reason: str, why: str = "") -> tuple[int, bytes, str]:
        self.stats.count(code, why or _REASONS.get(code, "other"))
        _LOG.debug("otlp: answered %d: %s", code, reason)
        return code, status(kind, rpc, reason), kind

    def refuse(self, code: int, reason: str) -> tuple[int, bytes, str]:
        """A request refused before its body was read (auth, path, method, size): plain text."""
        self.stats.count(code, _REASONS.get(code, "other"))
        return code, (reason + "\n").encode(), "text/plain; charset=utf-8"


class _Handler(BaseHTTPRequestHandler):
    """Requests on a kept-alive connection: each head under its deadline and byte budget (evictable while it
    comes), then the body, admitted first and read under a deadline of its own."""

    server: HTTPServer
    protocol_version = "HTTP/1.1"
    server_version = f"sglang-oom-exporter/{__version__}"
    sys_version = ""
    disable_nagle_algorithm = True  # the head and the body are two writes: no delayed-ACK wait between them

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the plain makefile() reader: unclosed, it would keep the socket's fd open
        self._reader = DeadlineReader(self.connection, 0.0, budget=MAX_HEAD_BYTES, too_large=HeadTooLargeError())
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self) -> None:
        app: OtlpServer = self.server.app
        self.server.head_started()  # a new connection, or a kept-alive one waiting: evictable until its head is in
        self._reader.rearm(time.monotonic() + app.request_timeout, MAX_HEAD_BYTES)
        try:
            super().handle_one_request()
        except HeadTooLargeError:
            self.request_version, self.command = "HTTP/1.1", ""
            self._answer(*app.refuse(431, "request head too large"), close=True)

    def parse_request(self) -> bool:
        """Parse the head; then mark the connection busy (not evictable)."""
        if not super().parse_request():
            return False
        self.server.head_done()
        return True

    def do_POST(self) -> None:
        """POST /v1/logs."""
        app: OtlpServer = self.server.app
        if self.path.split("?", 1)[0] != PATH:
            self._answer(*app.refuse(404, f"not found: OTLP logs are received at {PATH}"), close=True)
            return
        if not app.authorized(self.headers.get("Authorization")):
            status_, body, kind = app.refuse(401, "unauthorized")
            scheme = "Bearer" if app.bearer is not None else f'Basic realm="{BasicAuth.realm}"'
            self._answer(status_, body, kind, {"WWW-Authenticate": scheme}, close=True)
            return
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding") or length is None or not length.strip().isdigit():
            self._answer(*app.refuse(411, "send the body with a Content-Length"), close=True)
            return
        size = int(length)
        if size > app.max_request_bytes:
            # Not read: the connection closes, and the shipper does not retry a 413 (it splits or drops the batch).
            self._answer(*app.refuse(413, f"the body is {size} bytes; this receiver takes {app.max_request_bytes} "
                                          "at most (--otlp-max-request-kib)"), close=True)  # fmt: skip
            return
        # Admitted before the body is read: a refused body never takes memory.
        admitted = app.admit(size, self.headers.get("Content-Type"))
        self._reader.rearm(time.monotonic() + app.request_timeout + size / BODY_RATE)
        if not isinstance(admitted, Admission):
            code, answer, kind = admitted
            self._answer(code, answer, kind, {"Retry-After": str(RETRY_AFTER_SECONDS)})
            # Then the body is read and dropped a piece at a time (no memory held), so closing with it unread
            # cannot reset the answer before the shipper reads it; evictable meanwhile, as a slow head is.
            self.server.head_started()
            left = size
            while left:
                piece = len(self.rfile.read(min(left, DISCARD_BYTES)))
                if not piece:
                    self.close_connection = True
                    return
                left -= piece
            return
        try:
            body = self.rfile.read(size)
        except BaseException:
            admitted.release()
            raise
        if len(body) < size:
            admitted.release()
            self.close_connection = True
            return  # the client went away mid-body: nothing to answer
        with app.stats.lock:
            app.stats.bytes += size
        code, answer, kind = app.handle(body, self.headers.get("Content-Type"), self.headers.get("Content-Encoding"),
                                        admitted)  # fmt: skip
        del body
        extra = {"Retry-After": str(RETRY_AFTER_SECONDS)} if code in (429, 503) else {}
        self._answer(code, answer, kind, extra)

    def _refuse_method(self) -> None:
        app: OtlpServer = self.server.app
        self._answer(*app.refuse(405, "method not allowed: POST /v1/logs"), {"Allow": "POST"}, close=True)

    def do_GET(self) -> None:
        """405: OTLP/HTTP only posts."""
        self._refuse_method()

    def do_PUT(self) -> None:
        """405: OTLP/HTTP only posts."""
        self._refuse_method()

    def _answer(
        self, code: int, body: bytes, kind: str, headers: Mapping[str, str] | None = None, *, close: bool = False
    ) -> None:
        if close:
            self.close_connection = True
        self.connection.settimeout(self.server.app.request_timeout)  # sendall: a bound on the whole answer
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if close:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Requests go to DEBUG: never one line per request at INFO."""
        _LOG.debug("otlp client=%s %s", self.address_string(), format % args)


class OtlpCollector(Collector):
    """The receiver's numbers for /metrics: requests by status code, failures by reason, records and bytes."""

    def __init__(
        self,
        server: OtlpServer,
        received: Callable[[], tuple[int, int, int]],
        spool_bytes: Callable[[], int] | None = None,
    ) -> None:
        self._server = server
        self._received = received  # (lines written to the spool, retried copies skipped, filtered out)
        self._spool_bytes = spool_bytes  # the spool's disk use

    def describe(self) -> Iterable[CounterMetricFamily]:
        """Nothing up front: the registry then never calls collect() at registration."""
        return []

    def collect(self) -> Iterable[CounterMetricFamily | GaugeMetricFamily]:
        """The counters, zero-initialised for the statuses a shipper most needs to see."""
        stats = self._server.stats
        with stats.lock:
            requests, failures = dict(stats.requests), dict(stats.failures)
            nbytes = stats.bytes
        family = CounterMetricFamily(f"{SELF}_otlp_requests", "OTLP/HTTP log requests answered, by status code.",
                                     labels=["code"])  # fmt: skip
        for code in sorted({"200", *requests}):
            family.add_metric([code], requests.get(code, 0))
        yield family
        family = CounterMetricFamily(f"{SELF}_otlp_request_failures", "OTLP/HTTP log requests refused, by reason "
                                     "(malformed, too_large, unsupported, unauthorized, overloaded, unavailable, ...).",
                                     labels=["reason"])  # fmt: skip
        for reason in sorted({"malformed", "too_large", "overloaded", "unavailable", "spool_full", *failures}):
            family.add_metric([reason], failures.get(reason, 0))
        yield family
        written, duplicates, filtered = self._received()
        family = CounterMetricFamily(f"{SELF}_otlp_log_records", "OTLP log records received in accepted requests: "
                                     "spooled, skipped as a retried copy of one spooled before, or filtered out "
                                     "(a source the filters leave out).", labels=["result"])  # fmt: skip
        family.add_metric(["spooled"], written)
        family.add_metric(["duplicate"], duplicates)
        family.add_metric(["filtered"], filtered)
        yield family
        yield CounterMetricFamily(f"{SELF}_otlp_received_bytes", "OTLP/HTTP request body bytes read (as sent).",
                                  value=nbytes)  # fmt: skip
        yield GaugeMetricFamily(f"{SELF}_otlp_inflight_bytes", "Memory the OTLP requests in flight have reserved "
                                "(bodies, inflated bodies, decoded records); past the budget, 429.",
                                value=self._server.budget.used)  # fmt: skip
        httpd = self._server.httpd
        yield CounterMetricFamily(f"{SELF}_otlp_connections_evicted", "OTLP connections closed at the connection "
                                  "cap while they sent their request head slowly or waited idle.",
                                  value=httpd.evicted if httpd is not None else 0)  # fmt: skip
        yield CounterMetricFamily(f"{SELF}_otlp_thread_start_failures", "OTLP connections closed unanswered because "
                                  "their handler thread could not start (memory or pids limit).",
                                  value=httpd.thread_failures if httpd is not None else 0)  # fmt: skip
        if self._spool_bytes is not None:
            yield GaugeMetricFamily(f"{SELF}_otlp_spool_bytes", "Bytes the OTLP spool takes on disk (logs, rotated "
                                    "segments, identity files).", value=self._spool_bytes())  # fmt: skip
