"""The runbooks the exporter serves itself at /runbooks/: the same text as docs/runbooks/, as HTML whose every
link and anchor resolves within /runbooks/, linked from each event of the events page.

Servers listen on 127.0.0.1 port 0 and are stopped by the fixture.
"""

from __future__ import annotations

import http.client
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest
from prometheus_client import CollectorRegistry

from sglang_oom_exporter.detect.model import OomEvent
from sglang_oom_exporter.events.store import EventStore, Health
from sglang_oom_exporter.web.runbooks import _markdown_pages, markdown_html
from sglang_oom_exporter.web.server import ExporterServer
from tests.support.helpers import CATALOG

ROOT = Path(__file__).resolve().parent.parent
RUNBOOKS = ROOT / "docs" / "runbooks"


@pytest.fixture
def server():
    store = EventStore()
    for n, kind in enumerate(CATALOG.ids, 1):
        store.add(_event(n, kind), {"pod": f"sglang-{n}"})
    srv = ExporterServer(
        ("127.0.0.1", 0), registry=CollectorRegistry(), catalog=CATALOG, events=store, health=lambda: Health(True, "")
    )
    srv.start()
    yield srv
    srv.stop()


def _event(n: int, kind: str) -> OomEvent:
    return OomEvent(kind=kind, fatal=True, source="web", location=f"server.log:{n}", time=None, ranks=("TP0",),
                    message=f"message {n}", excerpt=f"excerpt {n}")  # fmt: skip


def _get(srv, path, method="GET"):
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        return response.status, response.headers, response.read().decode()
    finally:
        conn.close()


class _Links(HTMLParser):
    """The hrefs and element ids of an HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        values = dict(attrs)
        if tag == "a" and values.get("href"):
            self.hrefs.append(values["href"])
        if values.get("id"):
            self.ids.add(values["id"])


def _parse(page: str) -> _Links:
    parser = _Links()
    parser.feed(page)
    return parser


def test_the_served_markdown_is_the_committed_docs_runbooks():
    pages = _markdown_pages(CATALOG)
    on_disk = {p.name: p.read_text() for p in RUNBOOKS.glob("*.md")}
    assert sorted(pages) == sorted(on_disk)
    assert len(pages) == 20  # 19 alert pages and the index
    assert pages == on_disk


def test_every_runbook_is_served_and_every_link_in_it_resolves_to_a_served_page_and_anchor(server):
    names = sorted(p.name for p in RUNBOOKS.glob("*.md"))
    parsed: dict[str, _Links] = {}
    for name in names:
        status, headers, page = _get(server, f"/runbooks/{name}")
        assert status == 200, name
        assert headers["Content-Type"] == "text/html; charset=utf-8"
        assert "default-src 'none'" in headers["Content-Security-Policy"]
        parsed[f"/runbooks/{name}"] = _parse(page)
    status, _, index = _get(server, "/runbooks/")
    assert status == 200
    parsed["/runbooks/"] = _parse(index)
    assert parsed["/runbooks/"].ids == parsed["/runbooks/README.md"].ids
    for kind in CATALOG.ids:  # the dashboards and the events page link these
        assert kind in parsed["/runbooks/"].ids, kind
    checked = 0
    for path, links in parsed.items():
        for href in links.hrefs:
            target = urlsplit(urljoin(f"http://x{path}", href))
            if target.path == "/":
                continue  # the events page
            assert target.path in parsed, f"{path} links {href}"
            assert not target.fragment or target.fragment in parsed[target.path].ids, f"{path} links {href}"
            checked += 1
    # Each of the 19 alert pages links the index twice (header and foot); the index (served twice) links itself
    # once, the 19 pages in its table, and the 13 alerts of the kinds (and the crash) in their sections.
    assert checked == 19 * 2 + 2 * (1 + 19 + 13)


def test_the_events_page_links_each_event_to_its_kind_section_of_the_served_runbooks(server):
    status, _, page = _get(server, "/")
    assert status == 200
    links = _parse(page)
    runbook_links = [h for h in links.hrefs if h.startswith("runbooks/")]
    assert runbook_links[0] == "runbooks/"  # the header's link to the index
    assert sorted(runbook_links[1:]) == sorted(f"runbooks/#{kind}" for kind in CATALOG.ids)
    _, _, index = _get(server, "/runbooks/")
    ids = _parse(index).ids
    assert all(h.split("#")[1] in ids for h in runbook_links[1:])


def test_runbooks_without_slash_redirects_and_unknown_pages_are_404(server):
    status, headers, _ = _get(server, "/runbooks")
    assert (status, headers["Location"]) == (301, "runbooks/")
    for path in ("/runbooks/nope.md", "/runbooks/../README.md", "/runbooks/x/README.md", "/runbooksx"):
        assert _get(server, path)[0] == 404, path
    status, headers, _ = _get(server, "/runbooks/", method="POST")
    assert (status, headers["Allow"]) == (405, "GET, HEAD")


def test_markdown_html_escapes_text_and_drops_links_to_other_schemes():
    html = markdown_html(
        "## <b>x</b>\n\nText <script>alert(1)</script> [ok](README.md#a) [bad](javascript:alert(1)) "
        '[q](a.md"onclick=x)\n\n| a | b |\n|---|---|\n| <x> | `y` |\n\n```\n<pre>\n```\n'
    )
    for tag in ("<script", "<b>", "<x>"):
        assert tag not in html
    assert '<a href="README.md#a">ok</a>' in html
    assert "javascript:" not in html
    assert 'href="a.md&quot;onclick=x"' in html
    assert "<pre><code>&lt;pre&gt;</code></pre>" in html


def test_headings_get_githubs_anchors_with_repeats_numbered():
    html = markdown_html("## Meaning\n\n## Meaning\n\n## req_slots\n\n## Flags: `--max-running-requests` (decode)\n")
    ids = ["meaning", "meaning-1", "req_slots", "flags---max-running-requests-decode"]
    assert re.findall(r'id="([^"]+)"', html) == ids
