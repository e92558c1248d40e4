"""Configuration, the settings' names: which keys the file, the environment and the flags know, and the Builder
that checks each value as they hand it in (load.py layers them). All of it is derived from the settings table
(settings.py): a new setting is a row there, not an entry here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .settings import BY_NAME, ENV_PREFIX, NESTED_DURATION_BOUNDS, SCALARS, SETTINGS, Setting
from .values import parse_bool, parse_bounded_duration, parse_listen, regex_problem

# The scalar settings the environment can set (a structured one's variable is read by load.py).
ENV_SCALARS = tuple(s for s in SCALARS if s.env_var is not None)
# The environment variables load_config reads, after ENV_PREFIX.
_KNOWN_ENV = frozenset(s.env_var.removeprefix(ENV_PREFIX) for s in SETTINGS if s.env_var is not None)
FILE_KEYS = frozenset(s.name for s in SETTINGS if s.file)
FILE_SCALARS = tuple(s.name for s in SCALARS if s.file)


def bounded_duration(key: str, value: Any) -> float:
    """parse_duration, then the bounds of the key (a duration setting, or a nested key path such as
    discover_targets.interval); ValueError names them."""
    if key in NESTED_DURATION_BOUNDS:
        low, high = NESTED_DURATION_BOUNDS[key]
    else:
        setting = BY_NAME[key]
        if setting.kind != "duration" or setting.low is None or setting.high is None:
            raise KeyError(f"{key} is not a bounded duration")
        low, high = setting.low, setting.high
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
            value = checked(BY_NAME[key], value)
        except ValueError as exc:
            self.problems.append(f"{where}: {exc}")
            return
        self.values[key] = value

    def check_regex(self, where: str, text: str) -> None:
        """Note a problem if `text` is not a valid regex."""
        problem = regex_problem(where, text)
        if problem is not None:
            self.problems.append(problem)


def checked(setting: Setting, value: Any) -> Any:
    """The value of a scalar setting from what a file, a variable or a flag gave; ValueError says what is wrong."""
    kind = setting.kind
    if kind == "duration":
        return bounded_duration(setting.name, value)
    if kind == "bool":
        return parse_bool(value)
    if kind == "int":
        number = int(value)
        if setting.low is not None and setting.high is not None and not setting.low <= number <= setting.high:
            raise ValueError(f"must be between {setting.low:g} and {setting.high:g}")
        return number
    if kind == "choice":
        text = str(value).lower()
        if text not in setting.choices:
            raise ValueError(f"must be one of {', '.join(setting.choices)}")
        return text
    if kind == "listen":
        parse_listen(str(value))
    if kind == "structured":
        raise ValueError(f"{setting.name} is not a single value")
    return str(value)
