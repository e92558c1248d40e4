"""One HTTP GET with a total deadline and a body cap: the transport under the SGLang scraper.

http.client does the protocol (status line, headers, chunking, Content-Length). Its timeout applies per
socket operation, so a server that sends one byte per second would never trip it; here every read goes
through DeadlineReader and gets only the time left before one deadline, and a body past max_bytes is cut
(too_large) instead of filling memory. Failures are ScrapeErrors with a reason from a fixed set (a metric label).
"""

from __future__ import annotations

import http.client
import io
import socket
import ssl
import time
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from .. import __version__

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

REASONS = ("refused", "timeout", "http_status", "not_metrics", "truncated", "too_large", "bad_json", "error")
_READ_SIZE = 64 << 10
# Ask for the classic text format (prometheus_client serves OpenMetrics only when asked for it), and one
# request per connection. http.client adds Host and Accept-Encoding: identity.
_HEADERS = {
    "User-Agent": f"sglang-oom-exporter/{__version__}",
    "Accept": "text/plain;version=0.0.4;q=1.0, application/json;q=0.9, */*;q=0.1",
    "Connection": "close",
}


class ScrapeError(Exception):
    """A failed fetch or parse; reason is one of REASONS, status the HTTP status when there was one."""

    def __init__(self, reason: str, detail: str, status: int | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason if reason in REASONS else "error"
        self.detail = detail
        self.status = status


# ---------------------------------------------------------------------------------------------- fetch


class DeadlineReader(io.RawIOBase):
    """A socket's read side under one total deadline, and optionally a byte budget.

    A per-recv timeout alone lets a peer that sends a byte every few seconds hold a thread for ever; here
    every recv waits at most until the one deadline. The scraper reads responses through it, and the HTTP
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
    """What http.client.HTTPResponse needs of a socket (makefile), reading under the fetch's deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock, self._deadline = sock, deadline

    def makefile(self, _mode: str) -> io.BufferedReader:
        return io.BufferedReader(DeadlineReader(self._sock, self._deadline), _READ_SIZE)


def fetch(url: str, *, timeout: float, max_bytes: int) -> bytes:
    """GET url within a total deadline of timeout seconds and return a 2xx body of at most max_bytes."""
    deadline = time.monotonic() + timeout
    parts = urlsplit(url)
    # Control characters or non-ASCII would corrupt (or inject into) the request line.
    if parts.scheme not in ("http", "https") or not parts.hostname or not url.isascii() or not url.isprintable():
        raise ScrapeError("error", f"unsupported URL {url!r}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise ScrapeError("error", f"bad port in {url!r}") from exc
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn = _connect(parts.hostname, port, parts.scheme == "https", deadline)
    try:
        assert conn.sock is not None  # noqa: S101 - _connect connected it
        conn.sock.settimeout(max(deadline - time.monotonic(), 0.001))
        conn.request("GET", path, headers=_HEADERS)
        response = http.client.HTTPResponse(_DeadlineSocket(conn.sock, deadline), method="GET")  # type: ignore[arg-type]
        response.begin()
        if not 200 <= response.status < 300:
            raise ScrapeError("http_status", f"HTTP {response.status}", response.status)
        return _read_body(response, max_bytes)
    except TimeoutError:
        raise ScrapeError("timeout", "deadline passed before the whole response arrived") from None
    except http.client.IncompleteRead as exc:
        raise ScrapeError("truncated", f"{len(exc.partial)} body bytes, then the connection closed") from None
    except (http.client.HTTPException, OSError) as exc:
        raise ScrapeError("error", f"{type(exc).__name__}: {exc}") from exc
    finally:
        conn.close()


def _connect(host: str, port: int, tls: bool, deadline: float) -> http.client.HTTPConnection:
    # Name resolution is not bounded by the timeout (getaddrinfo has none); targets are usually literal.
    timeout = max(deadline - time.monotonic(), 0.001)
    conn = (
        http.client.HTTPSConnection(host, port, timeout=timeout, context=ssl.create_default_context())
        if tls
        else http.client.HTTPConnection(host, port, timeout=timeout)
    )
    try:
        conn.connect()
    except ConnectionRefusedError as exc:
        raise ScrapeError("refused", f"connection refused by {host}:{port}") from exc
    except TimeoutError:
        raise ScrapeError("timeout", f"no connection to {host}:{port} within the deadline") from None
    except OSError as exc:
        raise ScrapeError("error", f"cannot connect to {host}:{port}: {exc}") from exc
    return conn


def _read_body(response: http.client.HTTPResponse, max_bytes: int) -> bytes:
    """The body (http.client undoes chunking and checks Content-Length), cut at max_bytes."""
    if response.length is not None and response.length > max_bytes:
        raise ScrapeError("too_large", f"Content-Length {response.length} over the {max_bytes}-byte cap")
    body = bytearray()
    while data := response.read(min(_READ_SIZE, max_bytes + 1 - len(body))):
        body += data
        if len(body) > max_bytes:
            raise ScrapeError("too_large", f"body over the {max_bytes}-byte cap")
    if response.length:  # read(amt) ends quietly at EOF; what Content-Length promised and never came
        raise ScrapeError("truncated", f"{len(body)} body bytes, {response.length} short of Content-Length")
    return bytes(body)


# ---------------------------------------------------------------------------------------------- parse
