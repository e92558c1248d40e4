"""The Dockerfile's defaults a build here cannot exercise, and the same `pip install .` it runs, in a fresh venv.

tests/test_image.py builds the image with podman and runs it (configuration, user, labels, read-only root), but
from a stand-in Debian base, because no registry image can be pulled here. What only the published build uses is
checked on the Dockerfile's instructions: every stage builds on BASE_IMAGE, whose default is a pinned official
slim Python; the final stage runs the package's console script as a numeric non-root user who owns the state
directory; and .dockerignore keeps what the build copies. The install the Dockerfile performs is repeated in a new virtual environment whose
console script then runs `scan --sample` and `serve`, with a check that nothing was written outside the state
directory (the image runs with a read-only root).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import venv
from pathlib import Path

import pytest

from sglang_oom_exporter import __version__

ROOT = Path(__file__).resolve().parent.parent


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per Dockerfile instruction, continuation lines joined, comments dropped."""
    text = (ROOT / "Dockerfile").read_text()
    joined = re.sub(r"\\\n\s*", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages() -> list[list[tuple[str, str]]]:
    """The instructions of each build stage, a FROM first; the global ARGs before the first FROM are left out."""
    out: list[list[tuple[str, str]]] = []
    for word, rest in instructions():
        if word == "FROM":
            out.append([])
        if out:
            out[-1].append((word, rest))
    return out


def test_every_stage_builds_on_the_base_image_argument_whose_default_is_a_pinned_slim_python():
    # CI builds from a stand-in base by setting BASE_IMAGE (tests/support/podman.py): a stage on another image
    # would go untested. The default is an official slim Python with its minor version pinned (no floating tag),
    # at least the package's minimum.
    assert [stage[0][1].split()[0] for stage in stages()] == ["${BASE_IMAGE}"] * len(stages())
    args = dict(rest.split("=", 1) for word, rest in instructions() if word == "ARG" and "=" in rest)
    pinned = re.fullmatch(r"python:3\.(\d+)-slim", args["BASE_IMAGE"])
    assert pinned, args["BASE_IMAGE"]
    minimum = re.search(r'requires-python = ">=3\.(\d+)"', (ROOT / "pyproject.toml").read_text())
    assert minimum
    assert int(pinned[1]) >= int(minimum[1])
    assert args["VERSION"] == __version__  # the image's default version label is the package's


def test_the_image_runs_the_console_script_as_a_non_root_user_who_owns_the_state_dir():
    final = stages()[-1]
    (user,) = [rest for word, rest in final if word == "USER"]
    uid, _, gid = user.partition(":")
    # Numeric and not 0: Kubernetes' runAsNonRoot can only verify a numeric user.
    assert (uid.isdigit(), gid.isdigit()) == (True, True), user
    assert int(uid) != 0
    (entrypoint,) = [json.loads(rest) for word, rest in final if word == "ENTRYPOINT"]
    script = re.search(r'^([\w-]+) = "sglang_oom_exporter\.cli:main"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert script
    assert entrypoint == [script[1]]  # the package's console script, exec form (signals reach the exporter)
    (cmd,) = [json.loads(rest) for word, rest in final if word == "CMD"]
    (state_dir,) = [arg.split("=", 1)[1] for arg in cmd if arg.startswith("--state-dir=")]
    runs = " ".join(rest for word, rest in final if word == "RUN")
    assert f"chown {uid}:{gid} {state_dir}" in runs  # the one path it writes is the user's own


def test_dockerignore_keeps_what_the_build_copies():
    patterns = [p for p in (ROOT / ".dockerignore").read_text().splitlines() if p and not p.startswith("#")]
    for needed in ("pyproject.toml", "README.md", "LICENSE", "exporter/cli.py", "exporter/catalog/catalog.yaml"):
        assert not any(fnmatch.fnmatch(needed, p) or needed.startswith(p + "/") for p in patterns), needed
    for dropped in (".git", ".tools", "tests", "bench"):
        assert dropped in patterns


# ---------------------------------------------------------------------------------------------- the same install


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """(size, mtime_ns) of every file under root."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            st = os.stat(os.path.join(dirpath, name), follow_symlinks=False)
            out[os.path.join(dirpath, name)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_pip_install_into_a_fresh_venv_gives_a_working_console_script(tmp_path):
    # The build context holds exactly what the Dockerfile copies (after .dockerignore).
    context = tmp_path / "context"
    context.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, context / name)
    shutil.copytree(ROOT / "exporter", context / "exporter", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # The wheel is built by this interpreter's setuptools (the machine may be offline, so no isolated build
    # env), then installed into a new venv; the runtime dependencies come from this interpreter's
    # site-packages for the same reason.
    _needs_modern_setuptools()
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-cache-dir",
         "--disable-pip-version-check", "--quiet", "-w", str(wheels), str(context)],
        capture_output=True, text=True, timeout=200, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr
    (wheel,) = wheels.glob("sglang_oom_exporter-*.whl")
    env_dir = tmp_path / "venv"
    # No pip inside the venv (ensurepip alone took 6 s of CPU): this interpreter's pip installs into it with
    # --python, which runs the install under the venv's interpreter, into its site-packages and bin/.
    # The runtime dependencies are wherever this interpreter finds them: its own venv's site-packages, or
    # the base interpreter's when that venv was made with --system-site-packages. `system_site_packages`
    # would give only the base interpreter's (a fresh venv's dependencies would be missing), so the new
    # venv gets a .pth naming each of this interpreter's site directories instead: a .pth line only adds a
    # path, it does not run that directory's own .pth files, so the editable install of this checkout
    # stays invisible and the venv imports the wheel it installs.
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(env_dir)
    py = env_dir / "bin" / "python"
    (own_site,) = (env_dir / "lib").glob("python3*/site-packages")
    dirs = [p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages")) and os.path.isdir(p)]
    (own_site / "zz_outer_site.pth").write_text("".join(f"{p}\n" for p in dirs))
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-cache-dir",
         "--disable-pip-version-check", "--quiet", str(wheel)],
        capture_output=True, text=True, timeout=200, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr
    script = env_dir / "bin" / "sglang-oom-exporter"
    assert script.is_file()
    where = subprocess.run(
        [str(py), "-c", "import sglang_oom_exporter as m; print(m.__file__, m.__version__)"],
        capture_output=True, text=True, timeout=30, check=True, cwd=tmp_path,
    )  # fmt: skip
    path, version = where.stdout.split()
    assert path.startswith(str(env_dir)), "the venv imported the editable checkout, not its own install"
    assert version == __version__

    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    before = _tree(env_dir)
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    scan = subprocess.run([str(script), "scan", "--sample", "--format", "json"], capture_output=True, text=True,
                          timeout=60, check=False, cwd=workdir, env=env)  # fmt: skip
    assert scan.returncode == 0, scan.stderr
    result = json.loads(scan.stdout)
    assert result["fatal_events"] > 0
    assert sum(result["counts"].values()) == len(result["events"])

    # serve: only the state directory is written (the image's root filesystem is read-only).
    state, logs = tmp_path / "state", tmp_path / "logs"
    state.mkdir()
    logs.mkdir()
    (logs / "sglang.log").write_text("[2026-03-14 22:07:33] server started\n")
    proc = subprocess.Popen(
        [str(script), "serve", "--listen=127.0.0.1:0", f"--state-dir={state}", "--log-level=info",
         str(logs / "sglang.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=workdir, env=env,
    )  # fmt: skip
    try:
        port = _port_from_log(proc)
        deadline = time.monotonic() + 60
        while True:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                body = response.read().decode()
            if re.search(r"^sglang_oom_exporter_files_watched 1\.0$", body, re.M):
                break
            assert time.monotonic() < deadline, "the exporter never followed the log file"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert proc.returncode == 0
    assert _tree(env_dir) == before, "the installed package wrote into its own directory"
    assert list(workdir.iterdir()) == []
    assert (state / "state.json").is_file()


def _needs_modern_setuptools() -> None:
    """Skip unless this interpreter can build the wheel offline (PEP 639 `license = "..."` needs setuptools 77)."""
    try:
        from importlib.metadata import version

        major = int(version("setuptools").split(".")[0])
    except Exception:  # not installed or an odd version string
        major = 0
    if major < 77:
        pytest.skip("setuptools >= 77 is needed to build the wheel without network (pip install -e '.[dev]' brings it)")


def _port_from_log(proc: subprocess.Popen[str]) -> int:
    """The port from serve's startup line (it listens on port 0)."""
    assert proc.stderr is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if "serving on" in line:
            # "serving on HOST:PORT ..." or, with port 0, "serving on HOST:0 port=N ..."
            match = re.search(r"\bport=(\d+)", line) or re.search(r"serving on \S*:(\d+)", line)
            assert match, line
            return int(match.group(1))
        assert line or proc.poll() is None, "serve exited before listening"
    raise AssertionError("serve never logged its port")
