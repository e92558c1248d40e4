"""Render, the runbook page pieces shared by the kind pages (runbooks.py) and the pack pages (pack_runbooks.py):
the page skeleton with its four parts, and the labels, commands, series and dashboard paragraphs.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..catalog import OomKind
from ..config.settings import DEFAULT_PORT
from .alertspec import AlertSpec
from .options import GENERATED_NOTE, OVERVIEW_DASHBOARD_UID, RenderOptions
from .promql import SOURCE_LABELS

PORT = DEFAULT_PORT  # the exporter's own port, to port-forward to


def quote(text: str) -> str:
    """A shell single-quoted word."""
    return "'" + text.replace("'", "'\"'\"'") + "'"


def find_exporter(job: str) -> str:
    """Shell lines that find the exporter on the pod's node and port-forward to it."""
    return (
        "# 1. The exporter on the pod's node (DaemonSet mode; in sidecar mode it is the pod itself):\n"
        "NODE=$(kubectl get pod -n NAMESPACE POD -o jsonpath='{.spec.nodeName}')\n"
        f"kubectl get pods -A -l app.kubernetes.io/name={job} --field-selector spec.nodeName=$NODE\n"
        f"kubectl port-forward -n EXPORTER_NAMESPACE pod/EXPORTER_POD {PORT} &\n"
    )


def labels_note() -> str:
    """Which alert labels say where the OOM was."""
    labels = ", ".join(f"`{label}`" for label in SOURCE_LABELS)
    return (
        f"The alert's labels say where: {labels} (Kubernetes mode sets `namespace`, `pod` and `container`; "
        "plain log files set `source`, the file's name). Replace NAMESPACE, POD, CONTAINER and SOURCE below "
        "with them.\n\n"
    )


def dashboard_note(options: RenderOptions) -> str:
    """Where the overview dashboard is."""
    if options.grafana_url:
        url = f"{options.grafana_url}/d/{OVERVIEW_DASHBOARD_UID}"
        return f"The [SGLang OOM overview dashboard]({url}) shows the same series per pod and kind.\n\n"
    uid = OVERVIEW_DASHBOARD_UID
    return f"The SGLang OOM overview dashboard (uid `{uid}`) shows the same series per pod and kind.\n\n"


def series_note(names: list[str], selector: str = "") -> str:
    """The series to look at."""
    return "Series to look at: " + ", ".join(f"`{n}{selector}`" for n in names) + ".\n"


def steps(kind: OomKind, versions: Mapping[str, str]) -> str:
    """The kind's remediation steps, numbered, safest first, with their SGLang releases."""
    lines = []
    for i, step in enumerate(kind.steps, 1):
        flag = f"`{step.flag}`" if step.flag != "none" else "No flag"
        release = versions.get(step.flag, "see `--help` of the running release")
        lines.append(f"{i}. {flag}: {step.action}. When: {step.when}. SGLang: {release}.")
    return "\n".join(lines) + "\n"


def page(spec: AlertSpec, meaning: str, impact: str, diagnosis: str, mitigation: str) -> str:
    """One alert's page: header, its rule, then Meaning, Impact, Diagnosis and Mitigation."""
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
