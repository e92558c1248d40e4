"""`sglang-oom-exporter render`: the committed generated files are fresh, and --check notices when they are not.

Every renderer registered in render/renderers() (alerts, runbooks, dashboards, the chart's copies) is covered:
the check compares all of their files with the working tree, and each renderer must contribute at least one.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sglang_oom_exporter.catalog import load_catalog
from sglang_oom_exporter.cli import main
from sglang_oom_exporter.render import checkout_files, render_all, renderers
from sglang_oom_exporter.render.alerts import ALERTMANAGER_PATH, RULES_PATH
from sglang_oom_exporter.render.options import RenderOptions
from sglang_oom_exporter.render.runbooks import INDEX

ROOT = Path(__file__).resolve().parent.parent
CATALOG = load_catalog()


@pytest.fixture
def render(capsys):
    """Run `render` through cli.main() in this process (a subprocess costs about 0.3 s of CPU to start)."""

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        capsys.readouterr()  # only this run's output
        code = main(["render", *args])
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["render", *args], code, out, err)

    return run


@pytest.fixture(scope="module")
def fresh() -> dict[str, str]:
    """A fresh render with the defaults, made once: the files every test compares with."""
    return render_all(CATALOG)


def test_the_committed_files_are_a_fresh_render(fresh):
    # In the checkout render also writes exporter/project.py, pyproject's URL (render.checkout_files).
    files = fresh | checkout_files(CATALOG, ROOT)
    # A process, from the repository root with the default OUT_DIR: the check exactly as CI runs it.
    proc = subprocess.run([sys.executable, "-m", "sglang_oom_exporter", "render", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 0, f"stale generated files; run `sglang-oom-exporter render`:\n{proc.stderr}"
    assert proc.stdout.strip() == f"render --check: {len(files)} of {len(files)} generated files up to date"
    if (ROOT / ".git").exists():  # and committed, not just rendered locally
        listed = subprocess.run(["git", "ls-files", *files], cwd=ROOT, capture_output=True, text=True, check=True)
        assert sorted(listed.stdout.split()) == sorted(files)


def test_every_renderer_contributes_and_the_pack_files_are_among_them(fresh):
    files: dict[str, str] = {}
    for renderer in renderers():
        produced = renderer(CATALOG, RenderOptions(), dict(files))
        assert produced, f"{renderer.__name__} wrote nothing"
        files.update(produced)
    assert files == fresh
    assert {RULES_PATH, ALERTMANAGER_PATH, INDEX} <= set(files)
    assert [r.__name__ for r in renderers()][:2] == ["render_alerts", "render_runbooks"]


def test_check_names_each_stale_or_missing_file_and_writes_nothing(render, fresh, tmp_path):
    assert render(str(tmp_path)).returncode == 0
    rules = tmp_path / RULES_PATH
    rules.write_text(rules.read_text().replace("for: 0m", "for: 5m", 1))
    (tmp_path / INDEX).unlink()
    proc = render("--check", str(tmp_path))
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"stale: {RULES_PATH} (run: sglang-oom-exporter render)",
        f"stale: {INDEX} (run: sglang-oom-exporter render)",
    ]
    assert not (tmp_path / INDEX).exists()
    again = render(str(tmp_path))
    assert again.stdout.splitlines()[0] == f"render: {len(fresh)} files, 2 changed"
    assert render("--check", str(tmp_path)).returncode == 0


def test_runbook_and_grafana_urls_flow_into_the_rules(render, tmp_path):
    proc = render("--runbook-base-url", "https://wiki.example.com/runbooks/", "--grafana-url",
                  "https://grafana.example.com/", str(tmp_path))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rules = [
        r for g in yaml.safe_load((tmp_path / RULES_PATH).read_text())["groups"] for r in g["rules"] if "alert" in r
    ]
    for rule in rules:
        ann = rule["annotations"]
        assert ann["runbook_url"] == f"https://wiki.example.com/runbooks/{rule['alert'].lower()}.md"
        assert ann["dashboard_url"].startswith("https://grafana.example.com/d/sglang-oom-overview?from=now-3h&to=now")
    # The committed files are rendered with the defaults: a render with other URLs is not "fresh".
    assert render("--check", str(tmp_path)).returncode == 1


def test_a_runbook_url_template_without_the_md_suffix_moves_every_link(render, tmp_path):
    """A wiki's pages have no .md: every rule's runbook_url and every dashboard link follow the template."""
    base = "https://wiki.example.com/sglang"
    proc = render("--runbook-base-url", base, "--runbook-url-template", "{base}/{page}", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    rules = [
        r for g in yaml.safe_load((tmp_path / RULES_PATH).read_text())["groups"] for r in g["rules"] if "alert" in r
    ]
    assert len(rules) == len({r["alert"] for r in rules}) >= 17
    for rule in rules:
        assert rule["annotations"]["runbook_url"] == f"{base}/{rule['alert'].lower()}", rule["alert"]
    dashboard = (tmp_path / "dashboards" / "sglang-oom-overview.json").read_text()
    links = re.findall(r'"url": "(https://wiki\.example\.com/[^"]*)"', dashboard)
    assert links
    assert all(link == f"{base}/README" or link.startswith(f"{base}/README#") for link in links), links
    assert ".md" not in "".join(links)


@pytest.mark.parametrize(
    ("template", "why"),
    [
        ("{base}/runbook", "'{base}/runbook' has no {page}: every alert would link the same page"),
        ("{base}/{page}{anchor}", "'{base}/{page}{anchor}' names anchor; only {base} and {page} exist"),
        ("{base}/{page", "'{base}/{page': expected '}' before end of string"),
    ],
)
def test_a_bad_runbook_url_template_is_a_usage_error(render, tmp_path, template, why):
    proc = render("--runbook-url-template", template, str(tmp_path))
    assert (proc.returncode, proc.stderr) == (2, f"sglang-oom-exporter: bad --runbook-url-template: {why}\n")
    assert not (tmp_path / RULES_PATH).exists()


def test_a_bad_catalog_is_a_usage_error(render, tmp_path):
    data = yaml.safe_load(Path(CATALOG.path).read_text())
    data["alert_pack"]["crash_loop"]["for"] = "2 hours"
    data["kinds"][0]["alert"]["for"] = "10m"  # not below its 5m window
    bad = tmp_path / "catalog.yaml"
    bad.write_text(yaml.safe_dump(data, sort_keys=False))
    proc = render("--catalog", str(bad), "--check", str(tmp_path))
    assert proc.returncode == 2
    assert "alert_pack.crash_loop.for: '2 hours' is not a Prometheus duration" in proc.stderr
    assert "kinds[prefill].alert.for: must be shorter than the window (5m)" in proc.stderr
