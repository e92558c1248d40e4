"""README is a contract: its test command is what CI runs, and it documents every kind id."""

from __future__ import annotations

import os
import re
import subprocess

from tests.support.helpers import CATALOG

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md")).read()
CI_RUN = os.path.join(ROOT, ".ci", "run")


def _ci_extraction() -> str:
    """The command .ci/run would run: its own `cmd=$(...)` line, executed as it is, not a copy of it."""
    (line,) = [x for x in open(CI_RUN).read().splitlines() if x.startswith("cmd=$(")]
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", f'{line}\nprintf %s "$cmd"'],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip


def test_ci_runs_exactly_the_readme_test_command():
    block = README.split("<!-- test-command -->")[1].split("<!-- /test-command -->")[0]
    (command,) = re.findall(r"```sh\n(.*?)\n```", block, re.S)
    assert _ci_extraction() == command == "tools/test.sh"
    ci = open(CI_RUN).read()
    assert 'bash -euo pipefail -c "$cmd"' in ci
    assert "pkill" not in ci  # it stops nothing it did not start
    assert "killall" not in ci


def test_the_test_script_installs_helm_and_the_dev_extras_and_runs_the_whole_suite():
    script = open(os.path.join(ROOT, "tools", "test.sh")).read()
    assert os.access(os.path.join(ROOT, "tools", "test.sh"), os.X_OK)
    assert "pip install --disable-pip-version-check -q -e '.[dev]'" in script
    assert "tools/install-helm.sh" in script
    assert 'pytest -q -n auto --dist worksteal "$@"' in script


def test_readme_documents_every_kind():
    for kind in CATALOG.ids:
        assert f"| `{kind}` |" in README, kind
