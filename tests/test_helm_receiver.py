"""The chart's `mode: receiver`: an unprivileged Deployment that receives OTLP/HTTP logs, checked on the pod helm
renders against every rule of the Pod Security Standards' `restricted` profile, and its config read by the
exporter's own loader."""

from __future__ import annotations

import base64
import re
import shutil

import pytest
import yaml

from sglang_oom_exporter.config.load import load_config
from tests.support.helm import (
    CHART,
    by_kind,
    helm,
    helm_with_values,
    install_notes,
    one,
    rendered_config,
    run_tool,
    template,
    workload,
)
from tests.support.helpers import free_port, wait_until
from tests.support.logs import oom_block
from tests.support.otlp import json_request, post

pytestmark = pytest.mark.e2e  # every test here runs helm

# The volume types the restricted profile allows (Pod Security Standards, "Volume Types").
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}  # fmt: skip


def restricted_violations(pod_spec: dict) -> list[str]:
    """Every rule of the baseline and restricted profiles the pod spec breaks (an empty list: admitted)."""
    bad = []
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(key):
            bad.append(key)
    pod_sc = pod_spec.get("securityContext", {})
    for volume in pod_spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            bad.append(f"volume {volume['name']}: {sorted(kinds)}")
    for c in pod_spec.get("initContainers", []) + pod_spec["containers"]:
        sc = c.get("securityContext", {})
        name = c["name"]
        if sc.get("privileged"):
            bad.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{name}: allowPrivilegeEscalation must be false")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            bad.append(f"{name}: capabilities must drop ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            bad.append(f"{name}: adds {caps['add']}")
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
            bad.append(f"{name}: runAsNonRoot must be true")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            bad.append(f"{name}: runAsUser 0")
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            bad.append(f"{name}: seccompProfile {seccomp}")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            bad.append(f"{name}: hostPort")
        if sc.get("procMount", "Default") != "Default":
            bad.append(f"{name}: procMount")
    return bad


def test_the_restricted_check_catches_the_daemonsets_root_and_hostpath():
    pod = workload(template())["spec"]["template"]["spec"]
    violations = restricted_violations(pod)
    assert "oom-exporter: runAsNonRoot must be true" in violations
    assert "oom-exporter: runAsUser 0" in violations
    assert any(v.startswith("volume pod-logs: ['hostPath']") for v in violations)


def test_receiver_mode_is_an_unprivileged_deployment_that_the_restricted_profile_admits():
    docs = template(values={"mode": "receiver", "receiver": {"bearerTokenSecret": "otlp-token"}})
    deployment = workload(docs)
    assert deployment["kind"] == "Deployment"
    assert deployment["spec"]["replicas"] == 1  # one container's records to one replica (docs/otlp.md)
    pod = deployment["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    (c,) = pod["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"metrics": 9877, "otlp-http": 4318}
    assert {v["name"] for v in pod["volumes"]} == {"config", "tmp", "state", "otlp-token"}
    service = one(docs, "Service")
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        "metrics": (9877, "metrics"), "otlp-http": (4318, "otlp-http"),
    }  # fmt: skip


def test_receiver_modes_config_is_what_serve_loads(tmp_path):
    docs = template(values={"mode": "receiver", "receiver": {"port": 14318, "maxRequestKiB": 512,
                                                             "bearerTokenSecret": "otlp-token", "spoolSourceMiB": 64,
                                                             "spoolRetention": "30m"}})  # fmt: skip
    raw = rendered_config(docs)
    assert raw == {"listen": ":9877", "state_dir": "/var/lib/sglang-oom-exporter", "log_level": "info",
                   "otlp_listen": ":14318", "otlp_max_request_kib": 512, "otlp_spool_source_mib": 64,
                   "otlp_spool_total_mib": 1536, "otlp_spool_retention": "30m",
                   "otlp_bearer_token_file": "/etc/sglang-oom-exporter-otlp/token"}  # fmt: skip
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    config = load_config(str(path), env={})
    assert (config.otlp_listen, config.otlp_max_request_kib, config.state_dir) == (
        ":14318", 512, "/var/lib/sglang-oom-exporter",
    )  # fmt: skip
    assert (config.otlp_spool_source_mib, config.otlp_spool_total_mib, config.otlp_spool_retention) == (
        64,
        1536,
        1800.0,
    )


def test_the_receivers_volume_holds_the_spool_cap_and_the_state_file():
    docs = template(values={"mode": "receiver"})
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    (mount,) = [m for m in deployment["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
                if m["mountPath"] == "/var/lib/sglang-oom-exporter"]  # fmt: skip
    assert volumes[mount["name"]]["emptyDir"] == {"sizeLimit": "2Gi"}
    assert rendered_config(docs)["otlp_spool_total_mib"] == 1536  # 0.5Gi left for state.json and its rewrite


@pytest.mark.parametrize(("values", "where"), [({"receiver": {"port": 0}}, "/receiver/port"),
                                                ({"receiver": {"tokenSecret": "x"}}, "/receiver"),
                                                ({"receiver": {"spoolRetention": "soon"}}, "/receiver/spoolRetention"),
                                                ({"receiver": {"spoolTotalMiB": 0}}, "/receiver/spoolTotalMiB")])  # fmt: skip
def test_receiver_values_are_checked_by_the_schema(values, where):
    assert where in template(values={"mode": "receiver", **values}, ok=False)


def test_a_spool_cap_that_cannot_hold_two_requests_is_refused_at_install():
    out = template(values={"mode": "receiver", "receiver": {"maxRequestKiB": 8192, "spoolSourceMiB": 15}}, ok=False)
    assert "receiver.spoolSourceMiB: 15 MiB cannot hold two requests of receiver.maxRequestKiB 8192" in out
    assert "at least 16 MiB" in out
    docs = template(values={"mode": "receiver", "receiver": {"maxRequestKiB": 8192, "spoolSourceMiB": 16}})
    assert rendered_config(docs)["otlp_spool_source_mib"] == 16


def test_the_notes_and_docs_give_collector_configs_that_parse_and_point_at_the_service():
    proc = helm_with_values([helm(), "install", "t", str(CHART), "-n", "monitoring", "--dry-run=client"], (),
                            {"mode": "receiver"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:\n", 1)[1]
    block = notes.split("(docs/otlp.md has Alloy, Fluent Bit and Vector too):\n", 1)[1].split("files_watched", 1)[0]
    collector = yaml.safe_load(block)
    assert (
        collector["exporters"]["otlphttp/sglang-oom"]["endpoint"] == "http://t-sglang-oom-exporter.monitoring.svc:4318"
    )
    assert collector["service"]["pipelines"]["logs/sglang-oom"]["exporters"] == ["otlphttp/sglang-oom"]
    text = (CHART.parent.parent / "docs" / "otlp.md").read_text(encoding="utf-8")
    blocks = [b.split("\n", 1)[1] for b in text.split("```")[1::2] if b.startswith("yaml")]
    assert len(blocks) == 3  # the Collector agent, the loadbalancing route, Vector
    docs_collector = yaml.safe_load(blocks[0])
    assert docs_collector["exporters"]["otlphttp/sglang-oom"]["sending_queue"]["num_consumers"] == 1
    assert yaml.safe_load(blocks[1])["exporters"]["loadbalancing/sglang-oom"]["routing_key"] == "resource"


def test_the_receivers_memory_limit_is_receiver_memory_limit_and_the_other_modes_keep_theirs():
    docs = template(values={"mode": "receiver"})
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    resources = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources == {"limits": {"memory": "384Mi"}, "requests": {"cpu": "20m", "memory": "64Mi"}}
    docs = template(values={"mode": "receiver", "receiver": {"memoryLimit": "1Gi"}})
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {"memory": "1Gi"}
    (daemonset,) = [d for d in template() if d["kind"] == "DaemonSet"]
    assert daemonset["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {"memory": "256Mi"}


# ------------------------------------------------------------------------------- every endpoint the docs give

ROOT = CHART.parent.parent
ENDPOINT_DOCS = ("README.md", "helm/sglang-oom-exporter/README.md", "docs/otlp.md", "docs/kubernetes.md")
# <service>.<namespace>.svc[:port] (a URL, or Fluent Bit's Host line and the Port line under it), the loadbalancing
# resolver's `service: <service>.<namespace>, ports: [<port>]`, and `-n <namespace> port-forward svc/<service> <port>`.
_SVC = re.compile(r"(?<![\w<.-])([a-z0-9][a-z0-9-]*)\.([a-z0-9][a-z0-9-]*)\.svc(?::(\d+)|\s*\n\s*Port\s+(\d+))")
_RESOLVER = re.compile(r"service: ([a-z0-9][a-z0-9-]*)\.([a-z0-9][a-z0-9-]*), ports: \[(\d+)")
_FORWARD = re.compile(r"-n (\S+) port-forward svc/([a-z0-9][a-z0-9-]*) (\d+)")
_SECRET = re.compile(r"-n (\S+) get secret ([a-z0-9][a-z0-9-]*)")


def _endpoints(text: str) -> list[tuple[str, str, int]]:
    """Every (service, namespace, port) a text tells a client or an agent to reach, in order."""
    found = [(m[1], m[2], int(m[3] or m[4])) for m in _SVC.finditer(text)]
    found += [(m[1], m[2], int(m[3])) for m in _RESOLVER.finditer(text)]
    return found + [(m[2], m[1], int(m[3].split(":")[0])) for m in _FORWARD.finditer(text)]


def _services(docs) -> set[tuple[str, str, int]]:
    return {(d["metadata"]["name"], d["metadata"]["namespace"], p["port"]) for d in by_kind(docs, "Service")
            for p in d["spec"]["ports"]}  # fmt: skip


def test_every_endpoint_the_docs_give_is_a_service_port_the_chart_renders():
    # The docs name the Service of README's install: release sglang-oom-exporter in the namespace of that name.
    names = {"release": "sglang-oom-exporter", "namespace": "sglang-oom-exporter"}
    receiver = template(values={"mode": "receiver"}, **names)
    rendered = _services(template(**names)) | _services(receiver)
    secrets = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in by_kind(receiver, "Secret")}
    given: dict[str, list[tuple[str, str, int]]] = {}
    for rel in ENDPOINT_DOCS:
        text = (ROOT / rel).read_text(encoding="utf-8")
        given[rel] = _endpoints(text)
        assert [e for e in given[rel] if e not in rendered] == [], rel
        told = list(map(tuple, _SECRET.findall(text)))
        assert [s for s in told if s not in secrets] == [], rel
        assert len(told) == (1 if rel == "docs/otlp.md" else 0), rel
    receiver_url = ("sglang-oom-exporter", "sglang-oom-exporter", 4318)
    # The Collector, Alloy, Fluent Bit and Vector, and the sentence before them; the chart README's receiver text.
    assert given["docs/otlp.md"].count(receiver_url) == 5
    assert given["helm/sglang-oom-exporter/README.md"].count(receiver_url) == 1
    assert given["README.md"] == [("sglang-oom-exporter", "sglang-oom-exporter", 9877)]


def test_every_endpoint_the_notes_give_is_a_service_port_the_chart_renders():
    for values in (None, {"mode": "receiver"}, {"mode": "receiver", "receiver": {"port": 14318}}):
        notes = install_notes(values=values)
        endpoints = _endpoints(notes)
        assert len(endpoints) == (3 if values else 1), notes
        assert set(endpoints) <= _services(template(values=values)), notes
        secrets = {
            (d["metadata"]["namespace"], d["metadata"]["name"]) for d in by_kind(template(values=values), "Secret")
        }
        told = set(map(tuple, _SECRET.findall(notes)))
        assert told <= secrets
        assert len(told) == (1 if values else 0)


# ---------------------------------------------------------------------------------------------- closed by default

GENERATED = "t-sglang-oom-exporter-otlp-token"
TOKEN_FILE = "/etc/sglang-oom-exporter-otlp/token"  # noqa: S105 - a path, not a password


def _pod(docs) -> dict:
    return workload(docs)["spec"]["template"]["spec"]


def test_receiver_mode_is_closed_by_default_with_a_generated_token():
    docs = template(values={"mode": "receiver"})
    secret = one(docs, "Secret")
    assert secret["metadata"]["name"] == GENERATED
    assert set(secret["data"]) == {"token"}
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert len(token) == 48
    assert token.isalnum()
    assert rendered_config(docs)["otlp_bearer_token_file"] == TOKEN_FILE
    volumes = {v["name"]: v for v in _pod(docs)["volumes"]}
    assert volumes["otlp-token"]["secret"] == {"secretName": GENERATED, "items": [{"key": "token", "path": "token"}]}
    mounts = {m["name"]: m for m in _pod(docs)["containers"][0]["volumeMounts"]}
    assert mounts["otlp-token"] == {
        "name": "otlp-token",
        "mountPath": "/etc/sglang-oom-exporter-otlp",
        "readOnly": True,
    }
    assert by_kind(docs, "NetworkPolicy") == []  # offered, not on: it needs the agents' namespace


def test_a_named_token_secret_is_used_and_none_is_generated():
    docs = template(values={"mode": "receiver", "receiver": {"bearerTokenSecret": "mine"}})
    assert by_kind(docs, "Secret") == []
    assert rendered_config(docs)["otlp_bearer_token_file"] == TOKEN_FILE
    volumes = {v["name"]: v for v in _pod(docs)["volumes"]}
    assert volumes["otlp-token"]["secret"]["secretName"] == "mine"


def test_only_allow_unauthenticated_opens_the_receiver_and_the_notes_say_so():
    values = {"mode": "receiver", "receiver": {"allowUnauthenticated": True}}
    docs = template(values=values)
    assert by_kind(docs, "Secret") == []
    assert "otlp_bearer_token_file" not in rendered_config(docs)
    assert "otlp-token" not in {v["name"] for v in _pod(docs)["volumes"]}
    assert "WARNING: open (receiver.allowUnauthenticated)" in install_notes(values=values)
    closed = install_notes(values={"mode": "receiver"})
    assert f"get secret {GENERATED} -o jsonpath='{{.data.token}}' | base64 -d" in closed
    assert 'headers: {Authorization: "Bearer ${env:SGLANG_OOM_TOKEN}"}' in closed
    assert "WARNING: open" not in closed


def test_other_modes_make_no_token_secret():
    for mode in ("daemonset", "deployment"):
        values = {"mode": mode, "deployment": {"volume": {"emptyDir": {}}}} if mode == "deployment" else {}
        assert by_kind(template(values=values), "Secret") == []


def test_the_network_policy_admits_only_the_agents_to_the_otlp_port():
    np = {"enabled": True, "agentNamespaces": ["opentelemetry", "logging"],
          "agentPodLabels": {"app.kubernetes.io/name": "opentelemetry-collector"}}  # fmt: skip
    docs = template(values={"mode": "receiver", "receiver": {"port": 14318, "networkPolicy": np}})
    policy = one(docs, "NetworkPolicy")
    agents = {"matchLabels": {"app.kubernetes.io/name": "opentelemetry-collector"}}
    assert policy["spec"] == {
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "sglang-oom-exporter",
                                        "app.kubernetes.io/instance": "t"}},
        "policyTypes": ["Ingress"],
        "ingress": [
            {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}, "podSelector": agents}
                      for ns in ("opentelemetry", "logging")],
             "ports": [{"port": 14318, "protocol": "TCP"}]},
            {"ports": [{"port": 9877, "protocol": "TCP"}]},  # the metrics port: any source (no metricsFrom)
        ],
    }  # fmt: skip
    # The policy selects the exporter's own pod.
    labels = workload(docs)["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()


def test_the_network_policy_can_narrow_the_metrics_port_and_needs_the_agents_namespace():
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    np = {"enabled": True, "agentNamespaces": ["otel"], "metricsFrom": [peer]}
    (_, metrics) = one(template(values={"mode": "receiver", "receiver": {"networkPolicy": np}}), "NetworkPolicy")[
        "spec"
    ]["ingress"]
    assert metrics == {"ports": [{"port": 9877, "protocol": "TCP"}], "from": [peer]}
    out = template(values={"mode": "receiver", "receiver": {"networkPolicy": {"enabled": True}}}, ok=False)
    assert "receiver.networkPolicy.enabled: set receiver.networkPolicy.agentNamespaces" in out


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"receiver": {"networkPolicy": {"agentNamespace": ["x"]}}}, "/receiver/networkPolicy"),
        (
            {"receiver": {"networkPolicy": {"agentNamespaces": ["Not_A_Name"]}}},
            "/receiver/networkPolicy/agentNamespaces/0",
        ),
        ({"receiver": {"allowUnauthenticated": "yes"}}, "/receiver/allowUnauthenticated"),
    ],
)
def test_the_closed_receivers_values_are_checked_by_the_schema(values, where):
    assert where in template(values={"mode": "receiver", **values}, ok=False)


@pytest.mark.slow
@pytest.mark.parametrize("k8s", ["1.25.0", "1.37.0"])
def test_the_token_secret_and_the_network_policy_validate_strictly(tmp_path, k8s):
    if shutil.which("kubernetes-validate") is None:
        pytest.skip("kubernetes-validate is not installed (dev extra)")
    np = {"enabled": True, "agentNamespaces": ["otel"], "agentPodLabels": {"app": "collector"},
          "metricsFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]}  # fmt: skip
    docs = template(values={"mode": "receiver", "receiver": {"networkPolicy": np}})
    paths = []
    for doc in (one(docs, "Secret"), one(docs, "NetworkPolicy"), workload(docs)):
        path = tmp_path / f"{doc['kind']}.yaml"
        path.write_text(yaml.safe_dump(doc))
        paths.append(str(path))
    proc = run_tool("kubernetes-validate", "--strict", "--quiet", "-k", k8s, *paths)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_the_daemon_as_the_chart_configures_it_refuses_a_post_without_the_token(tmp_path, daemon_factory):
    docs = template(values={"mode": "receiver"})
    token = base64.b64decode(one(docs, "Secret")["data"]["token"])
    (tmp_path / "token").write_bytes(token)
    config = rendered_config(docs)
    port = free_port()
    config.update(otlp_listen=f"127.0.0.1:{port}", otlp_bearer_token_file=str(tmp_path / "token"))
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    d = daemon_factory("--config", str(tmp_path / "config.yaml"))
    body = json_request({"k8s.namespace.name": "prod", "k8s.pod.name": "llama-0", "k8s.pod.uid": "u1",
                         "k8s.container.name": "sglang"}, [oom_block()])  # fmt: skip
    url, json_type = f"http://127.0.0.1:{port}", {"Content-Type": "application/json"}
    assert post(url, body, json_type)[0] == 401  # a false page for prod/llama-0 is refused
    assert post(url, body, {**json_type, "Authorization": "Bearer wrong"})[0] == 401
    assert post(url, body, {**json_type, "Authorization": f"Bearer {token.decode()}"})[0] == 200
    assert "is open" not in d.log_tail()


@pytest.mark.slow
def test_an_open_receiver_says_so_in_its_log(tmp_path, daemon_factory):
    d = daemon_factory("--otlp-listen", f"127.0.0.1:{free_port()}")
    seen: list[str] = []

    def warned() -> bool:
        seen.append(d.log_tail(100000))  # each call returns what was written since the last
        return "otlp receiver on 127.0.0.1" in "".join(seen) and "is open: any client" in "".join(seen)

    wait_until(warned, timeout=15, what="the warning that the receiver is open")
