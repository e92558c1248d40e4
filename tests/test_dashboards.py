"""The generated Grafana dashboards: schema, the dashboard-linter rules, PromQL, conventions, catalog-derived parts.

Static and offline: the committed dashboards/*.json are validated against the vendored Grafana schema
(tests/schemas/dashboard.jsonschema.json) and linted by tests/support/dashboard_lint.py with the exclusions in
dashboards/.lint; each lint rule is also shown to catch a dashboard broken on purpose. The end-to-end test
against a real Prometheus is test_dashboards_e2e.py.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import jsonschema
import pytest
import yaml

from sglang_oom_exporter.catalog import load_catalog
from sglang_oom_exporter.render import render_all
from sglang_oom_exporter.render.dashboards import OVERVIEW_PATH, overview
from sglang_oom_exporter.render.options import (
    DASHBOARD_URL_VARIABLES,
    OVERVIEW_DASHBOARD_UID,
    RenderOptions,
    runbook_kind_url,
)
from tests.support.dashboard_lint import apply_exclusions, interpolate, lint, load_exclusions, panels, parse

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((ROOT / "tests" / "schemas" / "dashboard.jsonschema.json").read_text())
LINT_FILE = ROOT / "dashboards" / ".lint"
DASHBOARD_FILES = sorted((ROOT / "dashboards").glob("*.json"))
RULES = "alerts/sglang-oom.rules.yaml"
FATAL_PANEL = "Fatal OOMs in the picked range, by kind"
# Grafana's substitution for "All" on every filter variable, and the intervals of a 15s-scrape data source.
GRAFANA_ALL = {"cluster": ".*", "namespace": ".*", "pod": ".*", "source": ".*", "kind": ".*",
               "__rate_interval": "1m", "__range": "21600s", "__interval": "15s"}  # fmt: skip


def _load(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text(encoding="utf-8")))


@pytest.fixture(scope="module")
def dash() -> dict[str, Any]:
    return _load(ROOT / OVERVIEW_PATH)


@functools.cache
def _exclusions() -> dict[str, Any]:
    """dashboards/.lint, read once for the twenty-odd lints below (each gets its own copy)."""
    return load_exclusions(LINT_FILE)


@functools.cache
def _rendered() -> Mapping[str, str]:
    """Every generated file of the built-in catalog with the default options, rendered once per process
    (read-only, as the tests share it)."""
    return MappingProxyType(render_all(load_catalog()))


def _lint(d: dict[str, Any]) -> tuple[list[Any], list[Any]]:
    problems = lint(d, filter_variables=DASHBOARD_URL_VARIABLES, range_total_panels=[FATAL_PANEL])
    return apply_exclusions(problems, copy.deepcopy(_exclusions()))


def _panel(d: dict[str, Any], title: str) -> dict[str, Any]:
    (found,) = [p for p in panels(d) if p.get("title") == title]
    return dict(found)


def _exprs(d: dict[str, Any]) -> Iterator[str]:
    for p in panels(d):
        for t in p.get("targets", []):
            yield t["expr"]
    for a in d["annotations"]["list"]:
        yield a["expr"]


def _walk_json(node: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for k, v in node.items():
            yield k, v
            yield from _walk_json(v, k)
    elif isinstance(node, list):
        for v in node:
            yield from _walk_json(v, key)


# What exists and is current ----------------------------------------------------------------------------------


def test_the_overview_is_the_only_dashboard_and_it_is_current():
    files = {k: v for k, v in _rendered().items() if k.startswith("dashboards/")}
    assert list(files) == [OVERVIEW_PATH]
    assert [p.relative_to(ROOT).as_posix() for p in DASHBOARD_FILES] == [OVERVIEW_PATH]
    assert (ROOT / OVERVIEW_PATH).read_text(encoding="utf-8") == files[OVERVIEW_PATH], "run: render"
    assert len(files[OVERVIEW_PATH].encode()) < 256 * 1024  # client-side apply's last-applied annotation


# Schema -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.name)
def test_every_dashboard_validates_against_the_grafana_schema(path):
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    errors = list(jsonschema.Draft7Validator(SCHEMA).iter_errors(_load(path)))
    assert errors == [], [e.message[:200] for e in errors]


@pytest.mark.parametrize(
    "breakage",
    [
        lambda d: d.pop("schemaVersion"),
        lambda d: d["panels"][0].update(colour="red"),
        lambda d: d["templating"]["list"][1].update(refresh=5),
        lambda d: d["panels"][0]["gridPos"].pop("h"),
    ],
    ids=["no schemaVersion", "unknown panel key", "refresh out of range", "gridPos without h"],
)
def test_the_schema_rejects_a_broken_dashboard(dash, breakage):
    broken = copy.deepcopy(dash)
    breakage(broken)
    assert list(jsonschema.Draft7Validator(SCHEMA).iter_errors(broken)), "the schema check has teeth"


# Lint ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.name)
def test_lint_passes_with_the_exclusions_and_none_is_stale(path):
    remaining, stale = _lint(_load(path))
    assert [str(p) for p in remaining] == []
    assert stale == [], "an exclusion that excludes nothing must go"


def test_every_exclusion_has_a_reason():
    exclusions = load_exclusions(LINT_FILE)
    assert set(exclusions) == {
        "template-namespace-rule", "template-pod-rule", "template-source-rule", "template-kind-rule",
        "template-cluster-rule",
        "target-kind-rule", "target-namespace-rule", "target-pod-rule", "target-source-rule",
        "target-counter-agg-rule",
    }  # fmt: skip
    assert all(len(spec["reason"].split()) >= 15 for spec in exclusions.values())


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("exclusions:\n  panel-units-rule:\n    entries: [{panel: x}]\n", "has no reason"),
        ("exclusions:\n  panel-units-rule:\n    reason: r\n    entries: [{panle: x}]\n", "unknown entry keys"),
    ],
)
def test_an_exclusion_without_reason_or_with_a_misspelt_key_is_refused(tmp_path, text, error):
    path = tmp_path / ".lint"
    path.write_text(text)
    with pytest.raises(ValueError, match=error):
        load_exclusions(path)


def test_interpolate_knows_grafanas_three_variable_syntaxes():
    values = {"pod": "a|b", "__rate_interval": "1m"}
    assert interpolate('x{pod=~"$pod"}[$__rate_interval] ${pod} [[pod]] $other', values) == (
        'x{pod=~"a|b"}[1m] a|b a|b $other'
    )


def _variable(d: dict[str, Any], name: str) -> dict[str, Any]:
    (v,) = [v for v in d["templating"]["list"] if v["name"] == name]
    return dict(v)


def _set_expr(title: str, old: str, new: str) -> Callable[[dict[str, Any]], None]:
    def mutate(d: dict[str, Any]) -> None:
        target = _panel_ref(d, title)["targets"][0]
        assert old in target["expr"], (old, target["expr"])
        target["expr"] = target["expr"].replace(old, new)

    return mutate


def _panel_ref(d: dict[str, Any], title: str) -> dict[str, Any]:
    (found,) = [p for p in panels(d) if p.get("title") == title]
    return found  # type: ignore[no-any-return]


BY_KIND = "OOM events by kind"
BREAKAGES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "template-datasource-rule": lambda d: d["templating"]["list"].pop(0),
    "template-namespace-rule": lambda d: _variable_ref(d, "namespace").update(multi=False),
    "template-pod-rule": lambda d: _variable_ref(d, "pod").update(type="custom"),
    "template-source-rule": lambda d: _variable_ref(d, "source").update(datasource={"uid": "P1809F7CD0C75ACF3"}),
    "template-kind-rule": lambda d: _variable_ref(d, "kind").update(includeAll=False),
    "template-label-promql-rule": lambda d: _variable_ref(d, "kind").update(query="label_values(x{, kind)"),
    "template-on-time-change-reload-rule": lambda d: _variable_ref(d, "pod").update(refresh=1),
    "panel-datasource-rule": lambda d: _panel_ref(d, BY_KIND)["targets"][0].update(datasource={"uid": "abc"}),
    "panel-title-description-rule": lambda d: _panel_ref(d, "Bytes behind").pop("description"),
    "panel-units-rule": lambda d: _panel_ref(d, "Bytes behind")["fieldConfig"]["defaults"].update(unit="furlongs"),
    "panel-no-targets-rule": lambda d: _panel_ref(d, "Pending events").update(targets=[]),
    "target-promql-rule": _set_expr(BY_KIND, "[$__rate_interval]))", "[$__rate_interval]"),
    "target-rate-interval-rule": _set_expr(BY_KIND, "[$__rate_interval]", "[5m]"),
    "target-namespace-rule": _set_expr(BY_KIND, 'namespace=~"$namespace",', ""),
    "target-pod-rule": _set_expr(BY_KIND, 'pod=~"$pod"', 'pod=~".*"'),
    "target-source-rule": _set_expr(BY_KIND, 'source=~"$source"', 'source!="x"'),
    "target-kind-rule": _set_expr(BY_KIND, 'kind=~"$kind",', ""),
    "target-counter-agg-rule": _set_expr(BY_KIND, "increase(", "sum_over_time("),
    "uneditable-dashboard": lambda d: d.update(editable=True),
}


def _variable_ref(d: dict[str, Any], name: str) -> dict[str, Any]:
    (v,) = [v for v in d["templating"]["list"] if v["name"] == name]
    return v  # type: ignore[no-any-return]


@pytest.mark.parametrize("rule", sorted(BREAKAGES))
def test_each_lint_rule_catches_a_broken_dashboard(dash, rule):
    broken = copy.deepcopy(dash)
    BREAKAGES[rule](broken)
    remaining, _ = _lint(broken)
    assert rule in {p.rule for p in remaining}, [str(p) for p in remaining]


def test_range_totals_are_allowed_only_in_the_allow_listed_stat(dash):
    broken = copy.deepcopy(dash)
    _set_expr(BY_KIND, "[$__rate_interval]", "[$__range]")(broken)
    remaining, _ = _lint(broken)
    assert [(p.rule, p.panel) for p in remaining] == [("target-rate-interval-rule", BY_KIND)]
    problems = lint(dash, filter_variables=DASHBOARD_URL_VARIABLES)  # the fatal stat itself, not allow-listed
    assert {(p.rule, p.panel) for p in problems if p.rule == "target-rate-interval-rule"} == {
        ("target-rate-interval-rule", FATAL_PANEL)
    }


def test_exclusions_stay_narrow(dash):
    """The allValue exclusion hides only that check; the metric exclusions only metrics without the label."""
    broken = copy.deepcopy(dash)
    _variable_ref(broken, "namespace")["allValue"] = ".+"
    _set_expr("Files followed", "sglang_oom_exporter_files_watched", "sglang_oom_events_total")(broken)
    remaining, stale = _lint(broken)
    assert {p.rule for p in remaining} == {"target-counter-agg-rule", "target-pod-rule", "target-source-rule",
                                           "target-namespace-rule", "target-kind-rule"}  # fmt: skip
    assert ("template-namespace-rule", {"check": "allValue"}) in stale


# PromQL -------------------------------------------------------------------------------------------------------


def test_every_expression_parses_with_grafanas_all_values(dash):
    exprs = list(_exprs(dash))
    assert len(exprs) == 51  # 50 panel targets and the annotation
    for expr in exprs:
        # label_replace's "$1" is a regex group, not a variable: Grafana leaves a name it does not know as is
        concrete = interpolate(expr, GRAFANA_ALL).replace('"$1"', "")
        assert "$" not in concrete, concrete
        parse(expr, GRAFANA_ALL)
    for v in dash["templating"]["list"][1:]:
        inner = re.fullmatch(r"label_values\((.*), (\w+)\)", v["query"])
        assert inner is not None, v["query"]
        assert inner.group(2) == v["name"], v["query"]
        parse(inner.group(1), GRAFANA_ALL)


def test_every_counter_window_is_the_rate_interval_except_the_range_total(dash):
    windows = re.compile(r"\[([^\]]+)\]")
    for p in panels(dash):
        for t in p.get("targets", []):
            found = set(windows.findall(t["expr"]))
            assert found <= ({"$__range"} if p["title"] == FATAL_PANEL else {"$__rate_interval"}), (p["title"], found)


# Conventions --------------------------------------------------------------------------------------------------


def test_dashboard_conventions(dash):
    assert dash["uid"] == OVERVIEW_DASHBOARD_UID
    assert len(dash["uid"]) <= 40
    assert dash["schemaVersion"] == 41
    assert dash["editable"] is False
    assert not {"id", "__inputs", "__requires"} & set(dash)
    ids = [p["id"] for p in panels(dash)]
    assert len(ids) == len(set(ids)) == 40
    datasources = [v for k, v in _walk_json(dash) if k == "datasource"]
    assert datasources
    assert all(ds == {"type": "prometheus", "uid": "${datasource}"} for ds in datasources)
    for p in panels(dash):
        if p["type"] == "row":
            continue
        assert p["title"]
        assert len(p["description"]) > 60, p["title"]
        refs = [t["refId"] for t in p.get("targets", [])]
        assert len(refs) == len(set(refs)), p["title"]
        assert all(refs), p["title"]
        if p["type"] != "text":
            assert p["fieldConfig"]["defaults"]["unit"], p["title"]
            assert p["targets"], p["title"]


def test_variables_are_datasource_plus_the_dashboard_url_ones(dash):
    variables = dash["templating"]["list"]
    assert [v["name"] for v in variables] == ["datasource", *DASHBOARD_URL_VARIABLES]
    assert (variables[0]["type"], variables[0]["label"], variables[0]["query"]) == ("datasource", "Data source",
                                                                                  "prometheus")  # fmt: skip
    for v in variables[1:]:
        assert (v["type"], v["multi"], v["includeAll"], v["refresh"], v["allValue"]) == ("query", True, True, 2, ".*")
        if v["name"] == "cluster":  # every exporter reports it, with or without an OOM
            assert v["query"] == "label_values(sglang_oom_exporter_files_watched, cluster)"
        else:  # the other filters offer the selected clusters' values only
            assert v["query"].startswith('label_values(sglang_oom_events_total{cluster=~"$cluster"'), v["query"]


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.name)
def test_docs_name_every_variable_the_dashboards_define(path):
    text = (ROOT / "docs" / "dashboards.md").read_text()
    paragraph = text.split("\nVariables: ", 1)[1].split("\n\n", 1)[0]
    named = set(re.findall(r"`(\w+)`", paragraph.split(" (", 1)[0]))  # the list, before its parenthesis
    assert named == {v["name"] for v in _load(path)["templating"]["list"]}


def test_every_selector_filters_by_the_variables_or_is_scoped_to_their_exporters(dash):
    """A series without source labels is kept to the exporters that follow the selected sources."""
    for expr in _exprs(dash):
        if "sglang_oom_target_" in expr or "sglang_oom_exporter_files_watched" in expr:
            assert (
                "and on (cluster, job, instance) group by (cluster, job, instance) (sglang_oom_exporter_file_lag_bytes{"
                in expr
            )


def test_every_aggregation_keeps_the_cluster_and_every_selector_filters_on_it(dash):
    """Two clusters with the same namespace and pod names never add up, whatever the cluster variable says."""
    aggregations = 0
    for expr in _exprs(dash):
        for m in re.finditer(r"\b(sum|max|min|count|avg)\b\s*(by\s*\(([^)]*)\))?\s*\(", expr):
            assert m.group(3) is not None, (m.group(0), expr)
            assert m.group(3).split(", ")[0] == "cluster", (m.group(0), expr)
            aggregations += 1
        for m in re.finditer(r"\bon\s*\(([^)]*)\)", expr):
            assert m.group(1).split(", ")[0] == "cluster", expr
        for m in re.finditer(r"\b(sglang_oom_[a-z_]+)(\{[^}]*\})?", expr):
            assert m.group(2), (m.group(1), expr)
            assert 'cluster=~"$cluster"' in m.group(2), (m.group(1), expr)
    # every aggregation of the overview (a new panel or query adds its own); multi-node groups added 4 to the
    # fatal tile: per pod, per group member, per group and the group map (docs/multi-node.md); the start-up GPU
    # memory split added 4 (left, weights, graphs, KV pool), the HiCache panel 4 (host pool, three rates); SGLang
    # 0.5.23 added 4 to the HiCache panel (host mamba pool, three rates) and the two PD decode panels 3 and 4
    assert aggregations == 49


def test_layout_fits_the_grid_without_overlaps(dash):
    cells: set[tuple[int, int]] = set()
    for p in panels(dash):
        pos = p["gridPos"]
        assert 0 <= pos["x"] < pos["x"] + pos["w"] <= 24, p.get("title")
        mine = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not cells & mine, p.get("title")
        cells |= mine


def test_oom_events_are_overlaid_on_every_time_series_panel(dash):
    (annotation,) = dash["annotations"]["list"]
    assert annotation["filter"]["ids"] == [p["id"] for p in panels(dash) if p["type"] == "timeseries"]
    assert "sglang_oom_events_total" in annotation["expr"]
    assert annotation["titleFormat"] == "{{kind}} OOM"


# Derived from the catalog -------------------------------------------------------------------------------------


def test_one_remediation_panel_per_catalog_kind_linking_to_its_runbook_anchor(dash):
    catalog = load_catalog()
    texts = [p for p in panels(dash) if p["type"] == "text"]
    assert [p["title"] for p in texts] == list(catalog.ids)
    for kind, p in zip(catalog.kinds, texts, strict=True):
        url = runbook_kind_url(RenderOptions(), kind.id)
        assert p["options"]["mode"] == "markdown"
        assert [link["url"] for link in p["links"]] == [url]
        content = p["options"]["content"]
        assert kind.summary in content
        assert f"]({url})" in content
        assert all(f"`{step.flag}`" in content for step in kind.steps)


def test_data_links_point_at_the_kind_anchor(dash):
    base = RenderOptions().runbook_base_url
    field_link = f"{base}/README.md#${{__field.labels.kind}}"
    row_link = f"{base}/README.md#${{__data.fields.kind}}"
    for title, url in [(FATAL_PANEL, field_link), (BY_KIND, field_link),
                       ("What to change: suggested SGLang flag values", row_link),
                       ("Last event: requested vs available tokens", row_link)]:  # fmt: skip
        assert [link["url"] for link in _panel(dash, title)["fieldConfig"]["defaults"]["links"]] == [url]
    assert [link["url"] for link in dash["links"]] == [f"{base}/README.md"]


def test_a_smaller_catalog_gives_a_smaller_dashboard():
    """Nothing kind-specific is hard-coded: the fatal kinds and the text panels follow the catalog."""
    catalog = load_catalog()
    small = replace(catalog, kinds=catalog.kinds[:2])
    d = overview(small, RenderOptions(runbook_base_url="https://runbooks.example/x"))
    assert [p["title"] for p in panels(d) if p["type"] == "text"] == list(small.ids)
    fatal_expr = _panel(d, FATAL_PANEL)["targets"][0]["expr"]
    assert f'kind=~"{small.ids[0]}|{small.ids[1]}"' in fatal_expr
    urls = [v for k, v in _walk_json(d) if k == "url"]
    assert urls
    assert all(u.startswith("https://runbooks.example/x/README.md") for u in urls)


def test_no_kind_id_is_written_in_the_renderer():
    sources = [ROOT / "exporter" / "render" / name for name in ("dashboards.py", "overview_panels.py", "grafana.py")]
    text = "\n".join(p.read_text() for p in sources)
    for kind_id in load_catalog().ids:
        assert not re.search(rf"[\"'|]{kind_id}[\"'|]", text), kind_id


# Contracts with the other rendered files ----------------------------------------------------------------------


def test_every_runbook_link_lands_on_an_anchor_of_the_rendered_runbook_index(dash):
    index = _rendered()["docs/runbooks/README.md"]
    anchors = {
        re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", index, re.M)
    }
    anchors |= set(re.findall(r'<a id="([^"]+)"', index))
    urls = [v for k, v in _walk_json(dash) if k == "url"]
    fragments = {u.partition("#")[2] for u in urls if "#" in u}
    templated = {f for f in fragments if f.startswith("${")}
    assert templated == {"${__field.labels.kind}", "${__data.fields.kind}"}
    assert fragments - templated == set(load_catalog().ids)
    assert set(load_catalog().ids) <= anchors, "every kind id (what the templated links expand to) is an anchor"


def test_alerts_dashboard_urls_open_this_dashboard_with_its_variables(dash):
    rules = yaml.safe_load(render_all(load_catalog(), RenderOptions(grafana_url="https://grafana.example"))[RULES])
    urls = [r["annotations"]["dashboard_url"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert len(urls) >= len(load_catalog().kinds)
    variables = {v["name"] for v in dash["templating"]["list"]}
    for url in urls:
        assert url.startswith(f"https://grafana.example/d/{dash['uid']}?"), url
        names = set(re.findall(r"var-(\w+)=", url))
        assert names, url
        assert names <= variables, url


# What the tables show, and what the texts promise -------------------------------------------------------------


def _merged_columns(table: dict[str, Any], labels: Mapping[str, str]) -> list[str]:
    """The columns Grafana shows for a merged row with these labels: the include filter, the order, the renames."""
    steps = {t["id"]: t["options"] for t in table["transformations"]}
    kept = [name for name in ["Time", *labels, "Value #A", "Value #B", "Value #C"]
            if name in steps["filterFieldsByName"]["include"]["names"]]  # fmt: skip
    kept.sort(key=steps["organize"]["indexByName"].__getitem__)
    return [steps["organize"]["renameByName"].get(name, name) for name in kept]


def test_tables_show_their_own_columns_and_never_the_operators_labels(dash):
    tables = [p for p in panels(dash) if p.get("type") == "table"]
    assert len(tables) == 3
    # A series as a Prometheus Operator ServiceMonitor scrape labels it, in Kubernetes node mode.
    series = {"__name__": "x", "job": "sglang-oom-exporter", "instance": "10.0.0.7:9817", "endpoint": "http",
              "service": "sglang-oom-exporter", "prometheus": "monitoring/k8s", "prometheus_replica": "prometheus-0",
              "namespace": "llm", "pod": "sglang-0", "container": "sglang", "kind": "decode",
              "flag": "max-running-requests"}  # fmt: skip
    what, last, words = tables
    info = {**series, "limiting_pool": "mamba", "detail": "The last one ...", "advice": "Suggested: ..."}
    info.pop("flag")
    assert _merged_columns(words, info) == ["kind", "limiting pool", "detail", "advice", "namespace", "pod",
                                            "container"]  # fmt: skip
    assert _merged_columns(what, series) == ["kind", "flag", "current", "suggested", "namespace", "pod", "container"]
    assert _merged_columns(last, series) == [
        "kind",
        "requested tokens",
        "available tokens",
        "seconds ago",
        "namespace",
        "pod",
        "container",
    ]


def test_the_what_to_change_text_does_not_claim_it_needs_an_sglang_url(dash):
    (what,) = [p for p in panels(dash) if p.get("title") == "What to change: suggested SGLang flag values"]
    assert "Needs --sglang-url" not in what["description"]
    assert "show without any SGLang endpoint" in what["description"]
    context = [p for p in panels(dash) if p.get("type") == "timeseries" and "sglang_oom_target_" in json.dumps(p)]
    needs = [p["title"] for p in context if "Needs an SGLang endpoint the exporter scrapes" in p["description"]]
    assert needs == ["KV cache token usage", "KV tokens: used vs pool", "Running and queued requests",
                     "Aborted requests", "GPU memory split at start-up", "HiCache host pool and eviction",
                     "PD decode: KV pool held for transfers", "PD decode: transfer queues"]  # fmt: skip
