"""Every link resolves: each link the project generates (alert rules, dashboards, runbooks, the chart as helm
renders it, the image label) and each link of the hand-written docs is mapped to a file of this repository and,
when it has one, a heading anchor of that file (GitHub's anchors); the test fails on any that does not exist.

Generated links are absolute: pyproject.toml's one project URL, `/blob/<DOCS_REF>/`, a path and an anchor.
Grafana's `${__field.labels.kind}`-style variables in a dashboard link stand for a kind id, so each is
checked with every kind of the catalog.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from sglang_oom_exporter.project import PROJECT_URL
from sglang_oom_exporter.render.options import DEFAULT_RUNBOOK_BASE_URL, DOCS_REF
from sglang_oom_exporter.render.projecturl import read_project_url
from sglang_oom_exporter.web.runbooks import github_slug
from tests.support.helm import CHART, ROOT, helm, helm_with_values
from tests.support.helpers import CATALOG, load_toml

RULES = ROOT / "alerts" / "sglang-oom.rules.yaml"
BLOB = f"{PROJECT_URL}/blob/{DOCS_REF}/"
TREE = f"{PROJECT_URL}/tree/{DOCS_REF}/"
# Hand-written markdown whose links must resolve (generated runbooks are checked as generated links).
DOCS = sorted(
    [ROOT / n for n in ("README.md", "CHANGELOG.md", "CONTRIBUTING.md", "RELIABILITY.md")]
    + list((ROOT / "docs").glob("*.md"))
    + [CHART / "README.md", ROOT / "bench" / "README.md", ROOT / "tests" / "schemas" / "README.md"]
)
_GRAFANA_VARIABLE = re.compile(r"\$\{__(?:field\.labels|data\.fields)\.kind\}")
_MD_LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)\)")
_URL = re.compile(r"https?://[^\s\"'`<>)\]\\]+")


def _anchors(path: Path) -> set[str]:
    """GitHub's anchors of a markdown file: its headings (outside code fences, repeats numbered) and <a id/name>."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        heading = re.match(r" {0,3}#{1,6} +(.*?) *#*$", line)
        if heading:
            base = github_slug(heading.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            anchors.add(base if n == 0 else f"{base}-{n}")
        anchors.update(re.findall(r'<a (?:id|name)="([^"]+)"', line))
    return anchors


def _resolve(target: str, origin: Path) -> str | None:
    """Why a link in the file origin does not resolve, or None when it does: a repository file (a folder for
    /tree/) and anchor; a relative link is relative to origin's folder, a bare #anchor is in origin itself."""
    base_dir = origin.parent
    if target == PROJECT_URL:
        return None
    if target.startswith(BLOB):
        rel, want_dir = target[len(BLOB) :], False
        base_dir = ROOT
    elif target.startswith(TREE):
        rel, want_dir = target[len(TREE) :], True
        base_dir = ROOT
    elif target.startswith(PROJECT_URL):
        return f"a project link not at {BLOB} or {TREE}"
    elif re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):
        return None  # another site: not ours to check
    else:
        rel, want_dir = target, False
    path_part, _, anchor = rel.partition("#")
    path = (base_dir / path_part).resolve() if path_part else origin
    if path is not None:
        if not path.is_relative_to(ROOT):
            return "outside the repository"
        if not path.exists():
            return f"no file {path.relative_to(ROOT)}"
        if want_dir and not path.is_dir():
            return f"{path.relative_to(ROOT)} is not a folder"
    if anchor:
        if path.suffix != ".md":
            return f"an anchor #{anchor} outside a markdown file"
        if anchor not in _anchors(path):
            return f"no heading #{anchor} in {path.relative_to(ROOT)}"
    return None


def _expand(url: str) -> list[str]:
    """The URL with a Grafana kind variable replaced by every kind id (or as it is)."""
    if _GRAFANA_VARIABLE.search(url):
        return [_GRAFANA_VARIABLE.sub(kind, url) for kind in CATALOG.ids]
    return [url]


def _check(links: list[tuple[str, str, Path]]) -> list[str]:
    broken = []
    for name, url, origin in links:
        for target in _expand(url):
            why = _resolve(target, origin)
            if why:
                broken.append(f"{name}: {target}: {why}")
    return broken


def _project_urls(text: str) -> list[str]:
    return [u.rstrip(".,;:") for u in _URL.findall(text) if u.startswith(PROJECT_URL)]


def _markdown_links(path: Path) -> list[str]:
    """The link targets of a markdown file, outside code fences and code spans."""
    text = re.sub(r"^ *```.*?^ *```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)
    return _MD_LINK.findall(text)


# ------------------------------------------------------------------------------------------------ the project URL


def test_the_project_url_is_declared_once_in_pyproject_and_the_package_carries_that_one():
    text = (ROOT / "pyproject.toml").read_text()
    assert load_toml(ROOT / "pyproject.toml")["project"]["urls"] == {"Homepage": PROJECT_URL}
    assert read_project_url(text) == PROJECT_URL
    assert f"{PROJECT_URL}/blob/main/docs/runbooks" == DEFAULT_RUNBOOK_BASE_URL
    # No module but the generated one spells the URL out.
    spelled = [p.relative_to(ROOT) for p in (ROOT / "exporter").rglob("*.py") if PROJECT_URL in p.read_text()]
    assert [str(p) for p in spelled] == ["exporter/project.py"]


def test_read_project_url_reads_only_the_urls_table():
    text = '[project]\nname = "x"\nHomepage = "https://wrong"\n[project.urls]\n# c\nHomepage = "https://a.example/b/"  # x\n'
    assert read_project_url(text) == "https://a.example/b"
    assert read_project_url('[project]\nHomepage = "https://wrong"\n') is None


def test_the_image_label_is_the_project_url():
    labels = dict(re.findall(r'(org\.opencontainers\.image\.[a-z]+)="([^"]*)"', (ROOT / "Dockerfile").read_text()))
    assert labels["org.opencontainers.image.source"] == PROJECT_URL


# -------------------------------------------------------------------------------------------- generated links


def _generated_links() -> dict[str, list[tuple[str, str, Path]]]:
    """{where: [(name, link, the file it is in)]} of every file render writes."""
    out: dict[str, list[tuple[str, str, Path]]] = {}
    rules = yaml.safe_load(RULES.read_text())
    out["rules"] = [
        (f"rules {r['alert']}", r["annotations"]["runbook_url"], RULES)
        for g in rules["groups"] for r in g["rules"] if "alert" in r
    ]  # fmt: skip
    out["dashboards"] = [
        (f"dashboards/{p.name}", url, p)
        for p in sorted((ROOT / "dashboards").glob("*.json")) for url in _project_urls(p.read_text())
    ]  # fmt: skip
    out["runbooks"] = [
        (f"docs/runbooks/{p.name}", url, p)
        for p in sorted((ROOT / "docs" / "runbooks").glob("*.md")) for url in _markdown_links(p) + _project_urls(p.read_text())
    ]  # fmt: skip
    chart_files = [CHART / "Chart.yaml", *sorted((CHART / "files").rglob("*.*"))]
    out["chart files"] = [
        (str(p.relative_to(ROOT)), url, p) for p in chart_files for url in _project_urls(p.read_text())
    ]
    return out


def test_every_generated_link_resolves_to_a_file_and_heading_of_the_repository():
    links = _generated_links()
    counts = {where: len(items) for where, items in links.items()}
    # 19 alerts; the overview's 28 links; per runbook page its index link(s), and the index sections' 13 alert
    # links; the chart's home and sources, the defaults' base, and the copies of the rules (19) and the dashboard (28).
    assert counts == {"rules": 19, "dashboards": 28, "runbooks": 19 * 1 + 19 + 13, "chart files": 2 + 1 + 19 + 28}
    assert _check([item for items in links.values() for item in items]) == []


def test_the_link_check_catches_a_missing_file_a_missing_heading_and_another_ref():
    bad = [
        ("x", f"{BLOB}docs/runbooks/nope.md", RULES),
        ("x", f"{BLOB}docs/runbooks/README.md#no_such_kind", RULES),
        ("x", f"{PROJECT_URL}/blob/v0.1.0/docs/runbooks/README.md", RULES),
        ("x", "../../../etc/passwd", ROOT / "README.md"),
        ("x", "CHANGELOG.md#nope", ROOT / "README.md"),
        ("x", "#nope", ROOT / "README.md"),
        ("x", "#nope", RULES),
    ]
    assert len(_check(bad)) == len(bad)
    assert _check([("x", f"{BLOB}docs/runbooks/README.md#${{__field.labels.kind}}", RULES)]) == []
    assert _check([("x", "#more-documentation", ROOT / "README.md")]) == []


@pytest.mark.e2e
@pytest.mark.parametrize("base", [None, "https://wiki.example.com/sglang/runbooks"])
def test_the_chart_as_rendered_links_only_what_exists_and_one_setting_moves_every_link(base):
    values = {"prometheusRule": {"enabled": True}, "grafanaDashboards": {"enabled": True}}
    if base:
        values["runbookBaseUrl"] = base
    result = helm_with_values([helm(), "template", "t", str(CHART)], (), values)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    ours = _project_urls(text)
    if base is None:
        assert len(ours) == 19 + 28
        assert _check([("helm template", url, CHART / "Chart.yaml") for url in ours]) == []
    else:
        assert ours == []  # not one link left at the project
        assert len(re.findall(re.escape(base) + r"/(?:README\.md|sglang[a-z]+\.md)", text)) == 19 + 28


# ---------------------------------------------------------------------------------------- hand-written docs


def test_every_link_of_the_hand_written_docs_resolves():
    links = [(str(p.relative_to(ROOT)), url, p) for p in DOCS for url in _markdown_links(p)]
    links += [(str(p.relative_to(ROOT)), url, p) for p in DOCS for url in _project_urls(p.read_text())]
    assert len(links) >= 60  # README alone has 28
    assert _check(links) == []
