"""README is a contract: its test command is what CI runs, and it documents every kind id."""

from __future__ import annotations

import os
import subprocess

from tests.support.helpers import CATALOG

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md")).read()
CHART_README = open(os.path.join(ROOT, "helm", "sglang-oom-exporter", "README.md")).read()
CI_RUN = os.path.join(ROOT, ".ci", "run")
TEST_COMMAND = os.path.join(ROOT, ".ci", "test-command")


def _test_command(*readme: str) -> subprocess.CompletedProcess[str]:
    """.ci/test-command, the one extraction .ci/run runs, on README.md or the README given."""
    return subprocess.run([TEST_COMMAND, *readme], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)


def test_ci_runs_exactly_the_readme_test_command():
    assert _test_command().stdout == "tools/test.sh\n"
    ci = open(CI_RUN).read()
    # .ci/run runs what the script prints, and nothing else: its one command line after the setup.
    assert ci.splitlines()[-3:] == [
        "cmd=$(.ci/test-command)  # README's test command; exits 2 with the reason when there is none",
        'echo "+ $cmd"',
        'bash -euo pipefail -c "$cmd"',
    ]
    assert "pkill" not in ci  # it stops nothing it did not start
    assert "killall" not in ci


def test_the_extraction_takes_only_the_sh_block_between_the_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(
        "```sh\nnot this\n```\n<!-- test-command -->\nRun:\n```sh\npip install -e .\npytest -q\n```\n"
        "<!-- /test-command -->\n```sh\nnor this\n```\n"
    )
    assert _test_command(str(readme)).stdout == "pip install -e .\npytest -q\n"
    readme.write_text("# no markers\n```sh\npytest\n```\n")
    missing = _test_command(str(readme))
    assert (missing.returncode, missing.stdout) == (2, "")
    assert "no test command between the test-command markers" in missing.stderr


def test_the_test_script_installs_helm_and_the_dev_extras_and_runs_the_whole_suite():
    script = open(os.path.join(ROOT, "tools", "test.sh")).read()
    assert os.access(os.path.join(ROOT, "tools", "test.sh"), os.X_OK)
    assert "pip install --disable-pip-version-check -q -e '.[dev]'" in script
    assert "tools/install-helm.sh" in script
    assert 'pytest -q -n auto --dist worksteal "$@"' in script


def test_readme_documents_every_kind():
    for kind in CATALOG.ids:
        assert f"| `{kind}` |" in README, kind


def _marked(text: str, name: str) -> str:
    """The text between <!-- name --> and <!-- /name -->, which must be there once."""
    assert text.count(f"<!-- {name} -->") == text.count(f"<!-- /{name} -->") == 1, name
    return text.split(f"<!-- {name} -->", 1)[1].split(f"<!-- /{name} -->", 1)[0]


def test_the_chart_readme_installs_with_the_readmes_commands():
    for name in ("helm-install", "helm-install-released", "uninstall"):
        assert _marked(CHART_README, name) == _marked(README, name)
    assert "discovery.enabled=true" in _marked(CHART_README, "helm-install")
