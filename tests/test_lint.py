"""ruff, ruff format and mypy --strict are part of the test run, so CI fails on a lint or type error."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATHS = ["exporter", "tests", "bench", "tools"]

pytestmark = pytest.mark.slow


def _run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env, timeout=300, check=False)


@pytest.mark.timeout(120)
def test_ruff_check_is_clean():
    proc = _run(sys.executable, "-m", "ruff", "check", *PATHS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "All checks passed!"


@pytest.mark.timeout(120)
def test_ruff_format_is_clean():
    proc = _run(sys.executable, "-m", "ruff", "format", "--check", *PATHS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith("files already formatted")


@pytest.mark.timeout(300)
def test_mypy_as_configured_is_clean():
    # Plain `mypy` from the project root, exactly as a contributor runs it: pyproject's `files` and `strict`,
    # incremental with its cache in .mypy_cache (a fresh clone checks everything; a warm cache takes a second).
    # The package uses relative imports inside exporter/, so no path trick is needed to resolve it.
    proc = _run(sys.executable, "-m", "mypy")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Every module of the package was checked, not a subset that happened to resolve.
    modules = sum(f.endswith(".py") for _d, _s, files in os.walk(os.path.join(ROOT, "exporter")) for f in files)
    assert proc.stdout.strip().splitlines()[-1] == f"Success: no issues found in {modules} source files"


def test_the_tools_are_installed():
    # The dev extra pins both; the tests above run them as modules of this interpreter, so check exactly that.
    ruff = _run(sys.executable, "-m", "ruff", "--version")
    mypy = _run(sys.executable, "-m", "mypy", "--version")
    assert (ruff.returncode, ruff.stdout.split()[0]) == (0, "ruff")
    assert (mypy.returncode, mypy.stdout.split()[0]) == (0, "mypy")
