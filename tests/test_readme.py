"""README is a contract: its test command is what CI runs, and it documents every kind id."""

from __future__ import annotations

import os
import re
import subprocess

from tests.helpers import CATALOG

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md")).read()


def test_ci_runs_exactly_the_readme_test_command():
    block = README.split("<!-- test-command -->")[1].split("<!-- /test-command -->")[0]
    (command,) = re.findall(r"```sh\n(.*?)\n```", block, re.S)
    extracted = subprocess.run(
        ["bash", "-c", "sed -n '/<!-- test-command -->/,/<!-- \\/test-command -->/p' README.md"
         " | sed -n '/^```sh$/,/^```$/p' | sed '1d;$d'"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert extracted == command == "pip install -e '.[dev]' && python -m pytest -q -n auto --dist worksteal"
    assert "README.md" in open(os.path.join(ROOT, ".ci", "run")).read()


def test_readme_documents_every_kind():
    for kind in CATALOG.ids:
        assert f"| `{kind}` |" in README, kind
