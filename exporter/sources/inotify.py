"""Linux inotify for the Waker (watch.py), read on one thread in batches: a node's writes cost microseconds each.

    kernel inotify queue --one read per batch (BATCH_DELAY)--> Watches._dispatch --> Waker.note(dir, ...)

watchdog turns every write into an event object that crosses three Python threads; here one thread reads the
inotify descriptor (inotify_simple, a thin ctypes wrapper) once per batch of events, and the kernel merges a
file's repeated writes while the batch waits, so the cost grows with the directories written per batch, not with
the writes. A recursive root (the kubelet's pod log root) gets a watch on every directory below it, added as
directories appear; an overflowed queue means "look everywhere". Only Linux has it: elsewhere, and with
--force-polling, watch.py keeps watchdog.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
from collections.abc import Callable
from typing import Any

from inotify_simple import INotify, flags

from .fileid import dir_identity as _identity

log = logging.getLogger(__name__)

# Content and name changes only: opens, reads and closes by others (kubectl logs, the kubelet, our own tailers)
# would wake the loop for nothing.
MASK = (
    flags.MODIFY
    | flags.CREATE
    | flags.DELETE
    | flags.MOVED_FROM
    | flags.MOVED_TO
    | flags.DELETE_SELF
    | flags.MOVE_SELF
    | flags.ONLYDIR
)
# How long the reader lets events gather after the first one before it reads them all: far below the loop's own
# tick (and any alert's latency), long enough that a busy node's thousand writes a second are a few reads.
BATCH_DELAY = 0.02
_GONE = flags.DELETE_SELF | flags.MOVE_SELF | flags.IGNORED
_NEW = flags.CREATE | flags.MOVED_TO


class Note:
    """What the reader tells the Waker: the signature of Waker.note, and a queue overflow."""

    def __init__(self, note: Callable[..., None], overflow: Callable[[], None]) -> None:
        self.note = note
        self.overflow = overflow


class Watches:
    """One inotify instance and its reader thread; sync() makes the watched directories what is wanted."""

    def __init__(self, notify: Note, *, recursive: bool) -> None:
        self._notify = notify
        self.recursive = recursive
        self._inotify = INotify()
        self._lock = threading.Lock()
        self._paths: dict[int, str] = {}  # watch descriptor -> directory
        self._wds: dict[str, int] = {}  # directory -> watch descriptor
        self._refused = 0  # watches the kernel refused (fs.inotify.max_user_watches, permissions)
        self._roots: dict[str, tuple[int, int]] = {}  # wanted directories -> (st_dev, st_ino) when watched
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="inotify", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        """Stop the reader and close the descriptor; whether the thread ended within timeout."""
        os.write(self._stop_w, b"x")
        self._thread.join(timeout)
        alive = self._thread.is_alive()
        if not alive:
            self._inotify.close()
            os.close(self._stop_r)
            os.close(self._stop_w)
        return not alive

    @property
    def watched(self) -> set[str]:
        """The wanted directories with a live watch now."""
        with self._lock:
            return {d for d in self._roots if d in self._wds}

    def sync(self, wanted: set[str], gone: set[str]) -> None:
        """Watch exactly the wanted directories (and, recursive, all below them); re-watch a recreated one."""
        with self._lock:
            for root, known in list(self._roots.items()):
                if root not in wanted or root in gone or root not in self._wds or _identity(root) != known:
                    self._drop_tree(root)
                    del self._roots[root]
            for root in sorted(wanted - set(self._roots)):
                identity = _identity(root)
                if identity is None:
                    continue  # not there yet: the next sync tries again
                if self._add(root) is None:
                    continue
                self._roots[root] = identity
                if self.recursive:
                    self._add_below(root)

    # --- the reader thread --------------------------------------------------------------------

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._inotify.fileno(), select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        poller_stop = select.poll()
        poller_stop.register(self._stop_r, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll()}
            if self._stop_r in ready:
                return
            # Let the batch gather (a file's repeated writes merge in the kernel meanwhile); a stop ends the wait.
            if poller_stop.poll(BATCH_DELAY * 1000):
                return
            try:
                events = self._inotify.read(timeout=0)
            except OSError as exc:  # the descriptor broke: say so once and leave the safety poll to it
                log.warning("inotify read failed error=%s; relying on the safety poll", exc)
                return
            try:
                self._dispatch(events)
            except Exception:  # a surprise in one batch must not end the watching
                log.exception("inotify event handling failed (the safety poll covers it)")

    def _dispatch(self, events: list[Any]) -> None:
        for event in events:
            mask = event.mask
            if mask & flags.Q_OVERFLOW:
                self._notify.overflow()
                continue
            with self._lock:
                directory = self._paths.get(event.wd)
                if directory is None:
                    continue
                if mask & _GONE:
                    self._forget(event.wd)
                    self._notify.note(directory, gone=True)
                    continue
                is_dir = bool(mask & flags.ISDIR)
                path = os.path.join(directory, os.fsdecode(event.name))
                if is_dir and self.recursive and mask & _NEW:
                    # Files made in a new directory before its watch was in place raised no event: noted below.
                    if path not in self._wds:
                        self._add(path)
                    for made in [path, *self._add_below(path)]:
                        self._notify.note(made, created=True)
                if is_dir and mask & (flags.DELETE | flags.MOVED_FROM):
                    self._notify.note(path, gone=True)
                self._notify.note(directory, created=bool(mask & _NEW), modified=bool(mask & flags.MODIFY))

    # --- watches (the caller holds the lock) ----------------------------------------------------

    def _add(self, directory: str) -> int | None:
        try:
            wd = int(self._inotify.add_watch(directory, MASK))
        except OSError as exc:
            # Said once: a node past fs.inotify.max_user_watches refuses every new directory alike.
            self._refused += 1
            level = logging.WARNING if self._refused == 1 else logging.DEBUG
            log.log(level, "cannot watch dir=%s error=%s refused=%d; relying on the safety poll (further refusals "
                    "are logged at debug)", directory, exc, self._refused)  # fmt: skip
            return None
        self._paths[wd] = directory
        self._wds[directory] = wd
        return wd

    def _add_below(self, top: str) -> list[str]:
        """Watch every directory below top; the directories newly watched."""
        added = []
        for dirpath, dirnames, _files in os.walk(top):
            for name in dirnames:
                path = os.path.join(dirpath, name)
                if path not in self._wds and self._add(path) is not None:
                    added.append(path)
        return added

    def _forget(self, wd: int) -> None:
        directory = self._paths.pop(wd, None)
        if directory is not None and self._wds.get(directory) == wd:
            del self._wds[directory]

    def _drop_tree(self, root: str) -> None:
        prefix = os.path.join(root, "")
        for directory in [d for d in self._wds if d == root or d.startswith(prefix)]:
            wd = self._wds.pop(directory)
            self._paths.pop(wd, None)
            with contextlib.suppress(OSError):  # gone with its directory already
                self._inotify.rm_watch(wd)
