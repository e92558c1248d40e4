"""The HTML page of recent OOM events: readable without Grafana, each event linked to its runbook section at
/runbooks/ (served by the exporter too, so the link works without internet access). Pure rendering;
server.py serves it.

Everything that came from a log is escaped: log text is untrusted input.
"""

from __future__ import annotations

import html

from .. import __version__
from ..catalog.loader import Catalog
from ..daemon.store import Health, StoredEvent
from ..detect.model import OomEvent


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def render_page(entries: list[StoredEvent], catalog: Catalog, health: Health, capacity: int) -> str:
    """The HTML page: health, then one table row per event with its numbers and fix."""
    status = ("ok" if health.ok else "unhealthy") + (f": {health.reason}" if health.reason else "")
    rows = "".join(_event_row(i, s, catalog) for i, s in enumerate(entries, 1))
    if not rows:
        rows = '<tr><td colspan="7">No OOM events since the exporter started.</td></tr>'
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>SGLang OOM events</title>'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
        "th,td{border:1px solid #ccc;padding:.3em .5em;text-align:left;vertical-align:top}"
        "th{background:#eee}.fatal{color:#b00;font-weight:bold}.unhealthy{color:#b00}"
        "code,pre{white-space:pre-wrap;word-break:break-all}ol{margin:.3em 0;padding-left:1.4em}</style>"
        f'</head><body><h1>SGLang OOM events</h1><p class="{"ok" if health.ok else "unhealthy"}">'
        f"Exporter status: {_e(status)}</p><p>{len(entries)} recent events, newest first (the last {capacity}"
        f' are kept). <a href="metrics">metrics</a> &middot; <a href="events">events as JSON</a> &middot; '
        f'<a href="healthz">health</a> &middot; <a href="runbooks/">runbooks</a> &middot; '
        f"sglang-oom-exporter {_e(__version__)}</p>"
        "<table><thead><tr><th>Time</th><th>Kind</th><th>Fatal</th><th>Source</th><th>Ranks</th>"
        f"<th>Numbers</th><th>Fix</th></tr></thead><tbody>{rows}</tbody></table></body></html>\n"
    )


def runbook_href(kind_id: str) -> str:
    """The link from the page (served at /) to a kind's section of the exporter's own runbooks (web/runbooks.py)."""
    return f"runbooks/#{kind_id}"


def _event_row(index: int, stored: StoredEvent, catalog: Catalog) -> str:
    e = stored.event
    kind = catalog.kind(e.kind)
    fatal = '<td class="fatal">yes</td>' if e.fatal else "<td>no</td>"
    labels = "".join(f"<br>{_e(k)}={_e(v)}" for k, v in sorted(stored.labels.items()))
    steps = "".join(
        f"<li><code>{_e(s.flag)}</code>: {_e(s.action)} <em>(when {_e(s.when)})</em></li>" for s in kind.steps
    )
    return (
        f'<tr class="event" id="event-{index}"><td>{_e(e.time or "-")}</td>'
        f"<td><code>{_e(e.kind)}</code><br>{_e(kind.title)}<br><code>{_e(e.message)}</code>"
        f'<br><a class="runbook" href="{_e(runbook_href(e.kind))}">runbook</a>'
        f"<details><summary>log excerpt</summary><pre>{_e(e.excerpt)}</pre></details></td>"
        f"{fatal}"
        f"<td>{_e(e.source)}<br><code>{_e(e.location)}</code>{labels}</td>"
        f"<td>{_e(' '.join(e.ranks) or '-')}</td><td>{_numbers(e)}</td>"
        f"<td>{_suggestions(e)}{_e(kind.summary)}<ol>{steps}</ol>{_context(e)}</td></tr>"
    )


def _suggestions(e: OomEvent) -> str:
    """The concrete flag changes first: they are what the on-call engineer came for."""
    items = []
    for s in e.suggestions:
        if s.suggested is None:
            continue
        change = s.change("&rarr;")  # numbers only: nothing to escape
        when = f" <em>(when {_e(s.when)})</em>" if s.when else ""
        items.append(f'<li class="suggestion"><strong><code>{_e(s.flag)}</code> {change}</strong>{when}<br>'
                     f"<small>{_e(s.rule)}</small></li>")  # fmt: skip
    return f'<ul class="suggestions">{"".join(items)}</ul>' if items else ""


def _context(e: OomEvent) -> str:
    if not e.context:
        return ""
    rows = []
    for part in ("kv", "server_args"):
        values = e.context.get(part) or {}
        if values:
            text = ", ".join(f"{k}={v}" for k, v in sorted(values.items()))
            rows.append(f"<b>{_e(part)}</b>: {_e(text)}")
    if e.context.get("target"):
        rows.insert(0, f"<b>target</b>: {_e(e.context['target'])}")
    return f"<details><summary>context</summary>{'<br>'.join(rows)}</details>" if rows else ""


def _numbers(e: OomEvent) -> str:
    first = ("requested_tokens", "available_tokens")
    items = [(k, e.numbers[k]) for k in first if k in e.numbers]
    items += [(k, v) for k, v in e.numbers.items() if k not in first]
    if e.phase:
        items.append(("phase", e.phase + (f"/{e.subphase}" if e.subphase else "")))
    items += [(f"pool {p.name}", " ".join(f"{k}={v}" for k, v in p.as_dict().items() if k != "pool")) for p in e.pools]
    if e.inferred:
        items.append(("kind", "inferred from traceback frames"))
    return "<br>".join(f"{_e(k)}: {_e(v)}" for k, v in items) or "-"
