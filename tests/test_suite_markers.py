"""The e2e marker is kept honest: a test that starts a machine program or the daemon without it fails (conftest),
so `make test` stays pure Python and seconds long."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import e2e_program


def test_an_unmarked_test_that_starts_helm_fails_before_helm_runs():
    with pytest.raises(pytest.fail.Exception, match=r"starts helm: mark it @pytest\.mark\.e2e"):
        subprocess.Popen(["/nonexistent/bin/helm", "version"])  # without the check: FileNotFoundError


@pytest.mark.parametrize(
    ("argv", "program"),
    [
        ([sys.executable, "-m", "sglang_oom_exporter", "serve", "a.log"], "the daemon (serve)"),
        (["/usr/local/bin/sglang-oom-exporter", "serve", "--listen", ":0"], "the daemon (serve)"),
        ([sys.executable, "-m", "sglang_oom_exporter", "serve", "--check-config", "a.log"], None),
        ([sys.executable, "-m", "sglang_oom_exporter", "serve", "--help"], None),
        ([sys.executable, "-m", "sglang_oom_exporter", "scan", "serve"], None),
        (["/usr/bin/promtool", "check", "rules", "x.yaml"], "promtool"),
        ("podman run --rm x", "podman"),
        ([b"/usr/bin/chromium", b"--headless"], "chromium"),
        (["openssl", "req"], None),
    ],
)
def test_what_makes_a_test_end_to_end(argv, program):
    assert e2e_program(argv) == program
