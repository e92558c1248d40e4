"""The OTLP receiver's daemon side: received lines go to the spool, and the loop reads the spool like pod logs.

    web/otlp.py --accept(lines by spool path)--> Spool.append (durable) --> the loop: discover, tail, detect

The spool lives in the state directory (<state_dir>/otlp). A container run's lines are a file in the kubelet's
layout, so the source set names its series exactly as it names /var/log/pods ones, and the rest of the daemon
(positions, dedupe memory, evidence, retention) treats it as any followed file. append() runs under the source
set's lock: a state save never sees a read position inside a batch that is not committed yet (otlpspool.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..sources.otlpspool import Line, Spool
from .loop import Loop
from .sourceset import SourceSet

SPOOL_DIR = "otlp"


@dataclass(frozen=True, slots=True)
class Accepted:
    """What one request added: lines written to the spool and retried copies skipped."""

    written: int
    duplicates: int


class Receiver:
    """Makes received lines durable in the spool and wakes the loop to read them."""

    def __init__(self, state_dir: str, sources: SourceSet, loop: Loop, wake: Callable[[], None]) -> None:
        self.spool = Spool(os.path.join(state_dir, SPOOL_DIR))
        self.spool.recover()  # before the loop first reads: a batch cut short by a crash is not read
        self._sources = sources
        self._loop = loop
        self._wake = wake
        sources.received_root = self.spool.root
        self.written = 0
        self.duplicates = 0

    def accept(self, batch: Mapping[str, Sequence[Line]]) -> Accepted:
        """Spool a request's lines (SpoolError when the disk refuses), then have the loop read them."""
        with self._sources.locked():
            written, duplicates, new = self.spool.append(batch)
            self.written += written
            self.duplicates += duplicates
        if written:
            self._loop.mark_changed({os.path.dirname(self.spool.path(rel)) for rel in batch})
            if new:
                self._loop.request_discover()
            self._wake()
        return Accepted(written, duplicates)
