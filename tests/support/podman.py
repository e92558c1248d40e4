"""Podman for the container tests: the image built from the Dockerfile once per test run, and pods played.

Everything podman keeps (images, containers, volumes, its run state) lives in one directory of this test run,
with its own containers.conf and storage.conf (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF); nothing on the
machine is reconfigured. What these machines need, and why (docs/container-image.md says the same to users):
  - runc, with nofile and nproc ulimits at 1024: podman's default raises them, which this sandbox refuses
    ("error setting rlimit type 7: operation not permitted"); crun refuses its hybrid cgroup layout.
  - cgroupfs, not systemd, as the cgroup manager (no systemd runs here); host networking everywhere (no bridge).
  - no registry can be pulled from, so the base image is a Debian root filesystem made by mmdebstrap from
    Debian's python3 and python3-venv, imported, and passed as the Dockerfile's BASE_IMAGE build argument.
  - the build's `pip install` reaches PyPI through the machine's TLS-intercepting proxy, so the build stage
    runs with the host's CA bundle and pip configuration mounted read-only (pip_mounts below). The final stage
    is then built in a second `podman build` without those mounts, from the cached build stage, so that no
    mount point of them is left in the image.
The build takes about a minute on an idle machine (built_image returns the seconds of each step).
"""

from __future__ import annotations

import configparser
import json
import os
import shutil
import ssl
import subprocess
import time
from pathlib import Path

from tests.support import helpers

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "localhost/sglang-oom-exporter:test"
BASE_IMAGE = "localhost/sglang-oom-exporter-test-base:bookworm"
TOOLS = ("podman", "runc", "catatonit", "mmdebstrap")


def skip_reason() -> str | None:
    """Why the container tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "the container tests run podman as root (rootless podman needs subordinate uid ranges)"
    missing = [
        tool for tool in TOOLS if shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin") is None
    ]
    if missing:
        return f"{', '.join(missing)} not installed (.ci/run installs podman, runc, catatonit and mmdebstrap with apt)"
    return None


class Podman:
    """podman with this run's configuration and storage under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        (root / "tmp").mkdir(exist_ok=True)
        conf = root / "containers.conf"
        if not conf.exists():  # the xdist workers of one run share the directory; the first writes it
            conf.write_text(
                "[containers]\n"
                'default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\n'
                "[engine]\n"
                'runtime = "runc"\n'
                'cgroup_manager = "cgroupfs"\n'
                'events_logger = "file"\n'
                f'tmp_dir = "{root / "tmp"}"\n'
            )
            (root / "storage.conf").write_text(
                f'[storage]\ndriver = "overlay"\ngraphroot = "{root / "storage"}"\nrunroot = "{root / "run"}"\n'
            )
        self.env = {
            **os.environ,
            "CONTAINERS_CONF": str(conf),
            "CONTAINERS_STORAGE_CONF": str(root / "storage.conf"),
            "PATH": os.environ.get("PATH", "") + ":/usr/sbin:/sbin",
        }

    def __call__(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run `podman ARGS`; with check, a non-zero exit fails with podman's stderr."""
        done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=self.env,
                              check=False)  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} exited {done.returncode}:\n{done.stderr[-4000:]}")
        return done

    def pid(self, container: str) -> int:
        """The host pid of a running container's main process."""
        return int(self("inspect", "--format", "{{.State.Pid}}", container).stdout)


def pip_mounts(scratch: Path) -> list[str]:
    """`podman build -v` arguments that let `pip install` inside the build reach the registry as it does here:
    the host's pip configuration files, a user-level pip.conf made from this environment's PIP_* variables
    (a build does not inherit the environment), and every existing file or directory those settings name (the
    CA bundle, constraint files), each read-only at its own path."""
    mounts: list[Path] = []
    settings: dict[str, str] = {}
    for conf, mount in ((Path("/etc/xdg/pip/pip.conf"), Path("/etc/xdg/pip")), (Path("/etc/pip.conf"), None)):
        if conf.is_file():
            mounts.append(mount or conf)
            parser = configparser.ConfigParser(interpolation=None)
            parser.read(conf)
            for section in parser.sections():
                settings.update(parser[section])
    from_env = {
        key[4:].lower().replace("_", "-"): value
        for key, value in os.environ.items()
        if key.startswith("PIP_") and key != "PIP_CONFIG_FILE"
    }
    settings.update(from_env)
    if "cert" not in settings:
        # pip's own requests honours REQUESTS_CA_BUNDLE; else the interpreter's default bundle.
        bundle = os.environ.get("REQUESTS_CA_BUNDLE") or ssl.get_default_verify_paths().cafile
        if bundle:
            from_env["cert"] = settings["cert"] = bundle
    for value in settings.values():
        for word in value.split():
            path = Path(word)
            if path.is_absolute() and path.exists() and not any(m == path or m in path.parents for m in mounts):
                mounts.append(path)
    user_conf = scratch / "pip.conf"
    user_conf.write_text("[global]\n" + "".join(f"{k} = {v}\n" for k, v in sorted(from_env.items())))
    args = ["-v", f"{user_conf}:/root/.config/pip/pip.conf:ro"]
    for path in mounts:
        args += ["-v", f"{path.resolve()}:{path}:ro"]
    return args


def _timed(what: str, seconds: dict[str, float], podman: Podman | None, argv: list[str], timeout: float) -> None:
    started = time.monotonic()
    if podman is not None:
        podman(*argv, timeout=timeout)
    else:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        assert done.returncode == 0, f"{what}: {' '.join(argv)} exited {done.returncode}:\n{done.stderr[-4000:]}"
    seconds[what] = round(time.monotonic() - started, 1)


def _build(podman: Podman) -> dict[str, object]:
    """The base root filesystem, its image, and the project's image: the seconds of each step."""
    from sglang_oom_exporter import __version__

    seconds: dict[str, float] = {}
    scratch = podman.root / "build"
    scratch.mkdir(exist_ok=True)
    rootfs = scratch / "rootfs.tar"
    # The essential variant (no apt) plus python3-venv; no docs, man pages or translations: 150 MB, not 225.
    excludes = [f"--dpkgopt=path-exclude=/usr/share/{d}/*" for d in ("doc", "man", "locale", "info")]
    _timed("mmdebstrap", seconds, None,
           ["mmdebstrap", "--quiet", "--mode=root", "--variant=essential", "--include=python3-venv",
            "--aptopt=Acquire::Check-Valid-Until \"false\"", *excludes, "bookworm", str(rootfs)], 600)  # fmt: skip
    _timed("import", seconds, podman, ["import", "--quiet", str(rootfs), BASE_IMAGE], 300)
    rootfs.unlink()
    common = ["build", "--quiet", "--isolation=chroot", "--network=host", f"--build-arg=BASE_IMAGE={BASE_IMAGE}",
              f"--build-arg=VERSION={__version__}"]  # fmt: skip
    _timed("build stage", seconds, podman, [*common, "--target=build", *pip_mounts(scratch), str(ROOT)], 600)
    _timed("final stage", seconds, podman, [*common, f"--tag={IMAGE}", str(ROOT)], 300)
    return {"image": IMAGE, "seconds": seconds}


_BUILT: dict[str, dict[str, object]] = {}


def built_image(podman: Podman) -> dict[str, object]:
    """Build once per test run (the xdist workers share podman's directory and wait for the first)."""
    key = str(podman.root)
    if key not in _BUILT:
        _BUILT[key] = helpers.once_per_run("podman-image", lambda: _build(podman))
    return _BUILT[key]


def proc_status(pid: int) -> dict[str, str]:
    """/proc/PID/status as a dict (the kernel's view of what a container process may do)."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def mount_options(pid: int) -> dict[str, set[str]]:
    """Mount point -> its per-mount options (ro/rw...) as the process sees them."""
    out = {}
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        out[fields[4]] = set(fields[5].split(","))
    return out


def dump(obj: object) -> str:
    """JSON for the failure messages."""
    return json.dumps(obj, indent=1, default=str)
