"""Report -> OomEvent: one event per allocation failure, whatever number of ranks and copies. Pure.

Rules (facts 5): a rank's logged block and the traceback that repeats it are one report pair (R2);
an exception with no block counts once (R3, R4); N ranks failing with the same body within a second
are one server-level event with the ranks listed (R6); different bodies stay apart (data-parallel
ranks have their own pools); a rank can appear in an event only once, so two failures are two events.

A group is emitted when it settles: every block has its traceback, or the wait for a traceback ran out,
or the caller flushes (end of a scan). A rank arriving after its group was emitted still joins it
(recent groups are kept), so a late rank never counts again. The group's kind is fixed at emission.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..detect.match import excerpt
from ..detect.model import OomEvent, Report
from ..detect.prefix import epoch_of, iso_time

CROSS_RANK_SECONDS = 1.5  # ranks of one tick straddle a second boundary (R6)
SAME_RANK_SECONDS = 10.0  # block -> its traceback, with a tree dump printed in between
NO_TIME_LINES = 50_000  # without timestamps, a join must at least be this close in the file
RECENT_GROUPS = 256
# A settled group (every block has its traceback) may also go once the reader is this many lines past its
# last record: other ranks' copies come within a few records (dumps included), and one that comes later
# still joins the emitted group. Without it, reading a backlog would wait the wall-clock settle per slice.
SETTLE_LINES = 5000
STATE_GROUPS = 64  # emitted groups kept in the state file, for late tracebacks after a restart
EMITTED_KEYS = 1024  # keys of emitted events kept to suppress their replay after a restart
Resolve = Callable[[Report, Sequence[Report]], tuple[str, str | None, str | None]]


@dataclass(frozen=True, slots=True)
class _Seen:
    """What a later report needs to know of an earlier one to join it; small enough to persist."""

    short: str
    epoch: float | None
    lineno: int
    offset: int


@dataclass(slots=True)
class _Member:
    """One rank's part of a group: whether its block and its traceback were seen, and their reports."""

    block: _Seen | None = None
    trace: _Seen | None = None
    reports: list[Report] = field(default_factory=list)  # empty for a group restored from state


@dataclass(slots=True)
class _Group:
    body: str
    epoch: float | None
    lineno: int
    offset: int
    opened_at: float  # caller's clock when the group was opened
    last_lineno: int = 0  # the latest line of any record in the group
    members: dict[str, _Member] = field(default_factory=dict)
    emitted: bool = False

    def settled(self) -> bool:
        """Every block that can expect a traceback has one."""
        return all(
            m.trace is not None or not any(_expects_trace(r) for r in m.reports if r.record.kind == "block")
            for m in self.members.values()
        )

    def to_dict(self) -> dict[str, Any]:
        """The join-relevant part of an emitted group, for the state file."""

        def seen(s: _Seen | None) -> list[Any] | None:
            return None if s is None else [s.short, s.epoch, s.lineno, s.offset]

        return {
            "body": self.body, "epoch": self.epoch, "lineno": self.lineno, "offset": self.offset,
            "members": {rank: [seen(m.block), seen(m.trace)] for rank, m in self.members.items()},
        }  # fmt: skip

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> _Group:
        """Inverse of to_dict; raises (KeyError, TypeError, ValueError) on a malformed entry."""

        def seen(v: Any) -> _Seen | None:
            return None if v is None else _Seen(str(v[0]), None if v[1] is None else float(v[1]), int(v[2]), int(v[3]))

        group = cls(str(raw["body"]), None if raw["epoch"] is None else float(raw["epoch"]), int(raw["lineno"]),
                    int(raw["offset"]), 0.0, emitted=True)  # fmt: skip
        for rank, (block, trace) in dict(raw["members"]).items():
            group.members[str(rank)] = _Member(seen(block), seen(trace))
        return group


def _expects_trace(block: Report) -> bool:
    # Since 0.4.5 a fatal KV block is re-raised and a traceback follows; older eras exit(1) silently,
    # so waiting is only a latency cost, never a correctness one.
    return block.fatal and block.resolve in ("prefill", "decode", "frames")


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
        settle_seconds: float = 0.3,
    ) -> None:
        self._resolve = resolve  # the matcher's: (kind, phase, subphase) of the joined reports, decided once
        self._source = source
        self._location = location
        self._sink = sink
        self._wait = wait_seconds
        self._settle = settle_seconds
        self._groups: deque[_Group] = deque()
        self._emitted_keys: deque[str] = deque(maxlen=EMITTED_KEYS)
        self.generation = ""
        self.emitted = 0
        self.suppressed = 0

    def add(self, report: Report, now: float = 0.0) -> None:
        """Join the report to its group (or open one)."""
        rec = report.record
        rank = rec.ranks
        epoch = _epoch(report)
        typ = "trace" if rec.kind == "traceback" else "block"
        group = self._same_rank(report, rank, typ, epoch) or self._cross_rank(report, rank, epoch)
        if group is None:
            group = _Group(report.body, epoch, rec.lineno, rec.offset, now)
            self._groups.append(group)
            while len(self._groups) > RECENT_GROUPS:
                old = self._groups.popleft()
                if not old.emitted:
                    self._emit(old)
        member = group.members.setdefault(rank, _Member())
        seen = _Seen(report.short, epoch, rec.lineno, rec.offset)
        if typ == "trace":
            member.trace = seen
        else:
            member.block = seen
        if not group.emitted:  # a late report only joins an emitted group; its records are not needed again
            member.reports.append(report)
        if rec.lineno < group.lineno:
            group.lineno, group.offset = rec.lineno, rec.offset
        group.last_lineno = max(group.last_lineno, rec.lineno)
        if group.epoch is None:
            group.epoch = epoch

    def flush(self, now: float | None = None, lineno: int | None = None) -> None:
        """Emit settled or timed-out groups; with now=None (end of input) emit every pending group.

        lineno is how far the reader has got: a settled group far enough behind it goes at once.
        """
        pending = sorted((g for g in self._groups if not g.emitted), key=lambda g: g.lineno)
        for group in pending:
            if (
                now is None
                or now - group.opened_at >= self._wait
                or (
                    group.settled()
                    and (
                        now - group.opened_at >= self._settle
                        or (lineno is not None and lineno - group.last_lineno >= SETTLE_LINES)
                    )
                )
            ):
                self._emit(group)

    def pending(self) -> int:
        """Groups not emitted yet."""
        return sum(1 for g in self._groups if not g.emitted)

    def resume_point(self) -> tuple[int, int] | None:
        """(offset, lineno) of the oldest report of a group not emitted yet, if any."""
        points = [
            (r.record.offset, r.record.lineno)
            for g in self._groups if not g.emitted
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
            keys = [str(k) for k in raw.get("emitted_keys", [])]
            groups = [_Group.from_dict(g) for g in raw.get("groups", [])]
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ValueError(f"bad dedupe state: {exc}") from exc
        self._emitted_keys.extend(keys)
        self._groups.extend(groups)

    def _key(self, group: _Group) -> str:
        return f"{self.generation}@{group.offset}"

    def _same_rank(self, report: Report, rank: str, typ: str, epoch: float | None) -> _Group | None:
        for group in reversed(self._groups):
            member = group.members.get(rank)
            if member is None or getattr(member, typ) is not None:
                continue
            other = member.trace if typ == "block" else member.block
            if other is None:
                continue
            if report.short and other.short and report.short != other.short:
                continue
            if _close(epoch, other.epoch, report.record.lineno, other.lineno, SAME_RANK_SECONDS):
                return group
        return None

    def _cross_rank(self, report: Report, rank: str, epoch: float | None) -> _Group | None:
        if not report.body:
            return None
        for group in reversed(self._groups):
            if group.body != report.body or rank in group.members:
                continue
            if _close(epoch, group.epoch, report.record.lineno, group.lineno, CROSS_RANK_SECONDS):
                return group
        return None

    def _emit(self, group: _Group) -> None:
        group.emitted = True
        members = sorted((m for m in group.members.values() if m.reports), key=lambda m: m.reports[0].record.lineno)
        reports = [r for m in members for r in m.reports]
        # An emitted group stays in the window only so that late ranks and tracebacks join it (by its _Seen
        # marks and body); its reports hold every line of every rank's block and traceback, so let them go.
        # Keeping them made the window about 25 KB per TP8 event, 256 events per followed file.
        for m in group.members.values():
            m.reports = []
        key = self._key(group)
        if key in self._emitted_keys:
            self.suppressed += 1  # re-read after a restart: counted before it
            return
        self._emitted_keys.append(key)
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
        )
        self.emitted += 1
        self._sink(event)


def _epoch(report: Report) -> float | None:
    rec = report.record
    return epoch_of(rec.time) if rec.time else epoch_of(rec.runtime_time)


def _close(a: float | None, b: float | None, line_a: int, line_b: int, seconds: float) -> bool:
    if a is not None and b is not None:
        return abs(a - b) <= seconds
    return abs(line_a - line_b) <= NO_TIME_LINES


_DIGITS = re.compile(r"(\d+)")


def _natural(text: str) -> list[object]:
    return [int(p) if p.isdigit() else p for p in _DIGITS.split(text)]
