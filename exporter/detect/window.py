"""The dedupe window of one source: its recent groups, indexed so that a report finds its group in O(1).

Sits inside dedupe.Deduper. A group is one allocation failure: every rank's logged block and traceback
(facts 5). A report joins a group of its own rank whose other half (block or traceback) waits for it (R2),
or a group of other ranks with the same body (R6); the window answers both questions from two indexes
(rank, the missing half and the other half's short text; body), so the cost per report does not grow
with the number of groups kept. The window keeps a group after its event was counted, so that late ranks
and tracebacks still join it; dedupe.py decides when a group may go.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..catalog.vocabulary import KV_FAILURE_PHASES
from ..detect.model import Report
from ..sources import saved

CROSS_RANK_SECONDS = 1.5  # ranks of one tick straddle a second boundary (R6)
SAME_RANK_SECONDS = 10.0  # block -> its traceback, with a tree dump printed in between
NO_TIME_LINES = 50_000  # without timestamps, a join must at least be this close in the file


@dataclass(frozen=True, slots=True)
class Seen:
    """What a later report needs to know of an earlier one to join it; small enough to persist."""

    short: str
    epoch: float | None
    lineno: int
    offset: int


@dataclass(slots=True)
class Member:
    """One rank's part of a group: whether its block and its traceback were seen, and their reports."""

    block: Seen | None = None
    trace: Seen | None = None
    reports: list[Report] = field(default_factory=list)  # empty once counted, and for a group restored from state


@dataclass(slots=True)
class Group:
    """The reports of one failure on every rank, and when the group was last touched (caller's clock)."""

    body: str
    epoch: float | None
    lineno: int
    offset: int
    opened_at: float  # caller's clock when the group was opened
    touched: float | None = None  # caller's clock at the last report; None: restored, not seen since
    last_lineno: int = 0  # the latest line of any record in the group
    members: dict[str, Member] = field(default_factory=dict)
    emitted: bool = False
    seq: int = 0  # creation order in the window: the newest group wins a join
    key_offset: int = -1  # where the report that opened it starts: its replay key, whatever joins it later

    def waiting(self) -> list[Report]:
        """The blocks that expect a traceback and have none yet."""
        return [
            r
            for m in self.members.values()
            if m.trace is None
            for r in m.reports
            if r.record.kind == "block" and expects_trace(r)
        ]

    def to_dict(self) -> dict[str, Any]:
        """The join-relevant part of an emitted group, for the state file."""

        def seen(s: Seen | None) -> list[Any] | None:
            return None if s is None else [s.short, s.epoch, s.lineno, s.offset]

        return {
            "body": self.body, "epoch": self.epoch, "lineno": self.lineno, "offset": self.offset,
            "members": {rank: [seen(m.block), seen(m.trace)] for rank, m in self.members.items()},
        }  # fmt: skip

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Group:
        """Inverse of to_dict; raises (KeyError, TypeError, ValueError) on a malformed entry."""

        def seen(v: Any) -> Seen | None:
            if v is None:
                return None
            short, epoch, lineno, offset = saved.array(v, "members.*[]")
            return Seen(saved.text(short, "short"), saved.optional(saved.number, epoch, "epoch"),
                        saved.integer(lineno, "lineno"), saved.integer(offset, "offset"))  # fmt: skip

        group = cls(saved.text(raw["body"], "body"), saved.optional(saved.number, raw["epoch"], "epoch"),
                    saved.integer(raw["lineno"], "lineno"), saved.integer(raw["offset"], "offset"), 0.0,
                    emitted=True)  # fmt: skip
        for rank, halves in saved.obj(raw["members"], "members").items():
            block, trace = saved.array(halves, "members.*")
            group.members[saved.text(rank, "rank")] = Member(seen(block), seen(trace))
        group.last_lineno = max([group.lineno] + [s.lineno for m in group.members.values() for s in _halves(m)])
        return group


def expects_trace(block: Report) -> bool:
    """A fatal KV block: since 0.4.5 it is re-raised and a traceback follows (older eras exit(1) silently); or a
    line whose assertion may follow (Report.awaits_partner)."""
    return (block.fatal and block.resolve in KV_FAILURE_PHASES) or block.awaits_partner


def close(a: float | None, b: float | None, line_a: int, line_b: int, seconds: float) -> bool:
    """Near enough to be one failure: by log time when both have one, else by distance in the file."""
    if a is not None and b is not None:
        return abs(a - b) <= seconds
    return abs(line_a - line_b) <= NO_TIME_LINES


def _halves(m: Member) -> list[Seen]:
    return [s for s in (m.block, m.trace) if s is not None]


_Key = tuple[str, str, str]  # (rank, the missing half: "block" | "trace", the present half's short)


class Window:
    """The groups in creation order, with the two join indexes kept in step."""

    def __init__(self) -> None:
        self._groups: deque[Group] = deque()
        self._seq = 0
        self._halves: dict[_Key, dict[int, Group]] = {}  # members with one half seen, by what the other needs
        self._bodies: dict[str, dict[int, Group]] = {}

    def __len__(self) -> int:
        return len(self._groups)

    def __iter__(self) -> Iterator[Group]:
        return iter(self._groups)

    def oldest(self) -> Group | None:
        """The group opened first, if any."""
        return self._groups[0] if self._groups else None

    def newest(self) -> Group | None:
        """The group opened last, if any."""
        return self._groups[-1] if self._groups else None

    def add(self, group: Group) -> None:
        """Put a new (or restored) group in the window, newest."""
        self._seq += 1
        group.seq = self._seq
        self._groups.append(group)
        if group.body:
            self._bodies.setdefault(group.body, {})[group.seq] = group
        for rank, member in group.members.items():
            self._index(group, rank, member)

    def popleft(self) -> Group:
        """Take the oldest group out of the window and its indexes."""
        group = self._groups.popleft()
        if group.body:
            _drop(self._bodies, group.body, group.seq)
        for rank, member in group.members.items():
            key = _half_key(rank, member)
            if key is not None:
                _drop(self._halves, key, group.seq)
        return group

    def fill(self, group: Group, rank: str, typ: str, seen: Seen) -> Member:
        """Record that rank's block or traceback ("block" | "trace") was seen in group."""
        member = group.members.get(rank)
        if member is None:
            member = group.members[rank] = Member()
        else:
            key = _half_key(rank, member)
            if key is not None:
                _drop(self._halves, key, group.seq)
        setattr(member, typ, seen)
        self._index(group, rank, member)
        return member

    def same_rank(self, report: Report, rank: str, typ: str, epoch: float | None) -> Group | None:
        """The newest group where this rank's other half waits for this report (R2)."""
        if report.short:
            found = [*self._halves.get((rank, typ, report.short), {}).values(),
                     *self._halves.get((rank, typ, ""), {}).values()]  # fmt: skip
        else:  # a report that names no text (a traceback cut short) joins any half of its rank: rare
            found = [g for key, groups in self._halves.items() if key[:2] == (rank, typ) for g in groups.values()]
        best: Group | None = None
        for group in found:
            member = group.members[rank]
            other = member.trace if typ == "block" else member.block
            if other is None:  # never: a member is indexed as a half only while its other half is there
                continue
            if (best is None or group.seq > best.seq) and close(
                epoch, other.epoch, report.record.lineno, other.lineno, SAME_RANK_SECONDS
            ):
                best = group
        return best

    def cross_rank(self, report: Report, rank: str, epoch: float | None) -> Group | None:
        """The newest group of other ranks with the same body, near enough in time (R6)."""
        if not report.body:
            return None
        for group in reversed(self._bodies.get(report.body, {}).values()):
            if rank not in group.members and close(
                epoch, group.epoch, report.record.lineno, group.lineno, CROSS_RANK_SECONDS
            ):
                return group
        return None

    def _index(self, group: Group, rank: str, member: Member) -> None:
        key = _half_key(rank, member)
        if key is not None:
            self._halves.setdefault(key, {})[group.seq] = group


def _half_key(rank: str, member: Member) -> _Key | None:
    if member.block is not None and member.trace is None:
        return (rank, "trace", member.block.short)
    if member.trace is not None and member.block is None:
        return (rank, "block", member.trace.short)
    return None


def _drop(index: dict[Any, dict[int, Group]], key: Any, seq: int) -> None:
    groups = index.get(key)
    if groups is not None:
        groups.pop(seq, None)
        if not groups:
            del index[key]
