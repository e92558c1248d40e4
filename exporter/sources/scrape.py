"""SGLang endpoint scraping: a side edge of the pipeline, beside the log tailers.

    SGLang /metrics --fetch--> bytes --parse_metrics--> KvSnapshot (history) --> metrics, event context
    SGLang /server_info (/get_server_info) --fetch--> bytes --parse_server_info--> ServerInfo

The logs stay the only source of OOM events; a scrape adds context: whether the server is up, how full
its KV pool was just before an event (snapshot_before), and the settings the runbooks name. One
ScrapeLoop thread per target calls TargetScraper.scrape_once, so a hanging target delays neither another
target nor the log tailing, and fetch holds one total deadline so that even a server that sends one byte
per second gives up on time. Failures set up=False with a reason from REASONS; nothing here raises into
a loop.

Aggregation when one SGLang name has several series (ranks, DP groups, processes):
  1. Sum over the `pid` label first. Multiprocess gauges without a mode (num_retracted_reqs) carry one
     series per process, and the pid changes with every restart.
  2. Usage and ratio gauges (token_usage, new_token_ratio): the max over the remaining series, i.e. the
     worst rank, because the worst rank is the one that runs out.
  3. Token and request counts (and counters): group by `dp_rank` (absent = one group), take the max
     within a group, then sum the groups. Each DP group owns its own KV pool and requests, while the TP
     (and PP, MoE-EP) ranks of one group mirror the same pool; any other label (engine_type, model_name,
     extra labels) is treated like tp_rank.
Counters are read from their `_total` samples; sglang:total_retracted_reqs (0.4.10, cumulative although
typed gauge) feeds retracted_requests_total like the 0.5.8+ counter. Nothing here exports: metrics.py reads
the scrapers and yields the values under sglang_oom_target_* names, never SGLang's `sglang:` ones.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import ssl
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from sglang_oom_exporter import __version__

log = logging.getLogger(__name__)

REASONS = ("refused", "timeout", "http_status", "not_metrics", "truncated", "too_large", "bad_json", "error")
INFO_KEYS = (
    "chunked_prefill_size", "max_prefill_tokens", "max_running_requests", "mem_fraction_static", "page_size",
    "context_length", "speculative_algorithm", "speculative_num_draft_tokens", "speculative_num_steps",
    "speculative_eagle_topk", "schedule_conservativeness", "max_mamba_cache_size", "max_total_num_tokens",
    "version", "model_path", "served_model_name",
)  # fmt: skip
INFO_PATHS = ("/server_info", "/get_server_info")  # newest first; the old path is a deprecated alias
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


@dataclass(frozen=True, slots=True)
class KvSnapshot:
    """KV-related values of one target at one scrape, aggregated over ranks; None when not exposed."""

    target: str
    time: float  # wall seconds when the body arrived
    token_usage: float | None = None
    num_used_tokens: float | None = None
    max_total_num_tokens: float | None = None
    kv_available_tokens: float | None = None
    kv_evictable_tokens: float | None = None
    kv_used_tokens: float | None = None
    running_requests: float | None = None
    queued_requests: float | None = None
    retracted_requests_total: float | None = None
    retracted_reqs: float | None = None
    aborted_requests_total: float | None = None
    new_token_ratio: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """Target, time and the values that are present."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}


_MAX, _COUNT = "max", "count"
# Snapshot field -> (aggregation, SGLang sample names, first present wins).
_SOURCES: dict[str, tuple[str, tuple[str, ...]]] = {
    "token_usage": (_MAX, ("sglang:token_usage",)),
    "num_used_tokens": (_COUNT, ("sglang:num_used_tokens",)),
    "max_total_num_tokens": (_COUNT, ("sglang:max_total_num_tokens",)),
    "kv_available_tokens": (_COUNT, ("sglang:kv_available_tokens",)),
    "kv_evictable_tokens": (_COUNT, ("sglang:kv_evictable_tokens",)),
    "kv_used_tokens": (_COUNT, ("sglang:kv_used_tokens",)),
    "running_requests": (_COUNT, ("sglang:num_running_reqs",)),
    "queued_requests": (_COUNT, ("sglang:num_queue_reqs",)),
    "retracted_requests_total": (_COUNT, ("sglang:num_retracted_requests_total", "sglang:total_retracted_reqs")),
    "retracted_reqs": (_COUNT, ("sglang:num_retracted_reqs",)),
    "aborted_requests_total": (_COUNT, ("sglang:num_aborted_requests_total",)),
    "new_token_ratio": (_MAX, ("sglang:new_token_ratio",)),
}
_Series = list[tuple[dict[str, str], float]]


def parse_metrics(body: bytes, target: str, now: float) -> KvSnapshot:
    """Parse one SGLang /metrics body into a KvSnapshot; ScrapeError(not_metrics) when it is none."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScrapeError("not_metrics", f"body is not UTF-8 text: {exc}") from None
    head = text.lstrip()[:512].lower()
    if head.startswith("<") or "<html" in head:
        raise ScrapeError("not_metrics", "body is HTML")
    series: defaultdict[str, _Series] = defaultdict(list)
    families = 0
    try:
        for family in text_string_to_metric_families(text):
            families += family.name.startswith("sglang:")
            for sample in family.samples:
                if sample.name.startswith("sglang:") and not math.isnan(sample.value):
                    series[sample.name].append((sample.labels, sample.value))
    except Exception as exc:  # the parser raises several types; any of them means "not metrics"
        raise ScrapeError("not_metrics", f"unparsable: {str(exc)[:120]}") from exc
    if not families and not series:
        raise ScrapeError("not_metrics", "no sglang: metric family")
    values: dict[str, float] = {}
    for field, (rule, names) in _SOURCES.items():
        found = next((series[n] for n in names if series.get(n)), None)
        if found:
            values[field] = _aggregate(found, rule)
    return KvSnapshot(target, now, **values)


def _aggregate(series: _Series, rule: str) -> float:
    merged: dict[frozenset[tuple[str, str]], float] = defaultdict(float)
    for labels, value in series:
        merged[frozenset((k, v) for k, v in labels.items() if k != "pid")] += value
    if rule == _MAX:
        return max(merged.values())
    groups: dict[str, float] = {}
    for key, value in merged.items():
        dp = dict(key).get("dp_rank", "")
        groups[dp] = max(groups.get(dp, value), value)
    return sum(groups.values())


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """The server-info settings the runbooks use (only keys the server sent) and its top-level key count."""

    args: Mapping[str, Any]
    raw_keys: int


def parse_server_info(body: bytes) -> ServerInfo:
    """Parse a /server_info or /get_server_info body; ScrapeError(bad_json) unless a JSON object."""
    try:
        raw = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise ScrapeError("bad_json", f"not JSON: {str(exc)[:120]}") from None
    if not isinstance(raw, dict):
        raise ScrapeError("bad_json", f"JSON {type(raw).__name__}, not an object")
    args = {k: raw[k] for k in INFO_KEYS if k in raw and isinstance(raw[k], str | int | float | bool | type(None))}
    if args.get("max_total_num_tokens") is None:
        # Releases that keep scheduler info per DP rank put it in internal_states only; rank 0 first,
        # the same per-rank meaning as the top-level value.
        states = raw.get("internal_states")
        for state in states if isinstance(states, list) else [states]:
            value = state.get("max_total_num_tokens") if isinstance(state, dict) else None
            if isinstance(value, int | float) and not isinstance(value, bool):
                args["max_total_num_tokens"] = value
                break
    return ServerInfo(MappingProxyType(args), len(raw))


# ---------------------------------------------------------------------------------------------- scrape

Fetch = Callable[..., bytes]


class TargetScraper:
    """One SGLang endpoint: scrape_once() from one thread, the properties from any thread."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 5.0,
        max_bytes: int = 8 << 20,
        fetch: Fetch = fetch,
        clock: Callable[[], float] = time.time,
        info_every: float = 60.0,
        history: int = 120,
    ) -> None:
        self.url = self.target = url.rstrip("/")
        self.timeout = timeout
        self.max_bytes = max_bytes
        self._fetch = fetch
        self._clock = clock
        self._info_every = info_every
        self._lock = threading.Lock()
        self._up = False
        self._last_error = "not scraped yet"
        self._duration = 0.0
        self._history: deque[KvSnapshot] = deque(maxlen=history)
        self._info: ServerInfo | None = None
        self._info_path: str | None = None  # the path that answered last; None: try INFO_PATHS in order
        self._next_info = -math.inf
        self._errors = dict.fromkeys(REASONS, 0)
        self._info_errors = dict.fromkeys(REASONS, 0)

    def scrape_once(self, stop: threading.Event | None = None) -> None:
        """Fetch and parse /metrics once, and the server info when due; never raises."""
        started = time.perf_counter()
        try:
            body = self._fetch(f"{self.url}/metrics", timeout=self.timeout, max_bytes=self.max_bytes)
            snapshot = parse_metrics(body, self.target, self._clock())
        except ScrapeError as exc:
            self._fail(exc.reason, exc.detail, started)
            return
        except Exception as exc:  # an injected fetch or a bug must not kill the scrape thread
            self._fail("error", f"{type(exc).__name__}: {exc}", started)
            return
        with self._lock:
            came_up = not self._up
            self._up, self._last_error = True, ""
            self._duration = time.perf_counter() - started
            self._history.append(snapshot)
        if came_up:
            log.info("target up target=%s", self.target)
            self._info_path, self._next_info = None, -math.inf  # a restart may have changed version and settings
        if (stop is None or not stop.is_set()) and self._clock() >= self._next_info:
            self._refresh_info()

    def _fail(self, reason: str, detail: str, started: float) -> None:
        message = f"{reason}: {detail}"
        with self._lock:
            # Log on a change only: a target down for hours must not write a line per interval.
            changed = self._up or message != self._last_error
            self._up, self._last_error = False, message
            self._duration = time.perf_counter() - started
            self._errors[reason] = self._errors.get(reason, 0) + 1
        if changed:
            log.warning("target down target=%s reason=%s detail=%s", self.target, reason, detail)

    def _refresh_info(self) -> None:
        self._next_info = self._clock() + self._info_every  # failures wait for the next turn too
        paths = (self._info_path,) if self._info_path else INFO_PATHS
        for path in paths:
            try:
                info = parse_server_info(
                    self._fetch(f"{self.url}{path}", timeout=self.timeout, max_bytes=self.max_bytes)
                )
            except ScrapeError as exc:
                if exc.status == 404 and path != paths[-1]:
                    continue  # older releases serve only /get_server_info
                if exc.status == 404:
                    self._info_path = None  # a restart into another version: try every path next time
                reason = exc.reason
            except Exception:  # the info is optional: see scrape_once
                reason = "error"
            else:
                with self._lock:
                    self._info, self._info_path = info, path
                return
            with self._lock:
                self._info_errors[reason] += 1
            log.debug("server info failed target=%s reason=%s", self.target, reason)
            return

    @property
    def up(self) -> bool:
        """Whether the last /metrics scrape succeeded."""
        with self._lock:
            return self._up

    @property
    def last_error(self) -> str:
        """Reason and detail of the last failure; empty while up."""
        with self._lock:
            return self._last_error

    @property
    def duration(self) -> float:
        """Seconds the last /metrics scrape took, success or not."""
        with self._lock:
            return self._duration

    @property
    def snapshot(self) -> KvSnapshot | None:
        """The last good snapshot (kept while down, so callers check up)."""
        with self._lock:
            return self._history[-1] if self._history else None

    @property
    def history(self) -> tuple[KvSnapshot, ...]:
        """The last good snapshots, oldest first."""
        with self._lock:
            return tuple(self._history)

    def snapshot_before(self, t: float) -> KvSnapshot | None:
        """The newest snapshot taken at or before wall time t."""
        with self._lock:
            return next((s for s in reversed(self._history) if s.time <= t), None)

    @property
    def server_info(self) -> ServerInfo | None:
        """The last good server info, or None when it never answered."""
        with self._lock:
            return self._info

    @property
    def errors_total(self) -> dict[str, int]:
        """Failed /metrics scrapes by reason."""
        with self._lock:
            return dict(self._errors)

    @property
    def info_errors_total(self) -> dict[str, int]:
        """Failed server-info fetches by reason (they never set up=False)."""
        with self._lock:
            return dict(self._info_errors)


class ScrapeLoop:
    """One daemon thread per target, each calling scrape_once every interval seconds."""

    def __init__(self, scrapers: Sequence[TargetScraper], interval: float) -> None:
        if interval <= 0:
            raise ValueError(f"scrape interval must be positive, not {interval}")
        self._scrapers = tuple(scrapers)
        self._interval = interval
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Start the threads; the first scrape of each target happens at once."""
        if self._threads:
            raise RuntimeError("ScrapeLoop already started")
        self._stop.clear()
        for scraper in self._scrapers:
            thread = threading.Thread(target=self._run, args=(scraper,), name=f"scrape {scraper.target}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _run(self, scraper: TargetScraper) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            scraper.scrape_once(self._stop)
            self._stop.wait(max(0.0, self._interval - (time.monotonic() - started)))

    def stop(self) -> bool:
        """Stop and join every thread within the longest timeout + 1 s; False if one is still running."""
        self._stop.set()
        # A thread can be inside one fetch, which ends by its own deadline; scrape_once skips the rest.
        deadline = time.monotonic() + max((s.timeout for s in self._scrapers), default=0.0) + 1.0
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        self._threads = []
        if alive:
            log.warning("scrape threads still running after stop threads=%s", alive)
        return not alive
