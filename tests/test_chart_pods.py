"""The chart's pods, as rendered, run with `podman kube play` on the image built from the Dockerfile.

DaemonSet: `helm template` with the hostPaths pointed at a temporary /var/log/pods-shaped tree and state
directory; its pod counts an OOM written to a pod log, runs with the rendered security context (checked in the
kernel's view of the process: uid, capabilities, no_new_privs, seccomp, read-only mounts), and keeps its count
across a pod restart (the pod deleted and played again, with an OOM written while it was down).

Receiver: the chart's `mode: receiver` Deployment's pod, run as rendered (uid 65532, read-only root filesystem,
no hostPath, only its configMap and emptyDir volumes), receives a golden log from the OpenTelemetry SDK's own
OTLP/HTTP exporter on loopback (in two batches, the second retried) and counts exactly its expected events.

Sidecar: the chart README's sidecar snippet, beside a stand-in SGLang container (tests/support/fake_sglang.py run in the
same image in place of launch_server, behind the snippet's own script: FIFO, rotating log writer, SIGTERM trap)
that serves SGLang's /metrics and /get_server_info; an OOM it logs reaches the exporter's /events, /metrics and
page with the concrete flag suggestion, the same one `scan --server-args` gives for that log. With a 64 KiB cap,
ten caps of output keep the shared volume at four files within the cap and every OOM counted once; a pod
deletion as the kubelet does it (the exporter's preStop hook, SIGTERM to SGLang) takes seconds, not the 30 s
grace period, and the OOM SGLang prints on SIGTERM is counted.

What is changed before playing, and why (podman 4.3, Debian 12's, and this sandbox):
  - host networking (`--network host`); the exporter listens on 127.0.0.1 at a free port (the chart's
    `extraArgs`, the snippet's args), and the stand-in SGLang takes a free port instead of 30000;
  - `ports` and the probes that name them are taken out: podman 4.3 turns every containerPort into a host
    port mapping, which host networking refuses ("PortMappings can only be used with Bridge or slirp4netns
    networking"); it runs no readiness probe at all, and liveness probes only from systemd timers, which this
    machine lacks. The test requests each probe's path itself instead;
  - annotation values over 63 characters (the chart's checksum/config) are dropped: podman 4.3 applies the
    label-value limit to annotations ("value length exceeds Kubernetetes max 63"); Kubernetes does not;
  - the pods' emptyDir volumes and ConfigMaps get names of their own: podman 4.3 makes an emptyDir, and a
    ConfigMap a pod mounts, a named volume that every pod naming it shares and that outlives the pod (a
    receiver's config, left behind or played beside it, was a DaemonSet pod's config: it counted nothing, and
    held the receiver's port); the test removes those volumes with its pod. podman runs no lifecycle hooks
    either, so the test runs the exporter's preStop command with `podman exec` as the kubelet would, before
    that container's SIGTERM;
  - a secret volume gets `optional: false` spelt out: podman 4.3 dereferences the unset field and panics
    (Kubernetes defaults it to false); the Secret itself is a podman secret holding the Secret's manifest,
    which is what podman 4.3's secret volumes read: they write each `data` value as it is, without the base64
    decoding Kubernetes does (and ignore `stringData`), so the test's Secret holds the files' text there.
"""

from __future__ import annotations

import base64
import fcntl
import http.client
import json
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import bcrypt
import pytest
import yaml

from sglang_oom_exporter import __version__
from tests.support.daemon import settle
from tests.support.golden import load_expected
from tests.support.helm import CHART, helm
from tests.support.helpers import free_port, openssl_cert, wait_until
from tests.support.image import Served
from tests.support.logs import append, cri, oom_block
from tests.support.otlp import export, log_lines, pod_resource, records
from tests.support.podman import mount_options, proc_status
from tests.support.sglang_data import INFO
from tests.support.sidecar import container as named_container
from tests.support.sidecar import snippet_pod, with_stand_in

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

HERE = Path(__file__).resolve().parent
PUBLISHED = f"ghcr.io/sglang-oom-exporter/sglang-oom-exporter:{__version__}"


def playable(pod: dict) -> tuple[dict, list[tuple[str, int]]]:
    """The pod with podman 4.3's limits worked around (module docstring), and the (path, port) of every
    HTTP probe taken out, its named port resolved as Kubernetes does."""
    pod = json.loads(json.dumps(pod))
    annotations = pod["metadata"].get("annotations") or {}
    for key in [k for k, v in annotations.items() if len(str(v)) > 63]:
        del annotations[key]
    for volume in pod["spec"].get("volumes", []):
        if "secret" in volume:
            volume["secret"].setdefault("optional", False)
    probes = []
    for container in pod["spec"]["containers"]:
        named = {p["name"]: p["containerPort"] for p in container.pop("ports", []) if "name" in p}
        for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
            get = (container.pop(kind, None) or {}).get("httpGet")
            if get:
                probes.append((get["path"], named.get(get["port"], get["port"])))
    return pod, probes


def play(podman, tmp_path: Path, docs: list[dict]) -> Path:
    """`podman kube play` these documents on the host network; the file played (for a second play)."""
    path = tmp_path / f"play-{len(list(tmp_path.glob('play-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    podman("kube", "play", "--network=host", str(path), timeout=180)
    return path


def stop_pod(podman, name: str) -> dict[str, int]:
    """Stop the pod as a node drain would (SIGTERM, then the grace period); the exit code per container."""
    podman("pod", "stop", "--time=30", name, timeout=120)
    codes = {}
    for line in podman("ps", "--all", f"--filter=pod={name}", "--format={{.Names}} {{.ExitCode}}").stdout.splitlines():
        container, code = line.rsplit(" ", 1)
        if not container.endswith("-infra"):
            codes[container.removeprefix(f"{name}-")] = int(code)
    return codes


def assert_runs_as_rendered(podman, container: str, pod_sc: dict, sc: dict, mounts: list[dict]) -> None:
    """The rendered security context, as the kernel applies it to the running process."""
    pid = podman.pid(container)
    status = proc_status(pid)
    uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
    if uid is not None:
        assert status["Uid"].split() == [str(uid)] * 4
    if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
        assert status["Uid"].split()[0] != "0"
    if sc.get("capabilities", {}).get("drop") == ["ALL"]:
        for field in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            assert status[field] == "0000000000000000", (field, status[field])
    if sc.get("allowPrivilegeEscalation") is False:
        assert status["NoNewPrivs"] == "1"
    if (sc.get("seccompProfile") or pod_sc.get("seccompProfile")) == {"type": "RuntimeDefault"}:
        assert status["Seccomp"] == "2"  # a filter is applied
    seen = mount_options(pid)
    assert ("ro" in seen["/"]) is bool(sc.get("readOnlyRootFilesystem")), seen["/"]
    for mount in mounts:
        assert ("ro" if mount.get("readOnly") else "rw") in seen[mount["mountPath"]], mount


def probe_paths_answer(probes: list[tuple[str, int]]) -> None:
    """What kubelet would ask: every probe's path answers 200 on its port (none is fine: a pod may have none)."""
    for path, port in probes:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            assert r.status == 200, (path, port)


def helm_template(tmp_path: Path, values: dict, *ci: str) -> list[dict]:
    """`helm template` of the chart (release soe, namespace monitoring) with these values."""
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    argv = [helm(), "template", "soe", str(CHART), "--namespace=monitoring"]
    for name in ci:
        argv += ["-f", str(CHART / "ci" / name)]
    proc = subprocess.run([*argv, "-f", str(path)], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


@pytest.fixture
def node_turn(tmp_path: Path) -> Iterator[None]:
    """A DaemonSet runs one pod per node: the tests that play its pod on this host's network take turns (two at
    once, on two xdist workers, left one of them counting nothing), through a lock all workers share."""
    with (tmp_path.parent.parent / "daemonset-pod.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def daemonset_pod(tmp_path: Path, image: str, pods: Path, state: Path, prefix: str, values: dict | None = None):
    """The chart's DaemonSet (release soe) rendered to read `pods` and keep its state in `state`, serving on a
    free port, and its pod template as a playable Pod named <prefix>-<port>: (port, the ConfigMap, the
    DaemonSet, the Pod, the (path, port) of its HTTP probes)."""
    port = free_port()
    repository, tag = image.rsplit(":", 1)
    docs = helm_template(tmp_path, {
        "image": {"repository": repository, "tag": tag},
        "port": port,
        "extraArgs": [f"--listen=127.0.0.1:{port}"],
        "daemonset": {"logsHostPath": str(pods), "stateHostPath": str(state)},
        **(values or {}),
    })  # fmt: skip
    config_map, ds, pod, probes = workload_pod(docs, "DaemonSet", f"{prefix}-{port}")
    return port, config_map, ds, pod, probes


def workload_pod(docs: list[dict], kind: str, name: str) -> tuple[dict, dict, dict, list[tuple[str, int]]]:
    """The rendered ConfigMap, the workload of this kind, its pod template as a playable Pod of this name, and
    the (path, port) of its HTTP probes."""
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"]
    (workload,) = [d for d in docs if d["kind"] == kind]
    template = workload["spec"]["template"]
    pod, probes = playable({"apiVersion": "v1", "kind": "Pod", "metadata": {**template["metadata"], "name": name},
                            "spec": template["spec"]})  # fmt: skip
    own_volume_names(pod, name, [v for v in pod["spec"].get("volumes", []) if "emptyDir" in v])
    config_map = own_config_map(config_map, pod, name)
    return config_map, workload, pod, probes


def own_config_map(config_map: dict, pod: dict, suffix: str) -> dict:
    """The ConfigMap under a name of the pod's own, and the pod's configMap volumes pointed at it: podman 4.3
    keeps a mounted ConfigMap as a named volume of the ConfigMap's name, which the next pod naming it reuses."""
    own = f"{config_map['metadata']['name']}-{suffix}"
    for volume in pod["spec"].get("volumes", []):
        if volume.get("configMap", {}).get("name") == config_map["metadata"]["name"]:
            volume["configMap"]["name"] = own
    return {**config_map, "metadata": {**config_map["metadata"], "name": own}}


def assert_own_config(podman, config_map: dict) -> None:
    """The volume podman made of the ConfigMap holds this ConfigMap's files, as rendered."""
    root = Path(podman("volume", "inspect", "--format={{.Mountpoint}}", config_map["metadata"]["name"]).stdout.strip())
    assert {f: (root / f).read_text() for f in config_map["data"]} == config_map["data"]


def remove_pod(podman, pod: dict) -> None:
    """Remove the pod and the named volumes podman made for it (its emptyDirs and its ConfigMaps)."""
    podman("pod", "rm", "--force", "--time=0", pod["metadata"]["name"], check=False, timeout=120)
    for volume in pod["spec"].get("volumes", []):
        if "emptyDir" in volume:
            podman("volume", "rm", "--force", volume["name"], check=False)
        elif "configMap" in volume:
            podman("volume", "rm", "--force", volume["configMap"]["name"], check=False)


def own_volume_names(pod: dict, suffix: str, volumes: list[dict]) -> None:
    """Give these volumes of the pod (and their mounts) names of the pod's own. podman 4.3 makes an emptyDir a
    named volume that every pod naming it shares (a second play of that name fails while the first pod lives),
    so tests on other workers would collide."""
    for volume in volumes:
        for container in pod["spec"]["containers"]:
            for mount in container.get("volumeMounts", []):
                if mount["name"] == volume["name"]:
                    mount["name"] = f"{volume['name']}-{suffix}"
        volume["name"] = f"{volume['name']}-{suffix}"


# --------------------------------------------------------------------------------------------------- DaemonSet


def test_daemonset_pod_counts_an_oom_keeps_it_across_a_restart_and_runs_as_rendered(podman, image, tmp_path, node_turn):
    pods, state = tmp_path / "pods", tmp_path / "state"
    log = pods / "llm_sglang-0_0d7c" / "sglang" / "0.log"
    log.parent.mkdir(parents=True)
    log.write_text(cri("[2026-03-14 22:00:00 TP0] Load weight end."))
    coredns = pods / "kube-system_coredns-1_aa" / "coredns" / "0.log"
    coredns.parent.mkdir(parents=True)
    coredns.write_text(cri(oom_block()))  # the default filters skip kube-* namespaces
    state.mkdir()
    port, config_map, _, pod, probes = daemonset_pod(tmp_path, image, pods, state, "soe-node")
    name = pod["metadata"]["name"]
    (container,) = pod["spec"]["containers"]
    labels = {"namespace": "llm", "pod": "sglang-0", "container": "sglang"}
    served = Served(port, podman, f"{name}-oom-exporter")
    try:
        play(podman, tmp_path, [config_map, pod])
        wait_until(served.started, timeout=60, what="the DaemonSet pod")
        assert_own_config(podman, config_map)
        assert_runs_as_rendered(podman, f"{name}-oom-exporter", pod["spec"]["securityContext"],
                                container["securityContext"], container["volumeMounts"])  # fmt: skip
        (inspected,) = json.loads(podman("inspect", f"{name}-oom-exporter").stdout)
        limit = container["resources"]["limits"]["memory"]
        assert inspected["HostConfig"]["Memory"] == int(limit[:-2]) * {"Mi": 2**20, "Gi": 2**30}[limit[-2:]]
        assert {path for path, _ in probes} == {"/metrics"}
        probe_paths_answer(probes)

        append(log, cri(oom_block()))
        settle(served, 1)
        assert served.count(**labels) == 1
        assert stop_pod(podman, name) == {"oom-exporter": 0}
        podman("pod", "rm", name)
        # The node keeps logging while the DaemonSet's pod is replaced.
        append(log, cri(oom_block()))
        assert (state / "monitoring.soe" / "state.json").is_file()

        play(podman, tmp_path, [config_map, pod])
        wait_until(served.started, timeout=60, what="the new pod")
        settle(served, 2)
        assert served.count(**labels) == 2
        assert stop_pod(podman, name) == {"oom-exporter": 0}
    finally:
        remove_pod(podman, pod)


def _get(url: str, context: ssl.SSLContext | None, auth: tuple[str, str] | None = None) -> tuple[int, str]:
    """One GET: the status and the body (an HTTP error's too)."""
    request = urllib.request.Request(url)  # noqa: S310 - the test's own https://127.0.0.1 URL
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as r:  # noqa: S310 - as above
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_daemonset_pod_serves_tls_and_basic_auth_from_the_web_config_secret(podman, image, tmp_path, node_turn):
    pods, state = tmp_path / "pods", tmp_path / "state"
    (pods / "llm_sglang-0_0d7c" / "sglang").mkdir(parents=True)
    state.mkdir()
    cert, key = openssl_cert(tmp_path)
    password = "s3cret-scrape"  # noqa: S105 - a throwaway credential of this test
    web_config = yaml.safe_dump({
        "tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key"},  # beside the file, in the Secret
        "basic_auth_users": {"prometheus": bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()},
    })  # fmt: skip
    # The Secret as podman 4.3 reads it (module docstring): the files' text under `data`, not base64-encoded.
    secret = {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"oom-web-{tmp_path.name[-8:].lower()}"},
        "type": "Opaque",
        "data": {"web-config.yml": web_config, "tls.crt": cert.read_text(), "tls.key": key.read_text()},
    }  # fmt: skip
    web = {"webConfig": {"secretName": secret["metadata"]["name"], "tls": True, "basicAuth": True}}
    port, config_map, ds, pod, probes = daemonset_pod(tmp_path, image, pods, state, "soe-web", web)
    name = pod["metadata"]["name"]
    assert probes == []  # basic auth: TCP probes, which the test replays below
    (container,) = pod["spec"]["containers"]
    assert "--web-config=/etc/sglang-oom-exporter-web/web-config.yml" in container["args"]
    trusted = ssl.create_default_context(cafile=str(cert))
    url = f"https://127.0.0.1:{port}/metrics"
    try:
        secret_file = tmp_path / "secret.yaml"
        secret_file.write_text(yaml.safe_dump(secret))
        podman("secret", "create", secret["metadata"]["name"], str(secret_file))
        play(podman, tmp_path, [config_map, pod])

        def answers() -> tuple[int, str] | None:
            try:
                return _get(url, trusted)
            except OSError:
                Served(port, podman, f"{name}-oom-exporter").assert_running()
                return None

        # Over TLS, with the mounted certificate; without credentials, refused.
        status, _ = wait_until(answers, timeout=60, what="the exporter to answer over TLS")
        assert status == 401
        status, body = _get(url, trusted, ("prometheus", password))
        assert status == 200
        assert "sglang_oom_exporter_build_info{" in body
        assert _get(url, trusted, ("prometheus", "wrong"))[0] == 401
        # Plain HTTP gets no page.
        with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
        # What the rendered TCP probes ask: the port accepts a connection.
        for kind in ("readinessProbe", "livenessProbe"):
            assert ds["spec"]["template"]["spec"]["containers"][0][kind]["tcpSocket"] == {"port": "metrics"}
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        assert stop_pod(podman, name) == {"oom-exporter": 0}
    finally:
        remove_pod(podman, pod)
        podman("secret", "rm", secret["metadata"]["name"], check=False)


# ---------------------------------------------------------------------------------------------------- receiver


def test_receiver_pod_runs_unprivileged_and_counts_golden_records_sent_by_the_sdk(podman, image, tmp_path):
    port, otlp = free_port(), free_port()
    while otlp == port:
        otlp = free_port()
    repository, tag = image.rsplit(":", 1)
    docs = helm_template(tmp_path, {
        "mode": "receiver",
        "image": {"repository": repository, "tag": tag},
        "port": port,
        # Open, for the SDK's exporter to send without a token (the token path: test_helm_receiver.py's daemon).
        "receiver": {"port": otlp, "allowUnauthenticated": True},
        "extraArgs": [f"--listen=127.0.0.1:{port}", f"--otlp-listen=127.0.0.1:{otlp}"],
    })  # fmt: skip
    config_map, _, pod, probes = workload_pod(docs, "Deployment", f"soe-receiver-{port}")
    assert not [v for v in pod["spec"]["volumes"] if "hostPath" in v]
    assert {next(iter(set(v) - {"name"})) for v in pod["spec"]["volumes"]} == {"configMap", "emptyDir"}
    name = pod["metadata"]["name"]
    (container,) = pod["spec"]["containers"]
    served = Served(port, podman, f"{name}-oom-exporter")
    golden = HERE / "data" / "logs" / "cuda_oom_three_texts.log"
    expected = {k: n for k, n in load_expected(str(golden))["counts"].items() if n}
    lines = log_lines(golden.read_bytes())
    try:
        play(podman, tmp_path, [config_map, pod])
        wait_until(served.started, timeout=60, what="the receiver pod")
        assert_own_config(podman, config_map)
        assert_runs_as_rendered(podman, f"{name}-oom-exporter", pod["spec"]["securityContext"],
                                container["securityContext"], container["volumeMounts"])  # fmt: skip
        assert proc_status(podman.pid(f"{name}-oom-exporter"))["Uid"].split() == ["65532"] * 4
        probe_paths_answer(probes)
        url = f"http://127.0.0.1:{otlp}"
        half = len(lines) // 2
        resource = pod_resource("llm", "sglang-0")
        assert export(url, records(resource, lines[:half])) == "SUCCESS"
        assert export(url, records(resource, lines[half:], first=half)) == "SUCCESS"
        assert export(url, records(resource, lines[half:], first=half)) == "SUCCESS"  # a retried batch
        labels = {"namespace": "llm", "pod": "sglang-0", "container": "server"}
        for kind, n in expected.items():
            settle(served, n, kind)
        assert {k: served.count(k, **labels) for k in expected} == expected
        m = served.metrics("sglang_oom_exporter_otlp_log_records")
        assert m[("sglang_oom_exporter_otlp_log_records_total", (("result", "spooled"),))] == len(lines)
        assert m[("sglang_oom_exporter_otlp_log_records_total", (("result", "duplicate"),))] == len(lines) - half
        assert stop_pod(podman, name) == {"oom-exporter": 0}
    finally:
        remove_pod(podman, pod)


# ----------------------------------------------------------------------------------------------------- sidecar


class SidecarPod:
    """The chart README's sidecar snippet made playable: the stand-in SGLang (tests/support/fake_sglang.py, with
    these extra arguments) in place of launch_server behind the snippet's own script, both images the one built
    here, free ports, and podman 4.3's limits worked around (module docstring)."""

    def __init__(self, image: str, tmp_path: Path, *stand_in_args: str, env: dict[str, str] | None = None) -> None:
        pod = snippet_pod()
        exporter, sglang = named_container(pod, "oom-exporter"), named_container(pod, "sglang")
        fake_dir = tmp_path / "fake-sglang"
        fake_dir.mkdir()
        shutil.copy(HERE / "support" / "fake_sglang.py", fake_dir)
        shutil.copy(HERE / "data" / "scrape" / "v0.5.16-dp2.prom", fake_dir / "metrics.prom")
        (fake_dir / "info.json").write_text(json.dumps(INFO))
        self.sglang_port, self.port = free_port(), free_port()
        while self.port == self.sglang_port:
            self.port = free_port()
        self.name = f"llm-{self.port}"
        pod["metadata"]["name"] = self.name
        stand_in = " ".join([
            f"python3 -u /opt/fake-sglang/fake_sglang.py --port {self.sglang_port}",
            "--metrics /opt/fake-sglang/metrics.prom --info /opt/fake-sglang/info.json --info-path /get_server_info",
            *stand_in_args,
        ])  # fmt: skip
        sglang["args"] = [with_stand_in(sglang["args"][0], stand_in)]
        sglang["image"] = image
        sglang["securityContext"] = {"runAsUser": 0}  # SGLang's images run as root
        sglang["volumeMounts"].append({"name": "fake-sglang", "mountPath": "/opt/fake-sglang", "readOnly": True})
        for item in sglang["env"]:
            item["value"] = (env or {}).get(item["name"], item["value"])
        own_volume_names(pod, str(self.port), pod["spec"]["volumes"])
        pod["spec"]["volumes"].append({"name": "fake-sglang",
                                       "hostPath": {"path": str(fake_dir), "type": "Directory"}})  # fmt: skip
        exporter["image"] = image
        url = "--sglang-url=http://127.0.0.1:30000"
        assert url in exporter["args"]
        exporter["args"] = [
            a.replace(url, f"--sglang-url=http://127.0.0.1:{self.sglang_port}") for a in exporter["args"]
        ]
        exporter["args"] += [f"--listen=127.0.0.1:{self.port}", "--scrape-interval=1s"]
        for port in exporter["ports"]:
            port["containerPort"] = self.port
        self.pod, self.probes = playable(pod)
        assert all(p == self.port for _, p in self.probes), self.probes
        self.exporter = named_container(self.pod, "oom-exporter")
        self.target = f"http://127.0.0.1:{self.sglang_port}"


def test_sidecar_snippet_beside_a_stand_in_sglang_pages_the_flag_suggestion(podman, image, tmp_path):
    pod = snippet_pod()
    # The chart's sidecar mode selects this pod and its port by the names the snippet uses.
    docs = helm_template(tmp_path, {}, "sidecar-values.yaml")
    (service,) = [d for d in docs if d["kind"] == "Service"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    exporter = named_container(pod, "oom-exporter")
    assert service["spec"]["ports"][0]["targetPort"] in {p["name"] for p in exporter["ports"]}
    assert exporter["image"] == PUBLISHED

    sidecar = SidecarPod(image, tmp_path)
    pod, name, port, sglang_port, probes = sidecar.pod, sidecar.name, sidecar.port, sidecar.sglang_port, sidecar.probes
    exporter = sidecar.exporter

    served = Served(port, podman, f"{name}-oom-exporter")
    target = f"http://127.0.0.1:{sglang_port}"
    try:
        play(podman, tmp_path, [pod])
        wait_until(served.started, timeout=60, what="the sidecar")
        assert_runs_as_rendered(podman, f"{name}-oom-exporter", pod["spec"].get("securityContext") or {},
                                exporter["securityContext"], exporter["volumeMounts"])  # fmt: skip
        wait_until(lambda: _metric(served, "sglang_oom_target_up", target=target) == 1.0, timeout=60,
                 what="the exporter to scrape the stand-in SGLang")  # fmt: skip
        wait_until(lambda: _metric(served, "sglang_oom_target_server_arg", target=target, arg="chunked_prefill_size")
                 == INFO["chunked_prefill_size"], what="the server args", timeout=60.0)  # fmt: skip
        probe_paths_answer(probes)

        with urllib.request.urlopen(f"http://127.0.0.1:{sglang_port}/fake/oom", timeout=5) as r:
            assert r.read() == b"ok\n"
        settle(served, 1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/events", timeout=5) as r:
            (event,) = json.loads(r.read())["events"]
        assert event["context"]["target"] == target
        # The same suggestion as scan gives for the log the stand-in wrote, with the same server args.
        logged = podman("logs", f"{name}-sglang").stdout  # the log writer keeps `kubectl logs` working
        lines = logged.splitlines(keepends=True)
        block = "".join(lines[next(i for i, line in enumerate(lines) if "Prefill out of memory" in line) :])
        scanned = _scan(tmp_path, block)
        assert event["suggestions"] == scanned["suggestions"]
        first = event["suggestions"][0]
        assert (first["flag"], first["current"]) == ("--chunked-prefill-size", INFO["chunked_prefill_size"])
        assert first["suggested"] < first["current"]
        flag = first["flag"].removeprefix("--")
        assert (
            _metric(served, "sglang_oom_suggested_flag_value", kind="prefill", source="sglang", flag=flag)
            == (first["suggested"])
        )
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
            page = r.read().decode()
        assert f"<code>{first['flag']}</code> {first['current']} &rarr; {first['suggested']}" in page
        # The exporter stops on SIGTERM and saves its state.
        podman("stop", "--time=30", f"{name}-oom-exporter", timeout=120)
        assert podman("inspect", "--format={{.State.ExitCode}}", f"{name}-oom-exporter").stdout.strip() == "0"
    finally:
        remove_pod(podman, pod)


def _log_sizes(podman, sglang: str) -> dict[str, int]:
    """Each file on the shared log volume and its size, seen from the SGLang container."""
    out = podman("exec", sglang, "bash", "-c", "cd /var/log/sglang && stat -c '%n %s' *").stdout
    return {name: int(size) for name, size in (line.rsplit(" ", 1) for line in out.splitlines())}


def test_sidecar_snippet_bounds_its_log_stops_in_seconds_and_counts_every_oom(podman, image, tmp_path):
    # The snippet as it is, with a 64 KiB cap instead of 64 MiB so that a few seconds of output rotate it many times.
    cap, floods = 64 * 1024, 10
    sidecar = SidecarPod(image, tmp_path, f"--flood-bytes={cap}", "--flood-rate=262144", "--oom-on-term",
                         env={"LOG_MAX_BYTES": str(cap)})  # fmt: skip
    name = sidecar.name
    sglang, exporter = f"{name}-sglang", f"{name}-oom-exporter"
    pre_stop = sidecar.exporter["lifecycle"]["preStop"]["exec"]["command"]
    served = Served(sidecar.port, podman, exporter)
    try:
        play(podman, tmp_path, [sidecar.pod])
        wait_until(served.started, timeout=60, what="the sidecar")
        up = lambda: _metric(served, "sglang_oom_target_up", target=sidecar.target) == 1.0  # noqa: E731
        wait_until(up, timeout=60, what="the stand-in SGLang to answer")  # it may start after the exporter
        # Sustained output, 10 times the cap at 256 KiB/s (a generation lives about 250 ms), an OOM after each
        # cap's worth: the volume never holds more than the live file and 3 generations of at most the cap each.
        for _ in range(floods):
            with urllib.request.urlopen(f"http://127.0.0.1:{sidecar.sglang_port}/fake/flood", timeout=60) as r:
                assert r.read() == b"ok\n"
            sizes = _log_sizes(podman, sglang)
            assert max(sizes.values()) <= cap, sizes
            assert set(sizes) <= {"sglang.log", "sglang.log.1", "sglang.log.2", "sglang.log.3"}, sizes
        assert sorted(sizes) == ["sglang.log", "sglang.log.1", "sglang.log.2", "sglang.log.3"]
        assert sum(sizes.values()) <= 4 * cap
        written = len(podman("logs", sglang).stdout.encode())  # every line also went to the container's stdout
        assert written > floods * cap
        # The OOMs in the generations rotated away count too, each exactly once.
        settle(served, floods)

        # Pod deletion as the kubelet does it: each container's preStop hook, then its SIGTERM. SGLang has no
        # hook and gets SIGTERM at once; the exporter's hook (podman 4.3 runs no hooks: it is run here as the
        # kubelet would) waits for SGLang's last line.
        started = time.monotonic()
        hook = subprocess.Popen(["podman", "exec", exporter, *pre_stop], env=podman.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        podman("stop", "--time=30", sglang, timeout=120)
        sglang_seconds = time.monotonic() - started
        _, hook_err = hook.communicate(timeout=60)
        hook_seconds = time.monotonic() - started
        assert (hook.returncode, hook_err) == (0, "")
        # The OOM the stand-in printed on SIGTERM, after the last flood: counted before the exporter is stopped.
        settle(served, floods + 1)
        podman("stop", "--time=30", exporter, timeout=120)
        total_seconds = time.monotonic() - started
        codes = {c: podman("inspect", "--format={{.State.ExitCode}}", c).stdout.strip() for c in (sglang, exporter)}
        assert codes == {sglang: "0", exporter: "0"}
        print(f"\nstop: SGLang {sglang_seconds:.1f} s, preStop {hook_seconds:.1f} s, pod {total_seconds:.1f} s "
              f"(grace period 30 s); {written} bytes logged, {sum(sizes.values())} kept")  # fmt: skip
        # The grace period is 30 s; the `| tee` snippet's SGLang container took all of it.
        assert sglang_seconds < 10, sglang_seconds
        # The hook waited for the marker, not for its 20 s deadline: 3 s after SGLang's last line.
        assert hook_seconds < 15, hook_seconds
        assert total_seconds < 20, total_seconds
        assert podman("logs", sglang).stdout.endswith("Received sigterm; shutting down.\n")
    finally:
        remove_pod(podman, sidecar.pod)


def _metric(served: Served, name: str, **labels: str) -> float | None:
    return served.metrics(name).get((name, tuple(sorted(labels.items()))))


def _scan(tmp_path: Path, block: str) -> dict:
    """scan's one event for this log text, with the stand-in's server args."""
    (tmp_path / "scan.log").write_text(block)
    (tmp_path / "server-args.json").write_text(json.dumps(INFO))
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_oom_exporter", "scan", "--format=json",
         f"--server-args={tmp_path / 'server-args.json'}", str(tmp_path / "scan.log")],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    (event,) = json.loads(proc.stdout)["events"]
    return event
