"""One HTTP GET with a total deadline and a body cap: the transport under the SGLang scraper.

urllib's timeout applies per socket operation, so a server that sends one byte per second never trips it;
here every read gets only the time left before one deadline, and a body past max_bytes is cut (too_large)
instead of filling memory. Failures are ScrapeErrors with a reason from a fixed set (a metric label).
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Mapping
from urllib.parse import urlsplit

from .. import __version__

REASONS = ("refused", "timeout", "http_status", "not_metrics", "truncated", "too_large", "bad_json", "error")
_HEAD_LIMIT = 64 << 10
_READ_SIZE = 64 << 10
# Ask for the classic text format: prometheus_client serves OpenMetrics only when asked for it.
_ACCEPT = "text/plain;version=0.0.4;q=1.0, application/json;q=0.9, */*;q=0.1"


class ScrapeError(Exception):
    """A failed fetch or parse; reason is one of REASONS, status the HTTP status when there was one."""

    def __init__(self, reason: str, detail: str, status: int | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason if reason in REASONS else "error"
        self.detail = detail
        self.status = status


# ---------------------------------------------------------------------------------------------- fetch


class _Conn:
    """A socket read under one total deadline: every recv gets only the time that is left."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.buf = bytearray()

    def fill(self, what: str) -> bool:
        """Read more bytes into buf; False at EOF or when the peer broke the connection."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise ScrapeError("timeout", f"deadline passed while reading the {what}")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(_READ_SIZE)
        except TimeoutError:
            raise ScrapeError("timeout", f"deadline passed while reading the {what}") from None
        except (ConnectionError, ssl.SSLError):
            return False
        self.buf += data
        return bool(data)

    def need(self, size: int, what: str) -> bool:
        """Read until buf holds size bytes; False at EOF before that."""
        while len(self.buf) < size:
            if not self.fill(what):
                return False
        return True

    def find(self, sep: bytes, start: int, limit: int, what: str, eof: str = "error") -> int:
        """Index of sep at or after start, reading as needed; ScrapeError past limit bytes or (eof) at EOF."""
        while (at := self.buf.find(sep, start)) < 0:
            if len(self.buf) - start > limit:
                raise ScrapeError("error", f"{what} longer than {limit} bytes")
            if not self.fill(what):
                raise ScrapeError(eof, f"connection closed in the {what}")
        return at


def fetch(url: str, *, timeout: float, max_bytes: int) -> bytes:
    """GET url within a total deadline of timeout seconds and return a 2xx body of at most max_bytes."""
    deadline = time.monotonic() + timeout
    parts = urlsplit(url)
    # Control characters or non-ASCII would corrupt (or inject into) the request line we write by hand.
    if parts.scheme not in ("http", "https") or not parts.hostname or not url.isascii() or not url.isprintable():
        raise ScrapeError("error", f"unsupported URL {url!r}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise ScrapeError("error", f"bad port in {url!r}") from exc
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {parts.netloc.rpartition('@')[2]}\r\n"
        f"User-Agent: sglang-oom-exporter/{__version__}\r\nAccept: {_ACCEPT}\r\n"
        "Accept-Encoding: identity\r\nConnection: close\r\n\r\n"
    ).encode("ascii")
    sock = _connect(parts.hostname, port, parts.scheme == "https", deadline)
    try:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        sock.sendall(request)
        conn = _Conn(sock, deadline)
        status, headers, start = _read_head(conn)
        if not 200 <= status < 300:
            raise ScrapeError("http_status", f"HTTP {status}", status)
        return _read_body(conn, headers, start, max_bytes)
    except TimeoutError:
        raise ScrapeError("timeout", "deadline passed while sending the request") from None
    except OSError as exc:
        raise ScrapeError("error", f"{type(exc).__name__}: {exc}") from exc
    finally:
        sock.close()


def _connect(host: str, port: int, tls: bool, deadline: float) -> socket.socket:
    # Name resolution is not bounded by the timeout (getaddrinfo has none); targets are usually literal.
    try:
        sock = socket.create_connection((host, port), timeout=max(deadline - time.monotonic(), 0.001))
        if tls:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
    except ConnectionRefusedError as exc:
        raise ScrapeError("refused", f"connection refused by {host}:{port}") from exc
    except TimeoutError:
        raise ScrapeError("timeout", f"no connection to {host}:{port} within the deadline") from None
    except OSError as exc:
        raise ScrapeError("error", f"cannot connect to {host}:{port}: {exc}") from exc
    return sock


def _read_head(conn: _Conn) -> tuple[int, dict[str, str], int]:
    end = conn.find(b"\r\n\r\n", 0, _HEAD_LIMIT, "response headers")
    lines = bytes(conn.buf[:end]).decode("latin-1").split("\r\n")
    parts = lines[0].split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ScrapeError("error", f"not an HTTP response: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers, end + 4


def _read_body(conn: _Conn, headers: Mapping[str, str], start: int, max_bytes: int) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return _read_chunked(conn, start, max_bytes)
    if "content-length" in headers:
        try:
            length = int(headers["content-length"])
        except ValueError:
            raise ScrapeError("error", f"bad Content-Length {headers['content-length']!r}") from None
        if length > max_bytes:
            raise ScrapeError("too_large", f"Content-Length {length} over the {max_bytes}-byte cap")
        if not conn.need(start + length, "body"):
            raise ScrapeError("truncated", f"{len(conn.buf) - start} of {length} body bytes before EOF")
        return bytes(conn.buf[start : start + length])
    while conn.fill("body"):  # no length: the body ends when the server closes
        if len(conn.buf) - start > max_bytes:
            raise ScrapeError("too_large", f"body over the {max_bytes}-byte cap")
    return bytes(conn.buf[start:])


def _read_chunked(conn: _Conn, pos: int, max_bytes: int) -> bytes:
    body = bytearray()
    while True:
        eol = conn.find(b"\r\n", pos, 1024, "chunk header", "truncated")
        try:
            size = int(bytes(conn.buf[pos:eol]).split(b";")[0], 16)
        except ValueError:
            raise ScrapeError("error", "bad chunk size") from None
        pos = eol + 2
        if size == 0:
            return bytes(body)  # trailers, if any, carry nothing we use
        if len(body) + size > max_bytes:
            raise ScrapeError("too_large", f"body over the {max_bytes}-byte cap")
        if not conn.need(pos + size + 2, "body"):
            raise ScrapeError("truncated", "connection closed inside a chunk")
        body += conn.buf[pos : pos + size]
        pos += size + 2


# ---------------------------------------------------------------------------------------------- parse
