"""ruff, ruff format and mypy --strict are part of the test run, so CI fails on a lint or type error."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATHS = ["exporter", "tests", "bench"]

pytestmark = pytest.mark.slow


def _run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env, timeout=300, check=False)


@pytest.mark.timeout(120)
def test_ruff_check_is_clean():
    proc = _run(sys.executable, "-m", "ruff", "check", *PATHS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.timeout(120)
def test_ruff_format_is_clean():
    proc = _run(sys.executable, "-m", "ruff", "format", "--check", *PATHS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.timeout(300)
def test_mypy_as_configured_is_clean():
    # Plain `mypy` from the project root, exactly as a contributor runs it: pyproject's `files` and `strict`.
    # The package uses relative imports inside exporter/, so no path trick is needed to resolve it.
    proc = _run(sys.executable, "-m", "mypy", "--no-incremental")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success: no issues found in" in proc.stdout


def test_the_tools_are_installed():
    # The dev extra pins both; without them the tests above would not prove anything.
    assert shutil.which("ruff") or _run(sys.executable, "-m", "ruff", "--version").returncode == 0
    assert _run(sys.executable, "-m", "mypy", "--version").returncode == 0
