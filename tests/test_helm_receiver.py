"""The chart's `mode: receiver`: an unprivileged Deployment that receives OTLP/HTTP logs, checked on the pod helm
renders against every rule of the Pod Security Standards' `restricted` profile, and its config read by the
exporter's own loader."""

from __future__ import annotations

import pytest
import yaml

from sglang_oom_exporter.config.load import load_config
from tests.support.helm import CHART, helm, helm_with_values, one, rendered_config, template, workload

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
