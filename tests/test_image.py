"""The container image, built from the Dockerfile with podman and run: its configuration, `scan --sample` as the
image's default user, and `serve` with a read-only root filesystem on a mounted /var/log/pods tree, its /metrics
read from the host over loopback (host networking), an OOM counted, and its state kept in the mounted state dir.

The build (tests/support/podman.py) uses a Debian root filesystem made by mmdebstrap as the base image, because no
registry image can be pulled here; the Dockerfile's default base stays the official slim Python image.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sglang_oom_exporter import __version__
from sglang_oom_exporter.project import PROJECT_URL
from tests.support.daemon import settle
from tests.support.helpers import free_port, wait_until
from tests.support.image import Served
from tests.support.logs import cri, oom_block
from tests.support.podman import mount_options, proc_status

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

UID = 65532
STATE_DIR = "/var/lib/sglang-oom-exporter"


def test_image_configuration(podman, image):
    (info,) = json.loads(podman("image", "inspect", image).stdout)
    config = info["Config"]
    assert config["User"] == f"{UID}:{UID}"
    assert config["Entrypoint"] == ["sglang-oom-exporter"]
    assert config["Cmd"] == ["serve", f"--state-dir={STATE_DIR}", "--kubernetes-logs=/var/log/pods"]
    assert config["WorkingDir"] == STATE_DIR
    assert list(config["ExposedPorts"]) == ["9877/tcp"]
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["PATH"].startswith("/opt/sglang-oom-exporter/bin:")
    labels = {k: v for k, v in config["Labels"].items() if k.startswith("org.opencontainers.image.")}
    assert labels == {
        "org.opencontainers.image.title": "sglang-oom-exporter",
        "org.opencontainers.image.description": "SGLang KV-cache OOM events from logs as Prometheus metrics, with the fix for each.",
        "org.opencontainers.image.source": PROJECT_URL,  # pyproject.toml [project.urls]
        "org.opencontainers.image.licenses": "Apache-2.0",
        "org.opencontainers.image.version": __version__,
    }
    # Nothing of the build machine's pip configuration (mounted into the build stage only) is in the image.
    listing = podman("run", "--rm", "--network=host", "--entrypoint=/bin/sh", image, "-c",
                     "ls -d /etc/pip.conf /etc/xdg/pip /root/.config/pip /src 2>/dev/null; true").stdout  # fmt: skip
    assert listing == ""


def test_scan_sample_as_the_default_user_on_a_read_only_root(podman, image):
    run = podman("run", "--rm", "--read-only", "--network=host", image, "scan", "--sample", "--format", "json")
    in_image = _without_sample_dir(json.loads(run.stdout))
    # The same package on the host gives the same report, but for where the sample file is installed.
    here = subprocess.run([sys.executable, "-m", "sglang_oom_exporter", "scan", "--sample", "--format", "json"],
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    assert in_image == _without_sample_dir(json.loads(here.stdout))
    assert in_image["fatal_events"] > 0
    assert sum(in_image["counts"].values()) == len(in_image["events"])
    who = podman("run", "--rm", "--network=host", "--entrypoint=id", image).stdout
    assert who.split()[:2] == [f"uid={UID}({UID})", f"gid={UID}({UID})"]


def test_serve_with_a_read_only_root_on_a_mounted_pod_log_tree(podman, image, tmp_path):
    pods, state = tmp_path / "pods", tmp_path / "state"
    log = pods / "llm_sglang-0_0d7c" / "sglang" / "0.log"
    log.parent.mkdir(parents=True)
    log.write_text(cri("[2026-03-14 22:00:00 TP0] Load weight end."))
    # kubelet's logs are root's and 0644 here; the image's user needs only read access to them.
    state.mkdir()
    os.chown(state, UID, UID)
    port = free_port()
    name = f"soe-serve-{port}"
    podman("run", "--detach", f"--name={name}", "--read-only", "--network=host",
           f"--env=SGLANG_OOM_EXPORTER_LISTEN=127.0.0.1:{port}",  # loopback only; the image's CMD is unchanged
           f"--volume={pods}:/var/log/pods:ro", f"--volume={state}:{STATE_DIR}", image)  # fmt: skip
    try:
        served = Served(port, podman, name)
        wait_until(served.started, timeout=60, what="the exporter in the container to start")
        status = proc_status(podman.pid(name))
        assert (status["Uid"].split()[0], status["Gid"].split()[0]) == (str(UID), str(UID))
        assert status["CapEff"] == "0000000000000000"
        mounts = mount_options(podman.pid(name))
        assert "ro" in mounts["/"], mounts["/"]
        assert "ro" in mounts["/var/log/pods"]
        assert "rw" in mounts[STATE_DIR]

        log.write_text(log.read_text() + cri(oom_block()))
        settle(served, 1)
        assert served.count(namespace="llm", pod="sglang-0", container="sglang") == 1
        podman("stop", "--time=20", name)
        assert podman("inspect", "--format={{.State.ExitCode}}", name).stdout.strip() == "0"
        saved = json.loads((state / "state.json").read_text())
        assert saved, "the state file is empty"
        assert (state / "state.json").stat().st_uid == UID
    finally:
        podman("rm", "--force", "--time=0", name, check=False)


def _without_sample_dir(report: dict) -> dict:
    """The report with the installed sample's directory cut from its paths."""
    for item in report["inputs"]:
        item["path"] = os.path.basename(item["path"])
    for event in report["events"]:
        event["source"] = os.path.basename(event["source"])
    return report
