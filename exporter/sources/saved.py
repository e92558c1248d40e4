"""The values of the state file, checked by type and range as they are read back: each raises ValueError.

state.json is written by this daemon, but read at every start: a hand edit, a downgrade or another build's file
must cost the field it spoils (set aside and counted, daemon/state.py), never a start, a NaN counter or a page
that cannot be drawn. JSON gives str, int, float, bool, None, list and dict; float("NaN") and float("1e400") turn
strings into numbers no counter can hold, so nothing here converts: a number must already be one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# Counts and token numbers: exact in a float up to 2^53 (as the detect stage bounds a log's numbers).
MAX_COUNT = float(2**53)
# Unix seconds up to 9999-12-31T23:59:59Z: time.gmtime and the page's dates take every such value.
MAX_TIME = 253402300799.0


def number(value: object, what: str, low: float = -MAX_COUNT, high: float = MAX_COUNT) -> float:
    """A JSON number (not a bool, not a string) that is finite and within [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} is {type(value).__name__}, not a number")
    if not (math.isfinite(value) and low <= value <= high):
        raise ValueError(f"{what} is {value!r}, outside {low:g} to {high:g}")
    return value  # as saved: an int stays one (an event's numbers are shown as they were)


def count(value: object, what: str) -> float:
    """A count: a number from 0 to 2^53, as a float (the counters' type)."""
    return float(number(value, what, 0.0, MAX_COUNT))


def integer(value: object, what: str, low: int = 0, high: int = 2**53) -> int:
    """A JSON integer within [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} is {type(value).__name__}, not an integer")
    if not low <= value <= high:
        raise ValueError(f"{what} is {value}, outside {low} to {high}")
    return value


def timestamp(value: object, what: str) -> float:
    """Unix seconds from 0 to the year 9999."""
    return number(value, what, 0.0, MAX_TIME)


def text(value: object, what: str) -> str:
    """A JSON string."""
    if not isinstance(value, str):
        raise ValueError(f"{what} is {type(value).__name__}, not a string")
    return value


def optional(check: Any, value: object, what: str) -> Any:
    """None, or what check(value, what) gives."""
    return None if value is None else check(value, what)


def flag(value: object, what: str) -> bool:
    """A JSON true or false."""
    if not isinstance(value, bool):
        raise ValueError(f"{what} is {type(value).__name__}, not true or false")
    return value


def obj(value: object, what: str) -> Mapping[str, Any]:
    """A JSON object."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} is {type(value).__name__}, not an object")
    return value


def array(value: object, what: str) -> list[Any]:
    """A JSON array."""
    if not isinstance(value, list):
        raise ValueError(f"{what} is {type(value).__name__}, not an array")
    return value


def texts(value: object, what: str) -> Mapping[str, str]:
    """A JSON object of strings."""
    return {text(k, what): text(v, f"{what}.{k}") for k, v in obj(value, what).items()}
