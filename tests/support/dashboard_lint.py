"""A Python re-implementation of grafana/dashboard-linter's rules, for the tests.

The Go linter cannot be installed here, so this module checks what its code checks, with the rule ids it
uses, parametrised for our filter variables (namespace, pod, source, kind instead of job/instance):

    problems = lint(dashboard, filter_variables=("namespace", "pod", "source", "kind"))
    remaining, unused = apply_exclusions(problems, load_exclusions("dashboards/.lint"))

PromQL is parsed with promql-parser after Grafana's variables are replaced (`interpolate`): for the lint by
sentinels (`$__rate_interval` becomes a duration no one writes by hand, `$namespace` a marker string), so a
rule can tell a `[$__rate_interval]` range or a `namespace=~"$namespace"` matcher from a hard-coded one; for the
end-to-end test by the values Grafana would send.

Exclusions use the tool's `.lint` format (`exclusions: {rule: {reason, entries: [{dashboard, panel,
targetIdx}]}}`) plus two keys of ours: `metric` (a regex the selector's metric name must fully match) and
`check` (one sub-check of a template rule, e.g. allValue), so an exclusion can be as narrow as its reason.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import promql_parser
import yaml

RATE_INTERVAL_SENTINEL = timedelta(seconds=4321)
RANGE_SENTINEL = timedelta(seconds=8765)
INTERVAL_SENTINEL = timedelta(seconds=1111)
_BUILTIN = {"__rate_interval": RATE_INTERVAL_SENTINEL, "__range": RANGE_SENTINEL, "__interval": INTERVAL_SENTINEL}
DATA_PANELS = frozenset({"stat", "gauge", "timeseries", "table", "graph", "singlestat"})
DATASOURCE_PANELS = frozenset({"timeseries", "graph", "table", "singlestat", "stat"})
TEMPLATED_DATASOURCES = frozenset({"$datasource", "${datasource}"})
COUNTER_FUNCTIONS = frozenset({"rate", "irate", "increase"})
# Grafana unit ids (packages/grafana-data/src/valueFormats/categories.ts), the ones a dashboard like ours uses.
_UNITS = """none short percent percentunit string bool locale sci hex hex0x
s ms us ns m h d dtdurations dtdurationms clocks clockms dateTimeAsIso dateTimeAsSystem dateTimeFromNow
bytes decbytes bits decbits kbytes mbytes gbytes Bps binBps bps ops reqps rps wps rwps iops opm rpm wpm cps hertz"""
KNOWN_UNITS = frozenset(_UNITS.split())
_VAR_RE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")
_VARIABLE_QUERY_RE = re.compile(r"^\s*(label_values|label_names|metrics|query_result)\s*\((.*)\)\s*$", re.S)


@dataclass(frozen=True)
class Problem:
    """One rule violation, located as precisely as the rule can."""

    rule: str
    message: str
    dashboard: str
    panel: str | None = None
    target_idx: int | None = None
    metric: str | None = None
    check: str | None = None

    def __str__(self) -> str:
        where = "/".join(str(x) for x in (self.dashboard, self.panel, self.target_idx) if x is not None)
        return f"{self.rule} [{where}]: {self.message}"


def interpolate(expr: str, values: Mapping[str, str]) -> str:
    """Replace $name, ${name} and [[name]] by values[name] (unknown names stay, so parsing them fails)."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        return values.get(name, m.group(0))

    return _VAR_RE.sub(sub, expr)


def sentinel(variable: str) -> str:
    """The marker a dashboard variable is replaced with before parsing, for the lint."""
    return f"__lint_{variable}__"


def lint_values(variables: Sequence[str]) -> dict[str, str]:
    """Sentinel values for Grafana's built-in intervals and for every named variable."""
    out = {name: f"{int(d.total_seconds())}s" for name, d in _BUILTIN.items()}
    out.update({name: sentinel(name) for name in variables})
    return out


def parse(expr: str, values: Mapping[str, str]) -> Any:
    """Interpolate, then parse with promql-parser (ValueError on a syntax error)."""
    return promql_parser.parse(interpolate(expr, values))


def _children(node: Any) -> list[Any]:
    name = type(node).__name__
    if name == "BinaryExpr":
        return [node.lhs, node.rhs]
    if name == "AggregateExpr":
        return [node.expr] + ([node.param] if node.param is not None else [])
    if name == "Call":
        return list(node.args)
    if name == "MatrixSelector":
        return [node.vector_selector]
    if name in ("ParenExpr", "UnaryExpr", "SubqueryExpr"):
        return [node.expr]
    return []


def walk(node: Any, parents: tuple[Any, ...] = ()) -> Iterator[tuple[Any, tuple[Any, ...]]]:
    """Every node with its ancestors (nearest last), depth first."""
    yield node, parents
    for child in _children(node):
        yield from walk(child, (*parents, node))


@dataclass(frozen=True)
class _Target:
    panel: str
    panel_type: str
    index: int
    expr: str


def panels(dashboard: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Every panel, rows' nested panels included (rows themselves too)."""
    for p in dashboard.get("panels", []):
        yield p
        yield from p.get("panels", [])


def _targets(dashboard: Mapping[str, Any]) -> Iterator[_Target]:
    for p in panels(dashboard):
        for i, t in enumerate(p.get("targets", [])):
            if "expr" in t:
                yield _Target(p.get("title", ""), p["type"], i, t["expr"])
    for a in dashboard.get("annotations", {}).get("list", []):
        if "expr" in a:
            yield _Target(f"annotation: {a['name']}", "annotation", 0, a["expr"])


def lint(
    dashboard: Mapping[str, Any],
    *,
    filter_variables: Sequence[str],
    range_total_panels: Sequence[str] = (),
) -> list[Problem]:
    """Every problem the rule table finds; range_total_panels are stat panels allowed increase(...[$__range])."""
    title = str(dashboard.get("title", ""))
    out: list[Problem] = []
    out += _dashboard_rules(dashboard, title)
    out += _template_rules(dashboard, title, filter_variables)
    out += _panel_rules(dashboard, title)
    out += _target_rules(dashboard, title, filter_variables, set(range_total_panels))
    return out


def _dashboard_rules(dashboard: Mapping[str, Any], title: str) -> list[Problem]:
    if dashboard.get("editable") is not False:
        return [Problem("uneditable-dashboard", "editable must be false", title)]
    return []


def _variables(dashboard: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(dashboard.get("templating", {}).get("list", []))


def _template_rules(dashboard: Mapping[str, Any], title: str, filter_variables: Sequence[str]) -> list[Problem]:
    out: list[Problem] = []
    variables = {v.get("name"): v for v in _variables(dashboard)}
    ds = variables.get("datasource")
    if ds is None or ds.get("type") != "datasource":
        out.append(Problem("template-datasource-rule", "no datasource variable named datasource", title))
    else:
        if ds.get("label") != "Data source":
            out.append(Problem("template-datasource-rule", "label should be 'Data source'", title, check="label"))
        if ds.get("query") != "prometheus":
            out.append(Problem("template-datasource-rule", "query should be prometheus", title, check="query"))
    for name in filter_variables:
        rule = f"template-{name}-rule"
        v = variables.get(name)
        if v is None:
            out.append(Problem(rule, f"no {name} variable", title))
            continue
        checks = {
            "label": bool(v.get("label")),  # the tool wants Job/Instance; for our names any label will do
            "datasource": (v.get("datasource") or {}).get("uid") in TEMPLATED_DATASOURCES,
            "type": v.get("type") == "query",
            "multi": v.get("multi") is True,
            "includeAll": v.get("includeAll") is True,
            "allValue": v.get("allValue") == ".+",
        }
        out += [
            Problem(rule, f"{name}: {check} is wrong", title, check=check) for check, ok in checks.items() if not ok
        ]
    values = lint_values([str(v.get("name")) for v in _variables(dashboard)])
    for v in _variables(dashboard):
        if v.get("type") != "query":
            continue
        if v.get("refresh") != 2:
            out.append(Problem("template-on-time-change-reload-rule", f"{v.get('name')}: refresh must be 2", title))
        out += _variable_query_problems(v, values, title)
    return out


def _variable_query_problems(v: Mapping[str, Any], values: Mapping[str, str], title: str) -> list[Problem]:
    rule = "template-label-promql-rule"
    query = v.get("query")
    query = query.get("query", "") if isinstance(query, Mapping) else str(query or "")
    m = _VARIABLE_QUERY_RE.match(query)
    if m is None:
        return [Problem(rule, f"{v.get('name')}: not label_values/label_names/metrics/query_result: {query}", title)]
    func, inner = m.groups()
    if func == "metrics":
        return []
    expr = inner.rsplit(",", 1)[0] if func == "label_values" and "," in inner else inner
    if func in ("label_values", "label_names") and not expr.strip():
        return []
    try:
        parse(expr, values)
    except ValueError as exc:
        return [Problem(rule, f"{v.get('name')}: invalid PromQL {expr!r}: {exc}", title)]
    return []


def _panel_rules(dashboard: Mapping[str, Any], title: str) -> list[Problem]:
    out: list[Problem] = []
    for p in panels(dashboard):
        kind, name = p.get("type"), p.get("title")
        if kind == "row":
            continue
        # Our rule on top of the linter's: a title and a description on every non-row panel, text panels included.
        if not p.get("title") or not p.get("description"):
            out.append(Problem("panel-title-description-rule", "missing title or description", title, name))
        if kind in DATASOURCE_PANELS:
            sources = [p.get("datasource") or {}] + [t.get("datasource") or {} for t in p.get("targets", [])]
            if any(s.get("uid") not in TEMPLATED_DATASOURCES for s in sources):
                out.append(Problem("panel-datasource-rule", "panel or target not on ${datasource}", title, name))
        if kind not in DATA_PANELS:
            continue
        defaults = p.get("fieldConfig", {}).get("defaults", {})
        if not defaults.get("mappings") and defaults.get("unit") not in KNOWN_UNITS:
            out.append(Problem("panel-units-rule", f"unknown or missing unit {defaults.get('unit')!r}", title, name))
        if not p.get("targets"):
            out.append(Problem("panel-no-targets-rule", "no targets", title, name))
    return out


def _target_rules(
    dashboard: Mapping[str, Any], title: str, filter_variables: Sequence[str], range_total_panels: set[str]
) -> list[Problem]:
    out: list[Problem] = []
    values = lint_values([str(v.get("name")) for v in _variables(dashboard)])
    for t in _targets(dashboard):
        at = {"dashboard": title, "panel": t.panel, "target_idx": t.index}
        try:
            ast = parse(t.expr, values)
        except ValueError as exc:
            out.append(Problem("target-promql-rule", f"invalid PromQL: {exc}", **at))
            continue
        range_ok = t.panel_type == "stat" and t.panel in range_total_panels
        for node, parents in walk(ast):
            kind = type(node).__name__
            if kind == "MatrixSelector" and parents and type(parents[-1]).__name__ == "Call":
                func = parents[-1].func.name
                allowed = {RATE_INTERVAL_SENTINEL} | ({RANGE_SENTINEL} if range_ok and func == "increase" else set())
                if func in COUNTER_FUNCTIONS and node.range not in allowed:
                    out.append(Problem("target-rate-interval-rule", f"{func}() range is not $__rate_interval", **at))
            if kind != "VectorSelector":
                continue
            metric = node.name or ""
            matchers = {(m.name, str(m.op), m.value) for m in node.matchers.matchers}
            for name in filter_variables:
                if (name, str(promql_parser.MatchOp.Re), sentinel(name)) not in matchers:
                    msg = f'{metric}: no {name}=~"${name}"'
                    out.append(Problem(f"target-{name}-rule", msg, metric=metric, **at))
            if metric.endswith("_total") and not _counter_in_function(parents):
                out.append(Problem("target-counter-agg-rule", f"{metric} outside rate/irate/increase", metric=metric,
                                   **at))  # fmt: skip
    return out


def _counter_in_function(parents: tuple[Any, ...]) -> bool:
    return (
        len(parents) >= 2
        and type(parents[-1]).__name__ == "MatrixSelector"
        and type(parents[-2]).__name__ == "Call"
        and parents[-2].func.name in COUNTER_FUNCTIONS
    )


# Exclusions ---------------------------------------------------------------------------------------------------

_ENTRY_KEYS = {"dashboard", "panel", "targetIdx", "metric", "check"}


def load_exclusions(path: str | Path) -> dict[str, Any]:
    """The `exclusions` mapping of a .lint file; every rule needs a reason and entries use known keys."""
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    exclusions = data.get("exclusions") or {}
    for rule, spec in exclusions.items():
        if not isinstance(spec, Mapping) or not str(spec.get("reason", "")).strip():
            raise ValueError(f"{path}: exclusion of {rule} has no reason")
        for entry in spec.get("entries") or []:
            unknown = set(entry) - _ENTRY_KEYS
            if unknown:
                raise ValueError(f"{path}: {rule}: unknown entry keys {sorted(unknown)}")
    return dict(exclusions)


def _matches(entry: Mapping[str, Any], p: Problem) -> bool:
    checks = [
        ("dashboard", lambda v: p.dashboard == v),
        ("panel", lambda v: p.panel == v),
        ("targetIdx", lambda v: p.target_idx == v),
        ("metric", lambda v: p.metric is not None and re.fullmatch(v, p.metric) is not None),
        ("check", lambda v: p.check == v),
    ]
    return all(test(entry[key]) for key, test in checks if key in entry)


def apply_exclusions(
    problems: Sequence[Problem], exclusions: Mapping[str, Any]
) -> tuple[list[Problem], list[tuple[str, Mapping[str, Any]]]]:
    """(the problems no exclusion covers, the exclusion entries that covered nothing: stale ones)."""
    used: set[tuple[str, int]] = set()
    remaining = []
    for p in problems:
        spec = exclusions.get(p.rule)
        if spec is None:
            remaining.append(p)
            continue
        entries = spec.get("entries")
        if not entries:
            used.add((p.rule, -1))
            continue
        hit = [i for i, e in enumerate(entries) if _matches(e, p)]
        used.update((p.rule, i) for i in hit)
        if not hit:
            remaining.append(p)
    stale: list[tuple[str, Mapping[str, Any]]] = []
    for rule, spec in exclusions.items():
        entries = spec.get("entries") or []
        if not entries and (rule, -1) not in used:
            stale.append((rule, {}))
        stale += [(rule, e) for i, e in enumerate(entries) if (rule, i) not in used]
    return remaining, stale
