"""Wake-ups for the tailers, before any bytes are read: inotify on Linux (inotify.py), else watchdog.

    inotify (inotify.py; watchdog's Observer or PollingObserver) event --> Waker (threading.Event)
        --> app loop calls FileTailer.poll()

File events are wake-ups, not data: the event only says "poll now", the tailers find out what changed.
So a lost or coalesced event costs latency, never bytes, and the app's slow safety poll (a timeout on
wait()) bounds that latency. force_polling switches to watchdog's PollingObserver for network and
overlay filesystems, where inotify misses writes made by other hosts or layers; off Linux, watchdog's Observer
(FSEvents, kqueue, ReadDirectoryChangesW) watches.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)

from .fileid import dir_identity as _identity

if TYPE_CHECKING:
    from .inotify import Watches

log = logging.getLogger(__name__)

# Only changes to content and names. Opens, reads and closes by others (kubectl logs, the kubelet, our
# own tailers) would otherwise wake the loop for nothing; the filter also narrows the inotify mask.
_EVENT_FILTER = [
    FileModifiedEvent,
    FileCreatedEvent,
    FileMovedEvent,
    FileDeletedEvent,
    DirCreatedEvent,
    DirMovedEvent,
    DirDeletedEvent,
]
_GONE = frozenset({"deleted", "moved"})
_NEW = frozenset({"created", "moved"})  # a file that may be a glob's new match: discover soon (daemon/loop.py)
# Past this many distinct changed directories, take_changed() answers None ("poll everything").
_MAX_CHANGED_DIRS = 4096
_STOP_TIMEOUT = 5.0


class _WakeHandler(FileSystemEventHandler):
    """Runs on watchdog's dispatcher thread; records where something changed and sets the event."""

    def __init__(self, waker: Waker) -> None:
        super().__init__()
        self._waker = waker

    def on_any_event(self, event: FileSystemEvent) -> None:
        """Note the event's directory and wake the loop."""
        src = os.fsdecode(event.src_path)
        if event.is_directory:
            # A deleted or moved-away watched directory takes its inotify watch with it.
            self._waker.note(src, gone=event.event_type in _GONE)
        else:
            self._waker.note(
                os.path.dirname(src), created=event.event_type in _NEW, modified=event.event_type == "modified"
            )


class Waker:
    """Turns file events in watched directories into a wake-up that the app loop waits on."""

    def __init__(self, *, force_polling: bool = False, polling_interval: float = 2.0, recursive: bool = False) -> None:
        self.force_polling = force_polling
        self.polling_interval = polling_interval
        # recursive=True suits the Kubernetes pod log root: one watch (one thread) for every pod dir.
        self.recursive = recursive
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._changed: set[str] | None = set()
        self._gone: set[str] = set()
        self._created = False  # a file was created or moved in since the last take_created()
        self._wanted: set[str] = set()
        # Directories whose appends wake nobody: noted for the loop's next pass (daemon/loop.py, quiet_dirs).
        self._quiet: frozenset[str] = frozenset()
        # dir -> (watch handle, (st_dev, st_ino) at schedule time), to notice a deleted and recreated dir.
        self._watches: dict[str, tuple[Any, tuple[int, int]]] = {}
        self._handler = _WakeHandler(self)
        self._observer: Any = None  # watchdog's, with force_polling or off Linux
        self._inotify: Watches | None = None  # on Linux

    def start(self) -> None:
        """Start the observer thread(s) and watch the directories asked for so far."""
        if self._observer is not None or self._inotify is not None:
            return
        if not self.force_polling and sys.platform.startswith("linux"):
            from .inotify import Note, Watches  # Linux only: inotify_simple is installed there

            self._inotify = Watches(Note(self.note, self.overflowed), recursive=self.recursive)
            self._inotify.start()
            self._sync()
            return
        # Built here, not in __init__: the inotify observer starts a reader thread when constructed.
        if self.force_polling:
            from watchdog.observers.polling import PollingObserver  # only with force_polling

            self._observer = PollingObserver(timeout=self.polling_interval)
        else:
            from watchdog.observers import Observer  # off Linux only

            self._observer = Observer()
        self._observer.start()
        self._sync()

    def stop(self) -> None:
        """Stop and join the watcher's thread(s); safe to call twice or before start()."""
        watches, self._inotify = self._inotify, None
        observer, self._observer = self._observer, None
        self._watches.clear()
        if watches is not None:
            stopped = watches.stop(_STOP_TIMEOUT)
        elif observer is not None:
            observer.stop()
            observer.join(_STOP_TIMEOUT)
            stopped = not observer.is_alive()
        else:
            return
        if not stopped:
            log.warning("file watcher did not stop within %.0fs", _STOP_TIMEOUT)
        self._event.set()  # release a loop still waiting, so it can see the shutdown

    def wait(self, timeout: float | None) -> bool:
        """Block until a file event (True) or the timeout (False); clears the wake-up before returning."""
        woke = self._event.wait(timeout)
        if woke:
            # Cleared before the caller polls, so an event arriving during the poll wakes the next
            # wait; one that lands between wait() and clear() is covered by the poll that follows.
            # Never clear after a timeout: that would drop an event set in that same instant.
            self._event.clear()
        return woke

    def wake(self) -> None:
        """Wake the loop without a file event (shutdown, reload)."""
        self._event.set()

    def take_changed(self) -> set[str] | None:
        """Directories with events since the last call; None means too many to track, poll everything."""
        with self._lock:
            changed, self._changed = self._changed, set()
        return changed

    def take_created(self) -> bool:
        """Whether a file was created or moved in since the last call (a glob may have a new match)."""
        with self._lock:
            created, self._created = self._created, False
        return created

    def watch_dirs(self, dirs: set[str]) -> None:
        """Watch exactly these directories (added, removed, re-watched when recreated); missing ones later."""
        self._wanted = {os.path.abspath(d) for d in dirs}
        if self._inotify is not None or self._observer is not None:
            self._sync()

    def quiet(self, dirs: set[str]) -> None:
        """Appends in these directories are noted for the loop's next pass but wake nobody; a file created, moved
        or deleted there still wakes the loop. For directories whose files are read on the loop's own tick anyway
        (another program's container logs: daemon/loop.py), where one wake per write would cost more than the
        reading (a node's other containers write most of its log lines, one write and one event per line)."""
        self._quiet = frozenset(os.path.abspath(d) for d in dirs)

    @property
    def watched(self) -> set[str]:
        """Directories with a live watch now."""
        if self._inotify is not None:
            return set(self._inotify.watched)
        return set(self._watches)

    def note(self, directory: str, *, gone: bool = False, created: bool = False, modified: bool = False) -> None:
        """Something changed in this directory: record it for take_changed(), and wake the loop unless it is only
        an append in a quiet directory."""
        with self._lock:
            self._created = self._created or created
            if gone:
                self._gone.add(directory)
            if self._changed is not None:
                self._changed.add(directory)
                if len(self._changed) > _MAX_CHANGED_DIRS:
                    self._changed = None
        if modified and directory in self._quiet:
            return
        self._event.set()

    def overflowed(self) -> None:
        """The kernel's event queue overflowed: events were lost, so every followed file is looked at."""
        with self._lock:
            self._changed = None
            self._created = True
        self._event.set()

    def _sync(self) -> None:
        with self._lock:
            gone, self._gone = self._gone, set()
        if self._inotify is not None:
            self._inotify.sync(self._wanted, gone)
            return
        # A watch dies with its directory, and a recreated directory may even reuse the inode, so
        # the emitter's own state and the deletion events count as much as the identity check.
        stopped = {e.watch for e in list(self._observer.emitters) if e.stopped_event.is_set()}
        for directory, (watch, known) in list(self._watches.items()):
            if directory not in self._wanted or directory in gone or watch in stopped or _identity(directory) != known:
                self._unschedule(directory)
        for directory in sorted(self._wanted - set(self._watches)):
            identity = _identity(directory)
            if identity is None:
                continue  # not there yet: the next watch_dirs() call (safety poll) tries again
            try:
                watch = self._observer.schedule(
                    self._handler, directory, recursive=self.recursive, event_filter=_EVENT_FILTER
                )
            except OSError as exc:
                log.warning("cannot watch dir=%s error=%s; relying on the safety poll", directory, exc)
                continue
            self._watches[directory] = (watch, identity)

    def _unschedule(self, directory: str) -> None:
        watch, _ = self._watches.pop(directory)
        try:
            self._observer.unschedule(watch)
        except (KeyError, OSError) as exc:
            log.debug("unwatch failed dir=%s error=%s", directory, exc)
