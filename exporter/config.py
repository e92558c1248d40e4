"""Configuration of `serve`: frozen dataclasses and load_config(). Raw dicts stop here.

Precedence: command-line flags, then environment variables (prefix SGLANG_OOM_EXPORTER_), then the YAML
file, then the defaults, which work without any file. Every problem is collected into one ConfigError
listing each key path (and the file's line where there is one), so `--check-config` shows them all.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import regex
import yaml

from .errors import ProblemsError
from .sources.discover import DEFAULT_CONTAINER_FILTER, DEFAULT_NAMESPACE_FILTER, DEFAULT_POD_FILTER

DEFAULT_PORT = 9877
DEFAULT_LISTEN = f":{DEFAULT_PORT}"
ENV_PREFIX = "SGLANG_OOM_EXPORTER_"
_DURATION = regex.compile(r"^(?:(\d+(?:\.\d+)?)(ms|s|m|h|d))+$")
_DURATION_PART = regex.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class ConfigError(ProblemsError):
    """Every problem found in the configuration, one per line."""


@dataclass(frozen=True, slots=True)
class DiscoverTargetsConfig:
    """kubernetes.discover_targets: each followed pod's SGLang endpoint from the Kubernetes API (node mode)."""

    port: int = 30000  # SGLang's port when the pod has no port annotation
    port_annotation: str = "sglang-oom-exporter/port"
    interval: float = 30.0  # how often the node's pods are listed
    service_account_dir: str = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclass(frozen=True, slots=True)
class KubernetesConfig:
    """Kubernetes node mode: follow /var/log/pods/<ns>_<pod>_<uid>/<container>/<n>.log."""

    logs_root: str
    namespace: str = DEFAULT_NAMESPACE_FILTER  # the defaults, and why, live with the filter in discover.py
    pod: str = DEFAULT_POD_FILTER
    container: str = DEFAULT_CONTAINER_FILTER
    discover_targets: DiscoverTargetsConfig | None = None  # None: off (the default)


@dataclass(frozen=True, slots=True)
class Config:
    """Everything `serve` needs to know."""

    paths: tuple[str, ...] = ()
    names: Mapping[str, str] = field(default_factory=dict)  # path or glob -> source name
    listen: str = DEFAULT_LISTEN
    state_dir: str | None = None
    from_beginning: bool = False
    kubernetes: KubernetesConfig | None = None
    force_polling: bool = False
    poll_interval: float = 1.0  # the loop's tick, and the polling observer's interval with force_polling
    sweep_interval: float = 10.0  # stat every followed file even without a file event (a missed event)
    discover_interval: float = 5.0
    state_interval: float = 5.0
    traceback_wait: float = 2.5
    source_retention: float = 3600.0
    recent_events: int = 200
    catalog: str | None = None
    prefix_regex: tuple[str, ...] = ()
    web_config: str | None = None
    log_level: str = "info"
    sglang_urls: tuple[str, ...] = ()  # SGLang base URLs to scrape (/metrics, /server_info)
    target_sources: Mapping[str, str] = field(default_factory=dict)  # url -> source name it serves
    scrape_interval: float = 15.0
    scrape_timeout: float = 5.0


def parse_duration(text: str) -> float:
    """'15s', '2m', '1h30m', '250ms' -> seconds; ValueError without a unit."""
    text = str(text).strip()
    if not _DURATION.match(text):
        raise ValueError(f"{text!r} is not a duration with a unit (e.g. 15s, 2m, 1h)")
    return sum(float(n) * _UNITS[u] for n, u in _DURATION_PART.findall(text))


_DURATION_KEYS = (
    "poll_interval", "sweep_interval", "discover_interval", "state_interval", "traceback_wait", "source_retention",
    "scrape_interval", "scrape_timeout",
)  # fmt: skip
_MS, _HOUR, _DAY = 0.001, 3600.0, 86400.0
# (smallest, largest) per duration: past these a timer overflows (OverflowError in a wait) or the setting
# makes no sense (a loop that ticks once a year); either way --check-config says so instead of the daemon dying.
_DURATION_BOUNDS = {
    "poll_interval": (_MS, _HOUR), "sweep_interval": (_MS, _DAY), "discover_interval": (_MS, _DAY),
    "state_interval": (_MS, _DAY), "traceback_wait": (_MS, _HOUR), "source_retention": (1.0, 365 * _DAY),
    "scrape_interval": (_MS, _DAY), "scrape_timeout": (_MS, _HOUR), "discover_targets.interval": (1.0, _DAY),
}  # fmt: skip


def bounded_duration(key: str, value: Any) -> float:
    """parse_duration, then the key's bounds; ValueError names them."""
    seconds = parse_duration(value)
    low, high = _DURATION_BOUNDS[key]
    if not (math.isfinite(seconds) and low <= seconds <= high):
        raise ValueError(f"{str(value).strip()!r} must be between {_human(low)} and {_human(high)}")
    return seconds


def _human(seconds: float) -> str:
    for unit, size in (("d", _DAY), ("h", _HOUR), ("s", 1.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds * 1000:g}ms"


def unknown_env(env: Mapping[str, str]) -> list[str]:
    """SGLANG_OOM_EXPORTER_* variables that no setting reads (a typo is otherwise silently ignored)."""
    return sorted(k for k in env if k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX) :] not in _KNOWN_ENV)


_BOOL_KEYS = ("from_beginning", "force_polling")
_STR_KEYS = ("listen", "state_dir", "catalog", "web_config", "log_level")
# The environment variables load_config reads, after ENV_PREFIX.
_KNOWN_ENV = frozenset({"CONFIG", "PATHS", "SGLANG_URL", "KUBERNETES_LOGS",
                        *(k.upper() for k in (*_DURATION_KEYS, *_BOOL_KEYS, *_STR_KEYS))})  # fmt: skip
_FILE_KEYS = frozenset({*_DURATION_KEYS, *_BOOL_KEYS, *_STR_KEYS, "paths", "sources", "kubernetes", "prefix_regex",
                        "recent_events", "targets"})  # fmt: skip
_URL = regex.compile(r"^https?://[^\s/]+(?:/[^\s]*)?$")
_K8S_KEYS = frozenset({"logs_root", "namespace", "pod", "container"})
_DISCOVER_KEYS = frozenset({"enabled", "port", "port_annotation", "interval", "service_account_dir"})
_LEVELS = ("debug", "info", "warning", "error")


class _Builder:
    """Collects values and problems from the file, the environment and the flags."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.problems: list[str] = []

    def set(self, where: str, key: str, value: Any) -> None:
        try:
            if key in _DURATION_KEYS:
                value = bounded_duration(key, value)
            elif key in _BOOL_KEYS:
                value = _bool(value)
            elif key == "recent_events":
                value = int(value)
                if not 1 <= value <= 100_000:
                    raise ValueError("must be between 1 and 100000")
            elif key == "log_level":
                value = str(value).lower()
                if value not in _LEVELS:
                    raise ValueError(f"must be one of {', '.join(_LEVELS)}")
            elif key == "listen":
                value = str(value)
                parse_listen(value)
            elif key in _STR_KEYS:
                value = str(value)
        except ValueError as exc:
            self.problems.append(f"{where}: {exc}")
            return
        self.values[key] = value


def _bool(value: Any) -> bool:
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


def _regex_ok(builder: _Builder, where: str, text: str) -> None:
    try:
        regex.compile(text)
    except regex.error as exc:
        builder.problems.append(f"{where}: bad regex {text!r}: {exc}")


def _read_file(builder: _Builder, path: str) -> None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        builder.problems.append(f"{path}: cannot read: {exc.strerror or exc}")
        return
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        builder.problems.append(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}")
        return
    if data is None:
        return
    if not isinstance(data, dict):
        builder.problems.append(f"{path}: the config must be a mapping")
        return
    for key in sorted(set(data) - _FILE_KEYS):
        builder.problems.append(f"{path}: {key}: unknown key")
    for key in (*_DURATION_KEYS, *_BOOL_KEYS, *_STR_KEYS, "recent_events"):
        if key in data and data[key] is not None:
            builder.set(f"{path}: {key}", key, data[key])
    paths = list(_str_list(builder, f"{path}: paths", data.get("paths")))
    names: dict[str, str] = {}
    for i, entry in enumerate(data.get("sources") or []):
        where = f"{path}: sources[{i}]"
        if not isinstance(entry, dict) or set(entry) - {"name", "path"} or not isinstance(entry.get("path"), str):
            builder.problems.append(f"{where}: needs 'path' and an optional 'name', nothing else")
            continue
        paths.append(entry["path"])
        if entry.get("name"):
            names[entry["path"]] = str(entry["name"])
    if paths:
        builder.values["paths"] = tuple(paths)
        builder.values["names"] = names
    prefixes = list(_str_list(builder, f"{path}: prefix_regex", data.get("prefix_regex")))
    for i, rx in enumerate(prefixes):
        _regex_ok(builder, f"{path}: prefix_regex[{i}]", rx)
    if prefixes:
        builder.values["prefix_regex"] = tuple(prefixes)
    k8s = data.get("kubernetes")
    if k8s is not None:
        _kubernetes(builder, f"{path}: kubernetes", k8s)
    _targets(builder, f"{path}: targets", data.get("targets"))


def _targets(builder: _Builder, where: str, raw: Any) -> None:
    """targets: [{url: http://127.0.0.1:30000, source: name}]: which SGLang serves which log source."""
    if raw is None:
        return
    if not isinstance(raw, list):
        builder.problems.append(f"{where}: must be a list of {{url, source}}")
        return
    urls: list[str] = []
    owners: dict[str, str] = {}
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict) or set(entry) - {"url", "source"} or not isinstance(entry.get("url"), str):
            builder.problems.append(f"{where}[{i}]: needs 'url' and an optional 'source', nothing else")
            continue
        if not _URL.match(entry["url"]):
            builder.problems.append(f"{where}[{i}].url: {entry['url']!r} is not an http(s) URL")
            continue
        urls.append(entry["url"].rstrip("/"))
        if entry.get("source"):
            owners[entry["url"].rstrip("/")] = str(entry["source"])
    builder.values["sglang_urls"] = tuple(urls)
    builder.values["target_sources"] = owners


def _str_list(builder: _Builder, where: str, value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        builder.problems.append(f"{where}: must be a list of strings")
        return []
    return list(value)


def _kubernetes(builder: _Builder, where: str, raw: Any) -> None:
    if not isinstance(raw, dict) or not isinstance(raw.get("logs_root"), str):
        builder.problems.append(f"{where}: needs logs_root (e.g. /var/log/pods)")
        return
    for key in sorted(set(raw) - _K8S_KEYS - {"discover_targets"}):
        builder.problems.append(f"{where}.{key}: unknown key")
    for key in ("namespace", "pod", "container"):
        if key in raw:
            _regex_ok(builder, f"{where}.{key}", str(raw[key]))
    discover = _discover_targets(builder, f"{where}.discover_targets", raw.get("discover_targets"))
    builder.values["kubernetes"] = KubernetesConfig(
        **{k: str(v) for k, v in raw.items() if k in _K8S_KEYS}, discover_targets=discover
    )


def _discover_targets(builder: _Builder, where: str, raw: Any) -> DiscoverTargetsConfig | None:
    """kubernetes.discover_targets: {enabled, port, port_annotation, interval, service_account_dir}."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        builder.problems.append(f"{where}: must be a mapping with enabled, port, port_annotation, interval")
        return None
    for key in sorted(set(raw) - _DISCOVER_KEYS):
        builder.problems.append(f"{where}.{key}: unknown key")
    values: dict[str, Any] = {}
    try:
        enabled = _bool(raw.get("enabled", True))
        if "port" in raw:
            values["port"] = int(raw["port"])
            if isinstance(raw["port"], bool) or not 0 < values["port"] < 65536:
                raise ValueError(f"port {raw['port']!r} is not between 1 and 65535")
        if "interval" in raw:
            try:
                values["interval"] = bounded_duration("discover_targets.interval", raw["interval"])
            except ValueError as exc:
                raise ValueError(f"interval {exc}") from None
        for key in ("port_annotation", "service_account_dir"):
            if key in raw:
                values[key] = str(raw[key])
    except (TypeError, ValueError) as exc:
        builder.problems.append(f"{where}: {exc}")
        return None
    return DiscoverTargetsConfig(**values) if enabled else None


def load_config(
    path: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> Config:
    """Build the Config from file, environment and flags; ConfigError lists every problem."""
    env = os.environ if env is None else env
    flags = flags or {}
    builder = _Builder()
    path = flags.get("config") or env.get(ENV_PREFIX + "CONFIG") or path
    if path:
        _read_file(builder, path)
    for key in (*_DURATION_KEYS, *_BOOL_KEYS, *_STR_KEYS):
        name = ENV_PREFIX + key.upper()
        if env.get(name):
            builder.set(name, key, env[name])
    if env.get(ENV_PREFIX + "PATHS"):
        builder.values["paths"] = tuple(p for p in env[ENV_PREFIX + "PATHS"].split(",") if p)
    if env.get(ENV_PREFIX + "SGLANG_URL"):
        builder.values["sglang_urls"] = tuple(u.rstrip("/") for u in env[ENV_PREFIX + "SGLANG_URL"].split(",") if u)
    if env.get(ENV_PREFIX + "KUBERNETES_LOGS"):
        base = builder.values.get("kubernetes")
        root = env[ENV_PREFIX + "KUBERNETES_LOGS"]
        builder.values["kubernetes"] = replace(base, logs_root=root) if base else KubernetesConfig(root)
    for key, value in flags.items():
        if value is None or key == "config":
            continue
        if key == "paths":
            if value:
                builder.values["paths"] = tuple(value)
        elif key == "kubernetes_logs":
            base = builder.values.get("kubernetes")
            builder.values["kubernetes"] = replace(base, logs_root=value) if base else KubernetesConfig(value)
        elif key == "sglang_url":
            bad = [u for u in value if not _URL.match(u)]
            builder.problems.extend(f"--sglang-url: {u!r} is not an http(s) URL" for u in bad)
            if value and not bad:
                builder.values["sglang_urls"] = tuple(u.rstrip("/") for u in value)
        elif key == "prefix_regex":
            for i, rx in enumerate(value):
                _regex_ok(builder, f"--prefix-regex[{i}]", rx)
            if value:
                builder.values["prefix_regex"] = tuple(value)
        else:
            builder.set(f"--{key.replace('_', '-')}", key, value)
    if builder.problems:
        raise ConfigError(builder.problems)
    return Config(**builder.values)
