"""The daemon's loop: when to discover, which sources to read, when to save; and where its threads start.

    start services (file waker, scrape threads, node discovery, stdin pump)
    repeat: wait for a file event or a tick -> reload if asked -> discover (throttled) -> read the sources
            whose directory changed (all of them on a sweep) -> emit what is due -> save when due
    stop services, save the state, close the files

Every decision takes the time from an injected clock, so tests drive step() without threads or sleeps.
The one thread started elsewhere is the HTTP edge's: serve binds it right after begin() has saved the starting
positions (a kill before that save would make the next start a first start again), and a port in use fails
with exit status 2.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ..config.model import Config
from ..events.store import Health
from ..sources.stdin import StdinPump
from .health import HealthWatch, ReceivedFacts
from .logsource import IDLE_CLOSE_SECONDS, LogSource
from .publish import Publisher
from .sourceset import STDIN, SourceSet
from .state import StateKeeper

log = logging.getLogger(__name__)

BUSY_WAIT_SECONDS = 0.2  # loop tick while events wait for their traceback
DISCOVER_MIN_GAP = 1.0  # a busy log wakes us all the time: a requested discovery runs at most this often
# A file created (or moved in) asks for one sooner: a glob's new match may live less than DISCOVER_MIN_GAP, and a
# writer whose period divides it fell in step with the deferred discovery (measured: a glob match
# flipping with a directory once a second was counted 0 times in 10). Creations are rare next to appends.
DISCOVER_CREATED_GAP = 0.1
# A scrape hands the GIL back and forth a dozen times (accept, thread start, recv, send); behind a loop busy with
# a read slice each hand-off waits up to the switch interval, 5 ms by default. At 1 ms a scrape's p99 with one
# writer on 1,000 files was 82-110 ms instead of 186-208 ms (two rounds on the loaded 2-core machine).
SWITCH_INTERVAL = 0.001
# A source not (yet) identified as SGLang (detect/evidence.py) is read at most this often on file events, not on
# every one: a node's foreign containers write most of its log bytes, and each look has a fixed cost (tail, tick,
# publish). Reads get larger, the bytes are the same. An SGLang OOM in a container that has not shown SGLang yet
# (banner, scheduler lines) is seen up to this much later: well under any scrape interval. bench_foreign.py (100
# foreign containers, 10 MB/s): a 10 s window cost 2.24 CPU s reading on every event, 1.43 s at 1 s; a 30 s window
# 3.92 s at 1 s, 3.58 s at 2 s.
FOREIGN_LOOK_SECONDS = 2.0
_ERROR_LOG_INTERVAL = 60.0


class Service(Protocol):
    """Something with a thread of its own: started before the loop, stopped after it."""

    def start(self) -> None: ...
    def stop(self) -> Any: ...


class Wakeups(Protocol):
    """File events (sources/watch.Waker): wait for one, say where they happened, watch these directories."""

    def wait(self, timeout: float | None) -> bool: ...
    def take_changed(self) -> set[str] | None: ...
    def take_created(self) -> bool: ...
    def watch_dirs(self, dirs: set[str]) -> None: ...
    def quiet(self, dirs: set[str]) -> None: ...


class Loop:
    """Steps the source set on file events and ticks; owns the discovery, sweep and save schedules."""

    def __init__(
        self,
        config: Config,
        sources: SourceSet,
        keeper: StateKeeper,
        *,
        stdin: StdinPump | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.sources = sources
        self.keeper = keeper
        self._stdin = stdin
        self._clock, self._wall = clock, wall
        self._last_discover = -1e18
        self._discover_requested = False
        self._discover_gap = DISCOVER_MIN_GAP  # DISCOVER_CREATED_GAP when a file was created since the last one
        self._last_sweep = -1e18
        self._changed: set[str] | None = set()  # directories with file events since the last pass; None: all
        self._behind: set[str] = set()  # sources whose read budget ran out: more is waiting
        self._deferred: dict[str, float] = {}  # unidentified sources with file events: path -> when to read them
        self._foreign_next: dict[str, float] = {}  # unidentified sources: path -> the earliest next look
        self._last_loop = wall()
        self._last_error_log = -1e18
        self._reload_requested = threading.Event()
        self._watched: set[str] | None = None
        self._quiet: set[str] | None = None  # directories whose appends do not wake the loop (read on its tick)
        # Not ready until run() has saved the starting positions. True from construction: serve binds the HTTP
        # edge and starts services before run() primes the files, and /healthz must say `starting` meanwhile.
        self._starting = True
        self._begun = False  # the starting positions are saved (begin() or run())
        self._health = HealthWatch(sources, keeper, log)
        self._health.state_dir = config.state_dir
        self._published = Publisher(sources)  # read statistics, handed to the metrics page as files are read
        self.pending = 0  # events waiting for their traceback or other ranks, at the end of the last pass
        self.busy = 0  # sources joining lines or events at the end of the last pass

    # --- one pass ----------------------------------------------------------------------------

    def step(self) -> None:
        """Discover files, read what is new, emit what is due, publish the statistics, save the state when due."""
        self._starting = False  # run() steps only after _start(); a test may step a loop it never ran
        now = self._clock()
        with self.sources.locked():
            fresh: set[str] = set()
            since = now - self._last_discover
            if since >= self.config.discover_interval or (self._discover_requested and since >= self._discover_gap):
                # A file found now is read now: the event that named its directory was taken already.
                fresh = set(self.sources.discover())
                for gone in (self._foreign_next.keys() | self._deferred.keys()) - set(self.sources.paths()):
                    self._foreign_next.pop(gone, None)
                    self._deferred.pop(gone, None)
                self._last_discover = now
                self._discover_requested = False
                self._discover_gap = DISCOVER_MIN_GAP
                self._published.resync = True
            sweep = now - self._last_sweep >= self.config.sweep_interval or self._changed is None
            if sweep:
                self._last_sweep = now
            changed = self._changed or set()
            behind: set[str] = set()
            pending = busy = 0
            for source in self.sources.followed():
                # File events name their directory: between safety sweeps, only those files are looked at,
                # and only sources with something pending are ticked. An idle node costs almost nothing.
                path = source.path
                urgent = sweep or path in fresh or path in self._behind
                look = urgent or source.directory in changed or path in self._deferred
                if look and not urgent and not source.evidence.sglang:
                    look = self._foreign_look(path, now)
                # A report held for SGLang evidence is ticked (its bound ends by time too), but makes no source
                # busy: most are a foreign container's, and busy shortens the loop's wait and defers saves.
                ticked = source.close_at is not None or source.pipeline.pending() or source.pipeline.holding()
                if not (look or ticked):
                    continue  # nothing to read, close or publish; nothing pending either
                if self._guarded(source, now, look):
                    behind.add(source.path)
                self._published.publish(source, always=bool(ticked))
                waiting = source.pipeline.pending()
                pending += waiting
                busy += 1 if waiting or source.close_at is not None else 0
            self._changed = set()
            self._behind = behind
            self._drain_stdin(now)
            self._published.after_pass()
            self.pending, self.busy = pending, busy
        self.keeper.save_if_due()
        self._last_loop = self._wall()
        self._health.note()

    def _foreign_look(self, path: str, now: float) -> bool:
        """Whether an unidentified source with file events is read now, or deferred (FOREIGN_LOOK_SECONDS)."""
        due = self._foreign_next.get(path, 0.0)
        if now < due:
            self._deferred[path] = due
            return False
        self._deferred.pop(path, None)
        self._foreign_next[path] = now + FOREIGN_LOOK_SECONDS
        return True

    def _guarded(self, source: LogSource, now: float, look: bool) -> bool:
        """Poll (or tick) one source; an unexpected error in it is counted and logged, never raised."""
        try:
            if look and source.path != STDIN:
                return source.poll(now)
            if source.close_at is not None or source.pipeline.pending() or source.pipeline.holding():
                source.tick(now)
        except Exception:  # one broken source must not stop the others or the loop
            self.sources.count_error()
            if now - self._last_error_log >= _ERROR_LOG_INTERVAL:
                self._last_error_log = now
                log.exception("source error path=%s (counted; the loop goes on)", source.path)
        return False

    def mark_changed(self, dirs: set[str] | None) -> None:
        """File events happened in these directories (None: in too many to say); poll their files next."""
        with self.sources.locked():
            if dirs is None or self._changed is None:
                self._changed = None
            else:
                self._changed |= {os.path.abspath(d) for d in dirs}

    def request_discover(self) -> None:
        """Discover soon (a directory changed): on the next step at most DISCOVER_MIN_GAP after the last one."""
        self._discover_requested = True

    def request_reload(self) -> None:
        """Reload on the next wake-up (safe from a signal handler; the caller wakes the loop)."""
        self._reload_requested.set()

    def configure(self, config: Config) -> None:
        """A reloaded config: new intervals; discover and sweep on the next pass."""
        self.config = config
        self.keeper.interval = config.state_interval
        self._health.state_dir = config.state_dir
        self._last_discover = self._last_sweep = -1e18
        self._published.resync = True

    def next_timeout(self) -> float:
        """How long the loop may wait for a file event before it must look again."""
        if self._behind or self._changed is None or self._changed:
            return 0.0  # a backlog is being read in slices, or directories wait to be looked at: go on at once
        timeout = (
            min(self.config.poll_interval, BUSY_WAIT_SECONDS) if self.sources.busy() else self.config.poll_interval
        )
        now = self._clock()
        if self._discover_requested:
            timeout = min(timeout, max(0.0, self._discover_gap - (now - self._last_discover)))
        if self._deferred:
            timeout = min(timeout, max(0.0, min(self._deferred.values()) - now))
        close = self.sources.next_close()
        if close is not None:
            # Wake when a quiet file's records close, not at the next tick after it: that is when a block
            # and its traceback become an event, and the tick's phase must not add to the latency.
            timeout = min(timeout, max(0.0, close - now))
        return timeout

    def watch_receiver(self, facts: Callable[[], ReceivedFacts]) -> None:
        """Have /healthz say what the OTLP receiver has taken in (daemon/receiver.py)."""
        self._health.received = facts

    def health(self) -> Health:
        """Ready when sources are being read; otherwise the reason."""
        stalled = self._wall() - self._last_loop
        if stalled > max(30.0, 10 * self.config.poll_interval):
            return Health(False, f"the main loop has not run for {stalled:.0f}s")
        if self._starting:
            return Health(False, "starting: saving where each log file will be read from")
        return self._health.report()

    def last_loop(self) -> float:
        """Wall time when the last pass completed."""
        return self._last_loop

    # --- the running daemon ------------------------------------------------------------------

    def run(
        self,
        stop: threading.Event,
        *,
        waker: Wakeups | None = None,
        services: Sequence[Service] = (),
        reload: Callable[[], None] = lambda: None,
    ) -> None:
        """Start the services, step until stop is set, then stop them, save the state and close the files."""
        started: list[Service] = []
        interval = sys.getswitchinterval()
        sys.setswitchinterval(min(interval, SWITCH_INTERVAL))
        try:
            for service in services:
                service.start()
                started.append(service)
            if not self._begun:
                self._start()
            self._starting = False
            while not stop.is_set():
                self.step()
                if waker is None:
                    stop.wait(self.next_timeout())
                else:
                    self._wait(waker, reload)
        finally:
            for service in reversed(started):
                service.stop()
            self.keeper.save()
            self.sources.close()
            sys.setswitchinterval(interval)

    def begin(self) -> None:
        """The first thing a start does, before the HTTP edge binds: save where each file will be read from.

        Until that save, a SIGKILL leaves no trace of this start, and the next one is a first start again, which
        reads existing files from their end: what was written in between is lost. The shorter that window, the
        better; binding HTTP and starting the file watcher and the scrapers come after it.
        """
        self._start()
        self._starting = True  # /healthz is ready once run() has started the services too

    def _start(self) -> None:
        """Load the state, find the files, and save where each will be read from before its first byte is read.

        Without this save a SIGKILL before the first periodic one made the restart a first run, which reads
        existing files from their end: whatever was written while the daemon was down was lost.
        """
        self.keeper.load()
        with self.sources.locked():
            self.sources.discover()
            self._last_discover = self._clock()
            self.sources.prime()
        self.keeper.save()
        self._begun = True
        self._starting = False

    def _wait(self, waker: Wakeups, reload: Callable[[], None]) -> None:
        """Wait for a file event or the timeout; then reload if asked and note where files changed."""
        dirs = self.sources.watch_dirs()
        if dirs is not self._watched:  # the same set object comes back until the sources change
            waker.watch_dirs(dirs)
            # Bytes written before a directory's watch was in place raised no event: look there once more.
            self.mark_changed(dirs - (self._watched or set()))
            self._watched = dirs
        quiet = self.sources.quiet_dirs()
        if quiet is not self._quiet:
            waker.quiet(quiet)
            self._quiet = quiet
        waker.wait(self.next_timeout())
        if self._reload_requested.is_set():
            self._reload_requested.clear()
            reload()
        changed = waker.take_changed()
        self.mark_changed(changed)
        if waker.take_created():
            self._discover_gap = DISCOVER_CREATED_GAP
        if changed is None or changed:
            self.request_discover()

    def _drain_stdin(self, now: float) -> None:
        source = self.sources.stdin()
        if source is None or self._stdin is None:
            return
        was_done = self._stdin.done
        chunks, done = self._stdin.drain()
        for data in chunks:
            source.pipeline.feed(data, now)
            source.close_at = now + source.pipeline.quiet_seconds(IDLE_CLOSE_SECONDS)  # whole records close sooner
        if done:
            if not was_done:
                source.pipeline.finish()  # the end of stdin: everything pending counts now
            return
        source.tick(now)
