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
    # The same workflow with one misspelt permission value and one undefined job output: both are reported.
    # (actionlint checks the inputs of an action only when it is referenced by a tag it knows, never by SHA.)
    text = WORKFLOW.read_text()
    broken = text.replace("id-token: write # cosign keyless signing", "id-token: writ").replace(
        "needs.version.outputs.version }}\n          sbom", "needs.version.outputs.versoin }}\n          sbom"
    )
    assert broken.count("id-token: writ\n") == 2
    assert "versoin" in broken
    path = tmp_path / ".github" / "workflows" / "release.yml"
    path.parent.mkdir(parents=True)
    path.write_text(broken)
    proc = _lint(path)
    assert proc.returncode == 1
    assert proc.stdout.count('"writ" is invalid as permission of scope "id-token"') == 2
    assert '"versoin"' in proc.stdout


PINNED = re.compile(r"^\s*(?:-\s+)?uses:\s+([\w.-]+/[\w./-]+)@([0-9a-f]{40}) # (v\d+(?:\.\d+)*)$")


def test_every_action_is_pinned_by_a_full_commit_sha_with_its_tag_in_a_comment():
    # A tag can be moved to other code after review; a commit cannot. The comment says which release it was.
    seen = []
    for workflow in sorted((ROOT / ".github" / "workflows").glob("*.y*ml")):
        for number, line in enumerate(workflow.read_text().splitlines(), 1):
            if re.match(r"^\s*(?:-\s+)?uses:", line):
                assert PINNED.match(line), f"{workflow.name}:{number}: {line.strip()}"
                seen.append(PINNED.match(line).group(1))  # type: ignore[union-attr]
    assert sorted(set(seen)) == [
        "actions/checkout",
        "actions/setup-python",
        "azure/setup-helm",
        "docker/build-push-action",
        "docker/login-action",
        "docker/setup-buildx-action",
        "docker/setup-qemu-action",
        "sigstore/cosign-installer",
    ]
    # The pattern refuses what it must: a tag, a short SHA, a branch, a SHA without its tag.
    for bad in ("uses: actions/checkout@v6", "uses: actions/checkout@8e8c483", "uses: actions/checkout@main",
                "uses: actions/checkout@8e8c483db84b4bee98b60c0593521ed34d9990e8"):  # fmt: skip
        assert PINNED.match(bad) is None, bad


def test_the_image_and_the_chart_are_signed_keyless_and_the_image_carries_an_sbom():
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    image, chart = jobs["image"], jobs["chart"]
    for job in (image, chart):
        assert job["permissions"] == {"contents": "read", "packages": "write", "id-token": "write"}
        uses = [s.get("uses", "").split("@")[0] for s in job["steps"]]
        assert uses.index("sigstore/cosign-installer") < len(uses) - 1  # installed before the signing step
    (build,) = [s for s in image["steps"] if s.get("uses", "").startswith("docker/build-push-action@")]
    assert build["id"] == "build"
    assert (build["with"]["sbom"], build["with"]["provenance"]) == (True, "mode=max")
    sign_image = image["steps"][-1]
    assert sign_image["env"] == {"DIGEST": "${{ steps.build.outputs.digest }}"}
    assert sign_image["run"] == 'cosign sign --yes "$IMAGE@$DIGEST"'  # by digest, never by a movable tag
    push, sign_chart = chart["steps"][-2:]
    assert push["id"] == "push"
    assert 'echo "digest=$digest" >> "$GITHUB_OUTPUT"' in push["run"]
    assert sign_chart["env"]["DIGEST"] == "${{ steps.push.outputs.digest }}"
    assert sign_chart["run"].splitlines()[-1] == 'cosign sign --yes "${CHARTS#oci://}/sglang-oom-exporter@$DIGEST"'
    # No job but these two may mint an OIDC token.
    assert [name for name, job in jobs.items() if "id-token" in (job.get("permissions") or {})] == ["image", "chart"]
    assert yaml.safe_load(WORKFLOW.read_text())["permissions"] == {"contents": "read"}


RELEASE_FILES = ("tools/release-version.py", "exporter/__init__.py", "pyproject.toml",
                 "helm/sglang-oom-exporter/Chart.yaml", "CHANGELOG.md")  # fmt: skip


def _release_version(tag: str, root: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(root / "tools" / "release-version.py"), tag], capture_output=True,
                          text=True, timeout=30, check=False)  # fmt: skip


def _tree(tmp_path: Path, changelog: str) -> Path:
    """A copy of what the version check reads, with this CHANGELOG.md."""
    for name in RELEASE_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "CHANGELOG.md").write_text(changelog)
    return tmp_path


def test_nothing_is_released_yet_so_the_check_refuses_the_tag_until_changelog_dates_it():
    # The truth today: no tag exists and CHANGELOG.md's section says so; tagging now would fail in the first job.
    assert re.search(r"^## (\S+) / (\S+)$", (ROOT / "CHANGELOG.md").read_text(), re.M).groups() == (  # type: ignore[union-attr]
        __version__,
        "unreleased",
    )
    refused = _release_version(f"v{__version__}")
    assert (refused.returncode, refused.stdout) == (1, "")
    assert refused.stderr == (
        f"release-version: CHANGELOG.md's {__version__} section is marked unreleased: "
        f"date it (## {__version__} / YYYY-MM-DD)\n"
    )


def test_the_version_check_accepts_the_package_tag_once_dated_and_refuses_others(tmp_path):
    text = (ROOT / "CHANGELOG.md").read_text()
    dated = text.replace(f"## {__version__} / unreleased", f"## {__version__} / 2027-01-15", 1)
    root = _tree(tmp_path / "dated", dated)
    ok = _release_version(f"v{__version__}", root)
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, f"{__version__}\n", "")
    bad = _release_version("v9.9.9", root)
    assert bad.returncode == 1
    assert bad.stdout == ""
    assert bad.stderr == f"release-version: tag v9.9.9 is not v{__version__} (the package version)\n"
    assert _release_version(__version__, root).returncode == 1  # the tag carries the v
    for changelog, why in [
        (text.replace(f"## {__version__} / unreleased", "## 0.0.9 / 2027-01-15", 1),
         f"CHANGELOG.md's newest section is 0.0.9, not {__version__}"),
        (text.replace(f"## {__version__} / unreleased", f"## {__version__} / soon", 1),
         f"CHANGELOG.md's {__version__} section is dated 'soon', not YYYY-MM-DD"),
        ("# Changelog\n", "CHANGELOG.md has no version section (## <version> / <date>)"),
    ]:  # fmt: skip
        refused = _release_version(f"v{__version__}", _tree(tmp_path / str(len(why)), changelog))
        assert (refused.returncode, refused.stderr) == (1, f"release-version: {why}\n")


TAGS = ("[CHANGE]", "[FEATURE]", "[ENHANCEMENT]", "[BUGFIX]")


def test_changelog_has_one_section_per_version_and_one_tagged_line_per_change():
    text = (ROOT / "CHANGELOG.md").read_text()
    sections = re.findall(r"^## (.*)$", text, re.M)
    assert sections, "no version section"
    for heading in sections:
        assert re.fullmatch(r"\d+\.\d+\.\d+ / (\d{4}-\d{2}-\d{2}|unreleased)", heading), heading
    versions = [h.split(" / ")[0] for h in sections]
    assert len(set(versions)) == len(versions)
    assert [h for h in sections if h.endswith("/ unreleased")] in ([], [sections[0]])  # only the newest
    entries = [line for line in text.splitlines() if line.startswith("- ")]
    for line in entries:
        assert line.split(" ", 2)[1] in TAGS, line
    # One line per change: no entry continues on the next line.
    lines = text.splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.startswith("- "):
            assert lines[i + 1] == "" or lines[i + 1].startswith(("- ", "## ")), f"entry continues: {lines[i + 1]!r}"
    # Short enough that a user reads it; no tracker numbers a reader cannot resolve.
    assert len(entries) <= 40
    assert max(len(line) for line in entries) <= 300
    assert re.search(r"\bissue \d+", text, re.I) is None
    # Both claims at once ("published from tag v0.1.0" and "the tag did not exist") cannot stand.
    assert "published from" not in text


def test_the_workflow_publishes_what_the_chart_installs():
    flow = yaml.safe_load(WORKFLOW.read_text())
    assert flow[True] == {"push": {"tags": ["v*"]}}  # YAML 1.1 reads the key `on` as true
    assert flow["env"] == {"IMAGE": IMAGE, "CHARTS": CHARTS}
    jobs = flow["jobs"]
    check = " ".join(step.get("run", "") for step in jobs["version"]["steps"])
    assert 'tools/release-version.py "$TAG"' in check
    (build,) = [s["with"] for s in jobs["image"]["steps"] if s.get("uses", "").startswith("docker/build-push-action@")]
    assert build["platforms"].split(",") == ["linux/amd64", "linux/arm64"]
    assert build["tags"] == "${{ env.IMAGE }}:${{ needs.version.outputs.version }}"
    assert build["build-args"] == "VERSION=${{ needs.version.outputs.version }}"
    assert build["push"] is True
    assert jobs["image"]["permissions"]["packages"] == "write"
    # The chart is pushed only once the image it points at exists.
    assert set(jobs["chart"]["needs"]) == {"version", "image"}
    script = jobs["chart"]["steps"][-2]["run"]
    assert 'helm push "dist/sglang-oom-exporter-$VERSION.tgz" "$CHARTS" 2>&1 | tee push.log' in script
    # The chart's default image is that image, at the chart's appVersion.
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"] == {"repository": IMAGE, "tag": "", "pullPolicy": "IfNotPresent"}
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == __version__


def _sh_blocks(text: str) -> list[list[str]]:
    """Each ```sh block's commands (continuation lines joined, comments dropped) as argv lists."""
    out = []
    for block in re.findall(r"```sh\n(.*?)\n```", text, re.S):
        out.append([shlex.split(line, comments=True) for line in block.replace("\\\n", " ").splitlines()])
    return out


def _template(argv: list[str]) -> list[dict]:
    proc = subprocess.run([helm(), "template", *argv], capture_output=True, text=True, timeout=60, check=False,
                          cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


@pytest.mark.e2e
def test_chart_readme_installs_from_the_clone_until_a_release_exists_then_from_the_registry():
    text = (CHART / "README.md").read_text()
    first, released = [a for block in _sh_blocks(text) for a in block if a[:2] == ["helm", "install"]][:2]
    # First: the chart in this checkout, with the image the user built (nothing is published yet).
    # The namespace is created and labelled for Pod Security first (tests/test_docs_truth.py), then installed into.
    argv = first
    assert argv[:4] == ["helm", "install", "sglang-oom-exporter", "./helm/sglang-oom-exporter"]
    assert "No release is published yet" in text
    (ds,) = [d for d in _template(argv[2:]) if d["kind"] == "DaemonSet"]
    assert (
        ds["spec"]["template"]["spec"]["containers"][0]["image"]
        == f"registry.example.com/sglang-oom-exporter:{__version__}"
    )
    # Then, marked as what a release brings: the OCI chart at this version, whose default image is the published one.
    argv = released
    assert argv[:4] == ["helm", "install", "sglang-oom-exporter", f"{CHARTS}/sglang-oom-exporter"]
    assert argv[argv.index("--version") + 1] == __version__
    assert "Once a version is released, its tag publishes the chart" in text
    local = [str(CHART) if a == argv[3] else a for a in argv[2:]]
    (ds,) = [d for d in _template(local) if d["kind"] == "DaemonSet"]
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == f"{IMAGE}:{__version__}"


def test_readme_builds_the_image_from_the_clone_and_names_the_release_image_only_as_once_released():
    text = (ROOT / "README.md").read_text()
    assert "**Nothing is published yet.**" in text
    commands = [argv for block in _sh_blocks(text) for argv in block if argv]
    build = [a for a in commands if a[:2] == ["podman", "build"]]
    assert build == [["podman", "build", "-t", f"registry.example.com/sglang-oom-exporter:{__version__}",
                      "--build-arg", f"VERSION={__version__}", "."]]  # fmt: skip
    assert ["podman", "push", f"registry.example.com/sglang-oom-exporter:{__version__}"] in commands
    # Every command that pulls the published image or chart sits in a block the text marks as after the release.
    for argv in commands:
        if any(a.startswith(("ghcr.io/", "oci://ghcr.io/")) for a in argv):
            assert argv[:3] == ["helm", "install", "sglang-oom-exporter"], argv
    released = text.split("<!-- helm-install-released -->", 2)[1]
    assert (
        text.split("<!-- helm-install-released -->", 1)[0]
        .rstrip()
        .endswith(
            f"Once {__version__} is released (its tag `v{__version__}` publishes the image and the chart, signed with "
            "cosign), the same\ninstall needs no clone and no build:"
        )
    )
    assert f"{CHARTS}/sglang-oom-exporter" in released
    assert "docker run" not in text
    assert f"{IMAGE}:{__version__} scan" not in text


@pytest.mark.e2e
def test_notes_say_which_image_runs_and_where_it_comes_from():
    def notes(*extra: str) -> str:
        proc = subprocess.run([helm(), "install", "--dry-run=client", "t", str(CHART), "-n", "monitoring", *extra],
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split("NOTES:", 1)[1]

    published = notes()
    assert (
        f"Image: {IMAGE}:{__version__}\n  the image the project's {__version__} release (tag v{__version__})"
        in published
    )
    # Nothing is published yet: the notes say how to build it instead, as long as the release is not out.
    assert "Until that release is out (CHANGELOG.md), or where nodes cannot reach ghcr.io" in published
    assert (
        f"podman build -t <registry>/sglang-oom-exporter:{__version__} --build-arg VERSION={__version__} ." in published
    )
    assert "published by the project" not in published
    custom = notes("--set", "image.repository=registry.example.com/soe", "--set", "image.tag=dev")
    assert "Image: registry.example.com/soe:dev (image.repository, image.tag)" in custom
    assert f"This is not the published image, {IMAGE}:{__version__}" in custom
    sidecar = notes("-f", str(CHART / "ci" / "sidecar-values.yaml"))
    assert f"with the image {IMAGE}:{__version__}" in sidecar


def test_no_file_cites_our_trackers_issue_numbers():
    """A reader of the repository cannot resolve our tracker's numbers: code, tests and docs name the fact.
    SGLang's own tracker ("SGLang's GitHub issue #322") is a public reference and stays."""
    proc = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    cited = []
    for name in proc.stdout.splitlines():
        path = ROOT / name
        if not path.is_file() or path.suffix in {".png", ".gz"}:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if re.search(r"(?<!GitHub )\bissue ?#?\d+", line, re.I):
                cited.append(f"{name}:{number}")
    assert cited == []
