"""Record -> Report | None: classify a record by the catalog. Pure; built once from a Catalog.

Two steps: the message picks a candidate kind (catalog order, first match wins), then the
traceback frames, when there are any, decide the phase, and may move a KV kind to decode (speculative
verify says "Prefill" but is a decode step) or resolve the generic 0.5.4+ text. A traceback cut short
before its exception line still counts when its last allocator frame names the failure (R5).

The message must start the text: in a record SGLang's prefix opened, quoted text (a request echoed by
--log-requests) is never an event; in a record without a prefix, only an exception class, a warning's location or a
few of SGLang's own words may come first (prefix.starts_own). SGLang's text after another program's words (a log
forwarder's `Body: Str([...] Prefill out of memory...`, a JSON field) is an echo: a report marked `echo`, which the
pipeline counts as a foreign event and never as an event or as evidence.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

import regex

from ..catalog import Catalog, OomKind, Pattern
from ..catalog.vocabulary import (
    CRASH_INIT,
    CRASH_LAUNCH,
    CRASH_MEMORY,
    FIELD_TYPES,
    KV_FAILURE_PHASES,
    KV_PHASES,
    PHASE_FRAMES,
    PHASE_GROUPS,
    PHASE_NONE,
    POOL_FULL,
    POOL_SWA,
    SUBPHASES,
)
from ..detect.model import PoolState, Record, Report
from ..detect.prefix import starts_own

log = logging.getLogger(__name__)

Lead = Callable[[str, int], bool]  # may a match start at this offset of this line?

MAX_EXCERPT_LINES = 8
# The largest number an event field (or a pool's) may hold. SGLang's counts are far below it, and past it a
# float (the metrics, the suggestions' arithmetic, JSON readers) no longer holds an integer exactly: a bigger
# one (a 400-digit "Try to allocate") is dropped from the event, which is kept and counted.
MAX_NUMBER = 2**53
_MAX_DIGITS = len(str(MAX_NUMBER))  # longer digit runs are out of range without parsing them
MAX_EXCERPT_LINE = 300
_BAD_CONTEXT = ("'", '"', "obj=", "text=", "input_ids", "prompt")
_RAISED = regex.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception): ")
# Where the message SGLang wrote begins, before the words a pattern matched: after the log prefix ("] "), an
# exception class or a "Key: " (": "), or a logging field separator (" - "), whichever comes last, and only a
# short way back. "ValueError: Failed to retract any request. No space left ..." keeps its first sentence;
# "token_to_kv_pool_allocator memory leak detected!" keeps its pool's name.
_MESSAGE_STARTS = ("] ", ": ", " - ")
_MESSAGE_LEAD = 120
_POOL_TOTAL = regex.compile(
    r"(?:Ava(?:il|li)able (?P<name>tokens|full tokens|swa tokens|swa|mamba)|(?P<swa>SWA available tokens))"
    r": ?(?P<total>\d+)"
    r"(?: ?\((?:[\w ]*?)available[\w ]*?= ?(?P<free>\d+) ?\+ ?(?:[\w ]*?)evictable[\w ]*?= ?(?P<evictable>\d+)\))?"
)
# 0.5.18+ leak check, one pool per line: "[full] total=T, available=A, evictable=E, protected=P, ..." (facts 10.2);
# 2026 pool names have dashes ([mamba-active], [mamba-int8]); the busy-time check prints the same shape (11.1, 11.3).
_LEAK_POOL = regex.compile(r"\[(?P<name>\w[\w-]*)\] ?(?P<pairs>total ?= ?\d+(?:, ?\w+ ?= ?-?\d+)*)")
# Earlier busy-time checks (facts 11.1): what the check counted versus the capacity, then the pool's own pairs:
# "full_total=T vs self.full_tokens_per_layer=N, full_available=A, ..."; "total_tokens=T vs self.max_total_num_tokens=N"
_COUNTED_POOL = regex.compile(
    r"(?:(?P<name>full|swa)_total|total_tokens) ?= ?(?P<counted>\d+),? vs\.? "
    r"self\.(?:\w+_tokens_per_layer|max_total_num_tokens) ?= ?(?P<total>\d+)(?P<pairs>(?:, ?[\w.()]+ ?= ?-?\d+)*)"
)
# The byte-pool reporter (facts 11.3): "[joint] stale available_size memo: cached=C, actual=A".
_MEMO_POOL = regex.compile(
    r"\[(?P<name>\w[\w-]*)\] ?stale available[_ ]size memo: ?cached ?= ?(?P<cached>\d+), ?actual ?= ?(?P<actual>\d+)"
)
_PAIR = regex.compile(r"(\w+) ?= ?(-?\d+)")
# The leak check's words for the PoolState fields: its "available" is the allocator's free slots.
_LEAK_FIELDS = {"total": "total", "available": "free", "evictable": "evictable", "protected": "protected",
                "session_held": "session_held", "uncached": "uncached"}  # fmt: skip
_PAGED_AVAILABLE = regex.compile(r"token[_ ]to[_ ]kv[_ ]pool(?:[_ ]allocator)?\.available[_ ]size\(\) ?= ?(\d+)")
_PAGED_EVICTABLE = regex.compile(r"tree[_ ]cache\.evictable[_ ]size\(\) ?= ?(\d+)")
# The words of _POOL_TOTAL that name a pool otherwise (POOL_* in the vocabulary); any other word is the name.
_POOL_WORDS = {"tokens": POOL_FULL, "full tokens": POOL_FULL, "swa tokens": POOL_SWA}
_DIGITS = regex.compile(r"\d+")
SHORTFALL_NOTE = (
    "paged allocators fail on whole pages and round each request up to a page, so a real failure can ask for "
    "no more than was available"
)


class Matcher:
    """The catalog, compiled for classification."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.anchors = catalog.anchors()  # computed once per run: every pipeline's reader and assembler ask
        self._kinds = catalog.kinds
        self._phase_frames = [(g, _frame_specs(catalog.phase_frames.get(g, ()))) for g in PHASE_GROUPS]
        self._allocators = dict(catalog.allocator_frames)
        self._pattern_frames: dict[tuple[str, ...], tuple[tuple[str, str], ...]] = {}
        self._crash_frames = {g: _crash_specs(catalog.crash_frames.get(g, ())) for g in (CRASH_MEMORY, CRASH_INIT,
                                                                                          CRASH_LAUNCH)}  # fmt: skip
        self.numbers_dropped = 0  # numbers out of range left out of events (numbers_dropped_total)

    def match_line(
        self, line: str, lead: Lead | None = None, frames: Sequence[tuple[str, str]] = ()
    ) -> tuple[OomKind, Pattern, regex.Match[str]] | None:
        """The first kind whose pattern starts this line's message, or None. `lead` judges where a match may start
        (line, match start -> bool); by default after a log prefix or an exception class, never in quoted text.
        A pattern that names frames matches only in a traceback with one of them (`frames`: its (path, function))."""
        lead_ok = _context_ok if lead is None else lead
        for kind in self._kinds:
            if not any(a in line for a in kind.anchors):
                continue
            for pattern in kind.patterns:
                if pattern.frames and not self._under(pattern, frames):
                    continue
                m = pattern.regex.search(line)
                if m is not None and lead_ok(line, m.start()):
                    return kind, pattern, m
        return None

    def classify(self, record: Record) -> Report | None:
        """Classify one record; None when it is not an event. A record without a prefix whose text is SGLang's only
        after another program's words gives a report marked echo (never an event)."""
        if record.prefixed:
            return self._classify(record, _context_ok)
        if not record.echoed:
            report = self._classify(record, starts_own)
            if report is not None:
                return report
        echoed = self._classify(record, _anywhere)
        return replace(echoed, echo=True) if echoed is not None else None

    def _classify(self, record: Record, lead: Lead) -> Report | None:
        groups = _exception_groups(record) if record.kind == "traceback" else [list(record.lines)]
        frames_phase = self._frames_phase(record.frames or _call_chain(record))
        # The last exception of a chained traceback is the one the process died of: "Capture cuda graph
        # failed: <CUDA OOM>" raised while handling the OOM is a startup failure, not also cuda_oom (facts
        # 10.6). Earlier ones still count when the last names nothing.
        for group in reversed(groups):
            if not group:
                continue
            found = self.match_line(group[0], lead, record.frames)
            if found is not None:
                return self._report(record, group, found, frames_phase)
        if record.kind == "traceback" and not self._not_memory(record, groups, lead):
            inferred = self._inferred(record, groups, frames_phase)
            if inferred is not None:
                return inferred
        return self._died(record, groups, frames_phase, lead)

    def _not_memory(self, record: Record, groups: list[list[str]], lead: Lead) -> bool:
        """The exception is known to be no memory failure, however short it looks: a crash entry's text, or (when
        the traceback has its exception line) a configuration error's class (crash_exceptions)."""
        crash = self.catalog.crash
        if crash is None or not groups:
            return False
        if any(g and _matches(crash, g[0], lead) for g in groups):
            return True
        return not record.truncated and _exception_class(groups[-1][0]) in self.catalog.crash_exceptions

    def _died(self, record: Record, groups: list[list[str]], frames_phase: str | None, lead: Lead) -> Report | None:
        """An SGLang process that died (its traceback under a crash header, or the main process's through a launch
        frame: a start-up failure) of an exception no kind named: never silent. A known non-memory text is the crash
        entry; else a frame in memory-pool or allocator code makes it a memory failure (the start-up kind under a
        start-up or launch frame, else the phase its frames name, as the fallback kind is) unless its class is a
        configuration error's (crash_exceptions), and anything else is a non-memory crash, in its own series."""
        catalog = self.catalog
        crash, header = catalog.crash, record.header
        if crash is None:
            return None
        died = any((at := header.find(h)) >= 0 and lead(header, at) for h in catalog.crash_headers)
        launch = not died and record.kind == "traceback" and _in_frames(record.frames, self._crash_frames[CRASH_LAUNCH])
        if not (died or launch):
            return None
        last = groups[-1] if record.kind == "traceback" and groups else []
        func = record.frames[-1][1] if record.frames else ""
        line = last[0] if last else f"(traceback cut short{f' in {func}' if func else ''})"
        line = line[:MAX_EXCERPT_LINE]
        kind, resolve, inferred = crash, PHASE_NONE, False
        known = next((g for g in reversed(groups) if g and _matches(crash, g[0], lead)), None)
        if (
            known is None
            and _exception_class(line) not in catalog.crash_exceptions
            and _in_frames(record.frames, self._crash_frames[CRASH_MEMORY])
        ):
            inferred = True
            if catalog.startup_kind and (launch or _in_frames(record.frames, self._crash_frames[CRASH_INIT])):
                kind = catalog.kind(catalog.startup_kind)
                resolve = kind.phase
            else:
                kind, resolve = catalog.kind(catalog.fallback_kind), PHASE_FRAMES
        elif known is not None:
            line = known[0][:MAX_EXCERPT_LINE]
        # Ranks that die together are one crash whatever each died of (one server went down); a memory failure's
        # ranks join on its text, as a named failure's do.
        body = f"{kind.id}:" + ("" if kind is crash else "".join("".join(last).split()))
        return Report(
            kind=kind.id,
            resolve=resolve,
            fatal=True,
            record=record,
            body=body,
            short=f"{kind.id}:" + "".join(line.split()),
            message=line,
            frames_phase=frames_phase,
            inferred=inferred,
            numbers={"exception": line},
            pools=(),
            needs_evidence=True,
            aftermath=launch,
        )

    def _report(
        self,
        record: Record,
        group: list[str],
        found: tuple[OomKind, Pattern, regex.Match[str]],
        frames_phase: str | None,
    ) -> Report:
        kind, pattern, m = found
        first = group[0]
        text = "\n".join(group)
        dropped: list[str] = []
        numbers = _numbers(m.groupdict(), kind.extract, text, dropped)
        pools = _pools(text, dropped)
        if dropped:
            self._dropped(kind.id, record, dropped)
        if pools and kind.phase in KV_FAILURE_PHASES and "available_tokens" not in numbers:
            _add_limiting_pool(numbers, pools)
        raised = record.kind == "traceback" or _RAISED.match(first) is not None
        fatal = (
            pattern.fatal if pattern.fatal is not None else kind.fatal == "true" or (kind.fatal == "raised" and raised)
        )
        rest = "".join("".join(line.split()) for line in group[1:])
        anchor_body = first[m.start() :]
        # "anchor": ranks name their own GPU in the text (CUDA OOM), so only the matched words must agree.
        body = kind.id + ":" + m.group(0) if kind.join_on == "anchor" else "".join(anchor_body.split()) + rest
        # What a rank's other half must say to join this report (R2): the matched words and the ask; for patterns
        # that join by name (a warning and the assertion after it), that name and the request.
        rid = numbers.get("rid")
        short = (
            f"{kind.id}:{pattern.joins}:{rid}"
            if pattern.joins and rid
            else kind.id + ":" + "".join(m.group(0).split()) + ":" + str(numbers.get("requested_tokens", ""))
        )
        return Report(
            kind=kind.id,
            resolve=kind.phase,
            fatal=fatal,
            record=record,
            body=body,
            short=short,
            message=first[_message_start(first, m.start()) :][:MAX_EXCERPT_LINE],
            frames_phase=frames_phase,
            inferred=False,
            numbers=numbers,
            pools=pools,
            awaits_partner=bool(pattern.joins and rid) and record.kind != "traceback",
        )

    def _inferred(self, record: Record, groups: list[list[str]], frames_phase: str | None) -> Report | None:
        """R5: a traceback without a usable exception line whose last allocator frame names the failure."""
        cut_short = record.truncated or _looks_cut(groups)
        if not cut_short:
            return None
        target = None
        for _path, func in reversed(record.frames):
            if func in self._allocators:
                target = self._allocators[func]
                break
        if target is None:
            return None
        fallback = self.catalog.fallback_kind
        kind_id, resolve = (
            (fallback, PHASE_FRAMES) if target == PHASE_FRAMES else (target, self.catalog.kind(target).phase)
        )
        kind = self.catalog.kind(kind_id)
        # The ranks whose tracebacks were cut in the same allocator (with the same exception words, if any) at once
        # are one failure, as ranks of one named failure are (R6).
        text = "".join("".join(line.split()) for group in groups for line in group)
        return Report(
            kind=kind_id,
            resolve=resolve,
            fatal=kind.fatal != "false",
            record=record,
            body=f"{kind_id}:{target}:{text}",
            short="",
            message=f"(traceback cut short in {target if target != PHASE_FRAMES else 'alloc_token_slots'})",
            frames_phase=frames_phase,
            inferred=True,
            numbers={},
            pools=(),
        )

    def _dropped(self, kind: str, record: Record, names: list[str]) -> None:
        """Count numbers left out of an event; a WARNING at the 1st, 10th, 100th... (hostile input repeats)."""
        before, self.numbers_dropped = self.numbers_dropped, self.numbers_dropped + len(names)
        if len(str(self.numbers_dropped)) > len(str(before)) or before == 0:
            log.warning(
                "event kind=%s line=%d: %s out of range (above %d), left out of the event, which is kept; "
                "%d such number(s) so far (sglang_oom_exporter_numbers_dropped_total)",
                kind, record.lineno, ", ".join(sorted(set(names))), MAX_NUMBER, self.numbers_dropped,
            )  # fmt: skip

    def _under(self, pattern: Pattern, frames: Sequence[tuple[str, str]]) -> bool:
        """Is one of these traceback frames one the pattern names?"""
        specs = self._pattern_frames.get(pattern.frames)
        if specs is None:
            specs = self._pattern_frames[pattern.frames] = _frame_specs(pattern.frames)
        return any(func == name and (not frag or frag in path) for path, func in frames for frag, name in specs)

    def _frames_phase(self, frames: Iterable[tuple[str, str]]) -> str | None:
        frames = tuple(frames)
        if not frames:
            return None
        for group, specs in self._phase_frames:
            for path, func in frames:
                for frag, name in specs:
                    if func == name and (not frag or frag in path):
                        return group
        return None

    def resolve(self, base: Report, reports: Sequence[Report]) -> tuple[str, str | None, str | None]:
        """(kind, phase, subphase) of one joined failure, once: the frames of any member decide the phase.

        Speculative verify says "Prefill" but is a decode step; the generic text needs frames to name its phase.
        The kind a resolved phase counts as comes from the catalog's phase_kinds.
        """
        if base.resolve not in KV_FAILURE_PHASES:
            return base.kind, None, None
        frames = [r.frames_phase for r in reports if r.frames_phase]
        sub = next((f for f in frames if f in SUBPHASES), None)
        if sub is not None:
            return self.catalog.phase_kinds[SUBPHASES[sub]], SUBPHASES[sub], sub
        frames_phase = frames[0] if frames else None
        if base.resolve == PHASE_FRAMES:
            if frames_phase is not None and frames_phase in self.catalog.phase_kinds:
                phase = frames_phase if frames_phase in KV_PHASES else None  # a PD pre-allocation has no KV phase
                return self.catalog.phase_kinds[frames_phase], phase, None
            return base.kind, None, None
        return base.kind, base.resolve, None


def excerpt(record: Record) -> str:
    """A bounded excerpt of a record for humans."""
    lines = list(record.lines[:MAX_EXCERPT_LINES])
    if record.frames:
        path, func = record.frames[-1]
        lines.insert(0, f"(last frame: {func} in {path.rsplit('/sglang/', 1)[-1]})")
    return "\n".join(line[:MAX_EXCERPT_LINE] for line in lines)


_CHAIN = regex.compile(r"^((?:[A-Za-z_]\w* ?-> ?)+[A-Za-z_]\w*): ")


def _call_chain(record: Record) -> tuple[tuple[str, str], ...]:
    """The frames of a traceback pasted as one call chain ("alloc_for_extend -> alloc_token_slots: RuntimeError:
    ..."), outermost first, without paths; none for any other record."""
    m = _CHAIN.match(record.lines[0]) if record.kind == "block" and record.lines else None
    if m is None:
        return ()
    return tuple(("", func.strip()) for func in m.group(1).split("->"))


def _exception_class(line: str) -> str:
    """The exception class of an exception line, without its module ("torch.OutOfMemoryError: ..." -> its name)."""
    return line.partition(": ")[0].rpartition(".")[2]


def _crash_specs(entries: Iterable[str]) -> tuple[tuple[str, str, bool], ...]:
    """crash_frames entries as (path fragment, function, prefix?): "name*" a function prefix, "" any function."""
    out = []
    for frag, name in _frame_specs(entries):
        out.append((frag, name.rstrip("*"), name.endswith("*")))
    return tuple(out)


def _in_frames(frames: Iterable[tuple[str, str]], specs: Sequence[tuple[str, str, bool]]) -> bool:
    """Does any frame match any spec (both parts where a spec names both)?"""
    for path, func in frames:
        for frag, name, prefix in specs:
            if (not frag or frag in path) and (func.startswith(name) if prefix else (not name or func == name)):
                return True
    return False


def _matches(kind: OomKind, line: str, lead: Lead) -> bool:
    """Does one of the kind's patterns start this line's message (as Matcher.match_line judges it)?"""
    if not any(a in line for a in kind.anchors):
        return False
    return any((m := p.regex.search(line)) is not None and lead(line, m.start()) for p in kind.patterns)


def _frame_specs(entries: Iterable[str]) -> tuple[tuple[str, str], ...]:
    out = []
    for entry in entries:
        frag, _, name = entry.rpartition(":")
        out.append((frag, name))
    return tuple(out)


def _message_start(line: str, match_start: int) -> int:
    """Where the message that the match at `match_start` belongs to begins (see _MESSAGE_STARTS)."""
    ctx = line[:match_start]
    start = max((ctx.rfind(sep) + len(sep) for sep in _MESSAGE_STARTS if sep in ctx), default=0)
    return start if match_start - start <= _MESSAGE_LEAD else match_start


def _context_ok(line: str, at: int) -> bool:
    """What precedes the message may be a prefix or an exception class, never quoted request text."""
    return at <= 200 and not any(bad in line[:at] for bad in _BAD_CONTEXT)


def _anywhere(_line: str, _at: int) -> bool:
    """Any match: where the record is not SGLang's, to tell an echo of its text from no OOM text at all."""
    return True


def _exception_groups(record: Record) -> list[list[str]]:
    groups: list[list[str]] = [[]]
    for line in record.lines:
        if line == "" and groups[-1]:
            groups.append([])
        elif line != "":
            groups[-1].append(line)
    return [g for g in groups if g]


def _looks_cut(groups: list[list[str]]) -> bool:
    """An exception line cut mid-text (no closing punctuation) is as good as none."""
    if not groups:
        return True
    last = groups[-1][-1].rstrip()
    return not last.endswith((".", ")", ",", "]", ":")) and ": " in groups[-1][0] and len(last) < 60


_OUT_OF_RANGE = object()


def _convert(name: str, value: str) -> Any:
    """A captured field as its vocabulary type says: text as logged, a set counted ("{3, 7}" -> 2), a number."""
    kind = FIELD_TYPES.get(name, "int")
    if kind == "text":
        return value
    if kind == "count":
        return len(_DIGITS.findall(value))
    digits = value.strip().lstrip("+-")
    if digits.isdigit() and len(digits.lstrip("0")) > _MAX_DIGITS:
        return _OUT_OF_RANGE  # never parsed: int() of thousands of digits is slow, past 4,300 an error
    try:
        number = float(value) if kind == "float" else int(value)
    except ValueError:
        return value
    return number if math.isfinite(number) and abs(number) <= MAX_NUMBER else _OUT_OF_RANGE


def _numbers(
    groups: dict[str, str | Any], extract: Iterable[regex.Pattern[str]], text: str, dropped: list[str]
) -> dict[str, Any]:
    numbers = {k: _convert(k, v) for k, v in groups.items() if isinstance(v, str)}
    for rx in extract:
        m = rx.search(text)
        if m is not None:
            for k, v in m.groupdict().items():
                if isinstance(v, str) and k not in numbers:
                    numbers[k] = _convert(k, v)
    for k in [k for k, v in numbers.items() if v is _OUT_OF_RANGE]:
        dropped.append(k)
        del numbers[k]
    return numbers


def _int(value: str | None, name: str, dropped: list[str]) -> int | None:
    """A pool's number, or None when absent or out of range (then named in dropped)."""
    if not value:
        return None
    number = _convert(name, value)
    if isinstance(number, int):
        return number
    dropped.append(name)
    return None


def _pools(text: str, dropped: list[str]) -> tuple[PoolState, ...]:
    """Every pool the message describes, any era (facts 2, 10.2), each field as its name says."""
    pools: dict[str, PoolState] = {}
    for m in _POOL_TOTAL.finditer(text):
        name = POOL_SWA if m.group("swa") else _POOL_WORDS.get(m.group("name"), m.group("name"))
        if name in pools:
            continue
        pools[name] = PoolState(
            name,
            available=_int(m.group("total"), f"{name}.available", dropped),
            evictable=_int(m.group("evictable"), f"{name}.evictable", dropped),
            free=_int(m.group("free"), f"{name}.free", dropped),
        )
    a, e = _PAGED_AVAILABLE.search(text), _PAGED_EVICTABLE.search(text)
    if a or e:
        full = pools.get(POOL_FULL, PoolState(POOL_FULL))
        pools[POOL_FULL] = replace(
            full,
            free=full.free if full.free is not None else _int(a.group(1) if a else None, f"{POOL_FULL}.free", dropped),
            evictable=full.evictable
            if full.evictable is not None
            else _int(e.group(1) if e else None, f"{POOL_FULL}.evictable", dropped),
        )
    for m in _LEAK_POOL.finditer(text):
        name = m.group("name")
        if name not in pools:
            fields = {_LEAK_FIELDS[k]: _int(v, f"{name}.{_LEAK_FIELDS[k]}", dropped)
                      for k, v in _PAIR.findall(m.group("pairs")) if k in _LEAK_FIELDS}  # fmt: skip
            pools[name] = PoolState(name, **fields)
    for m in _COUNTED_POOL.finditer(text):
        name = m.group("name") or POOL_FULL
        if name not in pools:
            fields = {}
            for key, value in _PAIR.findall(m.group("pairs")):
                word = key.removeprefix(f"{name}_").removesuffix("_size")
                if word in _LEAK_FIELDS and word != "total":
                    fields[_LEAK_FIELDS[word]] = _int(value, f"{name}.{_LEAK_FIELDS[word]}", dropped)
            total = _int(m.group("total"), f"{name}.total", dropped)
            counted = _int(m.group("counted"), f"{name}.counted", dropped)
            pools[name] = PoolState(name, total=total, counted=counted, **fields)
    for m in _MEMO_POOL.finditer(text):
        name = m.group("name")
        if name not in pools:
            free = _int(m.group("actual"), f"{name}.free", dropped)
            pools[name] = PoolState(name, free=free, cached=_int(m.group("cached"), f"{name}.cached", dropped))
    return tuple(pools.values())


def _add_limiting_pool(numbers: dict[str, Any], pools: tuple[PoolState, ...]) -> None:
    """available_tokens is what the pool that ran out had available: the smallest that could not fit the ask.

    A request not above it is no shortfall (paged rounding, facts 10.9): the shortfall is then null and
    shortfall_note says why; it is never negative.
    """
    known = [p for p in pools if p.available is not None]
    if not known:
        return
    requested = numbers.get("requested_tokens")
    short = [p for p in known if isinstance(requested, int) and p.available is not None and p.available < requested]
    limiting = min(short or known, key=lambda p: p.available if p.available is not None else 0)
    numbers["available_tokens"] = limiting.available
    numbers["limiting_pool"] = limiting.name
    if isinstance(requested, int) and limiting.available is not None:
        if requested > limiting.available:
            numbers["shortfall_tokens"] = requested - limiting.available
        else:
            numbers["shortfall_tokens"] = None
            numbers["shortfall_note"] = f"asked for {requested}, {limiting.available} available: {SHORTFALL_NOTE}"
