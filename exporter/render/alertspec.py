"""Render, one rule: the AlertSpec value every alert module returns (RecordSpec for a recording rule), the
pack's fixed names and groups, and how a kind id becomes an alert name. alerts.py turns a list of these into
the rules file; runbooks.py into pages.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..catalog import OomKind
from .options import DASHBOARD_URL_VARIABLES, OVERVIEW_DASHBOARD_UID, RenderOptions, runbook_page_url

OOM_GROUP = "sglang-oom"
EXPORTER_GROUP = "sglang-oom-exporter"

# Alert names that are a contract (README, ROADMAP, user routes and silences); the per-kind ones are derived.
RETRACTIONS_HIGH = "SGLangKVCacheRetractionsHigh"
CRASH_LOOP = "SGLangOOMCrashLoop"
NEAR_FULL = "SGLangKVCacheNearFull"
EXPORTER_DOWN = "SGLangOOMExporterDown"
NO_LOGS = "SGLangOOMExporterNoLogs"
TARGET_DOWN = "SGLangOOMTargetDown"
STATE_ERRORS = "SGLangOOMExporterStateErrors"
# The catalog's non-memory crash (its own series, sglang_oom_crashes_total): one crash, and a crash loop.
CRASHED = "SGLangCrashed"
CRASH_LOOP_ANY = "SGLangCrashLoop"

# Words of a kind id that are acronyms keep their case in alert names (CUDA, not Cuda).
ACRONYMS = {"cuda": "CUDA", "kv": "KV", "oom": "OOM", "pd": "PD", "gpu": "GPU", "swa": "SWA"}
NAME_RE = re.compile(r"^SGLang[A-Z][A-Za-z0-9]+$")


@dataclass(frozen=True, slots=True)
class AlertSpec:
    """One alerting rule, plus what the runbooks and tests need to know about it."""

    name: str
    group: str
    role: str  # fatal, non_fatal, retraction, or the alert_pack key (crash_loop, kv_near_full, exporter_down, ...)
    severity: str
    expr: str
    for_: str
    summary: str
    description: str
    window: str | None = None  # the range its expression looks back over, if it has one
    keep_firing_for: str | None = None
    kind: OomKind | None = None
    threshold: float | None = None

    def rule(self, options: RenderOptions, cluster_label: str = "cluster") -> dict[str, Any]:
        """The rule as it goes into the rules file."""
        rule: dict[str, Any] = {"alert": self.name, "expr": self.expr, "for": self.for_}
        if self.keep_firing_for:
            rule["keep_firing_for"] = self.keep_firing_for
        rule["labels"] = {"severity": self.severity}
        annotations = {
            "summary": self.summary,
            "description": self.description,
            "runbook_url": runbook_page_url(options, self.name),
        }
        if options.grafana_url:
            annotations["dashboard_url"] = dashboard_url(options, cluster_label)
        rule["annotations"] = annotations
        return rule


@dataclass(frozen=True, slots=True)
class RecordSpec:
    """One recording rule: the joins and counts the alerts (and the dashboard) read, named
    `level:metric:operations` as the Prometheus docs recommend. It goes into its group before the alerts, so
    an alert reads the value recorded in the same evaluation (a group's rules run in order)."""

    name: str
    group: str
    expr: str

    def rule(self) -> dict[str, Any]:
        """The rule as it goes into the rules file."""
        return {"record": self.name, "expr": self.expr}


def alert_name(kind_id: str, suffix: str = "OOM") -> str:
    """`SGLang` + the kind id in CamelCase (acronyms kept) + suffix, without doubling a trailing OOM."""
    words = [ACRONYMS.get(w, w.capitalize()) for w in kind_id.split("_")]
    if suffix == "OOM" and words[-1] == "OOM":
        suffix = ""
    return "SGLang" + "".join(words) + suffix


def dashboard_url(options: RenderOptions, cluster_label: str = "cluster") -> str:
    """The overview dashboard, with a var-<name> for each dashboard variable the alert has a value for (the
    `cluster` variable from the configured cluster label)."""
    labels = {v: cluster_label if v == "cluster" else v for v in DASHBOARD_URL_VARIABLES}
    params = "".join(
        f"{{{{ if $labels.{label} }}}}&var-{v}={{{{ $labels.{label} | urlquery }}}}{{{{ end }}}}"
        for v, label in labels.items()
    )
    return f"{options.grafana_url}/d/{OVERVIEW_DASHBOARD_UID}?from=now-3h&to=now{params}"


def pack_alert(pack: Mapping[str, Any], key: str, name: str, expr: str, summary: str, description: str,
               **extra: Any) -> AlertSpec:  # fmt: skip
    """A pack alert: its severity and `for` from the catalog's alert_pack.<key>, its role the key itself."""
    spec = pack[key]
    group = OOM_GROUP if key in ("crash_loop", "kv_near_full") else EXPORTER_GROUP
    return AlertSpec(name=name, group=group, role=key, severity=str(spec["severity"]), expr=expr,
                     for_=str(spec["for"]), summary=summary, description=description, **extra)  # fmt: skip
