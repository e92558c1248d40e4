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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from sglang_oom_exporter.match import Report, excerpt, resolve_kind
from sglang_oom_exporter.model import OomEvent
from sglang_oom_exporter.prefix import epoch_of, iso_time

CROSS_RANK_SECONDS = 1.5  # ranks of one tick straddle a second boundary (R6)
SAME_RANK_SECONDS = 10.0  # block -> its traceback, with a tree dump printed in between
NO_TIME_LINES = 50_000  # without timestamps, a join must at least be this close in the file
RECENT_GROUPS = 256


@dataclass(slots=True)
class _Member:
    """One rank's reports in a group: its block, its traceback, or both."""

    block: Report | None = None
    trace: Report | None = None

    def first(self) -> Report:
        return self.block or self.trace  # type: ignore[return-value]

    def reports(self) -> Iterator[Report]:
        yield from (r for r in (self.block, self.trace) if r is not None)


@dataclass(slots=True)
class _Group:
    body: str
    epoch: float | None
    lineno: int
    opened_at: float  # caller's clock when the group was opened
    members: dict[str, _Member] = field(default_factory=dict)
    emitted: bool = False

    def settled(self) -> bool:
        """Every block that can expect a traceback has one."""
        return all(m.trace is not None or not _expects_trace(m.block) for m in self.members.values())


def _expects_trace(block: Report | None) -> bool:
    # Since 0.4.5 a fatal KV block is re-raised and a traceback follows; older eras exit(1) silently,
    # so waiting is only a latency cost, never a correctness one.
    return block is not None and block.fatal and block.resolve in ("prefill", "decode", "frames")


class Deduper:
    """Per source. add() reports in log order; emitted events go to the sink, each exactly once."""

    def __init__(
        self,
        source: str,
        location: str,
        sink: Callable[[OomEvent], None],
        remediation: Callable[[str], dict[str, object]] | None = None,
        *,
        wait_seconds: float = 2.5,
        settle_seconds: float = 0.3,
    ) -> None:
        self._source = source
        self._location = location
        self._sink = sink
        self._remediation = remediation
        self._wait = wait_seconds
        self._settle = settle_seconds
        self._groups: deque[_Group] = deque()
        self.emitted = 0

    def add(self, report: Report, now: float = 0.0) -> None:
        """Join the report to its group (or open one)."""
        rec = report.record
        rank = rec.ranks
        epoch = _epoch(report)
        typ = "trace" if rec.kind == "traceback" else "block"
        group = self._same_rank(report, rank, typ, epoch) or self._cross_rank(report, rank, epoch)
        if group is None:
            group = _Group(report.body, epoch, rec.lineno, now)
            self._groups.append(group)
            while len(self._groups) > RECENT_GROUPS:
                old = self._groups.popleft()
                if not old.emitted:
                    self._emit(old)
        member = group.members.setdefault(rank, _Member())
        if typ == "trace":
            member.trace = report
        else:
            member.block = report
        group.lineno = min(group.lineno, rec.lineno)
        if group.epoch is None:
            group.epoch = epoch

    def flush(self, now: float | None = None) -> None:
        """Emit settled or timed-out groups; with now=None (end of input) emit every pending group."""
        pending = sorted((g for g in self._groups if not g.emitted), key=lambda g: g.lineno)
        for group in pending:
            if (
                now is None
                or now - group.opened_at >= self._wait
                or (group.settled() and now - group.opened_at >= self._settle)
            ):
                self._emit(group)

    def pending(self) -> int:
        """Groups not emitted yet."""
        return sum(1 for g in self._groups if not g.emitted)

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
            if _close(epoch, _epoch(other), report.record.lineno, other.record.lineno, SAME_RANK_SECONDS):
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
        members = sorted(group.members.values(), key=lambda m: m.first().record.lineno)
        reports = [r for m in members for r in m.reports()]
        first = members[0].first()
        frames = [r.frames_phase for r in reports if r.frames_phase]
        frames_phase = "spec_verify" if "spec_verify" in frames else (frames[0] if frames else None)
        base = next((r for r in reports if not r.inferred), first)
        kind, phase, subphase = resolve_kind(base.kind, base.resolve, frames_phase)
        numbers: dict[str, object] = {}
        for r in reports:
            for k, v in r.numbers.items():
                numbers.setdefault(k, v)
        rec = first.record
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
            excerpt=excerpt(base.record if not base.inferred else rec),
            phase=phase,
            subphase=subphase,
            inferred=all(r.inferred for r in reports),
            numbers=numbers,
            pools=next((r.pools for r in reports if r.pools), ()),
            epoch=group.epoch,
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
