"""What /healthz says about the loop: ready, starting, stalled, or what keeps it from reading every source.

Sits beside the loop (loop.py), which notes each pass here; the HTTP edge calls Loop.health(). Each change of the
trouble is logged once, not every pass, on the logger the loop hands it: health is the loop's story, and its
lines carry the loop's logger name (`logger=sglang_oom_exporter.daemon.loop`), which operators filter on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..events.store import Health
from ..sources.fsname import shown
from .sourceset import SourceFacts, SourceSet
from .state import StateKeeper


@dataclass(frozen=True, slots=True)
class ReceivedFacts:
    """What the OTLP receiver has taken in since the start (daemon/receiver.py): /healthz's words for it."""

    listen: str  # the address it listens on, its bound port
    records: int  # log records received (spooled, retried copies and filtered ones alike)
    sources: int  # sources the spool holds
    last_batch: float | None  # wall time of the last batch it answered 200 (None: none yet)


class HealthWatch:
    """Follows the state saves' outcome and the source set's trouble."""

    def __init__(self, sources: SourceSet, keeper: StateKeeper, log: logging.Logger) -> None:
        self.sources = sources
        self.keeper = keeper
        self.log = log
        self.state_dir: str | None = None
        self._state_seen = (keeper.errors, keeper.saves)
        self._state_failing = False  # the last save attempt failed, and none has succeeded since
        self._trouble_logged = ""  # what health last logged: each change is logged once, not every pass
        self.received: Callable[[], ReceivedFacts] | None = None  # the OTLP receiver's facts, when it is on

    def note(self) -> None:
        """After a pass: follow the state saves, and log each change of what health reports once."""
        errors, saves = self.keeper.errors, self.keeper.saves
        if saves > self._state_seen[1]:
            self._state_failing = False
        elif errors > self._state_seen[0]:
            self._state_failing = True
        self._state_seen = (errors, saves)
        with self.sources.locked():
            facts = self.sources.facts()
            trouble = self._trouble(facts)
            if trouble == self._trouble_logged:
                return
            self._trouble_logged = trouble
            level = logging.WARNING if self._state_failing else logging.INFO
            self.log.log(level, "health: %s", trouble or self._following(facts, logged=True))

    def report(self) -> Health:
        """Ready when sources are being read (some may still be waiting to appear); otherwise the reason.

        Called from the HTTP edge without the source set's lock, which the loop holds through a read slice:
        what it reads are single attribute values the loop replaces whole (a probe must not wait a slice).
        """
        facts = self.sources.facts()
        trouble = self._trouble(facts)
        following = self._following(facts)
        if not trouble:
            return Health(True, following)
        missing = facts.waiting
        if trouble == waiting(missing) and len(missing) < facts.followed:
            return Health(True, f"{following}; {trouble}")  # some files are read: not blind
        return Health(False, trouble)

    def _following(self, facts: SourceFacts, logged: bool = False) -> str:
        """What is read: the sources followed, and in receiver mode what the receiver has taken in (the log line,
        written on each change of trouble, leaves out the counts that change with every batch)."""
        following = f"following {facts.followed} log source(s)"
        if self.received is None:
            return following
        r = self.received()
        if logged:
            return f"receiving OTLP/HTTP logs on {r.listen}; {following}"
        if r.last_batch is None:
            got = "nothing received yet (an agent must send to it: docs/otlp.md)"
        else:
            at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(r.last_batch))
            got = f"{r.records} record(s) received from {r.sources} source(s), the last batch at {at}"
        return f"receiving OTLP/HTTP logs on {r.listen}: {got}; {following}"

    def _trouble(self, facts: SourceFacts) -> str:
        """What keeps the daemon from reading every configured source and saving its state ("": nothing), a name
        in it that is not UTF-8 shown escaped (sources/fsname.py): /healthz's body must encode."""
        return shown(self._what_keeps(facts))

    def _what_keeps(self, facts: SourceFacts) -> str:
        if facts.problem:
            return facts.problem
        if not facts.followed and self.sources.received_root is None:  # the OTLP receiver waits for its records
            return "no log source is configured or found yet"
        if self._state_failing:
            return (
                f"the state cannot be saved in {self.state_dir} (sglang_oom_exporter_state_errors_total "
                "counts it; see the log): a restart would re-read from the end of every file"
            )
        if facts.handles_waiting:
            return (
                f"{facts.handles_waiting} log file(s) wait for a file handle: the open-file limit leaves room "
                f"for {facts.handle_limit} open at once (sglang_oom_exporter_open_file_limit_hits_total)"
            )
        return waiting(facts.waiting)


def waiting(paths: list[str]) -> str:
    """The configured files that do not exist yet, in words ("" for none)."""
    if not paths:
        return ""
    paths = [shown(p) for p in paths[:3]] + paths[3:]  # a configured name that is not UTF-8 (sources/fsname.py)
    why = "(normal until SGLang starts and writes its log)"
    if len(paths) == 1:
        return f"waiting for {paths[0]} to appear {why}"
    names = ", ".join(paths[:3]) + (", ..." if len(paths) > 3 else "")
    return f"waiting for {len(paths)} files to appear {why}: {names}"
