"""Configuration, the file: the YAML file's shape (scalars, paths, sources, prefix_regex, kubernetes, targets)
read into a Builder. Every problem names the file and the key path (and the line, for a YAML syntax error).
"""

from __future__ import annotations

from typing import Any

import yaml

from .keys import FILE_KEYS, FILE_SCALARS, Builder, bounded_duration
from .model import DiscoverTargetsConfig, EventsConfig, KubernetesConfig
from .values import URL, parse_bool

_K8S_KEYS = frozenset({"logs_root", "namespace", "pod", "container"})
_DISCOVER_KEYS = frozenset({"enabled", "port", "port_annotation", "interval", "service_account_dir"})
_EVENTS_KEYS = frozenset({"enabled", "service_account_dir", "nonfatal", "runbook_base_url"})


def read_file(builder: Builder, path: str) -> None:
    """Read the YAML config at `path` into the builder; problems go to builder.problems."""
    data = _load_yaml(builder, path)
    if data is None:
        return
    for key in sorted(set(data) - FILE_KEYS):
        builder.problems.append(f"{path}: {key}: unknown key")
    for key in FILE_SCALARS:
        if key in data and data[key] is not None:
            builder.set(f"{path}: {key}", key, data[key])
    _paths(builder, path, data)
    prefixes = list(_str_list(builder, f"{path}: prefix_regex", data.get("prefix_regex")))
    for i, rx in enumerate(prefixes):
        builder.check_regex(f"{path}: prefix_regex[{i}]", rx)
    if prefixes:
        builder.values["prefix_regex"] = tuple(prefixes)
    k8s = data.get("kubernetes")
    if k8s is not None:
        _kubernetes(builder, f"{path}: kubernetes", k8s)
    _targets(builder, f"{path}: targets", data.get("targets"))


def _load_yaml(builder: Builder, path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        builder.problems.append(f"{path}: cannot read: {exc.strerror or exc}")
        return None
    except UnicodeDecodeError as exc:
        builder.problems.append(f"{path}: not UTF-8 text: byte {exc.object[exc.start]:#04x} at offset {exc.start}")
        return None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        builder.problems.append(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}")
        return None
    if data is None:
        return None
    if not isinstance(data, dict):
        builder.problems.append(f"{path}: the config must be a mapping")
        return None
    return data


def _paths(builder: Builder, path: str, data: dict[str, Any]) -> None:
    """paths: [glob, ...] and sources: [{path, name}]: what to follow, and the source name of each."""
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


def _targets(builder: Builder, where: str, raw: Any) -> None:
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
        if not URL.match(entry["url"]):
            builder.problems.append(f"{where}[{i}].url: {entry['url']!r} is not an http(s) URL")
            continue
        urls.append(entry["url"].rstrip("/"))
        if entry.get("source"):
            owners[entry["url"].rstrip("/")] = str(entry["source"])
    builder.values["sglang_urls"] = tuple(urls)
    builder.values["target_sources"] = owners


def _str_list(builder: Builder, where: str, value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        builder.problems.append(f"{where}: must be a list of strings")
        return []
    return list(value)


def _kubernetes(builder: Builder, where: str, raw: Any) -> None:
    if not isinstance(raw, dict) or not isinstance(raw.get("logs_root"), str):
        builder.problems.append(f"{where}: needs logs_root (e.g. /var/log/pods)")
        return
    for key in sorted(set(raw) - _K8S_KEYS - {"discover_targets", "events"}):
        builder.problems.append(f"{where}.{key}: unknown key")
    for key in ("namespace", "pod", "container"):
        if key in raw:  # matched under a time limit (sources/discover.py): only the syntax is a config error
            builder.check_regex(f"{where}.{key}", str(raw[key]))
    discover = _discover_targets(builder, f"{where}.discover_targets", raw.get("discover_targets"))
    events = _events(builder, f"{where}.events", raw.get("events"))
    builder.values["kubernetes"] = KubernetesConfig(
        **{k: str(v) for k, v in raw.items() if k in _K8S_KEYS}, discover_targets=discover, events=events
    )


def _section(builder: Builder, where: str, raw: Any, keys: frozenset[str], shape: str) -> bool:
    """Whether an optional nested mapping is there to read: absent is False; not a mapping is a problem (False);
    its unknown keys are problems too (still True: the known ones are read)."""
    if raw is None:
        return False
    if not isinstance(raw, dict):
        builder.problems.append(f"{where}: must be a mapping with {shape}")
        return False
    for key in sorted(set(raw) - keys):
        builder.problems.append(f"{where}.{key}: unknown key")
    return True


def _discover_targets(builder: Builder, where: str, raw: Any) -> DiscoverTargetsConfig | None:
    """kubernetes.discover_targets: {enabled, port, port_annotation, interval, service_account_dir}."""
    if not _section(builder, where, raw, _DISCOVER_KEYS, "enabled, port, port_annotation, interval"):
        return None
    values: dict[str, Any] = {}
    try:
        enabled = parse_bool(raw.get("enabled", True))
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


def _events(builder: Builder, where: str, raw: Any) -> EventsConfig | None:
    """kubernetes.events: {enabled, service_account_dir, nonfatal, runbook_base_url}; None when off."""
    if not _section(builder, where, raw, _EVENTS_KEYS, "enabled, service_account_dir, nonfatal"):
        return None
    values: dict[str, Any] = {}
    try:
        enabled = parse_bool(raw.get("enabled", True))
        if "nonfatal" in raw:
            values["nonfatal"] = parse_bool(raw["nonfatal"])
        if raw.get("service_account_dir") is not None:
            values["service_account_dir"] = str(raw["service_account_dir"])
        url = raw.get("runbook_base_url")
        if url:
            if not URL.match(str(url)):
                raise ValueError(f"runbook_base_url {url!r} is not an http(s) URL")
            values["runbook_base_url"] = str(url).rstrip("/")
    except ValueError as exc:
        builder.problems.append(f"{where}: {exc}")
        return None
    return EventsConfig(**values) if enabled else None
