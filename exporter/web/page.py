"""The HTML page of recent OOM events: readable without Grafana, each event linked to its runbook section at
/runbooks/ (served by the exporter too, so the link works without internet access). Pure rendering;
server.py serves it.

Everything that came from a log is escaped: log text is untrusted input. Each event leads with what to change
(the event's numbers in words, naming the pool that ran out, then the concrete flag values, a lever left alone
and why, then the fix); a value the log did not give is left out, never shown as None.
"""

from __future__ import annotations

import html
import re
import time

from .. import __version__
from ..advise.explain import skipped
from ..catalog import Catalog
from ..detect.model import OomEvent
from ..events.sink import explanation
from ..events.store import Health, StoredEvent

# A logged time that carries its own zone (Z, +02:00, +0200): shown as it is; any other is said to have none.
_ZONED = re.compile(r"(?:Z|[+-]\d\d:?\d\d)$")


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def render_page(entries: list[StoredEvent], catalog: Catalog, health: Health, capacity: int) -> str:
    """The HTML page: health, then one table row per event, what to change first."""
    status = ("ok" if health.ok else "unhealthy") + (f": {health.reason}" if health.reason else "")
    rows = "".join(_event_row(i, s, catalog) for i, s in enumerate(entries, 1))
    if not rows:
        rows = '<tr><td colspan="5">No OOM events recorded.</td></tr>'
    restored = sum(1 for s in entries if s.restored)
    kept = f" ({restored} restored from the state file, counted before the last restart)" if restored else ""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>SGLang OOM events</title>'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
        "th,td{border:1px solid #ccc;padding:.3em .5em;text-align:left;vertical-align:top}"
        "th{background:#eee}.fatal{color:#b00;font-weight:bold}.unhealthy{color:#b00}"
        ".restored{color:#666;font-style:italic}.zone{color:#666;font-size:smaller}td.time{min-width:11em}"
        "ul.suggestions{margin:.2em 0;padding-left:1.2em}"
        "code,pre{white-space:pre-wrap;word-break:break-all}ol{margin:.3em 0;padding-left:1.4em}"
        # A phone: each event a card of labelled cells, every cell wrapped to the screen's width.
        "@media (max-width:40em){body{margin:.6em}table,tbody,tr,td{display:block}thead{display:none}"
        "tr.event{border:1px solid #ccc;margin:0 0 1em}td{border:0;border-top:1px solid #eee;overflow-wrap:anywhere}"
        "td.time{min-width:0}td[data-label]::before{content:attr(data-label);display:block;font-weight:bold;"
        "color:#555}code,pre{word-break:normal}}</style>"
        f'</head><body><h1>SGLang OOM events</h1><p class="{"ok" if health.ok else "unhealthy"}">'
        f"Exporter status: {_e(status)}</p><p>{len(entries)} recent events, newest first{kept}; the last "
        f"{capacity} are kept, and with --state-dir the newest of them survive a restart. "
        '<a href="metrics">metrics</a> &middot; <a href="events">events as JSON</a> &middot; '
        f'<a href="healthz">health</a> &middot; <a href="runbooks/">runbooks</a> &middot; '
        f"sglang-oom-exporter {_e(__version__)}</p>"
        "<table><thead><tr><th>Time</th><th>What to change</th><th>Event</th><th>Numbers</th>"
        f"<th>Source</th></tr></thead><tbody>{rows}</tbody></table></body></html>\n"
    )


def runbook_href(kind_id: str) -> str:
    """The link from the page (served at /) to a kind's section of the exporter's own runbooks (web/runbooks.py)."""
    return f"runbooks/#{kind_id}"


def _event_row(index: int, stored: StoredEvent, catalog: Catalog) -> str:
    e = stored.event
    kind = catalog.kind(e.kind)
    fatal = '<span class="fatal">fatal</span>' if e.fatal else "not fatal"
    labels = "".join(f"<br>{_e(k)}={_e(v)}" for k, v in sorted(stored.labels.items()))
    steps = "".join(
        f"<li><code>{_e(s.flag)}</code>: {_e(s.action)}" + (f" <em>(when {_e(s.when)})</em>" if s.when else "")
        + "</li>"
        for s in kind.steps
    )  # fmt: skip
    ranks = f"<br>ranks {_e(' '.join(e.ranks))}" if e.ranks else ""
    told = explanation(e, catalog)
    what = f'<p class="detail">{_e(told.sentence)}</p>' if told.sentence else ""
    return (
        f'<tr class="event" id="event-{index}"><td class="time" data-label="Time">{_time(stored)}</td>'
        f'<td data-label="What to change">{what}{_suggestions(e)}{_e(told.fix)}<ol>{steps}</ol>{_context(e)}</td>'
        f'<td data-label="Event"><code>{_e(e.kind)}</code> ({fatal})<br>{_e(kind.title)}'
        f"<br><code>{_e(e.message)}</code>"
        f'<br><a class="runbook" href="{_e(runbook_href(e.kind))}">runbook</a>'
        f"<details><summary>log excerpt</summary><pre>{_e(e.excerpt)}</pre></details></td>"
        f'<td data-label="Numbers">{_numbers(e)}</td>'
        f'<td data-label="Source">{_e(e.source)}<br><code>{_e(e.location)}</code>{ranks}{labels}</td></tr>'
    )


def _time(stored: StoredEvent) -> str:
    """The time as logged, saying whether it has a zone; then when the exporter counted it, in UTC."""
    logged = stored.event.time
    out = []
    if logged:
        zone = "" if _ZONED.search(logged) else '<br><span class="zone">as logged, no zone</span>'
        out.append(f"{_e(logged)}{zone}")
    else:
        out.append('<span class="zone">the log line gave no time</span>')
    if stored.seen is not None:
        seen = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(stored.seen))
        out.append(f'<span class="zone">counted {seen}</span>')
    if stored.restored:
        out.append('<span class="restored">restored from the state file</span>')
    return "<br>".join(out)


def _suggestions(e: OomEvent) -> str:
    """The concrete flag changes first: they are what the on-call engineer came for."""
    items = []
    for s in e.suggestions:
        if skipped(s):  # a lever left alone, and why: the on-call would otherwise reach for it first
            items.append(f'<li class="skipped"><code>{_e(s.flag)}</code> unchanged: <small>{_e(s.rule)}</small></li>')
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
        text = ", ".join(f"{k}={v}" for k, v in sorted(values.items()) if v is not None)
        if text:
            rows.append(f"<b>{_e(part)}</b>: {_e(text)}")
    if e.context.get("target"):
        rows.insert(0, f"<b>target</b>: {_e(e.context['target'])}")
    return f"<details><summary>context</summary>{'<br>'.join(rows)}</details>" if rows else ""


def _numbers(e: OomEvent) -> str:
    first = ("requested_tokens", "available_tokens")
    items = [(k, e.numbers[k]) for k in first if e.numbers.get(k) is not None]
    items += [(k, v) for k, v in e.numbers.items() if k not in first and v is not None]
    if e.phase:
        items.append(("phase", e.phase + (f"/{e.subphase}" if e.subphase else "")))
    for p in e.pools:
        known = " ".join(f"{k}={v}" for k, v in p.as_dict().items() if k != "pool" and v is not None)
        items.append((f"pool {p.name}", known or "no sizes given"))
    if e.inferred:
        items.append(("kind", "inferred from traceback frames"))
    return "<br>".join(f"{_e(k)}: {_e(v)}" for k, v in items) or "-"
