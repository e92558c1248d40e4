"""Value types that flow through the pipeline, left to right.

    source bytes -> RawLine (reader) -> LogLine (decode) -> Record (assemble)
        -> Report (match) -> OomEvent (dedupe) -> metrics / event store / scan output

Every type is frozen: a stage never mutates what an earlier stage produced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class RawLine:
    """One physical line as read, without its newline; lineno is 1-based within its source."""

    lineno: int
    data: bytes
    offset: int = 0  # byte offset of the line's start in its file generation


@dataclass(frozen=True, slots=True)
class Gap:
    """Lines the prefilter skipped because no anchor was near them (they can hold no event)."""

    lines: int


@dataclass(frozen=True, slots=True)
class LogLine:
    """A logical line after the container wrapper (CRI, docker JSON, compose) was removed."""

    lineno: int
    text: str
    stream: str = ""
    runtime_time: str | None = None
    offset: int = 0


@dataclass(frozen=True, slots=True)
class Prefix:
    """What SGLang's (or a custom) log prefix told us about a line."""

    time: str | None  # as logged, e.g. "2026-03-14 22:07:33" or "09:41:07"
    ranks: str  # rank tokens as logged, e.g. "DP0 TP1 EP1"; "" when none


@dataclass(frozen=True, slots=True)
class Record:
    """A logical SGLang log record: one message with its detail lines, or one traceback.

    kind is "block" (a logged message and its continuation lines), "traceback" (a header,
    frames and the exception text), or "line" (anything else that carried an anchor).
    """

    kind: str
    lineno: int  # first physical line
    time: str | None
    ranks: str
    stream: str
    lines: tuple[str, ...]  # message lines, prefixes removed; for a traceback, the exception text
    frames: tuple[tuple[str, str], ...] = ()  # traceback frames (path, function), outermost first
    runtime_time: str | None = None
    truncated: bool = False  # a traceback that ended before any exception line
    offset: int = 0  # byte offset of the first physical line
    prefixed: bool = False  # its first line carried a log prefix: SGLang's record by its own framing
    echoed: bool = False  # its first line held SGLang's traceback header after another program's words (an echo)
    header: str = ""  # a traceback's header line as logged after the prefix ("Scheduler hit an exception: ...")


@dataclass(frozen=True, slots=True)
class PoolState:
    """One KV pool (full, swa, mamba, ...) as a message gave it; None where it gave nothing.

    Each field means what SGLang's own words mean: available is what an allocation could get, free
    plus evictable ("Available tokens: T"); free is the allocator's free slots (available_size); total
    is the pool's capacity, which only the leak check prints. protected, session_held and uncached
    come from the 0.5.18+ leak check; counted is what an earlier busy-time check summed up against the
    capacity ("full_total=T vs self.full_tokens_per_layer=N": counted T, total N), and cached the stale
    available-size memo of the byte-pool check (its actual value is free).
    """

    name: str
    total: int | None = None
    available: int | None = None
    evictable: int | None = None
    free: int | None = None
    protected: int | None = None
    session_held: int | None = None
    uncached: int | None = None
    counted: int | None = None
    cached: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain data for JSON: the base fields always, the leak check's terms when it gave them."""
        out: dict[str, Any] = {"pool": self.name, "total": self.total, "available": self.available,
                               "evictable": self.evictable, "free": self.free}  # fmt: skip
        for key in ("protected", "session_held", "uncached", "counted", "cached"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


@dataclass(frozen=True, slots=True)
class Suggestion:
    """A concrete flag change for one event, with the rule that produced the number."""

    flag: str  # e.g. "--chunked-prefill-size"
    current: float | None  # the server's value, when known
    suggested: float | None  # None: the advice has no number (the inputs were missing)
    rule: str  # how the number was computed, in words, with the inputs
    when: str = ""  # the condition it applies under, when not always

    def as_dict(self) -> dict[str, Any]:
        """Plain data for JSON."""
        return {"flag": self.flag, "current": _num(self.current), "suggested": _num(self.suggested),
                "rule": self.rule, "when": self.when}  # fmt: skip

    def change(self, arrow: str = "->") -> str:
        """'16384 -> 4096', or just '4096' when the current value is unknown (for text and HTML)."""
        if self.current is None:
            return format_number(self.suggested)
        return f"{format_number(self.current)} {arrow} {format_number(self.suggested)}"


def _num(value: float | None) -> float | int | None:
    return int(value) if value is not None and float(value).is_integer() else value


def format_number(value: float | None) -> str:
    """A flag value as people write it: 4096 rather than 4096.0, 0.83 as is, ? when unknown."""
    return "?" if value is None else str(_num(value))


@dataclass(frozen=True, slots=True)
class ServerLog:
    """What a source's log said about its server up to one point of one run (detect/serverlog.py reads it).

    args: the start-up lines' values as /server_info names them (no None); batch: the run's last usage line,
    raw (parsed only for an event: serverlog.state_of); reset: a banner is among the lines folded in, so nothing
    before them applies. Hashable and compared by value.
    """

    args: tuple[tuple[str, Any], ...] = ()
    batch: str | None = None
    reset: bool = False

    def then(self, later: ServerLog) -> ServerLog:
        """This, then the lines `later` folds (a restart's banner among them replaces everything before)."""
        if later.reset:
            return later
        if not later.args and later.batch is None:
            return self
        merged = dict(self.args)
        merged.update(later.args)
        return ServerLog(tuple(sorted(merged.items())), later.batch or self.batch, self.reset)

    def server_args(self) -> dict[str, Any]:
        """The server args the log gave (empty when none)."""
        return dict(self.args)


@dataclass(frozen=True, slots=True)
class OomEvent:
    """One server-level OOM (or near-OOM) event: the unit that the counter counts once."""

    kind: str
    fatal: bool
    source: str  # logical source name
    location: str  # "path:line" of the first physical line; "-:line" for stdin
    time: str | None  # ISO 8601 as logged, without an invented zone; None without a date
    ranks: tuple[str, ...]
    message: str  # the first message line, bounded
    excerpt: str  # a bounded excerpt of the record(s)
    phase: str | None = None  # prefill | decode | None
    subphase: str | None = None  # spec_verify | None
    inferred: bool = False  # kind taken from traceback frames alone (R5)
    numbers: dict[str, Any] = field(default_factory=dict)
    pools: tuple[PoolState, ...] = ()
    epoch: float | None = None  # seconds used for ordering and the dedupe window; not serialised
    offset: int = 0  # byte offset of the first line in its file generation: with the file identity, its key
    context: dict[str, Any] = field(default_factory=dict)  # KV state before it and the server args, when known
    suggestions: tuple[Suggestion, ...] = ()
    server: ServerLog | None = None  # what its source's log said about the server before it (serverlog.py)


@dataclass(frozen=True, slots=True)
class Report:
    """One rank's view of one failure: a classified block or traceback, before dedupe."""

    kind: str  # the catalog kind the text (or, inferred, the allocator frame) named
    resolve: str  # that kind's phase rule: prefill | decode | frames | none
    fatal: bool
    record: Record
    body: str  # normalised message: equal across the ranks of one failure (cross-rank join)
    short: str  # anchor text + requested tokens (or a `joins` name + rid): the same-rank block/traceback join; "" any
    message: str
    frames_phase: str | None  # pd_decode_prealloc | spec_verify | decode | prefill | None
    inferred: bool
    numbers: dict[str, Any]
    pools: tuple[PoolState, ...]
    echo: bool = False  # SGLang's text inside another program's record: never an event, never evidence
    # A logged line whose pattern joins a later assertion for the same request (catalog `joins`): it waits for that
    # traceback as a block whose kind is in the frames does, so the assertion is never left to join a counted event.
    awaits_partner: bool = False
    # Decided by its structure (a crash header and frames, no kind's text): it counts only with SGLang evidence, as a
    # kind with requires_sglang_evidence does, since another program may print a header or frames that look alike.
    needs_evidence: bool = False
    # The main process's start-up failure (a launch frame, no crash header): after a crash it only repeats it, so
    # the deduper drops it when a failure of the same source came just before (dedupe.AFTERMATH_LINES).
    aftermath: bool = False
    server: ServerLog | None = None  # what its source's log said about the server before its first line
