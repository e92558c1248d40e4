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
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from ..sources.http import REASONS, ScrapeError, fetch

log = logging.getLogger(__name__)

INFO_KEYS = (
    "chunked_prefill_size", "max_prefill_tokens", "max_running_requests", "mem_fraction_static", "page_size",
    "context_length", "speculative_algorithm", "speculative_num_draft_tokens", "speculative_num_steps",
    "speculative_eagle_topk", "schedule_conservativeness", "max_mamba_cache_size", "max_total_num_tokens",
    "version", "model_path", "served_model_name",
)  # fmt: skip
INFO_PATHS = ("/server_info", "/get_server_info")  # newest first; the old path is a deprecated alias


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

    def snapshot_values(self) -> dict[str, float]:
        """The last good snapshot's numeric values (metrics.TargetView)."""
        snap = self.snapshot
        if snap is None:
            return {}
        return {k: float(v) for k, v in snap.as_dict().items() if isinstance(v, int | float) and k != "time"}

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
