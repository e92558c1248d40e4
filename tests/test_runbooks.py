"""The runbooks: a page per alert with its four parts, an anchor per kind, and links that resolve.

Offline checks over the committed docs/runbooks/ (test_render.py proves they are fresh). Anchors are computed
the way GitHub computes them from headings (lower-case, spaces to `-`, other punctuation dropped, `-1`
suffixes for repeats), so a link that works here works on the rendered page.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import yaml

from sglang_oom_exporter.catalog import load_catalog
from sglang_oom_exporter.render.alerts import RULES_PATH, alert_pack
from sglang_oom_exporter.render.options import RenderOptions, runbook_kind_url, runbook_page_url
from sglang_oom_exporter.render.runbooks import INDEX, PARTS, RUNBOOK_DIR, render_runbooks

ROOT = Path(__file__).resolve().parent.parent
CATALOG = load_catalog()
SPECS = alert_pack(CATALOG)
BASE = "https://runbooks.example.com/sglang"


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub generates for a Markdown file's headings, plus explicit <a id> / <a name> ones."""
    seen: dict[str, int] = {}
    anchors = set(re.findall(r'<a (?:id|name)="([^"]+)"', markdown))
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        m = re.match(r"^#{1,6} (.+?)\s*#*$", line)
        if in_code or not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _sections(markdown: str, level: str) -> dict[str, str]:
    """Heading text -> body, for headings of exactly this level (e.g. "## ")."""
    out: dict[str, str] = {}
    parts = re.split(rf"^{level}(.+)$", markdown, flags=re.M)
    for title, body in zip(parts[1::2], parts[2::2], strict=True):
        out[title.strip()] = body
    return out


def _page(name: str) -> str:
    return (ROOT / RUNBOOK_DIR / f"{name.lower()}.md").read_text()


def test_github_anchor_rules_as_implemented():
    text = "# SGLang OOM: a page\n## req_slots\n## Meaning\n### Meaning\n```\n## not a heading\n```\n"
    assert github_anchors(text) == {"sglang-oom-a-page", "req_slots", "meaning", "meaning-1"}


def test_every_alert_has_a_page_and_every_page_an_alert():
    pages = {p.name for p in (ROOT / RUNBOOK_DIR).glob("*.md")}
    assert pages == {f"{s.name.lower()}.md" for s in SPECS} | {Path(INDEX).name}


def test_every_runbook_url_in_the_rules_points_at_an_existing_page():
    rules = [r for g in yaml.safe_load((ROOT / RULES_PATH).read_text())["groups"] for r in g["rules"] if "alert" in r]
    assert len(rules) == len(SPECS)
    default = RenderOptions()
    for rule in rules:
        url = rule["annotations"]["runbook_url"]
        assert url == runbook_page_url(default, rule["alert"])
        relative = url.removeprefix(default.runbook_base_url + "/")
        assert "#" not in relative
        assert relative == relative.lower()
        assert (ROOT / RUNBOOK_DIR / relative).is_file(), url


def test_each_page_has_the_four_parts_in_order_and_says_what_pages():
    for spec in SPECS:
        text = _page(spec.name)
        assert text.startswith(f"# {spec.name}\n"), spec.name
        headings = re.findall(r"^## (.+)$", text, flags=re.M)
        assert headings == list(PARTS), (spec.name, headings)
        body = _sections(text, "## ")
        assert all(len(body[p].split()) >= 8 for p in PARTS), spec.name  # no empty section
        assert f"**Severity:** `{spec.severity}`" in text
        assert spec.expr.strip() in text  # the rule itself, for whoever wonders why it fired


def test_every_kind_is_an_anchor_of_the_index_with_the_four_parts():
    index = (ROOT / INDEX).read_text()
    anchors = github_anchors(index)
    sections = _sections(index, "## ")
    options = RenderOptions(runbook_base_url=BASE)
    for kind in CATALOG.kinds:
        url = runbook_kind_url(options, kind.id)  # what the dashboards link to
        page, anchor = url.removeprefix(BASE + "/").split("#")
        assert page == Path(INDEX).name
        assert anchor == kind.id == kind.id.lower(), kind.id
        assert anchor in anchors, kind.id
        subparts = re.findall(r"^### (.+)$", sections[kind.id], flags=re.M)
        assert subparts == list(PARTS), (kind.id, subparts)
        # no section without an alert: each kind section links the alerts that fire on it
        links = re.findall(r"\]\((sglang\w+\.md)\)", sections[kind.id].split("\n\n")[1])
        assert links, kind.id
        assert all((ROOT / RUNBOOK_DIR / link).is_file() for link in links), kind.id
    assert set(sections) == set(CATALOG.event_ids)  # the kinds and the non-memory crash


def test_diagnosis_has_the_commands_an_on_call_can_paste():
    for spec in SPECS:
        diagnosis = _sections(_page(spec.name), "## ")["Diagnosis"]
        assert "```sh\n" in diagnosis, spec.name
        if spec.kind is not None:
            kind = spec.kind.id
            assert "kubectl logs -n NAMESPACE POD -c CONTAINER --previous | sglang-oom-exporter scan -" in diagnosis
            assert (
                f"curl -s 'http://127.0.0.1:9877/events?limit=50' | jq '.events[] | select(.kind == \"{kind}\")'"
                in diagnosis
            )
            for anchor in spec.kind.anchors:
                assert f"-e '{anchor}'" in diagnosis, (spec.name, anchor)
        else:
            assert re.search(r"curl -s '?http://127\.0\.0\.1:9877/", diagnosis), spec.name


def test_mitigation_lists_the_catalog_flags_in_order_with_their_sglang_versions():
    versions = CATALOG.alert_pack["flag_versions"]
    for kind in CATALOG.kinds:
        for step in kind.steps:
            assert step.flag in versions, f"{kind.id}: add {step.flag} to alert_pack.flag_versions in the catalog"
    for spec in SPECS:
        if spec.kind is None:
            continue
        mitigation = _sections(_page(spec.name), "## ")["Mitigation"]
        lines = [line for line in mitigation.splitlines() if re.match(r"^\d+\. ", line)]
        assert len(lines) == len(spec.kind.steps), spec.name
        for i, (line, step) in enumerate(zip(lines, spec.kind.steps, strict=True), 1):
            flag = f"`{step.flag}`" if step.flag != "none" else "No flag"
            assert line.startswith(f"{i}. {flag}: {step.action}."), line
            assert line.endswith(f"SGLang: {versions[step.flag]}."), line


def test_a_kinds_own_diagnosis_hint_leads_its_diagnosis():
    prefill = CATALOG.kind("prefill")
    hint = "Look for one very long prompt in the request log just before the failure."
    kind = replace(prefill, runbook={**prefill.runbook, "diagnosis": hint})
    catalog = replace(CATALOG, kinds=tuple(kind if k.id == "prefill" else k for k in CATALOG.kinds))
    page = render_runbooks(catalog, RenderOptions(), {})[f"{RUNBOOK_DIR}/sglangprefilloom.md"]
    assert _sections(page, "## ")["Diagnosis"].startswith(f"\n\n{hint}\n\nThe alert's labels say where")
    assert hint not in _page("SGLangPrefillOOM")  # the shipped catalog has none


def test_every_mirrored_series_a_runbook_names_is_exported():
    from sglang_oom_exporter.metrics.collector import TARGET_VALUES

    exported = {
        f"sglang_oom_target_{name}{'_total' if typ == 'counter' else ''}" for name, typ, _ in TARGET_VALUES.values()
    } | {
        f"sglang_oom_target_{n}"
        for n in (
            "up",
            "scrape_duration_seconds",
            "scrape_errors_total",
            "server_info_errors_total",
            "server_arg",
            "last_success_timestamp_seconds",
        )
    }
    # a full name, then `..._x` / `…_x` short for the same prefix (the catalog's prose abbreviates so); a
    # recording rule's name (`target:sglang_oom_target_…:rate15m`) is not a series of the exporter's
    token = re.compile(r"(?<![:\w])(sglang_oom_target_|(?:\.\.\.|…)_)([a-z0-9_]*[a-z0-9])(?![:\w])")
    named: dict[str, set[str]] = {}
    for path in sorted((ROOT / RUNBOOK_DIR).glob("*.md")):
        found = token.findall(path.read_text())
        full = [i for i, (head, _) in enumerate(found) if head == "sglang_oom_target_"]
        if full:
            named[path.name] = {f"sglang_oom_target_{tail}" for _, tail in found[full[0] :]}
    unknown = {page: sorted(names - exported) for page, names in named.items() if names - exported}
    assert unknown == {}
    # SGLang 0.5.23's series beside the kinds they explain: the PD pre-allocation shares and the host mamba pool.
    assert {
        "sglang_oom_target_prealloc_full_token_usage",
        "sglang_oom_target_prealloc_swa_token_usage",
        "sglang_oom_target_decode_deferred_kv_release_requests",
    } <= named["sglangpdpreallocoom.md"]
    assert {
        "sglang_oom_target_hicache_host_mamba_used_states",
        "sglang_oom_target_hicache_host_mamba_total_states",
    } <= named["sglangmambaoom.md"]
