"""The catalog's alert fields: each kind's `alert:` block and the top-level `alert_pack`, checked for the loader.

render/alerts.py reads what this module checks; loader.py calls AlertFields while it validates a catalog,
and every problem goes into the same CatalogError.
"""

from __future__ import annotations

import re
from typing import Any, Protocol


class Reporter(Protocol):
    """Where problems go: the loader's validator (file:line: key.path: what)."""

    def err(self, node: Any, where: str, what: str) -> None: ...


# Prometheus durations as the alert fields use them: 30s, 5m, 1h, 1h30m.
_PROM_DURATION = re.compile(r"^(?:\d+(?:ms|s|m|h|d|w|y))+$")
# Image patterns (RE2, written into a PromQL string): constructs RE2 lacks, which Python's re would accept.
_IMAGE_KEYS = ("server_images", "excluded_images")
_NOT_RE2 = re.compile(r"\(\?(?:[=!]|<[=!])|\\[1-9]|\(\?P=")
_DURATION_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
# alert_pack entries: the keys each must have (all of them, nothing else) besides severity.
_PACK_ALERTS = {
    "crash_loop": ("count", "window", "for", "keep_firing_for"),
    "kv_near_full": ("threshold", "for"),
    "exporter_down": ("for",),
    "exporter_no_logs": ("window", "for", "server_images", "excluded_images"),
    "target_down": ("for",),
    "state_errors": ("window", "for"),
}


# Where the pack's series come from and the label that keeps clusters apart (render/promql.py Scope).
_SCOPE_KEYS = ("job_selector", "cluster_label")
_MATCHER = r'\s*[A-Za-z_][A-Za-z0-9_]*\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*'
_MATCHERS = re.compile(rf"^{_MATCHER}(?:,{_MATCHER})*$")
_LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _seconds(text: str) -> float:
    return sum(int(n) * _DURATION_SECONDS[u] for n, u in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", text))


class AlertFields:
    """Checks what render/alerts.py reads: each kind's `alert:` block and the top-level `alert_pack`."""

    def __init__(self, validator: Reporter, severities: tuple[str, ...]) -> None:
        self.v = validator
        self._severities = severities

    def check(self, data: dict[str, Any]) -> dict[str, Any]:
        """Validate every kind's alert block and the alert_pack section; return the pack without line keys."""
        for raw in data.get("kinds") or []:
            if isinstance(raw, dict) and isinstance(raw.get("alert"), dict):
                self._kind(raw, f"kinds[{raw.get('id')}].alert")
        pack = data.get("alert_pack")
        if not isinstance(pack, dict):
            self.v.err(data, "alert_pack", "missing: the job name and the pack alerts' thresholds")
            return {}
        for key in sorted(set(pack) - {*_PACK_ALERTS, *_SCOPE_KEYS, "job", "flag_versions", "__line__"}):
            self.v.err(pack, f"alert_pack.{key}", "unknown key")
        if not isinstance(pack.get("job"), str) or not pack["job"]:
            self.v.err(pack, "alert_pack.job", "must be the scrape job name")
        self.scope(pack, "alert_pack")
        for name, keys in _PACK_ALERTS.items():
            spec = pack.get(name)
            if not isinstance(spec, dict):
                self.v.err(pack, f"alert_pack.{name}", f"missing: needs severity, {', '.join(keys)}")
                continue
            self._fields(spec, f"alert_pack.{name}", {"severity", *keys}, {"severity", *keys})
        versions = pack.get("flag_versions")
        if not isinstance(versions, dict) or not all(
            isinstance(k, str) and isinstance(t, str) and t for k, t in versions.items() if k != "__line__"
        ):
            self.v.err(pack, "alert_pack.flag_versions", "must map each remediation flag to its SGLang versions")
        return dict(_strip_lines(pack))

    def scope(self, spec: dict[str, Any], where: str) -> None:
        """job_selector (label matchers, e.g. job=~"sglang-oom.*") and cluster_label (a label name), if set."""
        where = f"{where}." if where else ""
        selector = spec.get("job_selector")
        if "job_selector" in spec and (not isinstance(selector, str) or not _MATCHERS.match(selector)
                                       or "`" in selector):  # fmt: skip
            self.v.err(spec, f"{where}job_selector", f'{selector!r} is not label matchers like job=~"sglang-oom.*"')
        label = spec.get("cluster_label")
        if "cluster_label" in spec and (not isinstance(label, str) or not _LABEL_NAME.match(label)):
            self.v.err(spec, f"{where}cluster_label", f"{label!r} is not a Prometheus label name")

    def _kind(self, raw: dict[str, Any], where: str) -> None:
        alert = raw["alert"]
        fatal = raw.get("fatal")
        if fatal in (True, "raised"):
            self._fields(alert, where, {"for", "window", "keep_firing_for"}, {"for", "window", "keep_firing_for",
                                                                            "non_fatal"})  # fmt: skip
        elif "threshold_per_minute" in alert:
            # requests_threshold_per_minute: the rate of SGLang's retracted-requests counter that stands in
            # where no retraction logs are read (optional; the tick threshold when absent).
            self._fields(alert, where, {"for", "window", "threshold_per_minute"}, {"for", "window",
                         "threshold_per_minute", "requests_threshold_per_minute"})  # fmt: skip
        else:
            self._fields(alert, where, set(), {"for", "window"})
        non_fatal = alert.get("non_fatal")
        if non_fatal is None:
            return
        patterns = raw.get("patterns") or []
        if not any(isinstance(p, dict) and p.get("fatal") is False for p in patterns):
            self.v.err(alert, f"{where}.non_fatal", "only for a kind with a `fatal: false` pattern")
        keys = {"name", "severity", "for", "window", "threshold_per_minute"}
        if not isinstance(non_fatal, dict):
            self.v.err(alert, f"{where}.non_fatal", f"must be a mapping with {', '.join(sorted(keys))}")
            return
        self._fields(non_fatal, f"{where}.non_fatal", keys, keys)
        if not re.match(r"^[A-Z][A-Za-z0-9]+$", str(non_fatal.get("name"))):
            self.v.err(non_fatal, f"{where}.non_fatal.name", "must be CamelCase (the alert name's ending)")

    def fields(self, spec: dict[str, Any], where: str, required: set[str], allowed: set[str]) -> None:
        """One alert block: no unknown or missing keys, durations, severity, numbers, `for` below the window."""
        self._fields(spec, where, required, allowed)

    def _fields(self, spec: dict[str, Any], where: str, required: set[str], allowed: set[str]) -> None:
        for key in sorted(set(spec) - allowed - {"__line__"}):
            self.v.err(spec, f"{where}.{key}", "unknown key")
        for key in sorted(required - set(spec)):
            self.v.err(spec, f"{where}.{key}", "missing")
        for key in ("for", "window", "keep_firing_for"):
            if key in spec and not _PROM_DURATION.match(str(spec[key])):
                self.v.err(spec, f"{where}.{key}", f"{spec[key]!r} is not a Prometheus duration (5m, 1h)")
        if "severity" in spec and spec["severity"] not in self._severities:
            choices = ", ".join(self._severities)
            self.v.err(spec, f"{where}.severity", f"{spec['severity']!r} is not one of {choices}")
        for key in ("threshold_per_minute", "requests_threshold_per_minute", "threshold", "count"):
            value = spec.get(key)
            if key in spec and (isinstance(value, bool) or not isinstance(value, int | float) or value <= 0):
                self.v.err(spec, f"{where}.{key}", "must be a positive number")
        for key in _IMAGE_KEYS:
            if key in spec and not _image_pattern(spec[key]):
                self.v.err(spec, f"{where}.{key}", f"{spec[key]!r} is not an RE2 regex of container images")
        if "threshold" in spec and isinstance(spec["threshold"], int | float) and spec["threshold"] > 1:
            self.v.err(spec, f"{where}.threshold", "is a ratio: at most 1")
        durations = {k: str(spec[k]) for k in ("for", "window") if _PROM_DURATION.match(str(spec.get(k, "")))}
        if len(durations) == 2 and _seconds(durations["for"]) >= _seconds(durations["window"]):
            # One event keeps an increase() or rate() true for about one window: `for` must fit inside it.
            self.v.err(spec, f"{where}.for", f"must be shorter than the window ({durations['window']})")


def _image_pattern(value: Any) -> bool:
    """A non-empty regex both Python and RE2 read (no lookaround, no backreference)."""
    if not isinstance(value, str) or not value.strip() or _NOT_RE2.search(value):
        return False
    try:
        re.compile(value)
    except re.error:
        return False
    return True


def _strip_lines(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_lines(v) for k, v in value.items() if k != "__line__"}
    return value
