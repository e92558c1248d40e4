"""Configuration, one value at a time: durations, booleans, listen addresses, URLs and regexes.

Pure parsers that raise ValueError with a message fit for `--check-config`; keys.py says which key takes which.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable
from typing import Any

import regex

with warnings.catch_warnings():  # the parser behind re.compile; its public name is deprecated, not its use
    warnings.simplefilter("ignore", DeprecationWarning)
    import sre_constants
    import sre_parse

# Stdlib re for these three: compiling them with the `regex` module cost a millisecond of every start.
_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)(ms|s|m|h|d))+$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
MS, HOUR, DAY = 0.001, 3600.0, 86400.0
URL = re.compile(r"^https?://[^\s/]+(?:/[^\s]*)?$")
LEVELS = ("debug", "info", "warning", "error")


def parse_duration(text: str) -> float:
    """'15s', '2m', '1h30m', '250ms' -> seconds; ValueError without a unit."""
    text = str(text).strip()
    if not _DURATION.match(text):
        raise ValueError(f"{text!r} is not a duration with a unit (e.g. 15s, 2m, 1h)")
    return sum(float(n) * _UNITS[u] for n, u in _DURATION_PART.findall(text))


def parse_bounded_duration(value: Any, low: float, high: float) -> float:
    """parse_duration, then low <= seconds <= high; ValueError names the bounds."""
    seconds = parse_duration(value)
    if not (math.isfinite(seconds) and low <= seconds <= high):
        raise ValueError(f"{str(value).strip()!r} must be between {format_duration(low)} and {format_duration(high)}")
    return seconds


def format_duration(seconds: float) -> str:
    """Seconds as parse_duration reads them, in the largest whole unit: 3600 -> 1h, 2.5 -> 2.5s, 0.001 -> 1ms."""
    for unit, size in (("d", DAY), ("h", HOUR), ("m", 60.0), ("s", 1.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    if seconds >= 1:
        return f"{seconds:g}s"
    return f"{seconds * 1000:g}ms"


def parse_bool(value: Any) -> bool:
    """true/yes/on/1 and false/no/off/0/'' (any case) -> bool; ValueError otherwise."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{value!r} is not a boolean")


def parse_listen(text: str) -> tuple[str, int]:
    """Parse a listen address: "host:port", "[v6]:port", or ":port" for every interface; ValueError if not."""
    host, sep, port = text.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or len(port) > 5 or int(port) > 65535:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. :9877, 127.0.0.1:9877 or [::1]:9877)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def regex_problem(where: str, text: str) -> str | None:
    """The problem line for a regex that does not compile, or None."""
    try:
        regex.compile(text)
    except regex.error as exc:
        return f"{where}: bad regex {text!r}: {exc}"
    return None


# Kubernetes name lengths a filter is matched against: namespaces and containers are DNS labels, pods subdomains.
FILTER_NAME_MAX = {"namespace": 63, "pod": 253, "container": 63}
_NAME_UNITS = [*"abcxyz019.-", "ab", "a-", "a.", "a1", "-a", "1-", "aa-", "sglang-", "server-", "x0-"]
_NAME_TAILS = ("", "!", "-", ".", "_")
FILTER_DEADLINE = 0.1  # seconds per probe: a linear filter needs microseconds for a 253-character name
_REPEATS = (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT)
_ATOMIC = getattr(sre_constants, "ATOMIC_GROUP", None)  # Python 3.11+


def filter_problem(where: str, text: str, name_max: int) -> str | None:
    """The problem line for a Kubernetes filter regex that does not compile, or could backtrack catastrophically.

    The filters run on names a tenant chooses (a pod's name) with stdlib re, which has no time limit: a filter
    like (a+)+ or (a|aa)+ would stall discovery. Checked at load, as the catalog's log regexes are by the tests:
    a repetition inside a repetition (stdlib re backtracks through every split) is refused, and the rest is
    probed on adversarial names of the longest allowed length under a deadline (the `regex` module's).
    """
    try:
        parsed = sre_parse.parse(text)
        probe = regex.compile(text)
    except (re.error, regex.error) as exc:
        return f"{where}: bad regex {text!r}: {exc}"
    advice = "can take exponential time on a chosen pod name; write it without nesting repetitions"
    if _nested_repeat(parsed, within=None, fold=bool(parsed.state.flags & re.IGNORECASE)):
        return f"{where}: {text!r} repeats a repetition (like (a+)+), which {advice}"
    for unit in _NAME_UNITS:
        for tail in _NAME_TAILS:
            name = (unit * (name_max // len(unit)))[: name_max - len(tail)] + tail
            try:
                probe.fullmatch(name, timeout=FILTER_DEADLINE)
            except TimeoutError:
                return f"{where}: {text!r} took over {FILTER_DEADLINE}s on the name {name[:20]!r}..., so it {advice}"
    return None


def _nested_repeat(pattern: Any, *, within: bool | None, fold: bool = False) -> bool:
    """Whether a parsed pattern repeats an ambiguous repetition, one of the two unbounded (within: None outside
    any repeat, else whether the enclosing repeat is unbounded). A repeated body that must match a character
    none of its inner repetitions can (the "-" of (?:[a-z0-9]+-)*) splits a name one way only: not counted."""
    for op, av in pattern:
        if op in _REPEATS:
            _low, high, body = av
            repeats, unbounded = high > 1, high == sre_constants.MAXREPEAT
            if repeats and within is not None and (unbounded or within):
                return True
            inner = (unbounded or bool(within)) if repeats else within
            if inner is not None and repeats and _separated(body, fold):
                inner = None  # each iteration ends at its separator: the inner repeats cannot trade characters
            if _nested_repeat(body, within=inner, fold=fold):
                return True
        elif op is sre_constants.SUBPATTERN or op is _ATOMIC:
            if _nested_repeat(av[-1] if op is sre_constants.SUBPATTERN else av, within=within, fold=fold):
                return True
        elif op is sre_constants.BRANCH:
            if any(_nested_repeat(branch, within=within, fold=fold) for branch in av[1]):
                return True
        elif op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT) and _nested_repeat(av[1], within=within):
            return True
    return False


_ASCII = [chr(c) for c in range(32, 127)]
_CATEGORIES: dict[Any, Callable[[str], bool]] = {
    sre_constants.CATEGORY_DIGIT: str.isdigit, sre_constants.CATEGORY_NOT_DIGIT: lambda c: not c.isdigit(),
    sre_constants.CATEGORY_WORD: lambda c: c.isalnum() or c == "_",
    sre_constants.CATEGORY_NOT_WORD: lambda c: not (c.isalnum() or c == "_"),
    sre_constants.CATEGORY_SPACE: str.isspace, sre_constants.CATEGORY_NOT_SPACE: lambda c: not c.isspace(),
}  # fmt: skip


def _chars(pattern: Any, fold: bool) -> set[str]:
    """Every printable ASCII character any element of a parsed pattern could match (over-approximated)."""
    out: set[str] = set()
    for op, av in pattern:
        if op is sre_constants.LITERAL:
            out |= {chr(av), chr(av).swapcase()} if fold else {chr(av)}
        elif op is sre_constants.IN:
            out |= _class(av, fold)
        elif op in (sre_constants.ANY, sre_constants.NOT_LITERAL, sre_constants.CATEGORY):
            out |= set(_ASCII)
        elif op in _REPEATS:
            out |= _chars(av[2], fold)
        elif op is sre_constants.SUBPATTERN:
            out |= _chars(av[-1], fold)
        elif op is sre_constants.BRANCH:
            for branch in av[1]:
                out |= _chars(branch, fold)
        elif op is _ATOMIC:
            out |= _chars(av, fold)
    return out


def _class(items: Any, fold: bool) -> set[str]:
    """The printable ASCII characters a [...] class matches."""
    hit: set[str] = set()
    negate = False
    for op, av in items:
        if op is sre_constants.NEGATE:
            negate = True
        elif op is sre_constants.LITERAL:
            hit.add(chr(av))
        elif op is sre_constants.RANGE:
            hit |= {c for c in _ASCII if av[0] <= ord(c) <= av[1]}
        elif op is sre_constants.CATEGORY:
            test = _CATEGORIES.get(av)
            hit |= {c for c in _ASCII if test is None or test(c)}
        else:
            hit |= set(_ASCII)
    if fold:
        hit |= {c.swapcase() for c in hit}
    return set(_ASCII) - hit if negate else hit


def _separated(body: Any, fold: bool) -> bool:
    """Whether a repeated body must match a character (a literal or class at its top level) that none of its
    repetitions can."""
    repeated: set[str] = set()
    for op, av in body:
        if op in _REPEATS:
            repeated |= _chars(av[2], fold)
    for op, av in body:
        if op is sre_constants.LITERAL and not ({chr(av), chr(av).swapcase()} if fold else {chr(av)}) & repeated:
            return True
        if op is sre_constants.IN and not _class(av, fold) & repeated:
            return True
    return False
