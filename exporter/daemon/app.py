"""`serve`: wires sources -> pipelines -> counters/event store -> HTTP. The only place with a thread loop.

One LogSource per followed file: a FileTailer feeding its own Pipeline. The loop wakes on file events
(or a poll tick), polls every tailer, ticks every pipeline (a group waiting for its traceback is emitted
when its wait is over), and saves the state file every few seconds and on shutdown.

Exactly once across restarts: the state holds, per file, the offset of the oldest byte still in flight
(a partial line, an open traceback, an event waiting for its traceback), the counters at that moment,
and the keys (file identity + offset) of the events already counted. A restart re-reads from that
offset; events rebuilt from bytes that were already counted are recognised by their key and skipped,
and anything counted after the last save was lost with the counters, so it is counted again, once.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, BinaryIO

from ..advise.suggest import with_suggestions
from ..catalog.loader import Catalog
from ..config import Config
from ..daemon.logsource import IDLE_CLOSE_SECONDS, LogSource
from ..daemon.state import StateStore
from ..daemon.store import EventStore, Health
from ..detect.match import Matcher
from ..detect.model import OomEvent
from ..detect.pipeline import Pipeline
from ..metrics import EventCounts, SourceStats, label_names_for
from ..sources.discover import KubernetesFilter, dirs_to_watch, discover_pods, expand
from ..sources.scrape import TargetScraper
from ..sources.stdin import StdinPump
from ..sources.tail import FileTailer, TailPosition

log = logging.getLogger(__name__)

BUSY_WAIT_SECONDS = 0.2  # loop tick while events wait for their traceback
STATE_VERSION = 1


class App:
    """The daemon. run() blocks until stop is set; everything else is for it and for tests."""

    def __init__(
        self,
        config: Config,
        catalog: Catalog,
        *,
        counts: EventCounts | None = None,
        store: EventStore | None = None,
        stdin: BinaryIO | None = None,
        stdout: BinaryIO | None = None,
        wake: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.catalog = catalog
        self.matcher = Matcher(catalog)
        self.counts = counts or EventCounts(catalog.ids, label_names_for(config.kubernetes is not None))
        self.store = store or EventStore(config.recent_events)
        self._clock, self._wall = clock, wall
        self.sources: dict[str, LogSource] = {}
        self._saved_files: dict[str, dict[str, Any]] = {}
        self._state = StateStore(config.state_dir) if config.state_dir else None
        self._had_state = False
        self._last_discover = -1e18
        self._discovered_once = False
        self._watch_dirs: set[str] | None = None
        self._changed: set[str] | None = set()
        self._behind: set[str] = set()  # sources whose read budget ran out: more is waiting
        self._discover_requested = False
        self._last_sweep = -1e18
        self._saved_mark: tuple[float, float] | None = None  # (bytes read, events) at the last save
        self._last_save = clock()
        self._last_loop = wall()
        self._lock = threading.RLock()  # the loop and scrapes/healthz share the sources
        self._stdin = stdin
        self._stdin_pump = StdinPump(stdin, stdout, wake) if stdin is not None else None
        self._kfilter = self._filter(config)
        self.scrapers = [TargetScraper(url, timeout=config.scrape_timeout) for url in config.sglang_urls]
        self.extra = {"state_saves_total": 0.0, "state_errors_total": 0.0, "event_sink_errors_total": 0.0}
        self._problem = ""

    # --- lifecycle ---------------------------------------------------------------------------

    def load_state(self) -> None:
        """Continue from the state file, if there is a usable one; a bad one is a warning, not a crash."""
        if self._state is None:
            return
        try:
            data = self._state.load()
        except OSError as exc:
            self._state_error(f"cannot read the state file: {exc}")
            return
        if data is None:
            self.extra["state_errors_total"] += self._state.rejected
            return
        try:
            if data.get("state_version") != STATE_VERSION:
                raise ValueError(f"state_version {data.get('state_version')!r} is not {STATE_VERSION}")
            self.counts.restore_state(data["counters"])
            files = data.get("files", {})
            if not isinstance(files, dict):
                raise ValueError("files is not a mapping")
            self._saved_files = {str(k): v for k, v in files.items() if isinstance(v, dict)}
            self._had_state = True
        except (ValueError, KeyError, TypeError) as exc:
            # Documented fallback: start as on a first run (existing files read from their end).
            self._state_error(f"ignoring the state file: {exc}")
            self._saved_files = {}

    def save_state(self, *, force: bool = True) -> None:
        """Write positions, counters and dedupe memory atomically; a failure is counted and logged.

        With force=False (the periodic save) nothing is written while nothing was read or counted: an idle
        node with 1,000 files should not fsync a state file every few seconds.
        """
        if self._state is None:
            return
        mark = (sum(s.tailer.stats.bytes_read for s in self.sources.values() if s.tailer), self.counts.total())
        if not force and mark == self._saved_mark:
            self._last_save = self._clock()
            return
        with self._lock:
            files = {}
            for source in self.sources.values():
                saved = source.state()
                if saved is not None:
                    files[source.path] = saved
            data = {"state_version": STATE_VERSION, "counters": self.counts.export_state(), "files": files}
        try:
            self._state.save(data)
            self.extra["state_saves_total"] += 1
            self._saved_mark = mark
        except (OSError, TypeError, ValueError) as exc:
            self._state_error(f"cannot save the state file: {exc}")
        self._last_save = self._clock()

    def start_stdin(self) -> None:
        """Read stdin in a thread, passing every byte through to stdout unchanged."""
        if self._stdin_pump is None:
            return
        source = self._new_source("-", ("stdin",) if self.config.kubernetes is None else ("", "", "stdin"), None)
        self.sources["-"] = source
        self._stdin_pump.start()

    def run(self, stop: threading.Event, *, wake: Callable[[float], bool] | None = None) -> None:
        """Loop until stop is set; wake(timeout) waits for file events (or just sleeps)."""
        waiter = wake or stop.wait
        while not stop.is_set():
            self.step()
            waiter(self._next_timeout())

    def shutdown(self) -> None:
        """Save the state and close every file."""
        self.save_state()
        with self._lock:
            for source in self.sources.values():
                if source.tailer is not None:
                    source.tailer.close()

    # --- one pass of the loop ----------------------------------------------------------------

    def step(self) -> None:
        """Discover files, read what is new, emit what is due, save the state when due."""
        now = self._clock()
        with self._lock:
            since = now - self._last_discover
            # Asked for by a file event at most once a second (a busy log wakes us all the time), else
            # every discover_interval.
            if since >= self.config.discover_interval or (self._discover_requested and since >= 1.0):
                self.discover()
                self._last_discover = now
                self._discover_requested = False
            sweep = now - self._last_sweep >= self.config.sweep_interval or self._changed is None
            if sweep:
                self._last_sweep = now
            behind: set[str] = set()
            for source in list(self.sources.values()):
                # File events name their directory: between safety sweeps, only those files are looked at,
                # and only sources with something pending are ticked. An idle node costs almost nothing.
                if sweep or source.path in self._behind or source.directory in self._changed:  # type: ignore[operator]
                    if source.poll(now):
                        behind.add(source.path)
                elif source.close_at is not None or source.pipeline.pending():
                    source.tick(now)
            self._changed = set()
            self._behind = behind
            self._drain_stdin(now)
        if now - self._last_save >= self.config.state_interval:
            self.save_state(force=False)
        self._last_loop = self._wall()

    def mark_changed(self, dirs: set[str] | None) -> None:
        """File events happened in these directories (None: in too many to say); poll their files next."""
        with self._lock:
            if dirs is None or self._changed is None:
                self._changed = None
            else:
                self._changed |= {os.path.abspath(d) for d in dirs}

    def request_discover(self) -> None:
        """Discover soon (a directory changed): on the next step at most a second after the last one."""
        self._discover_requested = True

    def discover(self) -> None:
        """Find the files to follow now: paths and globs, and Kubernetes pod logs."""
        found: dict[str, tuple[tuple[str, ...], dict[str, str]] | None] = {}
        k8s = self.config.kubernetes is not None
        for path in expand(self.config.paths):
            found[path] = None  # named below, once, when it is new: naming is not free with 1,000 files
        if self.config.kubernetes is not None and self._kfilter is not None:
            for ref in discover_pods(self.config.kubernetes.logs_root, self._kfilter):
                found[ref.path] = (
                    (ref.namespace, ref.pod, ref.container),
                    {"namespace": ref.namespace, "pod": ref.pod, "container": ref.container},
                )
        for path, known in found.items():
            if path in self.sources:
                continue
            if known is None:
                name = self._source_name(path)
                known = (("", "", name) if k8s else (name,), {"source": name})
            self.sources[path] = self._new_source(path, *known)
            self._watch_dirs = None
        self._discovered_once = True
        self._problem = self._discovery_problem(found)
        self._retire(self._clock(), set(found))

    def watch_dirs(self) -> set[str]:
        """Directories whose events should wake the loop (recomputed only when the sources change)."""
        with self._lock:
            if self._watch_dirs is not None:
                return self._watch_dirs
            k = self.config.kubernetes
            # In Kubernetes mode the pod root is watched recursively: one watch (and one watchdog thread)
            # instead of one per container directory.
            plain = [p for p, s in self.sources.items() if p != "-" and ("namespace" not in s.label_map)]
            dirs = dirs_to_watch(self.config.paths, plain)
            if k is not None and os.path.isdir(k.logs_root):
                dirs.add(os.path.abspath(k.logs_root))
            self._watch_dirs = dirs
            return dirs

    def reload(self, config: Config) -> None:
        """Apply a new configuration (SIGHUP): paths, filters, intervals; counters and files stay."""
        with self._lock:
            if label_names_for(config.kubernetes is not None) != self.counts.label_names:
                log.warning("reload: switching Kubernetes mode on or off needs a restart; keeping the old sources")
                config = replace(config, kubernetes=self.config.kubernetes)
            self.config = config
            self._kfilter = self._filter(config)
            self._last_discover = -1e18
            self._last_sweep = -1e18
            self._watch_dirs = None
        log.info("configuration reloaded paths=%d kubernetes=%s", len(config.paths), config.kubernetes is not None)

    # --- health and metrics ------------------------------------------------------------------

    def health(self) -> Health:
        """Ready when sources are being read; otherwise the reason."""
        stalled = self._wall() - self._last_loop
        if stalled > max(30.0, 10 * self.config.poll_interval):
            return Health(False, f"the main loop has not run for {stalled:.0f}s")
        with self._lock:
            if self._problem:
                return Health(False, self._problem)
            if not self.sources:
                return Health(False, "no log source is configured or found yet")
            return Health(True, f"following {len(self.sources)} log source(s)")

    def source_stats(self) -> Iterable[SourceStats]:
        """Per-label read statistics for the collector."""
        with self._lock:
            merged: dict[tuple[str, ...], SourceStats] = {}
            for source in self.sources.values():
                s = merged.setdefault(source.labels, SourceStats(source.labels))
                stats = source.pipeline.stats()
                s.files += 1 if source.tailer is not None else 0
                s.lines_read += stats.lines_read
                s.oversized_lines += stats.oversized_lines
                for reason, n in source.resets.items():
                    s.resets[reason] = s.resets.get(reason, 0.0) + n
                if source.tailer is not None:
                    t = source.tailer.stats
                    s.bytes_read += t.bytes_read
                    s.read_errors += t.read_errors
                    s.lag_bytes += source.lag_bytes()
                    if t.last_read_wall_time is not None:
                        s.last_read = max(s.last_read or 0.0, t.last_read_wall_time)
            return list(merged.values())

    def extra_metrics(self) -> dict[str, float]:
        """Loop and state health for the collector."""
        with self._lock:
            pending = sum(s.pipeline.pending() for s in self.sources.values())
        return {**self.extra, "loop_timestamp_seconds": self._last_loop, "pending_events": float(pending)}

    # --- internals ---------------------------------------------------------------------------

    def _filter(self, config: Config) -> KubernetesFilter | None:
        k = config.kubernetes
        return None if k is None else KubernetesFilter(k.namespace, k.pod, k.container)

    def _source_name(self, path: str) -> str:
        for pattern, name in self.config.names.items():
            if pattern == path:
                return name
        base = os.path.basename(path)
        stem = base[:-4] if base.endswith(".log") else base
        taken = self._names_in_use()
        if stem in taken:
            parent = os.path.basename(os.path.dirname(path))
            return f"{parent}/{stem}" if parent else path
        return stem

    def _names_in_use(self) -> set[str]:
        return {s.label_map.get("source", "") for s in self.sources.values()}

    def _new_source(self, path: str, labels: tuple[str, ...], label_map: dict[str, str] | None) -> LogSource:
        label_map = label_map or dict(zip(self.counts.label_names, labels, strict=False))
        self.counts.ensure(labels)
        source: LogSource

        def sink(event: OomEvent) -> None:
            self._record(source, event)

        pipeline = Pipeline(
            self.catalog, self.matcher, source=label_map.get("source") or "/".join(labels), location=path,
            sink=sink, extra_prefixes=self.config.prefix_regex, wait_seconds=self.config.traceback_wait,
        )  # fmt: skip
        tailer = None
        resume_lineno = resume_offset = None
        epoch = 0
        if path != "-":
            saved = self._saved_files.pop(path, None)
            position = None
            if saved is not None:
                try:
                    position = TailPosition.from_dict(saved["position"])
                    resume_lineno = int(saved.get("lineno", 1))
                    resume_offset = position.offset
                    epoch = int(saved.get("epoch", 0))
                    pipeline.restore_state(saved.get("dedupe", {}))
                except (KeyError, TypeError, ValueError) as exc:
                    self._state_error(f"ignoring the saved position of {path}: {exc}")
                    position = None
            start_at_end = not self._had_state and not self.config.from_beginning and self._first_discovery()
            tailer = FileTailer(path, start_at_end=start_at_end and position is None, position=position)
        source = LogSource(
            path,
            labels,
            label_map,
            pipeline,
            tailer,
            resume_lineno=resume_lineno,
            resume_offset=resume_offset,
            epoch=epoch,
            directory=os.path.abspath(os.path.dirname(path)),
        )
        return source

    def _first_discovery(self) -> bool:
        # Files that exist at the very first start are history; files that appear later are read from 0.
        return not self._discovered_once

    def target_for(self, source: LogSource) -> TargetScraper | None:
        """The SGLang endpoint that serves this log: named in the config, or the only one there is."""
        owners = self.config.target_sources
        names = {source.label_map.get("source"), source.label_map.get("container"), source.label_map.get("pod")}
        for scraper in self.scrapers:
            if owners.get(scraper.url) in names:
                return scraper
        if len(self.scrapers) == 1 and not owners:
            return self.scrapers[0]
        return None

    def targets(self) -> list[TargetScraper]:
        """The scraped endpoints; each is a metrics.TargetView."""
        return list(self.scrapers)

    def _with_context(self, source: LogSource, event: OomEvent) -> OomEvent:
        scraper = self.target_for(source)
        if scraper is None:
            return with_suggestions(event, None, None)
        snapshot = scraper.snapshot_before(self._wall())
        info = scraper.server_info
        return with_suggestions(
            event, dict(info.args) if info else None, snapshot.as_dict() if snapshot else None, scraper.url
        )

    def _record(self, source: LogSource, event: OomEvent) -> None:
        try:
            event = self._with_context(source, event)
            self.counts.record(source.labels, event, self._wall())
            self.store.add(event, source.label_map)
        except Exception:  # a sink failure must never kill the loop or lose the rest
            self.extra["event_sink_errors_total"] += 1
            log.exception("cannot record event kind=%s source=%s", event.kind, event.location)
            return
        # Fatal events are rare and matter; retraction ticks can come every few seconds, so they stay at DEBUG.
        level = logging.WARNING if event.fatal else logging.DEBUG
        log.log(
            level, "oom event kind=%s fatal=%s location=%s ranks=%s requested=%s available=%s",
            event.kind, event.fatal, event.location, ",".join(event.ranks) or "-",
            event.numbers.get("requested_tokens"), event.numbers.get("available_tokens"),
        )  # fmt: skip

    def _retire(self, now: float, found: set[str]) -> None:
        """Drop sources whose file is gone, and their series once the retention is over.

        Runs at discovery's pace, not every pass: it costs a stat per file. A configured plain path is
        never retired (it is followed even while missing).
        """
        for path, source in list(self.sources.items()):
            configured = path in found and path in self.config.paths
            if path == "-" or source.tailer is None or configured or os.path.exists(path):
                source.gone_since = None
                continue
            if source.pipeline.pending():
                continue
            if source.gone_since is None:
                source.gone_since = now
            elif now - source.gone_since >= self.config.source_retention:
                source.tailer.close()
                del self.sources[path]
                self._watch_dirs = None
                if not any(s.labels == source.labels for s in self.sources.values()):
                    self.counts.drop(source.labels)
                log.info("source retired path=%s after %.0fs without its file", path, now - source.gone_since)

    def _next_timeout(self) -> float:
        if self._behind:
            return 0.0  # a backlog is being read in slices: go on at once
        with self._lock:
            busy = any(s.pipeline.pending() or s.close_at is not None for s in self.sources.values())
        return min(self.config.poll_interval, BUSY_WAIT_SECONDS) if busy else self.config.poll_interval

    def _discovery_problem(self, found: dict[str, Any]) -> str:
        if self._stdin is not None:
            return ""
        k = self.config.kubernetes
        if k is not None and not os.path.isdir(k.logs_root):
            return f"the Kubernetes log root {k.logs_root} does not exist"
        if not found and not self.config.paths and k is None:
            return "no log paths are configured"
        if not found:
            return "no log file matches the configured paths yet"
        return ""

    def _state_error(self, message: str) -> None:
        self.extra["state_errors_total"] += 1
        log.warning("state: %s", message)

    def _drain_stdin(self, now: float) -> None:
        source = self.sources.get("-")
        if source is None or self._stdin_pump is None:
            return
        was_done = self._stdin_pump.done
        chunks, done = self._stdin_pump.drain()
        for data in chunks:
            source.pipeline.feed(data, now)
            source.close_at = now + IDLE_CLOSE_SECONDS
        if done:
            if not was_done:
                source.pipeline.finish()  # the end of stdin: everything pending counts now
            return
        source.tick(now)


def stdio() -> tuple[BinaryIO, BinaryIO]:
    """The process's binary stdin and stdout."""
    return sys.stdin.buffer, sys.stdout.buffer
