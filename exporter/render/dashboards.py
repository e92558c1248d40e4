"""Render the Grafana overview dashboard (dashboards/sglang-oom-overview.json) from the catalog.

A renderer of render_all: catalog + options -> one JSON file. The dashboard answers, top to bottom, what the
on-call needs right after a page: how many fatal OOMs of which kind (top row), which flag to change and to what
(the suggestion table), when and where the events happened, the KV pressure that led to them (the mirrored
`sglang_oom_target_*` series with the events as annotations), the catalog's remediation per kind, and whether
the exporter itself is healthy. Metric names are those of metrics.py; every kind-specific piece (the fatal
kinds, the remediation panels, the runbook anchors) is derived from the catalog, so no kind id is written here.
Grafana's JSON model lives in grafana.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from ..catalog import Catalog
from ..metrics.groups import GROUP_INFO
from . import grafana as g
from .options import (
    DASHBOARD_URL_VARIABLES,
    GENERATED_NOTE,
    OVERVIEW_DASHBOARD_UID,
    RenderOptions,
    runbook_kind_url,
)
from .overview_panels import (
    ALL_VALUE,
    BY_SOURCE,
    CLUSTER,
    CLUSTERED,
    IN_CLUSTER,
    SOURCE_LEGEND,
    context_panels,
    health_panels,
    remediation_panel,
    scoped,
    sel,
)
from .promql import Scope, indent, per_group, relabel_cluster

OVERVIEW_PATH = f"dashboards/{OVERVIEW_DASHBOARD_UID}.json"
OVERVIEW_TITLE = "SGLang OOM overview"
SOURCE_COLUMNS = ["namespace", "pod", "container", "source"]  # the source labels a table shows, after its own


def render_dashboards(catalog: Catalog, options: RenderOptions, _files: Mapping[str, str]) -> dict[str, str]:
    """The renderer: the overview dashboard as pretty-printed JSON."""
    text = json.dumps(overview(catalog, options), indent=2, ensure_ascii=False) + "\n"
    return {OVERVIEW_PATH: relabel_cluster(text, Scope.of(catalog.alert_pack).cluster)}


def overview(catalog: Catalog, options: RenderOptions) -> g.Json:
    """The overview dashboard as a dict."""
    kind_link = runbook_kind_url(options, "${__field.labels.kind}")
    row_link = runbook_kind_url(options, "${__data.fields.kind}")
    index = runbook_kind_url(options, "").removesuffix("#")  # the index page itself
    panels = g.layout(
        [
            (None, _top_row(catalog, kind_link, index)),
            (g.row("What to change"), _what_to_change(row_link, index)),
            (g.row("Events"), _events(kind_link)),
            (g.row("Context: KV-cache pressure on the SGLang endpoints"), context_panels()),
            (g.row("Remediation by kind (from the OOM catalog)"), [(remediation_panel(k, options), 8, 9)
                                                                  for k in catalog.kinds]),
            (g.row("Exporter health"), health_panels()),
        ]
    )  # fmt: skip
    overlaid = [p["id"] for p in panels if p["type"] == "timeseries"]
    return {
        "uid": OVERVIEW_DASHBOARD_UID,
        "title": OVERVIEW_TITLE,
        "description": "SGLang KV-cache OOM events from sglang-oom-exporter: what happened, how bad, which flag "
        f"to change. {GENERATED_NOTE}",
        "tags": ["sglang", "oom", "sglang-oom-exporter"],
        "editable": False,
        "schemaVersion": 41,
        "graphTooltip": 1,
        "timezone": "browser",
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "1m",
        "links": [g.link("Runbooks", index, "The runbook index: one section per OOM kind, one page per alert")],
        "annotations": {"list": [_annotation(overlaid)]},
        "templating": {"list": _variables()},
        "panels": panels,
    }


def _variables() -> list[g.Json]:
    """datasource, then the filters an alert's dashboard_url sets (DASHBOARD_URL_VARIABLES)."""
    specs = {
        "cluster": ("Cluster", f"label_values(sglang_oom_exporter_files_watched, {CLUSTERED.cluster})",
                    "The cluster label of the series (a Thanos, Mimir or Cortex external label); All where the "
                    "series carry none, so a single Prometheus works as it is."),
        "namespace": ("Namespace", f"label_values(sglang_oom_events_total{{{CLUSTER}}}, namespace)",
                      "Kubernetes namespace of the SGLang pod (empty for plain log files)."),
        "pod": ("Pod", f'label_values(sglang_oom_events_total{{{CLUSTER},namespace=~"$namespace"}}, pod)',
                "SGLang pod (empty for plain log files)."),
        "source": ("Source", f"label_values(sglang_oom_events_total{{{CLUSTER}}}, source)",
                   "Log source name for plain files (empty in Kubernetes mode)."),
        "kind": ("OOM kind", f"label_values(sglang_oom_events_total{{{CLUSTER}}}, kind)",
                 "OOM kind id from the catalog."),
    }  # fmt: skip
    if set(specs) != set(DASHBOARD_URL_VARIABLES):  # alerts' dashboard_url sets exactly these
        raise ValueError(f"dashboard variables {sorted(specs)} != {sorted(DASHBOARD_URL_VARIABLES)}")
    out = [g.datasource_variable()]
    for name in DASHBOARD_URL_VARIABLES:
        label, query, description = specs[name]
        out.append(g.query_variable(name, label, query, description, all_value=ALL_VALUE))
    return out


def _annotation(panel_ids: list[int]) -> g.Json:
    """OOM events overlaid on the time series panels, one mark per kind and source."""
    return {
        "name": "OOM events",
        "datasource": g.DATASOURCE,
        "enable": True,
        "hide": False,
        "iconColor": "red",
        "expr": f"sum by ({BY_SOURCE}, kind) (increase({sel('sglang_oom_events_total')}[$__rate_interval])) > 0",
        "titleFormat": "{{kind}} OOM",
        "textFormat": SOURCE_LEGEND,
        "tagKeys": "kind",
        "useValueForTime": False,
        "filter": {"exclude": False, "ids": panel_ids},
    }


def _fatal_kinds(catalog: Catalog) -> str:
    """A matcher for the kinds that can be fatal (every kind whose catalog `fatal` is not false)."""
    return 'kind=~"' + "|".join(k.id for k in catalog.kinds if k.fatal != "false") + '"'


def fatal_in_range_expr(catalog: Catalog) -> str:
    """Fatal OOMs in the picked range per kind, counting series born non-zero inside the range too.

    increase() cannot see a series whose first sample is already 1 (a pod that failed before its first scrape,
    typical of startup OOMs); for series that did not exist at the start of the range the whole value counts.
    The pods of one multi-node server (a LeaderWorkerSet group) each log its OOM; they count once
    (promql.per_group, docs/multi-node.md), and two exporters reading one pod count once too.
    """
    fatal = sel("sglang_oom_fatal_events_total", extra=_fatal_kinds(catalog))
    per_pod = (
        f"max {CLUSTERED.by('namespace', 'pod', 'container', 'source', 'kind')} ("
        f"(round(increase({fatal}[$__range])) and {fatal} offset $__range)"
        f" or ({fatal} unless {fatal} offset $__range))"
    )
    info = sel(GROUP_INFO, kind=False)
    grouped = per_group(CLUSTERED, per_pod, "kind", info=info, sources=fatal)
    return f"sum {CLUSTERED.by('kind')} (\n{indent(grouped)})"


def last_oom_age_expr(catalog: Catalog) -> str:
    """Seconds since the last event of a kind that can be fatal (retractions alone do not reset it)."""
    last = sel("sglang_oom_last_event_timestamp_seconds", extra=_fatal_kinds(catalog))
    return f"time() - max {CLUSTERED.by()} ({last})"


def _top_row(catalog: Catalog, kind_link: str, index: str) -> list[tuple[g.Json, int, int]]:
    fatal = g.stat(
        "Fatal OOMs in the picked range, by kind",
        "SGLang OOMs that crashed the server (or its scheduler) within the dashboard's time range, one tile per "
        "kind that can be fatal. Any red tile means in-flight requests failed and the pod restarted: open the "
        "tile's link for that kind's runbook, and the table below for the flag to change.",
        [g.target(fatal_in_range_expr(catalog), "{{kind}}" + IN_CLUSTER, instant=True)],
        g.field_config("short", data_links=[g.link("Runbook for ${__field.labels.kind}", kind_link)],
                       steps=g.thresholds(g.GREEN, (1, g.RED)), decimals=0, noValue="0"),
        links=[g.link("Runbook index", index)],
    )  # fmt: skip
    age = g.stat(
        "Time since the last OOM",
        "Time since the exporter counted the last OOM of a kind that can be fatal (retractions excluded). With "
        "--state-dir the time survives exporter restarts and upgrades; without it, it counts from the exporter's "
        "start. Red within the last hour. Empty: no such OOM counted.",
        [g.target(last_oom_age_expr(catalog), "last OOM" + IN_CLUSTER, instant=True)],
        g.field_config("s", steps=g.thresholds(g.RED, (3600, g.ORANGE), (86400, g.GREEN)), noValue="none seen"),
        textMode="value",
    )
    sources = g.stat(
        "Sources followed",
        "Log sources (files or pod containers) the exporter follows under the current filters. 0 means the "
        "exporter reads nothing, so no OOM can be seen: check its paths or --kubernetes-logs.",
        [
            g.target(
                f"count {CLUSTERED.by()} ({sel('sglang_oom_exporter_file_lag_bytes', kind=False)})",
                "sources" + IN_CLUSTER,
                instant=True,
            )
        ],
        g.field_config("short", steps=g.thresholds(g.RED, (1, g.GREEN)), noValue="0"),
        textMode="value",
    )
    up = scoped("sglang_oom_target_up")
    targets_up = g.stat(
        "SGLang targets up",
        "SGLang endpoints (--sglang-url, targets: or Kubernetes discovery) that answered the exporter's last "
        "scrape. Empty: no endpoint is configured, so events carry no KV context, the KV panels below stay empty, "
        "and only the flag changes a log line's own numbers give are suggested, without current values.",
        [g.target(f"sum {CLUSTERED.by()} ({up})", "up" + IN_CLUSTER, instant=True)],
        g.field_config("short", steps=g.thresholds(g.GREEN)),
        textMode="value",
    )
    targets_down = g.stat(
        "SGLang targets down",
        "SGLang endpoints whose last scrape failed (see the scrape errors by reason below). Red above 0: events "
        "from those servers lose their KV context and the flag changes that start from the server's values, and "
        "their values leave the KV panels below (sglang_oom_target_last_success_timestamp_seconds says when they "
        "last answered).",
        [g.target(f"count {CLUSTERED.by()} (({up}) == 0)", "down" + IN_CLUSTER, instant=True)],
        g.field_config("short", steps=g.thresholds(g.GREEN, (1, g.RED)), noValue="0"),
        textMode="value",
    )
    return [(fatal, 10, 5), (age, 4, 5), (sources, 4, 5), (targets_up, 3, 5), (targets_down, 3, 5)]


def _merge_table(names: Mapping[str, str], order: list[str]) -> list[g.Json]:
    """Merge instant table queries into one row per label set; keep only the columns in `order` (the kind, the
    values and the source labels), so the scrape's bookkeeping labels (job, instance, and endpoint, service
    or prometheus from an operator's monitors) never become columns; rename the value columns."""
    return [
        {"id": "merge", "options": {}},
        {"id": "filterFieldsByName", "options": {"include": {"names": list(order)}}},
        {
            "id": "organize",
            "options": {
                "renameByName": dict(names),
                "indexByName": {name: i for i, name in enumerate(order)},
            },
        },
        {"id": "sortBy", "options": {"sort": [{"field": "kind", "desc": False}]}},
    ]


def suggestion_queries() -> list[g.Json]:
    """The What-to-change table's queries: the flag's current value (A) and the suggested one (B)."""
    return g.targets(
        (sel("sglang_oom_current_flag_value"), "current"),
        (sel("sglang_oom_suggested_flag_value"), "suggested"),
        instant=True,
        table=True,
    )


def last_event_queries() -> list[g.Json]:
    """The last-event table's queries: requested tokens (A), available tokens (B), seconds since (C)."""
    return g.targets(
        (sel("sglang_oom_last_event_requested_tokens"), "requested"),
        (sel("sglang_oom_last_event_available_tokens"), "available"),
        (f"time() - {sel('sglang_oom_last_event_timestamp_seconds')}", "seconds ago"),
        instant=True,
        table=True,
    )


def _source_table(
    title: str,
    description: str,
    queries: list[g.Json],
    unit: str,
    row_link: str,
    names: Mapping[str, str],
    columns: list[str],
) -> g.Json:
    """A table with one row per kind and source (these columns, renamed by names), each row linked to its runbook."""
    fields = g.field_config(unit, data_links=[g.link("Runbook for ${__data.fields.kind}", row_link)])
    return g.table(title, description, queries, fields, _merge_table(names, [*columns, *SOURCE_COLUMNS]))


def _what_to_change(row_link: str, index: str) -> list[tuple[g.Json, int, int]]:
    suggestions = _source_table(
        "What to change: suggested SGLang flag values",
        "The concrete flag change the last OOM of each kind suggests, per source: the flag (pass it with two "
        "leading dashes), its value on the server when the OOM happened, and the suggested value. Some changes "
        "come from the log line alone (the tokens available when a prefill ran out, a retraction, a start-up "
        "message that names the value) and show without any SGLang endpoint, with an empty current value; the "
        "others start from the server's current flag values, read from an SGLang endpoint the exporter scrapes "
        "(--sglang-url, targets: or Kubernetes discovery), and are missing without one. Empty until an OOM "
        "happened. Click a row for that kind's runbook section.",
        suggestion_queries(),
        "none",
        row_link,
        {"Value #A": "current", "Value #B": "suggested"},
        ["kind", "flag", "Value #A", "Value #B"],
    )
    suggestions["links"] = [g.link("Runbook index", index)]
    last = _source_table(
        "Last event: requested vs available tokens",
        "Per kind and source, the tokens the last failed KV allocation asked for, the tokens that were available "
        "(free plus evictable) in the pool that ran out, and how many seconds ago that was. Requested far above "
        "available: the batch or chunk is too big for the pool; both small: the pool itself is too small "
        "(--mem-fraction-static). Click a row for that kind's runbook section.",
        last_event_queries(),
        "short",
        row_link,
        {"Value #A": "requested tokens", "Value #B": "available tokens", "Value #C": "seconds ago"},
        ["kind", "Value #A", "Value #B", "Value #C"],
    )
    words = _source_table(
        "What to change: the last event in words",
        "Per kind and source, the last OOM in the words scan and /events give it: the pool that ran out (full, "
        "swa, mamba, ...; a hybrid model's small state pool can be the limit while the full KV pool has millions "
        "free), its numbers in one sentence, and the advice in one: the concrete change, or the fix with the "
        "reason a lever was left alone (a smaller chunk that would not change the failing prefill). Empty until "
        "an OOM happened. Click a row for that kind's runbook section.",
        g.targets((sel("sglang_oom_last_event_info"), "info"), instant=True, table=True),
        "none",
        row_link,
        {"limiting_pool": "limiting pool"},
        ["kind", "limiting_pool", "detail", "advice"],
    )
    return [(suggestions, 14, 8), (last, 10, 8), (words, 24, 8)]


def _events(kind_link: str) -> list[tuple[g.Json, int, int]]:
    events = sel("sglang_oom_events_total")
    by_kind = g.timeseries(
        "OOM events by kind",
        "OOM events of every kind (fatal and recoverable) per $__rate_interval window. KV-cache retractions are "
        "the near-miss the server survives; frequent ones precede fatal decode OOMs. Click a series for its "
        "runbook section.",
        [g.target(f"sum {CLUSTERED.by('kind')} (increase({events}[$__rate_interval]))", "{{kind}}" + IN_CLUSTER)],
        g.field_config("short", data_links=[g.link("Runbook for ${__field.labels.kind}", kind_link)], decimals=0),
        bars=True,
    )
    by_source = g.timeseries(
        "OOM events by source",
        "OOM events of the selected kinds per $__rate_interval window, per log source (pod container or file): "
        "which server failed. One source failing repeatedly is a crash loop.",
        [g.target(f"sum by ({BY_SOURCE}) (increase({events}[$__rate_interval]))", SOURCE_LEGEND)],
        g.field_config("short", decimals=0),
        bars=True,
    )
    return [(by_kind, 12, 8), (by_source, 12, 8)]
