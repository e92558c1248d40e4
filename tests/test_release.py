"""Something to pull: the release workflow (actionlint, and what it publishes), the version check it runs, and the
chart's defaults and README pointing at what it publishes."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sglang_oom_exporter import __version__
from tests.support.helm import CHART, ROOT, helm

WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
IMAGE = "ghcr.io/sglang-oom-exporter/sglang-oom-exporter"
CHARTS = "oci://ghcr.io/sglang-oom-exporter/charts"


def _actionlint() -> str:
    here = Path(sys.executable).parent / "actionlint"
    found = str(here) if here.is_file() else shutil.which("actionlint")
    if found is None:
        pytest.skip("actionlint is not installed (pip install -e '.[dev]' brings it, on Linux and Windows)")
    return found


def _lint(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_actionlint(), "-no-color", *map(str, paths)], capture_output=True, text=True, timeout=60,
                          check=False, cwd=ROOT)  # fmt: skip


def test_actionlint_passes_every_workflow():
    workflows = sorted((ROOT / ".github" / "workflows").glob("*.y*ml"))
    assert WORKFLOW in workflows
    proc = _lint(*workflows)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_catches_a_broken_copy(tmp_path):
    # The same workflow with one misspelt action input and one undefined job output: both are reported.
    text = WORKFLOW.read_text()
    broken = text.replace("platforms: linux/amd64", "platfroms: linux/amd64").replace(
        "needs.version.outputs.version }}\n          push", "needs.version.outputs.versoin }}\n          push"
    )
    assert broken.count("platfroms") == 1
    assert "versoin" in broken
    path = tmp_path / ".github" / "workflows" / "release.yml"
    path.parent.mkdir(parents=True)
    path.write_text(broken)
    proc = _lint(path)
    assert proc.returncode == 1
    assert '"platfroms"' in proc.stdout
    assert '"versoin"' in proc.stdout


def _release_version(tag: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "tools" / "release-version.py"), tag], capture_output=True,
                          text=True, timeout=30, check=False)  # fmt: skip


def test_the_version_check_accepts_the_package_tag_and_refuses_others():
    ok = _release_version(f"v{__version__}")
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, f"{__version__}\n", "")
    bad = _release_version("v9.9.9")
    assert bad.returncode == 1
    assert bad.stdout == ""
    assert bad.stderr == f"release-version: tag v9.9.9 is not v{__version__} (the package version)\n"
    assert _release_version(__version__).returncode == 1  # the tag carries the v


def test_the_workflow_publishes_what_the_chart_installs():
    flow = yaml.safe_load(WORKFLOW.read_text())
    assert flow[True] == {"push": {"tags": ["v*"]}}  # YAML 1.1 reads the key `on` as true
    assert flow["env"] == {"IMAGE": IMAGE, "CHARTS": CHARTS}
    jobs = flow["jobs"]
    check = " ".join(step.get("run", "") for step in jobs["version"]["steps"])
    assert 'tools/release-version.py "$TAG"' in check
    (build,) = [s["with"] for s in jobs["image"]["steps"] if s["uses"].startswith("docker/build-push-action@")]
    assert build["platforms"].split(",") == ["linux/amd64", "linux/arm64"]
    assert build["tags"] == "${{ env.IMAGE }}:${{ needs.version.outputs.version }}"
    assert build["build-args"] == "VERSION=${{ needs.version.outputs.version }}"
    assert build["push"] is True
    assert jobs["image"]["permissions"]["packages"] == "write"
    # The chart is pushed only once the image it points at exists.
    assert set(jobs["chart"]["needs"]) == {"version", "image"}
    script = jobs["chart"]["steps"][-1]["run"]
    assert 'helm push "dist/sglang-oom-exporter-$VERSION.tgz" "$CHARTS"' in script
    # The chart's default image is that image, at the chart's appVersion.
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"] == {"repository": IMAGE, "tag": "", "pullPolicy": "IfNotPresent"}
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == __version__


@pytest.mark.e2e
def test_chart_readme_first_command_installs_the_published_chart(tmp_path):
    text = (CHART / "README.md").read_text()
    first = re.search(r"```sh\n(.*?)\n```", text, re.S)
    assert first is not None
    command = first.group(1).replace("\\\n", " ").splitlines()[0]
    argv = shlex.split(command)
    assert argv[:4] == ["helm", "install", "sglang-oom-exporter", f"{CHARTS}/sglang-oom-exporter"]
    assert argv[argv.index("--version") + 1] == __version__
    # The same flags on the chart in this checkout render the published image.
    local = [str(CHART) if a == argv[3] else a for a in argv[2:]]
    proc = subprocess.run([helm(), "template", *local], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == f"{IMAGE}:{__version__}"


@pytest.mark.e2e
def test_notes_say_which_image_runs_and_where_it_comes_from():
    def notes(*extra: str) -> str:
        proc = subprocess.run([helm(), "install", "--dry-run=client", "t", str(CHART), "-n", "monitoring", *extra],
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split("NOTES:", 1)[1]

    published = notes()
    assert f"Image: {IMAGE}:{__version__}\n  published by the project's {__version__} release" in published
    custom = notes("--set", "image.repository=registry.example.com/soe", "--set", "image.tag=dev")
    assert "Image: registry.example.com/soe:dev (image.repository, image.tag)" in custom
    assert f"This is not the published image, {IMAGE}:{__version__}" in custom
    sidecar = notes("-f", str(CHART / "ci" / "sidecar-values.yaml"))
    assert f"with the image {IMAGE}:{__version__}" in sidecar
