"""The OTLP receiver's daemon side: received lines go to the spool, and the loop reads the spool like pod logs.

    web/otlp.py --accept(lines by spool path)--> Spool.append (durable), a new file followed --> the loop: tail, detect

The spool lives in the state directory (<state_dir>/otlp). A container run's lines are a file in the kubelet's
layout, so the source set names its series exactly as it names /var/log/pods ones, and the rest of the daemon
(positions, dedupe memory, evidence, retention) treats it as any followed file. append() runs under the source
set's lock: a state save never sees a read position inside a batch that is not committed yet (otlpspool.py).
Each durable state save tells the spool what was read (StateKeeper.on_saved), so it can drop rotated segments
and idle sources. The lines of a source the filters leave out (the Kubernetes system namespaces, the exporter's
own container) would never be read, so they are not spooled: counted as filtered.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..config.model import Config
from ..sources.otlpspool import Limits, Line, Spool
from .loop import Loop
from .sourceset import SourceSet

SPOOL_DIR = "otlp"


@dataclass(frozen=True, slots=True)
class Accepted:
    """What one request added: lines written to the spool and retried copies skipped."""

    written: int
    duplicates: int
    filtered: int = 0


class Receiver:
    """Makes received lines durable in the spool and wakes the loop to read them."""

    def __init__(
        self, state_dir: str, sources: SourceSet, loop: Loop, wake: Callable[[], None], config: Config | None = None
    ) -> None:
        self.spool = Spool(os.path.join(state_dir, SPOOL_DIR), limits(config) if config is not None else None)
        self.spool.recover()  # before the loop first reads: a batch cut short by a crash is not read
        self._sources = sources
        self._loop = loop
        self._wake = wake
        sources.received_root = self.spool.root
        loop.keeper.on_saved = self.spool.consumed
        self.written = 0
        self.duplicates = 0
        self.filtered = 0

    def accept(self, batch: Mapping[str, Sequence[Line]]) -> Accepted:
        """Spool a request's lines (SpoolError when the disk refuses), then have the loop read them."""
        wanted = {rel: lines for rel, lines in batch.items() if self._sources.follows_received(self.spool.path(rel))}
        filtered = sum(len(lines) for rel, lines in batch.items() if rel not in wanted)
        try:
            with self._sources.locked():
                written, duplicates, new = self.spool.append(wanted)
                # Followed before the 2xx: a file left to the next discovery would let the daemon report itself
                # caught up (no lag, nothing pending) while the lines it just acknowledged wait unread.
                self._sources.follow_received(new)
                self.written += written
                self.duplicates += duplicates
                self.filtered += filtered
        finally:
            if self.spool.wants_save:  # the spool waits for a save to rotate a log or drop a read segment
                self.spool.wants_save = False
                # Look at the batch's logs now (one may have been rotated in a request refused after it), then
                # save: the save that names the new logs lets the spool drop the segments they were drained from.
                self._loop.mark_changed({os.path.dirname(self.spool.path(rel)) for rel in wanted})
                self._loop.keeper.request_save()
                self._wake()
        if written:
            self._loop.mark_changed({os.path.dirname(self.spool.path(rel)) for rel in wanted})
            self._wake()
        return Accepted(written, duplicates, filtered)


def limits(config: Config) -> Limits:
    """The spool's bounds from the settings."""
    mib = 1024 * 1024
    return Limits(config.otlp_spool_source_mib * mib, config.otlp_spool_total_mib * mib, config.otlp_spool_retention)
