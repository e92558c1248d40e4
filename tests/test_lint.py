"""`make lint` (ruff, ruff format --check, mypy --strict) is clean. The Makefile holds the commands; this test runs
that target, so a plain `pytest` run and `make lint` check exactly the same thing. `make all` runs the target
itself and leaves this module out (marker lint)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = [pytest.mark.lint, pytest.mark.slow]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)


def _make(*argv: str) -> subprocess.CompletedProcess[str]:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed (apt-get install make): `make lint` holds the lint commands")
    return _run(make, "-s", *argv, f"PYTHON={sys.executable}")


@pytest.mark.timeout(300)
def test_make_lint_is_clean():
    # Plain `mypy` from the project root, exactly as a contributor runs it: pyproject's `files` and `strict`,
    # incremental with its cache in .mypy_cache (a fresh clone checks everything; a warm cache takes a second).
    proc = _make("lint")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    # Every module of the package was checked, not a subset that happened to resolve.
    modules = sum(f.endswith(".py") for _d, _s, files in os.walk(os.path.join(ROOT, "exporter")) for f in files)
    assert lines[0] == "All checks passed!"
    assert lines[1].endswith("files already formatted")
    assert lines[-1] == f"Success: no issues found in {modules} source files"


def test_make_lint_runs_ruff_its_formatter_and_mypy_with_the_project_settings():
    proc = _make("-n", "lint")
    assert proc.returncode == 0, proc.stderr
    paths = "exporter tests bench tools"
    assert proc.stdout.splitlines() == [
        f"{sys.executable} -m ruff check {paths}",
        f"{sys.executable} -m ruff format --check {paths}",
        f"{sys.executable} -m mypy",
    ]


def test_make_all_is_lint_render_check_and_the_whole_suite():
    # tools/test.sh (README's test command) runs `make all`, the live SGLang tests included; the pull-request
    # workflow leaves those out (ALL_MARKERS), since their pinned CPU torch is on .ci/run's machines only.
    proc = _make("-n", "all")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[3:] == [
        f"{sys.executable} -m sglang_oom_exporter render --check",
        f'{sys.executable} -m pytest -q -n auto --dist worksteal  -m "not lint"',
    ]
    with open(os.path.join(ROOT, "tools", "test.sh"), encoding="utf-8") as fh:
        script = fh.read()
    assert script.rstrip().endswith('make all PYTHON="$python"')
    assert "-m tests.support.live_sglang install" in script  # the live tests' install overlaps lint


def test_make_live_sglang_runs_the_live_sglang_marker_only():
    proc = _make("-n", "live-sglang")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f'{sys.executable} -m pytest -q -n auto --dist worksteal  -m "live_sglang"']


def test_the_tools_are_installed():
    # The dev extra pins both; make lint runs them as modules of this interpreter, so check exactly that.
    ruff = _run(sys.executable, "-m", "ruff", "--version")
    mypy = _run(sys.executable, "-m", "mypy", "--version")
    assert (ruff.returncode, ruff.stdout.split()[0]) == (0, "ruff")
    assert (mypy.returncode, mypy.stdout.split()[0]) == (0, "mypy")


def test_the_pull_request_workflow_runs_make_all_on_the_oldest_and_newest_python():
    import yaml

    with open(os.path.join(ROOT, ".github", "workflows", "ci.yml"), encoding="utf-8") as fh:
        text = fh.read()
    flow = yaml.safe_load(text)
    assert set(flow[True]) == {"pull_request", "push", "workflow_call"}  # YAML 1.1 reads the key `on` as true
    job = flow["jobs"]["make-all"]
    assert job["strategy"]["matrix"]["python"] == ["3.10", "3.13"]
    runs = [step["run"] for step in job["steps"] if "run" in step]
    assert runs[-1] == 'make all PYTHON=python ALL_MARKERS="not lint and not live_sglang"'
    uses = [step["uses"] for step in job["steps"] if "uses" in step]
    assert all(len(u.partition("@")[2]) == 40 for u in uses), uses  # pinned by commit, the tag in a comment
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as fh:
        assert 'requires-python = ">=3.10"' in fh.read()
