"""The set of followed log sources and their discovery: which files (or stdin) feed which pipeline.

    config (paths, globs, pod log root) --discover()--> LogSource per file --poll--> Pipeline --> EventSink

Discovery names each new file once (found.py), zero-initialises its series, and resumes it from the saved
position the state keeper handed over; a file gone longer than the retention is retired with its series.
Nothing here decides when to look: the loop (loop.py) does.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from ..catalog import Catalog
from ..config.model import Config
from ..detect.evidence import HOLD_LINES, Evidence, probe
from ..detect.match import Matcher
from ..detect.model import OomEvent
from ..detect.pipeline import Pipeline
from ..events.sink import Context, EventSink
from ..metrics.events import EventCounts
from ..metrics.names import KUBERNETES_LABELS
from ..metrics.sources import SourceStats
from ..sources.discover import (
    FilterTimeouts,
    KubernetesFilter,
    PodLogRef,
    dirs_to_watch,
    discover_pods,
    expand,
    pod_log_ref,
)
from ..sources.fileid import TailPosition
from ..sources.fsname import received
from ..sources.handles import HandleBudget, handle_bound
from ..sources.otlpspool import FILE_DIR, NO_UID, POD_DIR, spool_root
from ..sources.tail import FileTailer
from .found import discovery_problem, kubernetes_filter, restore, saved_but_missing, source_name
from .lazypipe import LazyPipeline
from .logsource import LogSource

PROBE_BYTES = 256 * 1024  # of a file followed from later on: SGLang's banner and first scheduler lines fit

log = logging.getLogger(__name__)

STDIN = "-"
ContextFor = Callable[[Mapping[str, str]], Context]


@dataclass(frozen=True)
class SourceFacts:
    """What health and the page say about the source set: single values, read without waiting for the lock."""

    followed: int  # sources followed now (files and stdin)
    problem: str  # why nothing can be followed ("" when something can)
    waiting: list[str]  # configured files that do not exist (yet)
    errors: int  # unexpected exceptions while reading a source
    bad_positions: int  # saved positions that could not be used
    numbers_dropped: int  # numbers the matcher dropped (detect/match.py)
    filter_timeouts: int  # Kubernetes filter matches given up at their time limit (sources/discover.py)
    open_files: int
    file_handle_parks: int
    open_file_limit_hits: int
    handles_waiting: int  # files waiting for a file handle
    handle_limit: int  # files the open-file limit lets be open at once


class SourceSet:
    """Every followed source by path, guarded by one lock that the loop and the scrape side share.

    The lock is the set's own: callers take it with locked() around a pass or a save, and read the sources
    through followed(), get(), stdin() and paths(), which take it too (it is re-entrant).
    """

    def __init__(
        self,
        config: Config,
        catalog: Catalog,
        counts: EventCounts,
        sink: EventSink,
        context_for: ContextFor = lambda _labels: Context(),
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.catalog = catalog
        self._matcher = Matcher(catalog)
        self.counts = counts
        self.sink = sink
        self._context_for = context_for
        self._clock = clock
        self._by_path: dict[str, LogSource] = {}
        # The same sources by directory, and how many carry each label set: what a source let go of or identified
        # asks, answered without a pass over every source (11,000 retired at once were 121 million comparisons).
        self._by_dir: dict[str, dict[str, LogSource]] = {}
        self._label_users: dict[tuple[str, ...], int] = {}
        self._lock = threading.RLock()
        self._saved: dict[str, dict[str, Any]] = {}  # positions from the state file, taken by new sources
        self._had_state = False
        self._problem = ""
        self._waiting: list[str] = []  # followed files that do not exist (yet): a configured path before SGLang starts
        self._errors = 0  # unexpected exceptions while reading a source (the loop goes on)
        self._bad_positions = 0  # saved positions that could not be used (a state error)
        self._discovered_once = False
        self._watch_dirs: set[str] | None = None
        self._quiet_dirs: set[str] | None = None
        # Series of sources a reload let go: (kept until, the page's scrape count then), by label values.
        self._released: dict[tuple[str, ...], tuple[float, int]] = {}
        self._filter_timeouts = FilterTimeouts()  # one for every filter a reload builds: a counter never goes back
        self._kfilter = kubernetes_filter(config, self._filter_timeouts)
        # Container directories (a pod's <namespace>_<pod>_<uid>/<container>) whose logs showed SGLang: a new run of
        # the container (the next <n>.log) is SGLang's from its first byte.
        self._sglang_dirs: set[str] = set()
        # Never more log files open than the open-file limit allows with room for HTTP and the state file.
        self._handles = HandleBudget(handle_bound())
        # The OTLP receiver's spool (sources/otlpspool.py): a root whose files are followed like pod logs and plain
        # files. Fixed for the process, as the receiver's port is.
        self.received_root = spool_root(config.state_dir) if config.otlp_listen and config.state_dir else None

    # --- discovery ---------------------------------------------------------------------------

    def discover(self) -> list[str]:
        """Find the files to follow now (paths, globs, pod logs); returns the paths that are new."""
        found: dict[str, tuple[tuple[str, ...], dict[str, str]] | None] = {}
        for path in expand(self.config.paths):
            found[path] = None  # named below, once, when it is new: naming is not free with 1,000 files
        k = self.config.kubernetes
        if k is not None and self._kfilter is not None:
            for ref in discover_pods(k.logs_root, self._kfilter):
                found[ref.path] = _pod_source(ref)
        found.update(self._received())
        with self._lock:
            # One stat per file at discovery's pace; a glob or a pod log only matches files that exist.
            self._waiting = sorted(p for p, known in found.items() if known is None and not os.path.exists(p))
            for path in saved_but_missing(self.config.paths, self._saved, found):
                # Renamed away while the daemon was down and not recreated yet: follow it now, so that its
                # rotated generation is drained from the saved position, not only once a new file appears.
                found[path] = None
            new = self._adopt(found)
            self._discovered_once = True
            self._problem = discovery_problem(self.config, found, STDIN in self._by_path or bool(self.received_root))
            self._retire(self._clock(), set(found))
        return new

    def _adopt(self, found: Mapping[str, tuple[tuple[str, ...], dict[str, str]] | None]) -> list[str]:
        """Follow the found paths not followed yet, each named once (the caller holds the lock); the new ones."""
        new = []
        taken: set[str] | None = None  # source names in use, built once per call (not once per file)
        for path, known in found.items():
            if path in self._by_path:
                continue
            if known is None:
                if taken is None:
                    taken = {s.label_map.get("source", "") for s in self._by_path.values()}
                name = source_name(self.config.names, path, taken)
                taken.add(name)
                known = (("", "", name) if self._pod_labels() else (name,), {"source": name})
            self._put(path, self._new_source(path, *known))
            self._watch_dirs = self._quiet_dirs = None
            new.append(path)
        return new

    def follow_received(self, paths: list[str]) -> list[str]:
        """Follow spooled files the receiver just made, before it answers: until a source reads them, nothing in
        the daemon's own report (lag, pending, busy) shows that their lines wait. The new ones."""
        with self._lock:
            return self._adopt({path: self._received_source(path) for path in paths})

    def add_stdin(self) -> LogSource:
        """The stdin source (fed by the loop from the stdin pump, not by a tailer)."""
        labels = ("", "", "stdin") if self._pod_labels() else ("stdin",)
        with self._lock:
            source = self._new_source(STDIN, labels, None)
            self._put(STDIN, source)
        return source

    def _pod_labels(self) -> bool:
        """Whether series carry namespace/pod/container (Kubernetes mode, or the OTLP receiver) or one source."""
        return self.counts.label_names == KUBERNETES_LABELS

    def _received(self) -> dict[str, tuple[tuple[str, ...], dict[str, str]] | None]:
        """The OTLP receiver's spooled sources: container runs by their kubelet-layout path, the others by name."""
        root = self.received_root
        if root is None:
            return {}
        found: dict[str, tuple[tuple[str, ...], dict[str, str]] | None] = {}
        pod_filter = self._kfilter or KubernetesFilter(timeouts=self._filter_timeouts)
        for ref in discover_pods(os.path.join(root, POD_DIR), pod_filter):
            found[ref.path] = _pod_source(ref)
        for path in expand([os.path.join(root, FILE_DIR, "*.log")]):
            found[path] = self._received_source(path)
        return found

    def _received_source(self, path: str) -> tuple[tuple[str, ...], dict[str, str]] | None:
        """A spooled file's series labels: a container run's by its pod, another source's by its name as a person
        reads it (sources/fsname.py `received`), not its file's escaped stem; None outside the spool."""
        root = self.received_root
        if root is None:
            return None
        ref = pod_log_ref(os.path.join(root, POD_DIR), path)
        if ref is not None:
            return _pod_source(ref)
        files = os.path.join(root, FILE_DIR)
        if os.path.dirname(os.path.abspath(path)) != os.path.abspath(files) or not path.endswith(".log"):
            return None
        name = received(os.path.basename(path)[: -len(".log")])
        return (("", "", name) if self._pod_labels() else (name,)), {"source": name}

    def _shown_at(self, path: str, label_map: Mapping[str, str]) -> str:
        """Where an event's lines are, as /events, the page and the log name it: a followed file by its path; a
        spooled source by what it is, not the spool's internal file (its line is the source's n-th line received)."""
        root = self.received_root
        if root is None or path == STDIN or not os.path.abspath(path).startswith(os.path.abspath(root) + os.sep):
            return path
        ref = pod_log_ref(os.path.join(root, POD_DIR), path)
        if ref is None:
            return f"{label_map.get('source', path)} (received over OTLP)"
        uid = f"uid {ref.uid}, " if ref.uid != NO_UID else ""
        return f"{ref.namespace}/{ref.pod}/{ref.container} (received over OTLP, {uid}run {ref.restart})"

    def follows_received(self, path: str) -> bool:
        """Whether a spooled path would be followed: a container run the filters take, or any other source."""
        root = self.received_root
        if root is None:
            return False
        ref = pod_log_ref(os.path.join(root, POD_DIR), path)
        if ref is None:
            return True
        flt = self._kfilter or KubernetesFilter()
        return flt.matches_pod(ref.namespace, ref.pod) and flt.matches_container(ref.container)

    def watch_dirs(self) -> set[str]:
        """Directories whose events should wake the loop (the same set object until the sources change)."""
        with self._lock:
            if self._watch_dirs is not None:
                return self._watch_dirs
            k = self.config.kubernetes
            # In Kubernetes mode the pod root is watched recursively: one watch (and one watchdog thread)
            # instead of one per container directory.
            plain = [p for p, s in self._by_path.items() if p != STDIN and "namespace" not in s.label_map]
            dirs = dirs_to_watch(self.config.paths, plain)
            if k is not None and os.path.isdir(k.logs_root):
                dirs.add(os.path.abspath(k.logs_root))
            self._watch_dirs = dirs
            return dirs

    def quiet_dirs(self) -> set[str]:
        """Directories whose every file is a source not (yet) shown to be SGLang (detect/evidence.py): the loop
        reads those on its tick, not on each append (the same set object until the sources or their evidence
        change)."""
        with self._lock:
            if self._quiet_dirs is None:
                quiet: set[str] = set()
                loud: set[str] = set()
                for path, source in self._by_path.items():
                    if path != STDIN:
                        (loud if source.evidence.sglang else quiet).add(source.directory)
                self._quiet_dirs = quiet - loud
            return self._quiet_dirs

    def reconfigure(self, config: Config, catalog: Catalog) -> None:
        """Apply a reloaded config and catalog to every file source, as a restart would, exactly once.

        Each file source is rebuilt from what the state file would hold for it (the offset of its oldest byte in
        flight, its dedupe memory), so the new pipeline, matcher and traceback wait take over without losing or
        recounting an event; stdin keeps its pipeline. A file the new config no longer names is let go at once
        (what it had pending counts now); its position is kept (and saved), so naming it again resumes there.
        """
        with self._lock:
            self.config, self.catalog = config, catalog
            dropped = self._matcher.numbers_dropped
            self._matcher = Matcher(catalog)
            self._matcher.numbers_dropped = dropped  # a counter: never goes back
            self._kfilter = kubernetes_filter(config, self._filter_timeouts)
            self._watch_dirs = self._quiet_dirs = None
            wanted = set(expand(config.paths))
            k = config.kubernetes
            if k is not None and self._kfilter is not None:
                wanted.update(ref.path for ref in discover_pods(k.logs_root, self._kfilter))
            wanted.update(self._received())
            for path, source in list(self._by_path.items()):
                if path != STDIN and source.tailer is not None and path not in wanted:
                    self._let_go(path, source)
                    continue
                saved = source.state()
                if source.tailer is None or saved is None:
                    continue
                source.tailer.close()
                self._saved[path] = saved
                self._put(path, self._new_source(path, source.labels, source.label_map))

    def _let_go(self, path: str, source: LogSource) -> None:
        """Stop following a file a reload removed: count what it had pending, keep its position and its series."""
        source.pipeline.finish()
        saved = source.state()
        if saved is not None:
            self._saved[path] = saved
        self._forget(path, source)
        if not self._label_users.get(source.labels):
            # Kept as a deleted file's are, for the retention: a reload that names it again continues its counter
            # (a config flipping between two versions showed 12 of 165 events), and what it had pending, counted
            # just now, is on the page until a scrape has shown it.
            self._released[source.labels] = (self._clock() + self.config.source_retention, self.counts.page.scrapes)
        log.info("source dropped path=%s: the reloaded configuration no longer names it", path)

    def _drop(self, path: str, source: LogSource) -> None:
        """Stop following path: close it, forget it, and drop its series unless another file has its labels."""
        self._forget(path, source)
        if not self._label_users.get(source.labels):
            self.counts.drop(source.labels)

    def _forget(self, path: str, source: LogSource) -> None:
        if source.tailer is not None:
            source.tailer.close()
        del self._by_path[path]
        self._unindex(path, source)
        self._watch_dirs = self._quiet_dirs = None
        if source.directory not in self._by_dir:
            self._sglang_dirs.discard(source.directory)  # the pod is gone (kubelet keeps a live pod's last run)

    # --- statistics --------------------------------------------------------------------------

    def busy(self) -> int:
        """Sources that wait for a traceback or for a quiet file's records to close (0: all caught up)."""
        with self._lock:
            return sum(1 for s in self._by_path.values() if s.pipeline.pending() or s.close_at is not None)

    def next_close(self) -> float | None:
        """The earliest time a quiet source's open records are due to close (None: no source waits for it)."""
        with self._lock:
            return min((s.close_at for s in self._by_path.values() if s.close_at is not None), default=None)

    def settle_ended(self) -> None:
        """Count now what files whose generation ended (a reset, and no new bytes yet) still wait for."""
        with self._lock:
            for s in self._by_path.values():
                if s.tailer is not None and s.generation is None and (s.pipeline.pending() or s.pipeline.holding()):
                    s.pipeline.finish()

    def generations(self) -> int:
        """File generations opened or first identified over every file source (the keeper saves after one)."""
        with self._lock:
            return sum(s.tailer.stats.generations for s in self._by_path.values() if s.tailer)

    def bytes_read(self) -> int:
        """Bytes read over every file source (the keeper's "anything new?" mark)."""
        with self._lock:
            return sum(s.tailer.stats.bytes_read for s in self._by_path.values() if s.tailer)

    def close(self) -> None:
        """Close every file."""
        with self._lock:
            for source in self._by_path.values():
                if source.tailer is not None:
                    source.tailer.close()

    # --- for the loop, the state keeper, health and the page -------------------------------

    def locked(self) -> AbstractContextManager[Any]:
        """The set's lock, for a caller whose work must see the sources unchanged (a pass, a save, a reload)."""
        return self._lock

    def held_elsewhere(self) -> bool:
        """Whether another thread holds the lock now (a probe: never waits)."""
        if not self._lock.acquire(blocking=False):
            return True
        self._lock.release()
        return False

    def followed(self) -> list[LogSource]:
        """Every followed source, in the order they were found (a copy: the set may change after)."""
        with self._lock:
            return list(self._by_path.values())

    def paths(self) -> list[str]:
        """The followed paths (stdin as STDIN), in the order they were found."""
        with self._lock:
            return list(self._by_path)

    def get(self, path: str) -> LogSource | None:
        """The source following path, if any."""
        with self._lock:
            return self._by_path.get(path)

    def stdin(self) -> LogSource | None:
        """The stdin source, if stdin is followed."""
        return self.get(STDIN)

    def label_maps(self) -> list[dict[str, str]]:
        """Each followed source's labels by name."""
        with self._lock:
            return [s.label_map for s in self._by_path.values()]

    def prime(self) -> None:
        """Open each file where it will be read from (before the first save, at start-up)."""
        with self._lock:
            for source in self._by_path.values():
                if source.tailer is not None:
                    source.tailer.prime()

    def resume_from(self, files: Mapping[str, object]) -> None:
        """Take the saved positions of a loaded state file: new sources resume there, and this is not a first run."""
        with self._lock:
            # An entry that is no object is kept as an unusable position (counted, and its file not read from 0
            # again under counters that hold its events), never dropped: dropped, the file would look new.
            self._saved = {str(k): v if isinstance(v, dict) else {"position": v} for k, v in files.items()}
            self._had_state = True

    def forget_saved(self) -> None:
        """Drop the saved positions (a rejected state file: files are read as on a first run)."""
        with self._lock:
            self._saved = {}

    def positions(self) -> dict[str, dict[str, Any]]:
        """Each file's entry for the state file: followed ones from their source, the others as loaded.

        A saved file not followed now (renamed away while the daemon was down and not recreated yet, or removed
        by a reload) keeps its entry: dropping it would make a later start read its rotated generation never,
        or its new file from 0 on top of counters that hold its events.
        """
        with self._lock:
            files = dict(self._saved)
            for path, source in self._by_path.items():
                saved = source.state()
                if saved is not None:
                    files[path] = saved
            return files

    def count_error(self) -> None:
        """An unexpected exception while reading a source (the loop went on)."""
        self._errors += 1

    def waiting_for_handles(self) -> int:
        """Files that wait for a file handle now (their lag grows unread)."""
        return self._handles.waiting

    def facts(self) -> SourceFacts:
        """Health's and the page's facts; taken without the lock, which the loop holds through a read slice.

        Each is a single value the loop replaces whole, so a probe or a scrape never waits for a slice.
        """
        handles = self._handles
        return SourceFacts(
            followed=len(self._by_path), problem=self._problem, waiting=self._waiting, errors=self._errors,
            bad_positions=self._bad_positions, numbers_dropped=self._matcher.numbers_dropped,
            filter_timeouts=self._filter_timeouts.count,
            open_files=handles.open_files, file_handle_parks=handles.parks,
            open_file_limit_hits=handles.limit_hits, handles_waiting=handles.waiting, handle_limit=handles.limit,
        )  # fmt: skip

    # --- internals ---------------------------------------------------------------------------

    def _put(self, path: str, source: LogSource) -> None:
        """Follow path with source (in place of the one following it, if any), indexed by directory and labels."""
        old = self._by_path.get(path)
        if old is not None:
            self._unindex(path, old)
        self._by_path[path] = source
        self._by_dir.setdefault(source.directory, {})[path] = source
        self._label_users[source.labels] = self._label_users.get(source.labels, 0) + 1

    def _unindex(self, path: str, source: LogSource) -> None:
        in_dir = self._by_dir.get(source.directory)
        if in_dir is not None and in_dir.get(path) is source:
            del in_dir[path]
            if not in_dir:
                del self._by_dir[source.directory]
        users = self._label_users.get(source.labels, 0) - 1
        if users > 0:
            self._label_users[source.labels] = users
        else:
            self._label_users.pop(source.labels, None)

    def _new_source(self, path: str, labels: tuple[str, ...], label_map: dict[str, str] | None) -> LogSource:
        label_map = label_map or dict(zip(self.counts.label_names, labels, strict=False))
        context = self._context_for
        history_end = self._history_end(path)
        directory = os.path.abspath(os.path.dirname(path))
        saved = None if path == STDIN else self._saved.pop(path, None)
        # A pod's container log is SGLang once its content says so (detect/evidence.py), or when an earlier run or
        # generation of the same container said so (its directory, or the saved state); a path the user named,
        # and stdin, are SGLang by the user's word.
        pod = path != STDIN and "namespace" in label_map
        evidence = Evidence(by_word=not pod)
        if pod and (directory in self._sglang_dirs or (isinstance(saved, dict) and saved.get("sglang") is True)):
            evidence.mark()
        if evidence.identified and pod:
            self._sglang_dirs.add(directory)
        if evidence.sglang:
            self.counts.ensure(labels)

        def record(event: OomEvent) -> None:
            # An event in the bytes that were there at a first start read from the beginning is history: counted,
            # but not live (no Kubernetes Event). After a rotation or truncation, low offsets are new bytes.
            live = history_end is None or event.offset >= history_end or bool(source.resets)
            self.sink.record(event, labels, label_map, context(label_map), live=live)

        # A file's pipeline is built on its first byte (most followed files stay quiet); stdin's at once.
        make = functools.partial(
            Pipeline, self.catalog, self._matcher, source=label_map.get("source") or "/".join(labels),
            location=self._shown_at(path, label_map), sink=record, extra_prefixes=self.config.prefix_regex,
            wait_seconds=self.config.traceback_wait, evidence=evidence,
            hold_lines=HOLD_LINES, hold_seconds=self.config.evidence_wait,
        )  # fmt: skip
        pipeline = make() if path == STDIN else LazyPipeline(make)
        source = LogSource(path, labels, label_map, pipeline, None, directory=directory, evidence=evidence)
        evidence.on_identified = lambda: self._identified(source)
        if path != STDIN:
            position = self._resume(source, saved)
            # Files that exist at the very first start are history; files that appear later are read from 0.
            start_at_end = not self._had_state and not self.config.from_beginning and not self._discovered_once
            # A rejected saved position: the kept counters already hold what this file had, so read from 0
            # would count it twice. Its end is the safe side.
            start_at_end = start_at_end or (saved is not None and position is None)
            start_at_end = start_at_end and position is None
            source.tailer = FileTailer(path, start_at_end=start_at_end, position=position, budget=self._handles)
            judged = isinstance(saved, dict) and "sglang" in saved  # its head was read before the restart
            later = start_at_end or (position is not None and position.offset > 0)
            # Followed from later on: the start-up banner is behind us. The file's head says what it is.
            if pod and not evidence.identified and later and not judged and probe(read_head(path, PROBE_BYTES)):
                evidence.mark()
        return source

    def _history_end(self, path: str) -> int | None:
        """The size of a file read from its start on a first run (from_beginning): its bytes up to there are history."""
        if path == STDIN or self._had_state or not self.config.from_beginning or self._discovered_once:
            return None
        try:
            return os.stat(path).st_size
        except OSError:
            return None

    def _identified(self, source: LogSource) -> None:
        """A source showed SGLang: its series start, and the container's other runs and generations follow suit."""
        self.counts.ensure(source.labels)
        self._quiet_dirs = None
        if source.path == STDIN or "namespace" not in source.label_map or source.directory in self._sglang_dirs:
            return
        self._sglang_dirs.add(source.directory)
        log.info("source identified as SGLang path=%s", source.path)
        for other in list(self._by_dir.get(source.directory, {}).values()):
            if other is not source:
                other.evidence.mark()

    def _resume(self, source: LogSource, saved: dict[str, Any] | None) -> TailPosition | None:
        """Where a restarted (or rebuilt) source goes on: the saved position, line number, epoch, dedupe."""
        if saved is None:
            return None
        try:
            return restore(source, saved)
        except (KeyError, TypeError, ValueError) as exc:
            self._bad_positions += 1
            log.warning("state: ignoring the saved position of %s: %s", source.path, exc)
            return None

    def _retire(self, now: float, found: set[str]) -> None:
        """Drop sources whose file is gone, and their series once the retention is over.

        Runs at discovery's pace, not every pass: it costs a stat per file. A configured plain path is
        never retired (it is followed even while missing).
        """
        if self._released:
            followed = {s.labels for s in self._by_path.values()}
            for labels, (until, scrapes) in list(self._released.items()):
                if labels in followed:
                    del self._released[labels]  # named again within the retention: its counter goes on
                elif now >= until and self.counts.page.scrapes > scrapes:
                    del self._released[labels]
                    self.counts.drop(labels)
        for path, source in list(self._by_path.items()):
            configured = path in found and path in self.config.paths
            if path == STDIN or source.tailer is None or configured or os.path.exists(path):
                source.gone_since = None
                continue
            if source.pipeline.pending():
                continue
            if source.gone_since is None:
                source.gone_since = now
            elif now - source.gone_since >= self.config.source_retention:
                self._drop(path, source)
                log.info("source retired path=%s after %.0fs without its file", path, now - source.gone_since)


def read_head(path: str, size: int) -> bytes:
    """The first bytes of a file (nothing when it cannot be read: it is then judged on what it writes)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(size)
    except OSError:
        return b""


def add_stats(s: SourceStats, source: LogSource) -> None:
    """Add one source's read statistics into `s` (the loop publishes them per file, daemon/publish.py)."""
    stats = source.pipeline.stats()
    s.files += 1 if source.tailer is not None else 0
    s.lines_read += stats.lines_read
    s.records += stats.records
    s.matched_records += stats.reports
    s.oversized_lines += stats.oversized_lines
    s.foreign_events += stats.foreign_events
    s.sglang = source.evidence.sglang
    for reason, n in source.resets.items():
        s.resets[reason] = s.resets.get(reason, 0.0) + n
    if source.tailer is not None:
        t = source.tailer.stats
        s.bytes_read += t.bytes_read
        s.read_errors += t.read_errors
        if s.sglang:  # only an SGLang source has a lag series: a foreign one costs no stat for it
            s.lag_bytes += source.lag_bytes()
        if t.last_read_wall_time is not None:
            s.last_read = max(s.last_read or 0.0, t.last_read_wall_time)


def _pod_source(ref: PodLogRef | None) -> tuple[tuple[str, ...], dict[str, str]] | None:
    """A container log's series labels (namespace, pod, container) as discovery names them; None for a plain file."""
    if ref is None:
        return None
    return (ref.namespace, ref.pod, ref.container), {
        "namespace": ref.namespace,
        "pod": ref.pod,
        "container": ref.container,
    }
