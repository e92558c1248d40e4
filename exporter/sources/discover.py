"""Discovery: which files the tailers follow; it runs before tail.py in the pipeline.

    config (paths, globs | pod log root + filters) --expand / discover_pods--> paths --> FileTailer

Everything here is re-evaluated on every call (on wake-ups and on the safety poll), so files that
appear later, such as a restarted container's <n+1>.log, are found. It only lists directories; it
never opens a log file.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import regex

from .fsname import shown

log = logging.getLogger(__name__)


# A glob such as "*.log*" or "*" would also pick up rotated generations (app.log.1, 0.log.20260314-220733,
# *.gz). Those are read through their live file's FileTailer (drained on rotation, or restored from a
# saved position), so tailing them again as new files would count their OOMs twice.
_ROTATED_NAME = re.compile(r".*(\.gz|\.bz2|\.xz|\.zst|\.\d+|[.-]\d{8}(?:[-T]?\d{2,6})?)")
_POD_LOG_NAME = re.compile(r"(\d+)\.log")
_GLOB_MAGIC = re.compile(r"[*?[]")


def expand(patterns: Sequence[str]) -> list[str]:
    """Plain paths as given (even when missing now) and the regular files that globs (with **) match now."""
    seen: set[str] = set()
    paths: list[str] = []
    for pattern in patterns:
        pattern = os.path.expanduser(pattern)
        if _GLOB_MAGIC.search(pattern) is None:
            # A configured path is followed even while absent: it is read from 0 once it appears.
            matches = [pattern]
        else:
            matches = [
                path
                for path in sorted(glob.glob(pattern, recursive=True))
                if os.path.isfile(path) and not _ROTATED_NAME.fullmatch(os.path.basename(path))
            ]
        for path in matches:
            if path not in seen:
                seen.add(path)
                paths.append(path)
    return paths


def glob_root(pattern: str) -> str:
    """The deepest directory of a pattern that holds no glob magic: where new matches can appear."""
    parts = os.path.expanduser(pattern).split(os.sep)
    literal: list[str] = []
    for part in parts[:-1]:
        if _GLOB_MAGIC.search(part):
            break
        literal.append(part)
    return os.sep.join(literal) or (os.sep if pattern.startswith(os.sep) else ".")


def dirs_to_watch(patterns: Sequence[str], paths: Iterable[str]) -> set[str]:
    """Directories whose events should wake the tailers: each followed file's and each pattern's root."""
    dirs = {os.path.abspath(os.path.dirname(path) or ".") for path in paths}
    dirs.update(os.path.abspath(glob_root(pattern)) for pattern in patterns)
    return {d for d in dirs if os.path.isdir(d)}


@dataclass(frozen=True, slots=True)
class PodLogRef:
    """One container run's log file under the kubelet pod log root, with labels taken from its path."""

    namespace: str
    pod: str
    uid: str
    container: str
    restart: int
    path: str


# The one home of the default filters (config.KubernetesConfig uses them too).
# Why these defaults: every container on the node is followed, because SGLang is recognised by what it writes
# (detect/evidence.py), not by what its container is called (KServe's "kserve-container", operators' "main" or
# "model"). A container that never shows SGLang costs a literal search over its bytes and no series. Two kinds are
# left out: this exporter's own container (the chart names it "oom-exporter"), whose log quotes the OOM lines it
# found, and the Kubernetes system namespaces. The filters pin sources for those who want fewer (docs/recognition.md).
DEFAULT_NAMESPACE_FILTER = r"(?!kube-system$|kube-public$|kube-node-lease$).+"
DEFAULT_POD_FILTER = r".+"
DEFAULT_CONTAINER_FILTER = r"(?i)(?!.*oom-exporter).+"


# A filter runs on names a tenant chooses (a pod's name, up to 253 characters): a linear pattern needs microseconds,
# one that backtracks catastrophically ((a|aa)+$) is given up after this many seconds and counts as no match.
FILTER_TIMEOUT = 0.1
WARN_EVERY = 60.0  # seconds between two warnings about filter timeouts


class FilterTimeouts:
    """Filter matches given up at FILTER_TIMEOUT (each counted as no match), with a rate-limited warning.

    One per source set, handed to every filter a reload builds, so the count never goes back.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.count = 0
        self._clock = clock
        self._lock = threading.Lock()
        self._warned = -WARN_EVERY  # clock() of the last warning

    def record(self, key: str, pattern: str, name: str) -> None:
        """One match of `pattern` on `name` gave up: count it, and warn at most once per WARN_EVERY."""
        with self._lock:
            self.count += 1
            now = self._clock()
            if now - self._warned < WARN_EVERY:
                return
            self._warned = now
        log.warning("kubernetes filter %s %r took over %gs on %r and counts as no match (%d so far, "
                    "sglang_oom_exporter_kubernetes_filter_timeouts_total); write it without nested repetitions",
                    key, pattern, FILTER_TIMEOUT, name[:64], self.count)  # fmt: skip


@dataclass(frozen=True, slots=True)
class KubernetesFilter:
    """Regexes (full match) that pick the pods' containers to follow; see the defaults' comment.

    Compiled with the `regex` module and matched under FILTER_TIMEOUT: a match that takes longer is no match,
    counted in `timeouts`.
    """

    namespace: str = DEFAULT_NAMESPACE_FILTER
    pod: str = DEFAULT_POD_FILTER
    container: str = DEFAULT_CONTAINER_FILTER
    timeouts: FilterTimeouts = field(default_factory=FilterTimeouts, compare=False, repr=False)
    compiled: dict[str, regex.Pattern[str]] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        compiled = {}
        for name in ("namespace", "pod", "container"):
            try:
                compiled[name] = regex.compile(getattr(self, name))
            except regex.error as exc:
                raise ValueError(f"kubernetes filter {name}: invalid regex: {exc}") from exc
        object.__setattr__(self, "compiled", compiled)

    def matches_pod(self, namespace: str, pod: str) -> bool:
        """Whether a pod directory passes the namespace and pod filters."""
        return self._matches("namespace", namespace) and self._matches("pod", pod)

    def matches_container(self, container: str) -> bool:
        """Whether a container directory passes the container filter."""
        return self._matches("container", container)

    def _matches(self, key: str, name: str) -> bool:
        try:
            return self.compiled[key].fullmatch(name, timeout=FILTER_TIMEOUT) is not None
        except TimeoutError:
            self.timeouts.record(key, getattr(self, key), name)
            return False


def _split_pod_dir(name: str) -> tuple[str, str, str] | None:
    # <namespace>_<pod>_<uid>: namespaces, pod names and uids never contain "_" (DNS-1123 names, UUIDs
    # or hex hashes), so the first and last "_" split it; the middle join is only defensive.
    parts = name.split("_")
    if len(parts) < 3 or not all(parts):
        return None
    return parts[0], "_".join(parts[1:-1]), parts[-1]


def pod_log_ref(root: str, path: str) -> PodLogRef | None:
    """The pod, container and restart of one file under the pod log root (None when it is not a pod log)."""
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
    parts = rel.split(os.sep)
    if len(parts) != 3 or rel.startswith(".."):
        return None
    pod = _split_pod_dir(parts[0])
    match = _POD_LOG_NAME.fullmatch(parts[2])
    if pod is None or match is None:
        return None
    return _ref(pod, parts[1], int(match.group(1)), path)


def _ref(pod: tuple[str, str, str], container: str, restart: int, path: str) -> PodLogRef:
    """The names as labels show them (a directory name that is not UTF-8 escaped, sources/fsname.py); the path
    as the filesystem gave it (it opens the file)."""
    return PodLogRef(shown(pod[0]), shown(pod[1]), shown(pod[2]), shown(container), restart, path)


def discover_pods(root: str, pod_filter: KubernetesFilter | None = None) -> list[PodLogRef]:
    """Every <n>.log under root whose namespace, pod and container pass the filter, sorted."""
    flt = pod_filter if pod_filter is not None else KubernetesFilter()
    refs: list[PodLogRef] = []
    for pod_dir in _subdirs(root):
        pod = _split_pod_dir(pod_dir)
        if pod is None or not flt.matches_pod(pod[0], pod[1]):
            continue
        for container in _subdirs(os.path.join(root, pod_dir)):
            if not flt.matches_container(container):
                continue
            container_dir = os.path.join(root, pod_dir, container)
            for name in _names(container_dir):
                match = _POD_LOG_NAME.fullmatch(name)
                if match is not None:
                    path = os.path.join(container_dir, name)
                    refs.append(_ref(pod, container, int(match.group(1)), path))
    refs.sort(key=lambda r: (r.namespace, r.pod, r.uid, r.container, r.restart))
    return refs


def _subdirs(directory: str) -> list[str]:
    try:
        with os.scandir(directory) as entries:
            return [e.name for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError as exc:
        # Pods come and go between listing and descending; the next call sees the new layout.
        log.debug("pod log listing failed dir=%s error=%s", directory, exc)
        return []


def _names(directory: str) -> list[str]:
    try:
        with os.scandir(directory) as entries:
            return [e.name for e in entries if e.is_file()]
    except OSError as exc:
        log.debug("pod log listing failed dir=%s error=%s", directory, exc)
        return []
