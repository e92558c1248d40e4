"""Configuration, one value at a time: durations, booleans, listen addresses, URLs and regexes.

Pure parsers that raise ValueError with a message fit for `--check-config`; keys.py says which key takes which.
"""

from __future__ import annotations

import math
import re
from typing import Any

import regex

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
