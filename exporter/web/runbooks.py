"""The runbooks at /runbooks/, served by the exporter itself: readable where GitHub is not (a cluster without
internet access), and always those of the running version and catalog.

The markdown comes from the same renderer that writes docs/runbooks/ (render/runbooks.py), run on the
catalog the daemon loaded (a custom catalog gets its own runbooks; a SIGHUP reload, new ones), once per
catalog and only when a runbook is first asked for, so `serve` never imports the renderer otherwise. This
module turns that markdown into plain HTML: only the constructs the renderer writes (headings, paragraphs,
lists, tables, fenced code, `<details>` blocks, code spans, bold and links), every text escaped. Headings get
GitHub's anchors, so `README.md#<kind>` means the same section here as in the repository. Pure rendering;
routes.py serves it.
"""

from __future__ import annotations

import html
import re
import threading
from collections.abc import Callable, Iterator

from .. import __version__
from ..catalog import Catalog

INDEX = "README.md"
_DETAILS = re.compile(r"<details><summary>(.*)</summary>")
_HEADING = re.compile(r"(#{1,6}) (.*)")
_LIST_ITEM = re.compile(r"(?:[-*]|(\d+)\.) (.*)")
_INLINE = re.compile(r"`([^`]*)`|\*\*(.+?)\*\*|\[([^\]]+)\]\(([^)\s]+)\)")
_STYLE = (
    "body{font-family:sans-serif;margin:1.5em;max-width:70em}table{border-collapse:collapse}"
    "th,td{border:1px solid #ccc;padding:.3em .5em;text-align:left;vertical-align:top}th{background:#eee}"
    "pre{background:#f6f6f6;padding:.6em;overflow-x:auto}code{white-space:pre-wrap}"
)


class RunbookPages:
    """The runbook pages of a catalog, rendered on first use and kept until the catalog changes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._catalog: Catalog | None = None
        self._pages: dict[str, str] = {}

    def page(self, catalog: Catalog, name: str) -> str | None:
        """The HTML of one runbook file (`README.md` is the index, as in docs/runbooks/); None if there is none."""
        with self._lock:
            if self._catalog is not catalog:
                self._pages, self._catalog = _markdown_pages(catalog), catalog
            text = self._pages.get(name)
        return None if text is None else render_html(text)


def _markdown_pages(catalog: Catalog) -> dict[str, str]:
    """{file name: markdown} of docs/runbooks/ as `render` writes it for this catalog."""
    from ..render.options import RenderOptions
    from ..render.runbooks import RUNBOOK_DIR, render_runbooks

    files = render_runbooks(catalog, RenderOptions(), {})
    return {path.removeprefix(RUNBOOK_DIR + "/"): text for path, text in files.items()}


def render_html(markdown: str) -> str:
    """One runbook page as a standalone HTML document."""
    body = markdown_html(markdown)
    title = next((line[2:] for line in markdown.splitlines() if line.startswith("# ")), "Runbook")
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{_STYLE}</style></head>'
        f'<body><p><a href="{INDEX}">All runbooks</a> &middot; <a href="../">recent OOM events</a> &middot; '
        f"sglang-oom-exporter {_e(__version__)}</p>\n{body}</body></html>\n"
    )


def markdown_html(markdown: str) -> str:
    """The HTML of the markdown subset the runbook renderer writes."""
    return "".join(_blocks(markdown.splitlines(), _Slugger()))


def _blocks(lines: list[str], slugs: _Slugger) -> Iterator[str]:
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if not stripped or (stripped.startswith("<!--") and stripped.endswith("-->")):
            i += 1
        elif stripped.startswith("```"):
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), len(lines))
            yield f"<pre><code>{_e(chr(10).join(lines[i + 1 : end]))}</code></pre>\n"
            i = end + 1
        elif details := _DETAILS.fullmatch(stripped):
            yield f"<details><summary>{_inline(details.group(1))}</summary>\n"
            i += 1
        elif stripped == "</details>":
            yield "</details>\n"
            i += 1
        elif heading := _HEADING.fullmatch(stripped):
            level, text = len(heading.group(1)), heading.group(2)
            yield f'<h{level} id="{_e(slugs.slug(text))}">{_inline(text)}</h{level}>\n'
            i += 1
        elif stripped.startswith("|"):
            end = _run(lines, i, lambda s: s.startswith("|"))
            yield _table([row.strip() for row in lines[i:end]])
            i = end
        elif _LIST_ITEM.fullmatch(stripped):
            end = _run(lines, i, lambda s: _LIST_ITEM.fullmatch(s) is not None)
            items = [_LIST_ITEM.fullmatch(row.strip()) for row in lines[i:end]]
            tag = "ol" if items[0] and items[0].group(1) else "ul"
            yield f"<{tag}>" + "".join(f"<li>{_inline(m.group(2))}</li>" for m in items if m) + f"</{tag}>\n"
            i = end
        else:
            end = _run(lines, i, lambda s: not _starts_block(s))
            yield f"<p>{_inline(' '.join(row.strip() for row in lines[i:end]))}</p>\n"
            i = end


def _run(lines: list[str], start: int, belongs: Callable[[str], bool]) -> int:
    """The end of the run of lines from start (which belongs) for which belongs(stripped line) holds."""
    end = start + 1
    while end < len(lines) and lines[end].strip() and belongs(lines[end].strip()):
        end += 1
    return end


def _starts_block(stripped: str) -> bool:
    return (
        stripped.startswith(("```", "|", "<details>", "</details>", "<!--"))
        or _HEADING.fullmatch(stripped) is not None
        or _LIST_ITEM.fullmatch(stripped) is not None
    )


def _table(rows: list[str]) -> str:
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    head, body = cells[0], [r for r in cells[1:] if not all(set(c) <= set("-: ") for c in r)]
    out = "<table><thead><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in head) + "</tr></thead><tbody>"
    out += "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in body)
    return out + "</tbody></table>\n"


def _inline(text: str) -> str:
    """Escaped text with code spans, bold and links; a link goes only to a relative or http(s) target."""
    out, pos = [], 0
    for m in _INLINE.finditer(text):
        out.append(_e(text[pos : m.start()]))
        code, bold, label, href = m.groups()
        if code is not None:
            out.append(f"<code>{_e(code)}</code>")
        elif bold is not None:
            out.append(f"<strong>{_inline(bold)}</strong>")
        elif re.match(r"[a-z][a-z0-9+.-]*:", href, re.I) and not href.lower().startswith(("http:", "https:")):
            out.append(_inline(label))  # javascript:, data: ...: the label, never the link
        else:
            out.append(f'<a href="{_e(href)}">{_inline(label)}</a>')
        pos = m.end()
    out.append(_e(text[pos:]))
    return "".join(out)


class _Slugger:
    """GitHub's heading anchors: lower case, punctuation but `-` and `_` dropped, spaces to `-`, and `-1`,
    `-2`... on repeats within a page."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}

    def slug(self, heading: str) -> str:
        base = github_slug(heading)
        n = self._seen.get(base, 0)
        self._seen[base] = n + 1
        return base if n == 0 else f"{base}-{n}"


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading's text (before de-duplication)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's label only
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)
