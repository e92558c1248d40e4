"""Render, the guard alerts (rule group sglang-oom-exporter): the exporter itself is down, reads no logs,
cannot reach SGLang, or cannot keep its state. A pack that silently cannot fire is worse than none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .alertspec import EXPORTER_DOWN, NO_LOGS, STATE_ERRORS, TARGET_DOWN, AlertSpec, pack_alert
from .promql import indent, new_events, sel


def exporter_down_alert(pack: Mapping[str, Any], job: str) -> AlertSpec:
    """SGLangOOMExporterDown: the target is down, or there is no target at all."""
    up = sel("up", job=job)
    # absent() takes its labels from the bare selector's `=` matchers, so the alert keeps job="<job>".
    expr = f"{up} == 0\nor\nabsent({up})\n"
    description = (
        "{{ if $labels.instance }}Prometheus cannot scrape the SGLang OOM exporter at {{ $labels.instance }}"
        f'{{{{ else }}}}Prometheus has no target with job="{job}" at all{{{{ end }}}} '
        f"(for {pack['exporter_down']['for']}). OOMs on the servers it watches go uncounted until it is back: check "
        f'the exporter pod or process, its logs, and that the scrape job is named "{job}".'
    )
    summary = "The SGLang OOM exporter is down or not scraped, so no OOM alert can fire."
    return pack_alert(pack, "exporter_down", EXPORTER_DOWN, expr, summary, description)


def no_logs_alert(pack: Mapping[str, Any], job: str) -> AlertSpec:
    """SGLangOOMExporterNoLogs: up, but following no file, reading nothing, or waiting for a file, for a window."""
    window = str(pack["exporter_no_logs"]["window"])
    files = sel("sglang_oom_exporter_files_watched", job=job)
    lines = sel("sglang_oom_exporter_lines_read_total", job=job)
    waiting = sel("sglang_oom_exporter_sources_waiting", job=job)
    expr = (
        f"max by (job, instance) ({files}) == 0\n"
        "or\n(\n"
        f"  sum by (job, instance) (increase({lines}[{window}])) == 0\n"
        # Only once the exporter has had sources for a whole window: a fresh install is not "silent for 1h".
        f"  and on (job, instance)\n  max by (job, instance) ({lines} offset {window})\n)\n"
        "or\n(\n"
        # A configured file that has not appeared for a whole window (SGLang never started there, or a wrong
        # path), even while the other files are read. Waiting at start is normal, so only once it lasted a window.
        f"  max by (job, instance) (min_over_time({waiting}[{window}])) > 0\n"
        f"  and on (job, instance)\n  max by (job, instance) ({waiting} offset {window})\n)\n"
    )
    description = (
        "The SGLang OOM exporter at {{ $labels.instance }} is up but follows no log file, read nothing "
        f"from its files in the last {window}, or has waited {window} for a configured log file to appear: "
        "a wrong path or glob, a wrong hostPath or container filter, unreadable files, an SGLang server that "
        "never started, or servers that logged nothing. Its /healthz names the files it waits for; see also its "
        "sglang_oom_exporter_sources_waiting and sglang_oom_exporter_read_errors_total."
    )
    summary = "The SGLang OOM exporter reads no logs from some or all of its SGLang servers, so their OOMs go unseen."
    return pack_alert(pack, "exporter_no_logs", NO_LOGS, expr, summary, description, window=window)


def target_down_alert(pack: Mapping[str, Any], job: str) -> AlertSpec:
    """SGLangOOMTargetDown: the exporter cannot scrape an SGLang endpoint."""
    expr = f"{sel('sglang_oom_target_up', job=job)} == 0\n"
    description = (
        "The exporter at {{ $labels.instance }} has failed to scrape SGLang at {{ $labels.target }} for "
        f"{pack['target_down']['for']}. OOMs are still counted from the logs, but without the server's KV state and "
        "flags their alerts fall back to generic fixes, and the KV near-full alert is blind. See "
        'sglang_oom_target_scrape_errors_total{target="{{ $labels.target }}"} for the reason.'
    )
    summary = "The SGLang OOM exporter cannot reach an SGLang endpoint, so pages lose their suggested values."
    return pack_alert(pack, "target_down", TARGET_DOWN, expr, summary, description)


def state_errors_alert(pack: Mapping[str, Any], job: str) -> AlertSpec:
    """SGLangOOMExporterStateErrors: new state file errors within the window."""
    window = str(pack["state_errors"]["window"])
    series = sel("sglang_oom_exporter_state_errors_total", job=job)
    expr = "max by (job, instance) (\n" + indent(new_events(series, window)) + "\n)\n"
    description = (
        '{{ $value | printf "%.0f" }} state file error(s) in the last '
        f"{window} on the exporter at {{{{ $labels.instance }}}}: it could not write its --state-dir, or found the "
        "state file unreadable or corrupt at start (moved aside as state.json.corrupt-<time>). Check the "
        "directory's free space, permissions and mount, and the exporter's log."
    )
    summary = "The SGLang OOM exporter cannot save or load its state, so a restart may lose or recount OOMs."
    return pack_alert(pack, "state_errors", STATE_ERRORS, expr, summary, description, window=window)
