"""Render: catalog + alert pack -> docs/runbooks/ (one page per alert, and an index with one section per kind).

Sits beside render/alerts.py and reads the same `alert_pack(catalog)`, so every alert's runbook_url has a page and
every page an alert. Each page has the four parts an on-call engineer who has never seen SGLang needs, in this
order: Meaning, Impact, Diagnosis (copy-pasteable commands), Mitigation (flags safest first, with the SGLang
releases they apply to). The index's kind sections are headed by the bare kind id (`## prefill`), so their
anchors are exactly the kind ids the dashboards link to (`README.md#<kind>`). This module writes the kind pages
and the index; pack_runbooks.py the pack alerts' pages; runbook_parts.py holds what both use.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..catalog import Catalog, OomKind
from .alerts import alert_pack
from .alertspec import AlertSpec
from .options import GENERATED_NOTE, Files, RenderOptions
from .pack_runbooks import pack_page
from .runbook_parts import PORT, dashboard_note, find_exporter, labels_note, page, quote, series_note, steps

RUNBOOK_DIR = "docs/runbooks"
INDEX = f"{RUNBOOK_DIR}/README.md"
PARTS = ("Meaning", "Impact", "Diagnosis", "Mitigation")


def _grep(kind: OomKind, catalog: Catalog) -> str:
    """grep -F's patterns for a kind's lines: its anchors; for the non-memory crash, SGLang's crash headers."""
    literals = (*catalog.crash_headers, *kind.anchors) if catalog.is_crash(kind.id) else kind.anchors
    return " ".join(f"-e {quote(a)}" for a in literals)


def _kind_commands(kind: OomKind, job: str, grep: str) -> str:
    return (
        "```sh\n"
        + find_exporter(job)
        + "# 2. The recent events of this kind, with their numbers and suggested flag values:\n"
        f"curl -s 'http://127.0.0.1:{PORT}/events?limit=50' | jq '.events[] | select(.kind == \"{kind.id}\")'\n"
        "# 3. The crashed container's own log (it restarted, so --previous), scanned for every OOM and its fix:\n"
        "kubectl logs -n NAMESPACE POD -c CONTAINER --previous | sglang-oom-exporter scan -\n"
        "#    without a local install, run scan inside the exporter's container:\n"
        "kubectl logs -n NAMESPACE POD -c CONTAINER --previous \\\n"
        "  | kubectl exec -i -n EXPORTER_NAMESPACE EXPORTER_POD -- sglang-oom-exporter scan -\n"
        "# 4. The raw lines:\n"
        f"kubectl logs -n NAMESPACE POD -c CONTAINER --previous | grep -F {grep}\n"
        "# Plain files instead of Kubernetes (SOURCE is the alert's source label):\n"
        f"sglang-oom-exporter scan /path/to/SOURCE.log; curl -s 'http://EXPORTER_HOST:{PORT}/events?limit=50'\n"
        "```\n"
    )


def _apply_note(kind: OomKind) -> str:
    return (
        "\nIn that order, safest first. The alert's description already names the flag and a value computed from "
        "the failed allocation when the exporter could read the server's settings "
        f'(`sglang_oom_suggested_flag_value{{kind="{kind.id}"}}`, `sglang_oom_current_flag_value`). Change the flag '
        "in the server's launch command (the Deployment or StatefulSet args on Kubernetes), roll it out, and "
        "watch this alert stay quiet under the same load.\n"
    )


def _patterns(kind: OomKind, crash: bool = False) -> str:
    releases = "\n".join(f"- {p.versions}" for p in kind.patterns)
    examples = "\n".join(kind.match_examples)
    forms = (
        "Any exception that no OOM kind names, raised outside memory-pool and allocator code, is one (its traceback "
        "follows SGLang's '<process> hit an exception' header); so are these texts, which SGLang raises in "
        "allocator code although they are no memory failure"
        if crash
        else "The message has changed over SGLang releases; this kind matches these forms"
    )
    return (
        "<details><summary>Background: what SGLang prints</summary>\n\n"
        f"{kind.title}. The exporter counts one event per server-level failure (all ranks and the traceback "
        f"that repeats the message are one event). {forms}:\n\n{releases}\n\nLines like these (the catalog's "
        f"own test examples):\n\n```\n{examples}\n```\n\n</details>\n"
    )


def _kind_page(spec: AlertSpec, kind: OomKind, catalog: Catalog, options: RenderOptions) -> str:
    job = str(catalog.alert_pack["job"])
    versions = catalog.alert_pack["flag_versions"]
    meaning = kind.runbook["meaning"]
    impact = kind.runbook["impact"]
    if spec.role == "non_fatal":
        meaning = (
            f"SGLang 0.5.10+ no longer crashes on this {kind.id} failure: it aborts the one request that did not fit "
            f"and keeps serving. This alert fires while those aborts keep coming (more than {spec.threshold:g} a "
            f"minute over {spec.window}, for {spec.for_}). Background: {kind.runbook['meaning']}"
        )
        impact = "Each abort failed one request (HTTP 500 to its client); the server and other requests go on."
    elif spec.role == "retraction":
        meaning = (
            f"{kind.runbook['meaning']} This alert fires when that happens more than {spec.threshold:g} times a "
            f"minute (over {spec.window}, for {spec.for_}); a few retractions are normal and never alert."
        )
    elif spec.role == "crash_loop_any":
        meaning = (
            f"{kind.runbook['meaning']} This alert pages when it happened {spec.threshold:g} times or more on one "
            f"server within {spec.window}: the server restarts and dies again, and no OOM alert says why "
            "(SGLangCrashed warns on each crash)."
        )
    crash = catalog.is_crash(kind.id)
    series = ["sglang_oom_events_total", "sglang_oom_fatal_events_total", "sglang_oom_last_event_requested_tokens",
              "sglang_oom_last_event_available_tokens", "sglang_oom_suggested_flag_value"]  # fmt: skip
    if crash:
        series = ["sglang_oom_crashes_total", "sglang_oom_last_event_info", "sglang_oom_last_event_timestamp_seconds"]
    hint = kind.runbook.get("diagnosis", "")
    diagnosis = (
        (f"{hint.rstrip()}\n\n" if hint else "")
        + labels_note()
        + _kind_commands(kind, job, _grep(kind, catalog))
        + "\n"
        + series_note(series, "" if crash else f'{{kind="{kind.id}"}}')
        + "\n"
        + dashboard_note(options)
    )
    mitigation = steps(kind, versions) + (_CRASH_NOTE if crash else _apply_note(kind))
    return page(spec, meaning + "\n\n" + _patterns(kind, crash), impact, diagnosis, mitigation)


_CRASH_NOTE = (
    "\nNo memory flag fixes it: the exception, not a pool, is the cause. The last-event series carry "
    '`kind="crash"`. Once the change is rolled out, watch SGLangCrashed stay quiet and the pod\'s restart count '
    "stop growing.\n"
)


def page_path(alert: str) -> str:
    """Where an alert's page is written: runbook_page_url's file name under docs/runbooks/."""
    return f"{RUNBOOK_DIR}/{alert.lower()}.md"


def _index(catalog: Catalog, specs: list[AlertSpec]) -> str:
    versions = catalog.alert_pack["flag_versions"]
    rows = "\n".join(f"| [{s.name}]({s.name.lower()}.md) | `{s.severity}` | {s.summary} |" for s in specs)
    sections = []
    for kind in (*catalog.kinds, *((catalog.crash,) if catalog.crash is not None else ())):
        alerts = [s for s in specs if s.kind is not None and s.kind.id == kind.id]
        links = ", ".join(f"[{s.name}]({s.name.lower()}.md)" for s in alerts)
        grep = _grep(kind, catalog)
        crash = catalog.is_crash(kind.id)
        counter = "sglang_oom_crashes_total" if crash else f'sglang_oom_events_total{{kind="{kind.id}"}}'
        sections.append(
            f"## {kind.id}\n\n"
            f"**{kind.title}.** Alerts: {links}.\n\n"
            f"### Meaning\n\n{kind.runbook['meaning']}\n\n"
            f"### Impact\n\n{kind.runbook['impact']}\n\n"
            "### Diagnosis\n\n"
            f"```sh\nkubectl logs -n NAMESPACE POD -c CONTAINER --previous | grep -F {grep}\n"
            "kubectl logs -n NAMESPACE POD -c CONTAINER --previous | sglang-oom-exporter scan -\n```\n\n"
            f"Series: `{counter}`; the alert pages above have the full steps.\n\n"
            f"### Mitigation\n\n{steps(kind, versions)}"
        )
    return (
        "# Runbooks: SGLang OOM alerts\n\n"
        f"<!-- {GENERATED_NOTE} -->\n\n"
        "One page per alert of `alerts/sglang-oom.rules.yaml`, each with its Meaning, Impact, Diagnosis and "
        "Mitigation. `critical` alerts page; `warning` alerts are tickets. Below the table, one section per OOM "
        "kind (the `kind` label), then one for the non-memory crash, linked from the dashboards.\n\n"
        "| alert | severity | summary |\n|---|---|---|\n"
        f"{rows}\n\n" + "\n".join(sections)
    )


def render_runbooks(catalog: Catalog, options: RenderOptions, files_so_far: Mapping[str, str]) -> Files:
    """Renderer: docs/runbooks/<alert>.md for every alert, and the index with one section per kind."""
    specs = alert_pack(catalog)
    files: Files = {}
    for spec in specs:
        if spec.kind is not None:
            files[page_path(spec.name)] = _kind_page(spec, spec.kind, catalog, options)
        else:
            files[page_path(spec.name)] = pack_page(spec, catalog, options)
    files[INDEX] = _index(catalog, specs)
    return files
