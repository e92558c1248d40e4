"""The e2e marker is kept honest: a test that starts a machine program or the daemon without it fails (conftest),
so `make test` stays pure Python and seconds long. Whatever leaves `make test` (a `slow` or `e2e` mark) still runs
in `make all`, CI's selection; and no test sets a timeout tighter than pyproject's hang guard."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression  # pytest's own `-m` parser

from tests.conftest import e2e_program
from tests.support.helpers import load_toml

ROOT = Path(__file__).resolve().parent.parent


def _selections() -> dict[str, str]:
    """Makefile target -> the `-m` expression its pytest run selects with."""
    text = (ROOT / "Makefile").read_text()
    defaults = dict(re.findall(r"^([A-Z_]+) \?= (.*)$", text, flags=re.M))  # e.g. ALL_MARKERS, as CI leaves it
    found = re.findall(r"^([a-z0-9-]+):[^\n]*\n((?:\t[^\n]*\n)+)", text, flags=re.M)
    return {
        name: re.sub(r"\$\((\w+)\)", lambda v: defaults[v.group(1)], m.group(1))
        for name, body in found
        if (m := re.search(r'\$\(PYTEST\)[^"\n]* -m "([^"]+)"', body))
    }


def _markers() -> list[str]:
    ini = load_toml(ROOT / "pyproject.toml")["tool"]["pytest"]["ini_options"]
    return [line.split(":", 1)[0] for line in ini["markers"]]


def test_every_test_runs_in_make_all_or_a_target_of_its_own():
    selections = _selections()
    assert set(selections) == {"all", "test", "e2e", "live-sglang"}
    compiled = {name: Expression.compile(expr) for name, expr in selections.items()}
    markers = _markers()
    assert {"slow", "e2e", "lint", "live_sglang"} <= set(markers)
    for n in range(len(markers) + 1):
        for marks in map(set, itertools.combinations(markers, n)):
            if "live_sglang" in marks and "e2e" not in marks:
                continue  # a live test starts the daemon, so conftest fails it unless it is marked e2e too
            chosen = {name for name, expr in compiled.items() if expr.evaluate(marks.__contains__)}
            # The lint tests wrap ruff and mypy, which `make lint` runs itself (and `make all` runs first).
            assert chosen & {"all", "live-sglang"} or "lint" in marks, sorted(marks)
            # What the quick loop and the end-to-end target run, CI runs too (lint through `make lint`).
            assert not chosen & {"test", "e2e"} or "all" in chosen or "lint" in marks, sorted(marks)
    assert not compiled["test"].evaluate({"slow"}.__contains__)
    assert compiled["all"].evaluate({"slow"}.__contains__)


def test_no_test_sets_a_timeout_below_the_hang_guard_of_pyproject():
    ini = load_toml(ROOT / "pyproject.toml")["tool"]["pytest"]["ini_options"]
    assert ini["timeout"] == 180
    tight = [
        f"{path.relative_to(ROOT)}: timeout({seconds})"
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for seconds in re.findall(r"mark\.timeout\((\d+)", path.read_text(encoding="utf-8"))
        if int(seconds) <= ini["timeout"]
    ]
    assert tight == []


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


def test_every_measured_slow_test_names_a_test_that_exists():
    from tests.conftest import MEASURED_SLOW

    assert len(MEASURED_SLOW) == 40
    for nodeid in sorted(MEASURED_SLOW):
        path, name = nodeid.split("::")
        assert re.search(rf"^def {name}\(", (ROOT / path).read_text(encoding="utf-8"), flags=re.M), nodeid


def test_two_test_runs_on_one_machine_never_share_aport_slice():
    # Slices were picked by xdist worker number alone: CI's gw0 and a developer's gw0 on one machine both started
    # daemons on 10016, and one exited "Address already in use". Another process as this same worker gets another.
    import os

    from tests.support.helpers import port_slice

    mine = port_slice()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    code = "from tests.support.helpers import port_slice; r = port_slice(); print(r.start, r.stop)"
    env = {**os.environ, "PYTEST_XDIST_WORKER": worker}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    start, stop = map(int, out.stdout.split())
    assert stop - start == len(mine) == 400
    assert not set(range(start, stop)) & set(mine)
