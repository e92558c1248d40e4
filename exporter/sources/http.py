"""The one HTTP client: the SGLang scrape (/metrics, server info), node discovery's pod list, the Events poster.

    request(method, url, timeout, max_bytes, [body, headers, tls]) --> Response(status, body) | HttpError(Reason)

http.client does the protocol (status line, headers, chunking, Content-Length). Its timeout applies per
socket operation, so a server that sends one byte per second would never trip it; here the connect and the
TLS handshake get the time left, and every read goes through DeadlineReader and gets only the time left
before one deadline for the whole call. A body past max_bytes is refused (too_large) instead of filling memory.
TLS verifies against the system's CAs, or a given CA file (the pod's service account's); bearer() reads the
service account's token for the Authorization header, on every call (kubelet rotates projected tokens).

Every failure is an HttpError with a Reason. The callers' metric labels are older than this client and a public
interface, and they name some reasons differently: LABELS is the one place that maps each Reason to each
caller's label.
"""

from __future__ import annotations

import http.client
import io
import socket
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, NamedTuple
from urllib.parse import urlsplit

from .. import __version__

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

_READ_SIZE = 64 << 10
USER_AGENT = f"sglang-oom-exporter/{__version__}"


class Reason(Enum):
    """Why a call gave no usable answer."""

    TIMEOUT = "timeout"  # the deadline passed (connect, handshake, or before the whole answer arrived)
    REFUSED = "refused"  # the connection was refused: the request never reached the server
    TLS = "tls"  # the CA could not be loaded, or the handshake or the certificate check failed
    NO_TOKEN = "no_token"  # noqa: S105 - a reason, not a secret: the bearer token file is missing or empty
    TOO_LARGE = "too_large"  # the body is over max_bytes
    HTTP_STATUS = "http_status"  # an answer, but not the status the caller needs
    TRUNCATED = "truncated"  # the connection closed before the body Content-Length or chunking promised
    BAD_BODY = "bad_body"  # the body is not what the caller reads (not Prometheus text, not JSON)
    ERROR = "error"  # anything else: a bad URL, a name that does not resolve, a protocol error


class HttpError(Exception):
    """A call that gave no usable answer: reason, a detail for the log, and the HTTP status when there was one."""

    def __init__(self, reason: Reason, detail: str, status: int | None = None) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail
        self.status = status


class Labels(NamedTuple):
    """One Reason's label in each caller's metric."""

    scrape: str  # sglang_oom_exporter_target_scrape_errors_total{reason} (SGLang /metrics)
    server_info: str  # sglang_oom_exporter_target_server_info_errors_total{reason}
    discovery: str  # sglang_oom_exporter_discovery_errors_total{reason} (node discovery's pod list)
    k8s_events: str  # sglang_oom_exporter_k8s_events_total{result} (the Events poster)


# fmt: off
LABELS: dict[Reason, Labels] = {
    #                         scrape         server_info    discovery      k8s_events
    Reason.TIMEOUT:     Labels("timeout",     "timeout",     "timeout",     "timeout"),
    Reason.REFUSED:     Labels("refused",     "refused",     "refused",     "unreachable"),
    Reason.TLS:         Labels("error",       "error",       "tls",         "tls"),
    Reason.NO_TOKEN:    Labels("error",       "error",       "no_token",    "no_token"),
    Reason.TOO_LARGE:   Labels("too_large",   "too_large",   "too_large",   "error"),
    Reason.HTTP_STATUS: Labels("http_status", "http_status", "http_status", "http_error"),
    Reason.TRUNCATED:   Labels("truncated",   "truncated",   "error",       "error"),
    Reason.BAD_BODY:    Labels("not_metrics", "bad_json",    "bad_json",    "error"),
    Reason.ERROR:       Labels("error",       "error",       "error",       "error"),
}
# fmt: on


@dataclass(frozen=True, slots=True)
class Response:
    """An answer: any HTTP status, the whole body (at most max_bytes), and the Retry-After header when sent."""

    status: int
    body: bytes
    retry_after: str | None = None  # the header as sent (the Events poster waits by it on a 429 or 5xx)


class DeadlineReader(io.RawIOBase):
    """A socket's read side under one total deadline, and optionally a byte budget.

    A per-recv timeout alone lets a peer that sends a byte every few seconds hold a thread for ever; here
    every recv waits at most until the one deadline. The client reads responses through it, and the HTTP
    edge reads request heads through it (with a budget: too_large is raised once it is spent).
    """

    def __init__(
        self, sock: socket.socket, deadline: float, *, budget: int | None = None, too_large: Exception | None = None
    ) -> None:
        super().__init__()
        self._sock, self._deadline, self._budget = sock, deadline, budget
        self._too_large = too_large or OSError("read budget spent")

    def readable(self) -> bool:
        """Always: this is a reader."""
        return True

    def rearm(self, deadline: float, budget: int | None = None) -> None:
        """A new deadline and byte budget (the next request on a kept-alive connection, or a request's body)."""
        self._deadline, self._budget = deadline, budget

    def readinto(self, buffer: WriteableBuffer) -> int:
        """recv into buffer with the time that is left; TimeoutError once the deadline has passed."""
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("deadline passed")
        view = memoryview(buffer).cast("B")
        size = len(view)
        if self._budget is not None:
            if self._budget <= 0:
                raise self._too_large
            size = min(size, self._budget)
        self._sock.settimeout(remaining)
        n = self._sock.recv_into(view, size)
        if self._budget is not None:
            self._budget -= n
        return n


class _DeadlineSocket:
    """What http.client.HTTPResponse needs of a socket (makefile), reading under the call's deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock, self._deadline = sock, deadline

    def makefile(self, _mode: str) -> io.BufferedReader:
        return io.BufferedReader(DeadlineReader(self._sock, self._deadline), _READ_SIZE)


def tls_context(ca_file: str | None = None) -> ssl.SSLContext:
    """A verifying client context: the system's CAs, or only ca_file's; HttpError(TLS) when it cannot be loaded."""
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise HttpError(Reason.TLS, f"cannot load the CA {ca_file}: {exc}") from exc


def bearer(token_file: str) -> dict[str, str]:
    """The Authorization header of a service account's token file; HttpError(NO_TOKEN) when it has none."""
    try:
        with open(token_file, encoding="utf-8") as fh:
            token = fh.read().strip()
    except OSError as exc:
        raise HttpError(Reason.NO_TOKEN, f"cannot read {token_file}: {exc.strerror or exc}") from exc
    if not token:
        raise HttpError(Reason.NO_TOKEN, f"{token_file} is empty")
    return {"Authorization": f"Bearer {token}"}


def request(
    method: str,
    url: str,
    *,
    timeout: float,
    max_bytes: int,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    tls: ssl.SSLContext | None = None,
) -> Response:
    """One call within a total deadline of timeout seconds: any status is an answer; HttpError when there is none.

    tls is the context for an https URL (the system's CAs when None). One request per connection.
    """
    deadline = time.monotonic() + timeout
    parts = urlsplit(url)
    # Control characters or non-ASCII would corrupt (or inject into) the request line.
    if parts.scheme not in ("http", "https") or not parts.hostname or not url.isascii() or not url.isprintable():
        raise HttpError(Reason.ERROR, f"unsupported URL {url!r}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise HttpError(Reason.ERROR, f"bad port in {url!r}") from exc
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    where = f"{parts.hostname}:{port}"
    sent = {"User-Agent": USER_AGENT, "Connection": "close", **(headers or {})}
    conn = _connection(parts.hostname, port, parts.scheme == "https", tls, deadline)
    try:
        try:
            conn.connect()  # name resolution is not bounded by the deadline (getaddrinfo has none)
        except ConnectionRefusedError as exc:
            raise HttpError(Reason.REFUSED, f"connection refused by {where}") from exc
        assert conn.sock is not None  # noqa: S101 - connect() connected it
        conn.sock.settimeout(max(deadline - time.monotonic(), 0.001))
        conn.request(method, path, body=body, headers=sent)
        response = http.client.HTTPResponse(_DeadlineSocket(conn.sock, deadline), method=method)  # type: ignore[arg-type]
        response.begin()
        return Response(response.status, _read_body(response, max_bytes), response.getheader("Retry-After"))
    except HttpError:
        raise
    except ssl.SSLError as exc:  # an OSError too: before the general case
        raise HttpError(Reason.TLS, f"TLS with {where} failed: {exc}") from exc
    except TimeoutError:
        raise HttpError(Reason.TIMEOUT, f"{where} gave no whole answer within {timeout:g}s") from None
    except http.client.IncompleteRead as exc:
        raise HttpError(Reason.TRUNCATED, f"{len(exc.partial)} body bytes, then the connection closed") from None
    except (http.client.HTTPException, OSError) as exc:
        raise HttpError(Reason.ERROR, f"{where}: {type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()


def get(url: str, *, timeout: float, max_bytes: int, headers: Mapping[str, str] | None = None) -> bytes:
    """GET url with request()'s deadline and cap; the body of a 2xx answer, else HttpError(HTTP_STATUS)."""
    response = request("GET", url, timeout=timeout, max_bytes=max_bytes, headers=headers)
    if not 200 <= response.status < 300:
        raise HttpError(Reason.HTTP_STATUS, f"HTTP {response.status}", response.status)
    return response.body


def _connection(
    host: str, port: int, https: bool, tls: ssl.SSLContext | None, deadline: float
) -> http.client.HTTPConnection:
    timeout = max(deadline - time.monotonic(), 0.001)
    if https:
        return http.client.HTTPSConnection(host, port, timeout=timeout, context=tls or ssl.create_default_context())
    return http.client.HTTPConnection(host, port, timeout=timeout)


def _read_body(response: http.client.HTTPResponse, max_bytes: int) -> bytes:
    """The body (http.client undoes chunking and checks Content-Length), refused past max_bytes."""
    if response.length is not None and response.length > max_bytes:
        raise HttpError(Reason.TOO_LARGE, f"Content-Length {response.length} over the {max_bytes}-byte cap")
    body = bytearray()
    while data := response.read(min(_READ_SIZE, max_bytes + 1 - len(body))):
        body += data
        if len(body) > max_bytes:
            raise HttpError(Reason.TOO_LARGE, f"body over the {max_bytes}-byte cap")
    if response.length:  # read(amt) ends quietly at EOF; what Content-Length promised and never came
        raise HttpError(Reason.TRUNCATED, f"{len(body)} body bytes, {response.length} short of Content-Length")
    return bytes(body)
