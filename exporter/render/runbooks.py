"""Render: catalog + alert pack -> docs/runbooks/ (one page per alert, and an index with one section per kind).

Sits beside render/alerts.py and reads the same `alert_pack(catalog)`, so every alert's runbook_url has a page and
every page an alert. Each page has the four parts an on-call engineer who has never seen SGLang needs, in this
order: Meaning, Impact, Diagnosis (copy-pasteable commands), Mitigation (flags safest first, with the SGLang
releases they apply to). The index's kind sections are headed by the bare kind id (`## prefill`), so their
anchors are exactly the kind ids the dashboards link to (`README.md#<kind>`).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..catalog import Catalog, OomKind
from . import GENERATED_NOTE, OVERVIEW_DASHBOARD_UID, Files, RenderOptions
from .alerts import SOURCE_LABELS, AlertSpec, alert_pack

RUNBOOK_DIR = "docs/runbooks"
INDEX = f"{RUNBOOK_DIR}/README.md"
PARTS = ("Meaning", "Impact", "Diagnosis", "Mitigation")
PORT = 9877

# What each pack alert (not one per kind) means, in the runbook's four parts. Kind alerts take theirs from
# the catalog; these describe the exporter and the pack itself.
_PACK_TEXT: dict[str, dict[str, str]] = {
    "crash_loop": {
        "meaning": "The same SGLang server had several fatal out-of-memory errors within the window: it restarts, "
        "runs out of memory again under the same load, and restarts again.",
        "impact": "Every crash fails all in-flight requests and drops the prefix cache; while it loops, the server "
        "is mostly unavailable and its restarts add load to the other replicas.",
        "mitigation": "Apply the fix of the kind that keeps failing (its own alert and runbook name the flag and a "
        "value computed from the event). Until the new flags are rolled out, consider taking the server out of "
        "rotation or scaling out, so one crash-looping replica does not carry traffic.",
    },
    "kv_near_full": {
        "meaning": "SGLang reports that its KV cache (the GPU memory holding every running request's tokens) has "
        "stayed almost completely used. The exporter mirrors SGLang's own `token_usage` from its /metrics.",
        "impact": "Nothing failed yet. New requests queue, running ones get retracted and recomputed, and the next "
        "large prefill or decode step may fail with a fatal OOM.",
        "mitigation": "Admit less work per server or give the KV cache more room: lower `--max-running-requests` "
        "or `--chunked-prefill-size`, raise `--mem-fraction-static` if the startup log shows spare GPU memory "
        "(5-8 GB of available_gpu_mem is the tuning guide's mark), or add replicas.",
    },
    "exporter_down": {
        "meaning": "Prometheus cannot scrape the SGLang OOM exporter, or has no scrape target for it at all. "
        "Without it, no OOM alert can fire.",
        "impact": "No user impact by itself, but OOMs on the servers it watches go unnoticed until it is back "
        "(with --state-dir, OOMs logged meanwhile are counted when it returns).",
        "mitigation": "Restart or fix the exporter (a crash, an OOM-killed pod, a bad config: run "
        "`sglang-oom-exporter serve --config FILE --check-config`). If the target is missing, check the "
        "scrape job name (`job` must be `{job}`), the ServiceMonitor or PodMonitor labels that Prometheus "
        "selects (kube-prometheus-stack wants `release: <its release>`), and the Service's port.",
    },
    "exporter_no_logs": {
        "meaning": "The exporter runs, but it follows no log file, or read no line from its files for a whole "
        "window. OOMs cannot be counted from logs it does not read.",
        "impact": "No user impact by itself; OOMs on the unread servers never alert.",
        "mitigation": "Fix the paths: the glob or file names in its config, `--kubernetes-logs` pointing at the "
        "node's pod-log directory (usually /var/log/pods, mounted read-only), the namespace/pod/container filters "
        "(container names must look like an SGLang server), and file permissions. An SGLang server that was idle "
        "for the whole window logs nothing; that is normal, and the alert resolves with the next request.",
    },
    "target_down": {
        "meaning": "The exporter cannot scrape the SGLang endpoint (`--sglang-url`) it reads KV usage and server "
        "arguments from.",
        "impact": "OOMs are still counted from the logs, but their alerts carry only the generic fix instead of "
        "concrete flag values, and the KV near-full warning is blind for this server.",
        "mitigation": "Start SGLang with `--enable-metrics`, check the URL and port in `--sglang-url` or the "
        "config's `targets:`, and network policy between the exporter and SGLang. A server that is restarting "
        "after an OOM is unreachable for a while; that is expected and resolves on its own.",
    },
    "state_errors": {
        "meaning": "The exporter could not write its state file, or found it unreadable or corrupt at start. The "
        "state file is how a restarted exporter neither loses nor recounts an OOM.",
        "impact": "No user impact now. After a corrupt state it started like a first run (old OOMs not counted "
        "again, but OOMs logged while it was down may be missed); if saves keep failing, its next restart will.",
        "mitigation": "Give `--state-dir` space and write permission (the chart mounts a small hostPath), then "
        "check the exporter's log for the reason. A moved-aside `state.json.corrupt-<time>` can be deleted once "
        "read.",
    },
}

# Which series and pages each pack alert's diagnosis points at.
_PACK_SERIES = {
    "crash_loop": ["sglang_oom_fatal_events_total", "sglang_oom_last_event_timestamp_seconds"],
    "kv_near_full": [
        "sglang_oom_target_token_usage",
        "sglang_oom_target_kv_available_tokens",
        "sglang_oom_target_running_requests",
        "sglang_oom_target_queued_requests",
    ],
    "exporter_down": ["up", "sglang_oom_exporter_build_info"],
    "exporter_no_logs": [
        "sglang_oom_exporter_files_watched",
        "sglang_oom_exporter_lines_read_total",
        "sglang_oom_exporter_read_errors_total",
        "sglang_oom_exporter_last_read_timestamp_seconds",
    ],
    "target_down": ["sglang_oom_target_up", "sglang_oom_target_scrape_errors_total"],
    "state_errors": ["sglang_oom_exporter_state_errors_total", "sglang_oom_exporter_state_saves_total"],
}


def _quote(text: str) -> str:
    """A shell single-quoted word."""
    return "'" + text.replace("'", "'\"'\"'") + "'"


def _find_exporter(job: str) -> str:
    return (
        "# 1. The exporter on the pod's node (DaemonSet mode; in sidecar mode it is the pod itself):\n"
        "NODE=$(kubectl get pod -n NAMESPACE POD -o jsonpath='{.spec.nodeName}')\n"
        f"kubectl get pods -A -l app.kubernetes.io/name={job} --field-selector spec.nodeName=$NODE\n"
        f"kubectl port-forward -n EXPORTER_NAMESPACE pod/EXPORTER_POD {PORT} &\n"
    )


def _kind_commands(kind: OomKind, job: str) -> str:
    grep = " ".join(f"-e {_quote(a)}" for a in kind.anchors)
    return (
        "```sh\n"
        + _find_exporter(job)
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


def _labels_note() -> str:
    labels = ", ".join(f"`{label}`" for label in SOURCE_LABELS)
    return (
        f"The alert's labels say where: {labels} (Kubernetes mode sets `namespace`, `pod` and `container`; "
        "plain log files set `source`, the file's name). Replace NAMESPACE, POD, CONTAINER and SOURCE below "
        "with them.\n\n"
    )


def _dashboard(options: RenderOptions) -> str:
    if options.grafana_url:
        url = f"{options.grafana_url}/d/{OVERVIEW_DASHBOARD_UID}"
        return f"The [SGLang OOM overview dashboard]({url}) shows the same series per pod and kind.\n\n"
    uid = OVERVIEW_DASHBOARD_UID
    return f"The SGLang OOM overview dashboard (uid `{uid}`) shows the same series per pod and kind.\n\n"


def _series(names: list[str], selector: str = "") -> str:
    return "Series to look at: " + ", ".join(f"`{n}{selector}`" for n in names) + ".\n"


def _steps(kind: OomKind, versions: Mapping[str, str]) -> str:
    lines = []
    for i, step in enumerate(kind.steps, 1):
        flag = f"`{step.flag}`" if step.flag != "none" else "No flag"
        release = versions.get(step.flag, "see `--help` of the running release")
        lines.append(f"{i}. {flag}: {step.action}. When: {step.when}. SGLang: {release}.")
    return "\n".join(lines) + "\n"


def _apply_note(kind: OomKind) -> str:
    return (
        "\nIn that order, safest first. The alert's description already names the flag and a value computed from "
        "the failed allocation when the exporter could read the server's settings "
        f'(`sglang_oom_suggested_flag_value{{kind="{kind.id}"}}`, `sglang_oom_current_flag_value`). Change the flag '
        "in the server's launch command (the Deployment or StatefulSet args on Kubernetes), roll it out, and "
        "watch this alert stay quiet under the same load.\n"
    )


def _patterns(kind: OomKind) -> str:
    releases = "\n".join(f"- {p.versions}" for p in kind.patterns)
    examples = "\n".join(kind.match_examples)
    return (
        "<details><summary>Background: what SGLang prints</summary>\n\n"
        f"{kind.title}. The exporter counts one event per server-level failure (all ranks and the traceback "
        "that repeats the message are one event). The message has changed over SGLang releases; this kind "
        f"matches these forms:\n\n{releases}\n\nLines like these (the catalog's own test examples):\n\n"
        f"```\n{examples}\n```\n\n</details>\n"
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
    series = ["sglang_oom_events_total", "sglang_oom_fatal_events_total", "sglang_oom_last_event_requested_tokens",
              "sglang_oom_last_event_available_tokens", "sglang_oom_suggested_flag_value"]  # fmt: skip
    hint = kind.runbook.get("diagnosis", "")
    diagnosis = (
        (f"{hint.rstrip()}\n\n" if hint else "")
        + _labels_note()
        + _kind_commands(kind, job)
        + "\n"
        + _series(series, f'{{kind="{kind.id}"}}')
        + "\n"
        + _dashboard(options)
    )
    mitigation = _steps(kind, versions) + _apply_note(kind)
    return _page(spec, meaning + "\n\n" + _patterns(kind), impact, diagnosis, mitigation)


def _pack_page(spec: AlertSpec, catalog: Catalog, options: RenderOptions) -> str:
    job = str(catalog.alert_pack["job"])
    text = _PACK_TEXT[spec.role]
    if spec.role == "crash_loop":
        commands = (
            "```sh\n"
            + _find_exporter(job)
            + f"curl -s 'http://127.0.0.1:{PORT}/events?limit=50' | jq '.events[] | select(.fatal) | "
            "{time, kind, labels, suggestions}'\n"
            "kubectl get pod -n NAMESPACE POD   # RESTARTS\n"
            "kubectl logs -n NAMESPACE POD -c CONTAINER --previous | sglang-oom-exporter scan -\n```\n"
        )
    elif spec.role == "kv_near_full":
        commands = (
            "```sh\n# The exporter's mirror of SGLang's KV state (sidecar mode: the exporter runs in the SGLang pod):\n"
            f"kubectl port-forward -n NAMESPACE pod/POD {PORT} &\n"
            f"curl -s http://127.0.0.1:{PORT}/metrics | grep -E '^sglang_oom_target_(token_usage|kv_|running|queued)'\n"
            "# SGLang's own view (start it with --enable-metrics), from a pod that reaches it:\n"
            "curl -s http://SGLANG_HOST:30000/metrics | grep -E 'token_usage|num_running_reqs|num_queue_reqs'\n"
            "kubectl logs -n NAMESPACE POD -c CONTAINER --since=15m | grep -E 'token usage|Retract'\n```\n"
        )
    elif spec.role in ("exporter_down", "exporter_no_logs", "state_errors", "target_down"):
        commands = (
            "```sh\n"
            f"kubectl get pods -A -l app.kubernetes.io/name={job} -o wide\n"
            "kubectl logs -n EXPORTER_NAMESPACE EXPORTER_POD --tail=100\n"
            f"kubectl port-forward -n EXPORTER_NAMESPACE pod/EXPORTER_POD {PORT} &\n"
            f"curl -s http://127.0.0.1:{PORT}/healthz; echo\n"
            f"curl -s http://127.0.0.1:{PORT}/metrics | grep -E '^sglang_oom_(exporter|target)_'\n"
            "# Plain hosts: the same curls against EXPORTER_HOST, and the service's journal or log.\n```\n"
        )
    else:  # pragma: no cover - every pack role is listed above
        raise ValueError(spec.role)
    diagnosis = _pack_labels(spec) + commands + "\n" + _series(_PACK_SERIES[spec.role]) + "\n" + _dashboard(options)
    return _page(spec, text["meaning"], text["impact"], diagnosis, text["mitigation"].replace("{job}", job))


def _pack_labels(spec: AlertSpec) -> str:
    if spec.role == "crash_loop":
        return _labels_note()
    if spec.role == "kv_near_full":
        return (
            "The alert's `target` label is the SGLang URL the exporter scrapes, `instance` the exporter's address, "
            "and `namespace`/`pod` (sidecar mode) the pod both run in.\n\n"
        )
    return "The alert's `instance` label is the exporter's address (host:port of its /metrics).\n\n"


def _page(spec: AlertSpec, meaning: str, impact: str, diagnosis: str, mitigation: str) -> str:
    when = f"`for: {spec.for_}`" + (f", `keep_firing_for: {spec.keep_firing_for}`" if spec.keep_firing_for else "")
    action = {"critical": "pages the on-call now", "warning": "opens a ticket: fix it in working hours",
              "info": "is not routed"}[spec.severity]  # fmt: skip
    return (
        f"# {spec.name}\n\n"
        f"<!-- {GENERATED_NOTE} -->\n\n"
        f"**Severity:** `{spec.severity}` ({action}). **Summary:** {spec.summary}\n\n"
        f"<details><summary>The rule ({when})</summary>\n\n```promql\n{spec.expr.rstrip()}\n```\n\n</details>\n\n"
        f"## Meaning\n\n{meaning.rstrip()}\n\n"
        f"## Impact\n\n{impact.rstrip()}\n\n"
        f"## Diagnosis\n\n{diagnosis.rstrip()}\n\n"
        f"## Mitigation\n\n{mitigation.rstrip()}\n\n"
        "[All runbooks](README.md)\n"
    )


def page_path(alert: str) -> str:
    """Where an alert's page is written: runbook_page_url's file name under docs/runbooks/."""
    return f"{RUNBOOK_DIR}/{alert.lower()}.md"


def _index(catalog: Catalog, specs: list[AlertSpec]) -> str:
    versions = catalog.alert_pack["flag_versions"]
    rows = "\n".join(f"| [{s.name}]({s.name.lower()}.md) | `{s.severity}` | {s.summary} |" for s in specs)
    sections = []
    for kind in catalog.kinds:
        alerts = [s for s in specs if s.kind is not None and s.kind.id == kind.id]
        links = ", ".join(f"[{s.name}]({s.name.lower()}.md)" for s in alerts)
        grep = " ".join(f"-e {_quote(a)}" for a in kind.anchors)
        sections.append(
            f"## {kind.id}\n\n"
            f"**{kind.title}.** Alerts: {links}.\n\n"
            f"### Meaning\n\n{kind.runbook['meaning']}\n\n"
            f"### Impact\n\n{kind.runbook['impact']}\n\n"
            "### Diagnosis\n\n"
            f"```sh\nkubectl logs -n NAMESPACE POD -c CONTAINER --previous | grep -F {grep}\n"
            "kubectl logs -n NAMESPACE POD -c CONTAINER --previous | sglang-oom-exporter scan -\n```\n\n"
            f'Series: `sglang_oom_events_total{{kind="{kind.id}"}}`; the alert pages above have the full steps.\n\n'
            f"### Mitigation\n\n{_steps(kind, versions)}"
        )
    return (
        "# Runbooks: SGLang OOM alerts\n\n"
        f"<!-- {GENERATED_NOTE} -->\n\n"
        "One page per alert of `alerts/sglang-oom.rules.yaml`, each with its Meaning, Impact, Diagnosis and "
        "Mitigation. `critical` alerts page; `warning` alerts are tickets. Below the table, one section per OOM "
        "kind (the `kind` label), linked from the dashboards.\n\n"
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
            files[page_path(spec.name)] = _pack_page(spec, catalog, options)
    files[INDEX] = _index(catalog, specs)
    return files
