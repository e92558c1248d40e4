"""Grafana dashboard JSON as plain dicts: the small builders the dashboard renderer is written with.

Sits under render/dashboards.py, which decides what the panels show; this module only knows Grafana's JSON
model (schemaVersion 41, the vendored tests/schemas/dashboard.jsonschema.json) and our conventions (the
rules of grafana/dashboard-linter, re-implemented in tests/support/dashboard_lint.py): every panel and target on the
`${datasource}` variable, a refId on every target, a description and a unit on every data panel, thresholds
with a -Infinity base step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Json = dict[str, Any]

DATASOURCE: Json = {"type": "prometheus", "uid": "${datasource}"}
GREEN, RED, ORANGE, BLUE = "green", "red", "orange", "blue"
_REF_IDS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def target(expr: str, legend: str = "__auto", *, ref: int = 0, instant: bool = False, table: bool = False) -> Json:
    """One Prometheus query of a panel."""
    out: Json = {
        "datasource": DATASOURCE,
        "editorMode": "code",
        "expr": expr,
        "legendFormat": legend,
        "range": not instant,
        "instant": instant,
        "refId": _REF_IDS[ref],
    }
    if table:
        out["format"] = "table"
    return out


def targets(*queries: tuple[str, str], instant: bool = False, table: bool = False) -> list[Json]:
    """Several (expr, legend) queries with refIds A, B, C..."""
    return [target(e, legend, ref=i, instant=instant, table=table) for i, (e, legend) in enumerate(queries)]


def link(title: str, url: str, tooltip: str = "") -> Json:
    """A panel link, data link or dashboard link to a URL (opens in a new tab)."""
    return {
        "title": title,
        "type": "link",
        "icon": "doc",
        "tooltip": tooltip or title,
        "url": url,
        "tags": [],
        "asDropdown": False,
        "targetBlank": True,
        "includeVars": False,
        "keepTime": False,
    }


def thresholds(base: str, *steps: tuple[float, str]) -> Json:
    """Absolute thresholds: the base colour from -Infinity (null in JSON), then (value, colour) steps."""
    return {
        "mode": "absolute",
        "steps": [{"color": base, "value": None}] + [{"color": c, "value": v} for v, c in steps],
    }


def field_config(unit: str, *, data_links: Sequence[Json] = (), steps: Json | None = None, **extra: Any) -> Json:
    """fieldConfig with a unit on the defaults, optional data links, thresholds and other default keys."""
    defaults: Json = {"unit": unit, **extra}
    if data_links:
        defaults["links"] = list(data_links)
    if steps is not None:
        defaults["thresholds"] = steps
        defaults.setdefault("color", {"mode": "thresholds"})
    return {"defaults": defaults, "overrides": []}


def panel(kind: str, title: str, description: str, *, fieldconfig: Json | None = None, **rest: Any) -> Json:
    """A data or text panel on the templated datasource; gridPos and id are set by the layout."""
    out: Json = {"type": kind, "title": title, "description": description}
    if kind != "text":
        out["datasource"] = DATASOURCE
    if fieldconfig is not None:
        out["fieldConfig"] = fieldconfig
    out.update(rest)
    return out


def stat(title: str, description: str, queries: list[Json], fieldconfig: Json, **options: Any) -> Json:
    """A stat panel: one tile per series, the last value, coloured by thresholds."""
    opts = {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "colorMode": "background",
        "graphMode": "none",
        "justifyMode": "auto",
        "textMode": "value_and_name",
        "orientation": "auto",
        **options,
    }
    return panel("stat", title, description, fieldconfig=fieldconfig, targets=queries, options=opts)


def timeseries(title: str, description: str, queries: list[Json], fieldconfig: Json, *, bars: bool = False) -> Json:
    """A time series panel with a table legend showing the last and max values."""
    custom = {"drawStyle": "bars" if bars else "line", "fillOpacity": 60 if bars else 10, "lineWidth": 1,
              "showPoints": "never", "spanNulls": False}  # fmt: skip
    fieldconfig["defaults"].setdefault("custom", custom)
    opts = {
        "legend": {"displayMode": "table", "placement": "bottom", "showLegend": True, "calcs": ["lastNotNull", "max"]},
        "tooltip": {"mode": "multi", "sort": "desc"},
    }
    return panel("timeseries", title, description, fieldconfig=fieldconfig, targets=queries, options=opts)


def table(title: str, description: str, queries: list[Json], fieldconfig: Json, transformations: list[Json]) -> Json:
    """A table panel over instant queries merged into rows."""
    opts = {"showHeader": True, "cellHeight": "sm", "footer": {"show": False, "reducer": ["sum"], "fields": ""}}
    return panel("table", title, description, fieldconfig=fieldconfig, targets=queries, options=opts,
                 transformations=transformations)  # fmt: skip


def text(title: str, description: str, markdown: str, links: Sequence[Json] = ()) -> Json:
    """A markdown text panel (no data, so no datasource and no unit)."""
    return panel("text", title, description, links=list(links), options={"mode": "markdown", "content": markdown})


def row(title: str) -> Json:
    """A row header (expanded, so its panels follow it at the top level)."""
    return {"type": "row", "title": title, "collapsed": False, "panels": []}


def query_variable(name: str, label: str, query: str, description: str, *, all_value: str) -> Json:
    """A multi-value Prometheus query variable with an All option, refreshed when the time range changes."""
    return {
        "type": "query",
        "name": name,
        "label": label,
        "description": description,
        "datasource": DATASOURCE,
        "definition": query,
        "query": query,
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        "allValue": all_value,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "regex": "",
        "sort": 1,
        "hide": 0,
    }


def datasource_variable() -> Json:
    """The Prometheus data source picker every panel refers to as ${datasource}."""
    return {
        "type": "datasource",
        "name": "datasource",
        "label": "Data source",
        "description": "The Prometheus that scrapes sglang-oom-exporter.",
        "query": "prometheus",
        "refresh": 1,
        "regex": "",
        "hide": 0,
        "multi": False,
        "includeAll": False,
        "options": [],
    }


def layout(sections: Sequence[tuple[Json | None, Sequence[tuple[Json, int, int]]]]) -> list[Json]:
    """Place (panel, width, height) items left to right in rows of 24 under each row header; number ids from 1."""
    out: list[Json] = []
    y = 0
    for header, items in sections:
        if header is not None:
            out.append({"id": len(out) + 1, **header, "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
            y += 1
        x, line_height = 0, 0
        for item, w, h in items:
            if x + w > 24:
                x, y, line_height = 0, y + line_height, 0
            out.append({"id": len(out) + 1, **item, "gridPos": {"h": h, "w": w, "x": x, "y": y}})
            x, line_height = x + w, max(line_height, h)
        y += line_height
    return out
