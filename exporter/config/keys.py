"""Configuration, the settings' names: which keys exist, of which type and within which bounds, and the
Builder that checks each value as the file, the environment and the flags hand it in (load.py layers them).

A new scalar setting is one entry in a key table below (and a field in model.py); a duration also gets bounds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .values import DAY, HOUR, LEVELS, MS, parse_bool, parse_bounded_duration, parse_listen, regex_problem

ENV_PREFIX = "SGLANG_OOM_EXPORTER_"
DURATION_KEYS = (
    "poll_interval", "sweep_interval", "discover_interval", "state_interval", "traceback_wait", "source_retention",
    "scrape_interval", "scrape_timeout",
)  # fmt: skip
# (smallest, largest) per duration: past these a timer overflows (OverflowError in a wait) or the setting
# makes no sense (a loop that ticks once a year); either way --check-config says so instead of the daemon dying.
_DURATION_BOUNDS = {
    "poll_interval": (MS, HOUR), "sweep_interval": (MS, DAY), "discover_interval": (MS, DAY),
    "state_interval": (MS, DAY), "traceback_wait": (MS, HOUR), "source_retention": (1.0, 365 * DAY),
    "scrape_interval": (MS, DAY), "scrape_timeout": (MS, HOUR), "discover_targets.interval": (1.0, DAY),
}  # fmt: skip
BOOL_KEYS = ("from_beginning", "force_polling")
STR_KEYS = ("listen", "state_dir", "catalog", "web_config", "log_level")
SCALAR_KEYS = (*DURATION_KEYS, *BOOL_KEYS, *STR_KEYS)  # the keys the environment can set too
# The environment variables load_config reads, after ENV_PREFIX.
_KNOWN_ENV = frozenset({"CONFIG", "PATHS", "SGLANG_URL", "KUBERNETES_LOGS", *(k.upper() for k in SCALAR_KEYS)})
FILE_KEYS = frozenset({*SCALAR_KEYS, "paths", "sources", "kubernetes", "prefix_regex", "recent_events", "targets"})


def bounded_duration(key: str, value: Any) -> float:
    """parse_duration, then the key's bounds; ValueError names them."""
    low, high = _DURATION_BOUNDS[key]
    return parse_bounded_duration(value, low, high)


def unknown_env(env: Mapping[str, str]) -> list[str]:
    """SGLANG_OOM_EXPORTER_* variables that no setting reads (a typo is otherwise silently ignored)."""
    return sorted(k for k in env if k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX) :] not in _KNOWN_ENV)


class Builder:
    """Collects values and problems from the file, the environment and the flags."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.problems: list[str] = []

    def set(self, where: str, key: str, value: Any) -> None:
        """Check one scalar value for its key; keep it, or note the problem at `where`."""
        try:
            value = _checked(key, value)
        except ValueError as exc:
            self.problems.append(f"{where}: {exc}")
            return
        self.values[key] = value

    def check_regex(self, where: str, text: str) -> None:
        """Note a problem if `text` is not a valid regex."""
        problem = regex_problem(where, text)
        if problem is not None:
            self.problems.append(problem)


def _checked(key: str, value: Any) -> Any:
    if key in DURATION_KEYS:
        return bounded_duration(key, value)
    if key in BOOL_KEYS:
        return parse_bool(value)
    if key == "recent_events":
        value = int(value)
        if not 1 <= value <= 100_000:
            raise ValueError("must be between 1 and 100000")
        return value
    if key == "log_level":
        value = str(value).lower()
        if value not in LEVELS:
            raise ValueError(f"must be one of {', '.join(LEVELS)}")
        return value
    if key == "listen":
        parse_listen(str(value))
    if key in STR_KEYS:
        return str(value)
    return value
