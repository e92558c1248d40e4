"""Report -> OomEvent: one event per allocation failure, whatever number of ranks and copies. Pure.

Rules (facts 5): a rank's logged block and the traceback that repeats it are one report pair (R2);
an exception with no block counts once (R3, R4); N ranks failing with the same body within a second
are one server-level event with the ranks listed (R6); different bodies stay apart (data-parallel
ranks have their own pools); a rank can appear in an event only once, so two failures are two events.

When a group is counted (emitted), as soon as it is decidable:
- its kind is known and every block has its traceback: once the rank window closed (RANK_WINDOW_SECONDS
  on the caller's clock; the ranks of one tick come within milliseconds);
- its blocks' own text names the kind (every catalog kind whose phase rule is not `frames`): the same,
  unless a traceback of one of its ranks is being assembled right now (its frames may say speculative
  verify, which makes a "Prefill" text a decode step); a traceback that comes later joins the counted
  event and is not counted again;
- a block whose kind needs the traceback's frames (the generic 0.5.4+ text), or a line whose assertion may
  follow (a catalog `joins` pattern: 0.5.23's SWA eviction warning): when its traceback came, or when the wait
  for it (--traceback-wait) ran out; a line that waits for its assertion also when a fatal failure after it is
  decided (the scheduler dies of that one, so its own assertion cannot follow), and before it, in log order;
- by position, whatever the clock says: when the reader is far past the group (a backlog read at speed:
  catch-up after a restart, stdin), its traceback did not follow and will not;
- at the end of the input (flush(None)), or when the window overflows.
A rank or traceback arriving after its group was counted still joins it (the window keeps counted groups
until no report can join them any more), so a late copy never counts again. The group's kind is fixed when
it is counted.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from typing import Any

from ..catalog.vocabulary import PHASE_FRAMES
from ..detect.match import excerpt
from ..detect.model import OomEvent, Report
from ..detect.prefix import epoch_of, iso_time
from ..detect.window import NO_TIME_LINES, SAME_RANK_SECONDS, Group, Seen, Window
from ..sources import saved
from ..sources.fsname import shown

RANK_WINDOW_SECONDS = 0.15  # the ranks of one tick, and a traceback written with its block, arrive within this
RECENT_GROUPS = 256
# By position: a group whose kind is known goes once the reader is this many lines past its last record (other
# ranks' copies come within a few records, dumps included); one whose kind needs the traceback's frames waits
# as far as a join can reach without timestamps. A report that comes later still joins the counted group.
SETTLE_LINES = 5000
FRAMES_LINES = NO_TIME_LINES
# A counted group untouched this long (caller's clock; at least the traceback wait plus the same-rank window)
# can join nothing any more: it leaves the window, so a followed file's memory is flat in steady state.
KEEP_SECONDS = 30.0
# The main process's start-up failure (Report.aftermath) this close after the source's latest failure only repeats
# it (the scheduler that died is that failure): by log time when both have one, else by lines.
AFTERMATH_SECONDS = 60.0
AFTERMATH_LINES = 1000
STATE_GROUPS = 64  # emitted groups kept in the state file, for late tracebacks after a restart
EMITTED_KEYS = 1024  # at most this many keys of emitted events, to suppress their replay after a restart
_EPS = 1e-6  # the loop wakes at opened_at + window: float rounding must not make that a tick too early
Resolve = Callable[[Report, Sequence[Report]], tuple[str, str | None, str | None]]


class Deduper:
    """Per source. add() reports in log order; emitted events go to the sink, each exactly once.

    Across restarts: the caller re-reads from resume_point(), and export_state()/restore_state() carry
    the keys of events already emitted (re-created ones are suppressed) and the recent emitted groups (a
    traceback arriving after the restart still joins the block that was counted before it).
    """

    def __init__(
        self,
        source: str,
        location: str,
        sink: Callable[[OomEvent], None],
        *,
        resolve: Resolve,
        wait_seconds: float = 2.5,
        settle_seconds: float = RANK_WINDOW_SECONDS,
    ) -> None:
        self._resolve = resolve  # the matcher's: (kind, phase, subphase) of the joined reports, decided once
        # A file name that is not UTF-8 reaches every event, label and answer escaped (sources/fsname.py).
        self._source = shown(source)
        self._location = shown(location)
        self._sink = sink
        self._wait = wait_seconds
        self.settle_seconds = settle_seconds  # the rank window
        self._keep = max(KEEP_SECONDS, wait_seconds + SAME_RANK_SECONDS)
        self._groups = Window()
        self._pending: dict[int, Group] = {}  # by seq: the groups not emitted yet
        self._emitted_keys: dict[str, None] = {}  # insertion-ordered set
        self.generation = ""
        self.emitted = 0
        self.suppressed = 0
        self.repeats = 0  # start-up failures dropped as the echo of the failure just before them

    def add(self, report: Report, now: float = 0.0) -> None:
        """Join the report to its group (or open one)."""
        rec = report.record
        rank = rec.ranks
        epoch = _epoch(report)
        if report.aftermath and self._repeats(report, epoch):
            self.repeats += 1
            return
        typ = "trace" if rec.kind == "traceback" else "block"
        window = self._groups
        group = window.same_rank(report, rank, typ, epoch) or window.cross_rank(report, rank, epoch)
        if group is None:
            group = Group(report.body, epoch, rec.lineno, rec.offset, now, key_offset=rec.offset)
            window.add(group)
            self._pending[group.seq] = group
            while len(window) > RECENT_GROUPS:
                old = window.popleft()
                if not old.emitted:
                    self._emit(old)  # out of the window already: nothing can join it any more
        member = window.fill(group, rank, typ, Seen(report.short, epoch, rec.lineno, rec.offset))
        if not group.emitted:  # a late report only joins an emitted group; its records are not needed again
            member.reports.append(report)
        if rec.lineno < group.lineno:
            group.lineno, group.offset = rec.lineno, rec.offset
        group.last_lineno = max(group.last_lineno, rec.lineno)
        group.touched = now
        if group.epoch is None:
            group.epoch = epoch

    def _repeats(self, report: Report, epoch: float | None) -> bool:
        """Whether this start-up failure follows the source's latest failure closely enough to be its echo."""
        latest = self._groups.newest()
        if latest is None:
            return False
        if epoch is not None and latest.epoch is not None:
            return 0 <= epoch - latest.epoch <= AFTERMATH_SECONDS
        # A group restored from the state file knows its first line only.
        return 0 <= report.record.lineno - max(latest.last_lineno, latest.lineno) <= AFTERMATH_LINES

    def flush(self, now: float | None = None, lineno: int | None = None, tracing: Collection[str] = ()) -> None:
        """Emit the groups that are decidable now (module docstring); with now=None (end of input) every one.

        lineno is how far the reader has got; tracing holds the ranks whose traceback is being assembled.
        """
        pending = sorted(self._pending.values(), key=lambda g: g.lineno)
        due = [now is None or self._due(g, now, lineno, tracing) for g in pending]
        # A fatal failure decided after a line that waits for its partner assertion (a `joins` pattern): the
        # scheduler is dying of that failure, so the partner cannot follow any more. Both are decided now, in log
        # order, so that the last event is the same however the clock and the reads fall.
        dying = max((i for i, g in enumerate(pending) if due[i] and _fatal(g)), default=-1)
        for i, group in enumerate(pending):
            if due[i] or (i < dying and _awaits_partner_only(group)):
                if now is not None:
                    group.touched = now  # late copies may come from now on: its time in the window starts here
                self._emit(group)
        if now is not None:
            self._forget(now)

    def pending(self) -> int:
        """Groups not emitted yet."""
        return len(self._pending)

    def start(self, generation: str) -> None:
        """The reports that follow come from this file generation: keys of any other one can never recur."""
        if generation != self.generation:
            self._emitted_keys = {k: None for k in self._emitted_keys if k.rpartition("@")[0] == generation}
        self.generation = generation

    def forget_before(self, offset: int) -> None:
        """The reader will never again go back before offset (a restart resumes at or after it): the keys of
        this generation's events that began before it cannot be re-created, so they go."""
        keys = self._emitted_keys
        if keys:
            gen = self.generation
            drop = [k for k in keys if (p := k.rpartition("@"))[0] == gen and p[2].isdigit() and int(p[2]) < offset]
            for k in drop:
                del keys[k]

    def resume_point(self) -> tuple[int, int] | None:
        """(offset, lineno) of the oldest report of a group not emitted yet, if any."""
        points = [
            (r.record.offset, r.record.lineno)
            for g in self._pending.values()
            for m in g.members.values() for r in m.reports
        ]  # fmt: skip
        return min(points, default=None)

    def export_state(self) -> dict[str, Any]:
        """Emitted keys and the recent emitted groups, as plain data."""
        emitted = [g.to_dict() for g in self._groups if g.emitted][-STATE_GROUPS:]
        return {"emitted_keys": list(self._emitted_keys), "groups": emitted}

    def restore_state(self, raw: dict[str, Any]) -> None:
        """Take back what export_state() gave; ValueError when it is malformed."""
        try:
            memory = saved.obj(raw, "dedupe")
            keys = [saved.text(k, "emitted_keys[]") for k in saved.array(memory.get("emitted_keys", []), "keys")]
            groups = [
                Group.from_dict(dict(saved.obj(g, "groups[]"))) for g in saved.array(memory.get("groups", []), "groups")
            ]
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ValueError(f"bad dedupe state: {exc}") from exc
        for k in keys[-EMITTED_KEYS:]:
            self._emitted_keys[k] = None
        for g in groups:
            self._groups.add(g)  # touched stays None: its age counts from the first flush after the restart

    def _key(self, group: Group) -> str:
        # The opening report's offset, not the group's earliest: a record that started earlier but closed later
        # (another stream) may join after the count, and a re-read must still make the same key.
        return f"{self.generation}@{group.key_offset}"

    def _due(self, group: Group, now: float, lineno: int | None, tracing: Collection[str]) -> bool:
        age = now - group.opened_at
        if age >= self._wait:
            return True
        behind = -1 if lineno is None else lineno - group.last_lineno
        waiting = group.waiting()
        if any(r.resolve == PHASE_FRAMES or r.awaits_partner for r in waiting):
            return behind >= FRAMES_LINES  # its kind (or its fatality) is in the traceback: only the wait or position
        if behind >= SETTLE_LINES:
            return True
        if age < self.settle_seconds - _EPS:
            return False  # the rank window is open
        # A traceback of a waiting rank is being assembled: let it join first (its frames may name the phase).
        return not any(r.record.ranks in tracing or "" in tracing for r in waiting)

    def _forget(self, now: float) -> None:
        """Counted groups that nothing can join any more leave the window (oldest first)."""
        window = self._groups
        while (group := window.oldest()) is not None and group.emitted:
            if group.touched is None:
                group.touched = now  # restored from state: give late reports their time after the restart
            if now - group.touched < self._keep:
                return
            window.popleft()

    def _emit(self, group: Group) -> None:
        group.emitted = True
        self._pending.pop(group.seq, None)
        members = sorted((m for m in group.members.values() if m.reports), key=lambda m: m.reports[0].record.lineno)
        reports = [r for m in members for r in m.reports]
        # An emitted group stays in the window only so that late ranks and tracebacks join it (by its Seen
        # marks and body); its reports hold every line of every rank's block and traceback, so let them go.
        # Keeping them made the window about 25 KB per TP8 event, 256 events per followed file.
        for m in group.members.values():
            m.reports = []
        key = self._key(group)
        if key in self._emitted_keys:
            self.suppressed += 1  # re-read after a restart: counted before it
            return
        self._emitted_keys[key] = None
        if len(self._emitted_keys) > EMITTED_KEYS:
            del self._emitted_keys[next(iter(self._emitted_keys))]
        if not reports:
            return
        first = reports[0]
        base = next((r for r in reports if not r.inferred), first)
        kind, phase, subphase = self._resolve(base, reports)
        numbers: dict[str, object] = {}
        for r in reports:
            for k, v in r.numbers.items():
                numbers.setdefault(k, v)
        stamp = next((r.record.time for r in reports if r.record.time), None)
        time = iso_time(stamp) or next((r.record.runtime_time for r in reports if r.record.runtime_time), None)
        event = OomEvent(
            kind=kind,
            fatal=any(r.fatal for r in reports),
            source=self._source,
            location=f"{self._location}:{group.lineno}",
            time=time,
            ranks=tuple(sorted((r for r in group.members if r), key=_natural)),
            message=base.message,
            excerpt=excerpt(base.record if not base.inferred else first.record),
            phase=phase,
            subphase=subphase,
            inferred=all(r.inferred for r in reports),
            numbers=numbers,
            pools=next((r.pools for r in reports if r.pools), ()),
            epoch=group.epoch,
            offset=group.offset,
            server=first.server,
        )
        self.emitted += 1
        self._sink(event)


def _fatal(group: Group) -> bool:
    return any(r.fatal for m in group.members.values() for r in m.reports)


def _awaits_partner_only(group: Group) -> bool:
    """Its only wait is for a partner assertion (not for frames that name its kind)."""
    waiting = group.waiting()
    return bool(waiting) and all(r.awaits_partner and r.resolve != PHASE_FRAMES for r in waiting)


def _epoch(report: Report) -> float | None:
    rec = report.record
    return epoch_of(rec.time) if rec.time else epoch_of(rec.runtime_time)


_DIGITS = re.compile(r"(\d+)")


def _natural(text: str) -> list[object]:
    return [int(p) if p.isdigit() else p for p in _DIGITS.split(text)]
