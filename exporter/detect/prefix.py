"""LogLine text -> (Prefix | None, message): SGLang's `[time ranks] ` prefix and its variants. Pure.

Tried in order (facts 4): a Ray actor tag; SGLang's default bracket in every era (HH:MM:SS, a date,
optional milliseconds, rank tokens in any order, a lost leading "[", no timestamp at all); the custom
dictConfig format seen in the wild, which prefixes every physical line with date, level, pid and a
bracket of ranks and file:line, or Python logging's " - " fields; and any extra patterns from the config
(named groups ts and ranks).
0.1.x-0.2.x scheduler lines may carry `[gpu_id=N] ` (alone, or after the time): it names the rank, as
logged (facts 10.7).

A line without a prefix is SGLang's only where SGLang's words start it (`starts_own`): a traceback's lines, an
unprefixed era, piped output. The same words after another program's (a log forwarder's `Body: Str(...`, a JSON
field, `"log"=>"...`) are an echo of SGLang's line inside that program's record, not SGLang's log.
"""

from __future__ import annotations

import calendar
import datetime as dt
import functools
from collections.abc import Sequence

import regex

from ..detect.model import Prefix

RAY_TAG = r"\(\w+ pid=\d+(?:, ip=[\d.:a-fA-F]+)?\) "  # a Ray actor's tag before the prefix (facts 4)
_RAY = regex.compile("^" + RAY_TAG)
_GPU_ID = regex.compile(r"^\[(gpu_id=\d+)\] ?")
_RANK = r"[A-Z][A-Z_]*\d+"
BUILTIN_PATTERNS = (
    # [2026-03-14 22:07:33.123 DP0 TP1 EP1] msg / [09:41:07 TP0] msg / 2026-03-14 22:07:33 TP0] msg
    rf"^\[?(?P<ts>(?:\d{{4}}-\d\d-\d\d )?\d\d:\d\d:\d\d(?:[.,]\d{{1,6}})?)(?P<ranks>(?: {_RANK})*)\] ?",
    # [TP0] msg (timestamp trimmed away)
    rf"^\[(?P<ranks>{_RANK}(?: {_RANK})*)\] ?",
    # 2026-04-02 09:15:07 ERROR 2210 [ TP1 PP0 scheduler.py:2604] msg  (custom dictConfig, every line)
    rf"^(?P<ts>\d{{4}}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d{{1,6}})?) (?:[A-Z]+ )?(?:\d+ )?"
    rf"\[ ?(?P<ranks>(?:{_RANK} ?)*)(?:[\w.-]+:\d+)?\] ?",
    # 2026-03-14 22:07:33,120 - sglang - ERROR - msg  (a dictConfig with Python logging's "%(asctime)s - ..." fields)
    r"^(?P<ts>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d{1,6})?) - (?:[\w.-]+ - ){1,3}",
)


# What may stand before SGLang's own words on a line without a prefix, and nothing else: Python's exception class
# ("RuntimeError: ", "torch.OutOfMemoryError: "), a warning's location ("/.../radix_cache.py:123: UserWarning: "),
# a traceback pasted as one call chain ("alloc_for_extend -> alloc_token_slots: RuntimeError: "), the crash header
# ("Scheduler hit an exception: "), then a few plain words of the message itself ("Failed to retract any request. ",
# a pool's name, a frame's path). Brackets, parentheses, quotes, braces, tabs, "=" or "#" before them are another
# program's framing around SGLang's text.
_MAX_LEAD = 400  # a longer run before SGLang's words is never its own (and the regex stays cheap)
_OWN_LEAD = regex.compile(
    r"(?:[\w./\\-]+:\d+: )?"
    r"(?:(?:[A-Za-z_]\w* ?-> ?)+[A-Za-z_]\w*: )?"  # a traceback pasted as one call chain: "alloc_for_extend -> f: "
    r"(?:(?:[A-Za-z_][\w.]*)?(?:Error|Exception|Warning|Exit|Interrupt): )?"
    r"(?:\w+ hit an exception:? )?"
    r"(?:[\w./-]+ ){0,6}[\w./-]*"
)


def starts_own(message: str, at: int) -> bool:
    """Whether SGLang's words at `at` start this unprefixed message (only an exception class, a warning's location,
    the crash header or a few of its own words before them), rather than stand inside another program's line."""
    return at <= _MAX_LEAD and _OWN_LEAD.fullmatch(message, 0, at) is not None


_STAMP = regex.compile(r"^(?:(\d{4})-(\d\d)-(\d\d)[ T])?(\d\d):(\d\d):(\d\d)(?:[.,](\d+))?(Z|[+-]\d\d:?\d\d)?$")


@functools.lru_cache(maxsize=16)
def _compiled(extra_patterns: tuple[str, ...]) -> tuple[regex.Pattern[str], ...]:
    # Once per run, not once per source: a scan of 1,000 files spent a quarter of a second here.
    return tuple(regex.compile(p) for p in (*extra_patterns, *BUILTIN_PATTERNS))


class PrefixParser:
    """Splits a line into its prefix and message, trying the built-in and configured patterns."""

    def __init__(self, extra_patterns: Sequence[str] = ()) -> None:
        self._patterns = _compiled(tuple(extra_patterns))

    def parse(self, text: str) -> tuple[Prefix | None, str]:
        """Return (prefix, message); prefix is None for a bare continuation or unprefixed line."""
        if text.startswith("("):
            m = _RAY.match(text)
            if m is not None:
                text = text[m.end() :]
        if not text or text[0] in " \t":
            return None, text  # frames, source lines and indented detail never carry a prefix
        prefix: Prefix | None = None
        for pattern in self._patterns:
            m = pattern.match(text)
            if m is not None:
                groups = m.groupdict()
                prefix = Prefix(groups.get("ts"), " ".join((groups.get("ranks") or "").split()))
                text = text[m.end() :]
                break
        if text.startswith("[gpu_id="):
            g = _GPU_ID.match(text)
            if g is not None:
                ranks = " ".join(r for r in (prefix.ranks if prefix else "", g.group(1)) if r)
                return Prefix(prefix.time if prefix else None, ranks), text[g.end() :]
        return prefix, text


def iso_time(stamp: str | None) -> str | None:
    """SGLang's stamp as ISO 8601, zone not invented; None when it has no date (0.2.x HH:MM:SS)."""
    if not stamp or len(stamp) < 10 or stamp[4] != "-":
        return None
    return stamp[:10] + "T" + stamp[11:].replace(",", ".")


def epoch_of(stamp: str | None) -> float | None:
    """Seconds for ordering and the dedupe window, comparable within one source only.

    A bare HH:MM:SS is seconds since midnight; a dated stamp without a zone is read as UTC, which is off
    by the container's offset but consistent within the source, and that is all the window needs.
    RFC 3339 runtime stamps keep their real offset.
    """
    if not stamp:
        return None
    m = _STAMP.match(stamp)
    if m is None:
        return None
    year, month, day, hh, mm, ss, frac, zone = m.groups()
    seconds = int(hh) * 3600 + int(mm) * 60 + int(ss) + (int(frac[:9]) / 10 ** len(frac[:9]) if frac else 0.0)
    if year is None:
        return seconds
    try:
        days = calendar.timegm(dt.date(int(year), int(month), int(day)).timetuple())
    except ValueError:
        return None
    offset = 0
    if zone and zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        digits = zone[1:].replace(":", "")
        offset = sign * (int(digits[:2]) * 3600 + int(digits[2:4] or 0) * 60)
    return days + seconds - offset
