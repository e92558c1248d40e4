"""SGLang endpoint scraping: a side edge of the pipeline, beside the log tailers.

    SGLang /metrics --fetch--> bytes --parse_metrics--> KvSnapshot (history) --> metrics, event context
    SGLang /server_info (/get_server_info) --fetch--> bytes --parse_server_info--> ServerInfo

The logs stay the only source of OOM events; a scrape adds context: whether the server is up, how full
its KV pool was just before an event (snapshot_before), and the settings the runbooks name. One
ScrapeLoop thread per target calls TargetScraper.scrape_once, so a hanging target delays neither another
target nor the log tailing, and fetch holds one total deadline so that even a server that sends one byte
per second gives up on time. Failures set up=False with a reason from REASONS; nothing here raises into
a loop. Parsing, and the aggregation over ranks, live in sglang_metrics.py.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .http import LABELS, HttpError, get

if TYPE_CHECKING:  # the parsers are imported by the first scrape: a serve without targets never needs them
    from .sglang_metrics import KvSnapshot, ServerInfo

log = logging.getLogger(__name__)

Fetch = Callable[..., bytes]
# The `reason` label of the scrape and server-info error counters (a public interface; http.LABELS maps to it).
REASONS = ("refused", "timeout", "http_status", "not_metrics", "truncated", "too_large", "bad_json", "error")
# Ask for the classic text format (prometheus_client serves OpenMetrics only when asked for it).
ACCEPT = {"Accept": "text/plain;version=0.0.4;q=1.0, application/json;q=0.9, */*;q=0.1"}


def fetch(url: str, *, timeout: float, max_bytes: int) -> bytes:
    """GET one SGLang page: a 2xx body within the deadline and the cap, else HttpError."""
    return get(url, timeout=timeout, max_bytes=max_bytes, headers=ACCEPT)


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
        from .sglang_metrics import parse_metrics

        started = time.perf_counter()
        try:
            body = self._fetch(f"{self.url}/metrics", timeout=self.timeout, max_bytes=self.max_bytes)
            snapshot = parse_metrics(body, self.target, self._clock())
        except HttpError as exc:
            self._fail(LABELS[exc.reason].scrape, exc.detail, started)
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
        from .sglang_metrics import INFO_PATHS, parse_server_info

        self._next_info = self._clock() + self._info_every  # failures wait for the next turn too
        paths = (self._info_path,) if self._info_path else INFO_PATHS
        for path in paths:
            try:
                info = parse_server_info(
                    self._fetch(f"{self.url}{path}", timeout=self.timeout, max_bytes=self.max_bytes)
                )
            except HttpError as exc:
                if exc.status == 404 and path != paths[-1]:
                    continue  # older releases serve only /get_server_info
                if exc.status == 404:
                    self._info_path = None  # a restart into another version: try every path next time
                reason = LABELS[exc.reason].server_info
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
    def last_success(self) -> float | None:
        """Wall time of the last good /metrics scrape (kept while down), or None when none worked yet."""
        with self._lock:
            return self._history[-1].time if self._history else None

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

    def snapshot_values(self) -> dict[str, float]:
        """The last good snapshot's numeric values (metrics.TargetView)."""
        snap = self.snapshot
        if snap is None:
            return {}
        return {k: float(v) for k, v in snap.as_dict().items() if isinstance(v, int | float) and k != "time"}

    def snapshot_labels(self) -> dict[str, str]:
        """SGLang labels of the last good snapshot the mirrored values keep (metrics.TargetView): engine_type."""
        snap = self.snapshot
        return {"engine_type": snap.engine_type} if snap is not None and snap.engine_type else {}

    def server_args(self) -> dict[str, Any]:
        """The last server info's args (metrics.TargetView)."""
        info = self.server_info
        return dict(info.args) if info else {}


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
