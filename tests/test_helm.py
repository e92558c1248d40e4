"""The Helm chart (helm/sglang-oom-exporter), checked through the real helm v4 binary and the real validators.

What `ct lint` would do offline (helm lint --strict per ci/*-values.yaml, yamllint, yamale), kubernetes-validate
--strict on the rendered manifests, the vendored CRD schemas on the monitors and rules, promtool on the rules
taken out of the rendered PrometheusRule, and assertions on what the templates must get right: the security
context, the read-only hostPath, probes, resources, RBAC only with discovery, the values schema, the per-alert
knobs and `--reuse-values` with null subtrees.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jsonschema
import pytest
import yaml

from sglang_oom_exporter import __version__
from sglang_oom_exporter.config.load import load_config
from tests.support.helm import (
    CHART,
    CI_FILES,
    CRD_SCHEMAS,
    ROOT,
    RULES_FILE,
    by_kind,
    crd_validate,
    helm,
    install_notes,
    needs_dashboards,
    needs_rules,
    one,
    rendered_config,
    run_tool,
    template,
    workload,
)
from tests.support.helpers import YAML_LOADER, once_per_run
from tests.support.sidecar import snippet_pod

SCHEMAS = ROOT / "tests" / "schemas"
DEFAULTS_FILE = CHART / "files" / "render-defaults.yaml"
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
OCI_CHART = "oci://ghcr.io/sglang-oom-exporter/charts/sglang-oom-exporter"  # where the release workflow pushes it


# ---------------------------------------------------------------------------------------------- static (ct lint)


@pytest.mark.e2e
@pytest.mark.parametrize("ci", CI_FILES)
def test_helm_lint_strict_per_ci_values_file(ci):
    needs_rules()
    proc = run_tool(helm(), "lint", "--strict", str(CHART), "-f", str(CHART / "ci" / ci))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout


def test_the_ci_files_are_the_documented_six():
    assert CI_FILES == [
        "all-off-values.yaml", "all-on-values.yaml", "deployment-values.yaml", "options-values.yaml",
        "reuse-values-values.yaml", "sidecar-values.yaml",
    ]  # fmt: skip


def test_yamllint_with_chart_testing_config():
    if shutil.which("yamllint") is None:
        pytest.skip("yamllint is not installed (dev extra)")
    files = [CHART / "Chart.yaml", CHART / "values.yaml", *sorted((CHART / "ci").glob("*.yaml"))]
    proc = run_tool("yamllint", "--strict", "-c", str(SCHEMAS / "lintconf.yaml"), *map(str, files))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_yamale_chart_schema():
    if shutil.which("yamale") is None:
        pytest.skip("yamale is not installed (dev extra)")
    proc = run_tool("yamale", "-s", str(SCHEMAS / "chart_schema.yaml"), str(CHART / "Chart.yaml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_values_yaml_points_editors_at_the_schema():
    first = (CHART / "values.yaml").read_text().splitlines()[0]
    assert first == "# yaml-language-server: $schema=values.schema.json"
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(schema)
    # Every key in values.yaml is described by the schema and the defaults pass it.
    jsonschema.validate(yaml.safe_load((CHART / "values.yaml").read_text()), schema)


def test_chart_version_follows_the_package():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == __version__
    assert chart["appVersion"] == __version__
    assert chart["apiVersion"] == "v2"


def test_chart_generated_files_are_exactly_the_rendered_ones():
    from sglang_oom_exporter.catalog import load_catalog
    from sglang_oom_exporter.render import render_all

    everything = render_all(load_catalog())
    rendered = {p: t for p, t in everything.items() if p.startswith("helm/")}
    on_disk = {str(p.relative_to(ROOT)) for p in (CHART / "files").rglob("*") if p.is_file()} | {
        "helm/sglang-oom-exporter/Chart.yaml"
    }
    assert set(rendered) == on_disk
    for rel, text in rendered.items():
        assert (ROOT / rel).read_text(encoding="utf-8") == text, f"{rel} is stale: run sglang-oom-exporter render"
    if "alerts/sglang-oom.rules.yaml" in everything:
        assert (ROOT / "alerts" / "sglang-oom.rules.yaml").read_bytes() == RULES_FILE.read_bytes()


# ---------------------------------------------------------------------------------------------- validators


K8S_VERSIONS = ["1.25.0", "1.37.0"]
MISSPELT = "misspelt-field"  # the all-off render with one field misspelt: strict validation must reject it


def needs_kubernetes_validate():
    if shutil.which("kubernetes-validate") is None:
        pytest.skip("kubernetes-validate is not installed (dev extra)")


@functools.cache
def _kubernetes_validate(k8s: str) -> tuple[int, dict[str | None, list[str]]]:
    """_validate_all once per run: every xdist worker that meets a case of this version reads the one result."""
    returncode, cases = once_per_run(f"kubernetes-validate-{k8s}", lambda: _validate_all(k8s))
    return returncode, {None if name == "" else name: lines for name, lines in cases}


def _validate_all(k8s: str) -> tuple[int, list[tuple[str, list[str]]]]:
    """kubernetes-validate --strict on every ci render and the misspelt one in ONE process: its code, lines by case.

    One process per case cost 0.5-1 s of CPU each (start-up, then the 1-2 MB definitions reloaded per object),
    and the renders share most objects: each distinct object is written to its own file and validated once, and
    the tool names the file on every line it prints for it, so each case gets exactly the lines of its objects.
    Lines naming no file (a fatal error, a traceback) are filed under None and fail every case.
    """
    renders = {name: template(name) for name in CI_FILES}
    renders[MISSPELT] = template("all-off-values.yaml")
    workload(renders[MISSPELT])["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFilesytem"] = True
    owners: dict[str, list[str]] = {}  # one object's YAML -> the cases that render it
    for name, docs in renders.items():
        for doc in docs:
            owners.setdefault(yaml.safe_dump(doc), []).append(name)
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for i, (text, names) in enumerate(owners.items()):
            path = Path(tmp) / f"object-{i}.yaml"
            path.write_text(text)
            paths[str(path)] = names
        proc = run_tool("kubernetes-validate", "--strict", "--quiet", "-k", k8s, *paths)
    lines: dict[str | None, list[str]] = {name: [] for name in [*renders, None]}
    for line in (proc.stdout + proc.stderr).splitlines():
        words = line.split(maxsplit=2)
        for name in paths.get(words[1], [None]) if len(words) > 1 else [None]:
            lines[name].append(line)
    return proc.returncode, [("" if name is None else name, found) for name, found in lines.items()]


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("ci", CI_FILES)
@pytest.mark.parametrize("k8s", K8S_VERSIONS)
def test_kubernetes_validate_strict(ci, k8s):
    needs_rules()
    needs_kubernetes_validate()
    # The exit code is shared with the misspelt render (so never 0): every failure prints a line naming its file.
    _, lines = _kubernetes_validate(k8s)
    assert lines[None] == []
    errors = [line for line in lines[ci] if not line.startswith("WARN ")]
    assert errors == []
    # Only the CRD kinds have no built-in schema, only a warning (they are checked against the vendored CRDs
    # below); every other object was validated.
    warned = sorted(re.findall(r"Couldn't find schema for kind (\w+) ", "\n".join(lines[ci])))
    assert warned == sorted(d["kind"] for d in template(ci) if d["kind"] in MONITORING_KINDS)
    assert len(warned) == len(lines[ci])


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("k8s", K8S_VERSIONS)
def test_kubernetes_validate_rejects_a_misspelt_field(k8s):
    needs_kubernetes_validate()
    returncode, lines = _kubernetes_validate(k8s)
    assert returncode != 0
    (error,) = lines[MISSPELT]
    assert error.startswith("ERROR ")
    assert "readOnlyRootFilesytem" in error
    assert "did not validate for resource daemonset/t-sglang-oom-exporter" in error


@pytest.mark.e2e
@pytest.mark.parametrize("ci", CI_FILES)
def test_monitoring_objects_match_the_crd_schemas(ci):
    needs_rules()
    docs = template(ci)
    checked = 0
    for doc in docs:
        if doc["kind"] in CRD_SCHEMAS:
            crd_validate(doc)
            checked += 1
    expected = {"all-on-values.yaml": 2, "all-off-values.yaml": 0, "sidecar-values.yaml": 2,
                "deployment-values.yaml": 1, "reuse-values-values.yaml": 2, "options-values.yaml": 1}  # fmt: skip
    assert checked == expected[ci]


@pytest.mark.e2e
def test_crd_schema_rejects_a_bad_duration():
    needs_rules()
    pr = one(template(values={"prometheusRule": {"enabled": True}}), "PrometheusRule")
    pr["spec"]["groups"][0]["rules"][0]["for"] = "2 minutes"
    with pytest.raises(jsonschema.ValidationError, match="2 minutes"):
        crd_validate(pr)


@pytest.mark.e2e
@pytest.mark.parametrize("ci", ["all-on-values.yaml", "sidecar-values.yaml", "reuse-values-values.yaml"])
def test_promtool_checks_the_rules_from_the_rendered_prometheusrule(ci, tmp_path):
    needs_rules()
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (Debian package prometheus)")
    pr = one(template(ci), "PrometheusRule")
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": pr["spec"]["groups"]}))
    proc = run_tool("promtool", "check", "rules", str(rules))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    count = sum(len(g["rules"]) for g in pr["spec"]["groups"])
    assert f"SUCCESS: {count} rules found" in proc.stdout


# ---------------------------------------------------------------------------------------------- the workload


@pytest.mark.e2e
def test_daemonset_security_context():
    spec = workload(template("all-off-values.yaml"))["spec"]["template"]["spec"]
    # uid 0 reads kubelet's root-owned pod logs; everything else is taken away.
    assert spec["securityContext"] == {
        "runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False, "seccompProfile": {"type": "RuntimeDefault"},
    }  # fmt: skip
    (container,) = spec["containers"]
    assert container["securityContext"] == {
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
    }
    assert spec["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in spec
    assert [t["key"] for t in spec["tolerations"]] == ["nvidia.com/gpu", "amd.com/gpu"]


@pytest.mark.e2e
def test_deployment_runs_as_the_image_user_non_root():
    spec = workload(template("deployment-values.yaml"))["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == 65532
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.e2e
def test_only_the_state_dir_and_tmp_are_writable():
    spec = workload(template("all-on-values.yaml"))["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    writable = sorted(n for n, m in mounts.items() if not m.get("readOnly"))
    assert writable == ["state", "tmp"]
    assert mounts["pod-logs"] == {"name": "pod-logs", "mountPath": "/var/log/pods", "readOnly": True}
    assert volumes["pod-logs"]["hostPath"] == {"path": "/var/log/pods", "type": "Directory"}
    assert volumes["log-target-0"]["hostPath"] == {"path": "/var/lib/docker/containers", "type": "Directory"}
    assert mounts["log-target-0"]["readOnly"] is True
    # One state directory per release on the node.
    assert volumes["state"]["hostPath"] == {
        "path": "/var/lib/sglang-oom-exporter/monitoring.t",
        "type": "DirectoryOrCreate",
    }
    assert mounts["state"]["mountPath"] == "/var/lib/sglang-oom-exporter"
    assert rendered_config(template("all-on-values.yaml"))["state_dir"] == "/var/lib/sglang-oom-exporter"


@pytest.mark.e2e
def test_probes_and_resources():
    (ds_container,) = workload(template("all-off-values.yaml"))["spec"]["template"]["spec"]["containers"]
    # A node without SGLang pods answers /healthz 503; readiness there would stall every DaemonSet rollout.
    assert ds_container["readinessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    assert ds_container["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    assert ds_container["resources"] == {"requests": {"cpu": "20m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}
    assert ds_container["ports"] == [{"name": "metrics", "containerPort": 9877, "protocol": "TCP"}]
    (dep_container,) = workload(template("deployment-values.yaml"))["spec"]["template"]["spec"]["containers"]
    assert dep_container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert dep_container["resources"]["limits"] == {"memory": "256Mi"}


@pytest.mark.e2e
def test_gpu_node_placement_is_the_daemonset_default_and_easy_to_turn_off():
    # The terms themselves, per cloud: tests/test_helm_gpu_nodes.py.
    spec = workload(template())["spec"]["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[:2] == [
        {"matchExpressions": [{"key": "feature.node.kubernetes.io/amd-gpu", "operator": "In", "values": ["true"]}]},
        {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]},
    ]
    assert len(terms) == 10
    off = workload(template(values={"gpuNodes": {"enabled": False}}))["spec"]["template"]["spec"]
    assert "affinity" not in off
    # A label of your own (helm merges maps: a default label set to null is dropped); and an affinity of your
    # own with a nodeAffinity replaces the default.
    labels = {"accelerator": "h100", "feature.node.kubernetes.io/amd-gpu": None}
    mine = workload(template(values={"gpuNodes": {"nodeLabels": labels}}))["spec"]["template"]["spec"]
    got = mine["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert got == [{"matchExpressions": [{"key": "accelerator", "operator": "In", "values": ["h100"]}]}, *terms[1:]]
    own = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 1,
                    "preference": {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["llm"]}]},
                }
            ]
        }
    }
    assert workload(template(values={"affinity": own}))["spec"]["template"]["spec"]["affinity"] == own
    pod_affinity = {"podAntiAffinity": {}}
    merged = workload(template(values={"affinity": pod_affinity}))["spec"]["template"]["spec"]["affinity"]
    assert set(merged) == {"podAntiAffinity", "nodeAffinity"}
    # A Deployment reads a volume: no GPU needed.
    dep = workload(template("deployment-values.yaml"))["spec"]["template"]["spec"]
    assert "nodeAffinity" not in dep.get("affinity", {})
    # --reuse-values from a release without gpuNodes: the default placement.
    assert workload(template("reuse-values-values.yaml"))["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    assert "Placement: GPU nodes only: a node with one of the labels of gpuNodes" in _notes()
    assert "Placement" not in _notes(values={"gpuNodes": {"enabled": False}})
    readme = (CHART / "README.md").read_text()
    assert "**Placement: GPU nodes by default.**" in readme
    assert "`--set gpuNodes.enabled=false`" in readme


@pytest.mark.e2e
def test_priority_class_option():
    spec = workload(template("all-on-values.yaml"))["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert "priorityClassName" not in workload(template("all-off-values.yaml"))["spec"]["template"]["spec"]


@pytest.mark.e2e
def test_the_rendered_config_is_accepted_by_the_exporter(tmp_path):
    for ci in ("all-on-values.yaml", "all-off-values.yaml", "deployment-values.yaml", "reuse-values-values.yaml"):
        path = tmp_path / f"{ci}.config.yaml"
        path.write_text(yaml.safe_dump(rendered_config(template(ci))))
        config = load_config(str(path), env={})
        assert config.listen == ":9877"
        assert config.state_dir == "/var/lib/sglang-oom-exporter"
        if ci == "deployment-values.yaml":
            assert config.kubernetes is None
            assert config.paths == ("/logs/llama-70b.log", "/logs/*.log")
            assert dict(config.names) == {"/logs/llama-70b.log": "llama-70b"}
            assert dict(config.target_sources) == {"http://llama-70b.llm.svc:30000": "llama-70b"}
        else:
            assert config.kubernetes is not None
            assert config.kubernetes.logs_root == "/var/log/pods"
        discovery = getattr(config.kubernetes, "discover_targets", None)
        if ci == "all-on-values.yaml":
            assert discovery is not None
            assert (discovery.port, discovery.port_annotation, discovery.interval) == (
                30000, "sglang-oom-exporter/port", 30.0,
            )  # fmt: skip
        else:
            assert discovery is None


@pytest.mark.e2e
def test_filters_reach_the_config():
    config = rendered_config(template(values={"kubernetes": {"namespace": "llm-.*", "container": "sglang"}}))
    assert config["kubernetes"] == {"logs_root": "/var/log/pods", "namespace": "llm-.*", "container": "sglang"}


@pytest.mark.e2e
def test_rbac_and_node_name_only_with_discovery():
    off = template("all-off-values.yaml")
    assert not {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"} & {d["kind"] for d in off}
    assert "env" not in workload(off)["spec"]["template"]["spec"]["containers"][0]
    on = template(values={"discovery": {"enabled": True}})
    role = one(on, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    binding = one(on, "ClusterRoleBinding")
    account = one(on, "ServiceAccount")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "monitoring"}
    ]
    spec = workload(on)["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == account["metadata"]["name"]
    assert spec["automountServiceAccountToken"] is True
    assert spec["containers"][0]["env"] == [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    ]
    # Discovery is a node feature: in deployment mode it renders nothing.
    dep = template("deployment-values.yaml", values={"discovery": {"enabled": True}})
    assert not {"ServiceAccount", "ClusterRole"} & {d["kind"] for d in dep}


@pytest.mark.e2e
def test_sidecar_mode_renders_no_workload_and_selects_the_sglang_pods():
    needs_rules()
    docs = template("sidecar-values.yaml")
    assert {d["kind"] for d in docs} == {"Service", "PodMonitor", "PrometheusRule", "ConfigMap", "Pod"}
    assert one(docs, "Service")["spec"]["selector"] == {"app.kubernetes.io/name": "sglang"}
    assert one(docs, "Service")["spec"]["ports"][0]["targetPort"] == "oom-metrics"
    pm = one(docs, "PodMonitor")
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["honorLabels"] is False
    assert endpoint["port"] == "oom-metrics"
    # The target pod is the SGLang pod here: namespace/pod stay; the exporter's container moves; the job is pinned.
    assert endpoint["relabelings"] == [*KEEP_EXPORTER_IDENTITY, {"action": "labeldrop", "regex": "container"},
                                       {"targetLabel": "job", "replacement": "sglang-oom-exporter"}]  # fmt: skip
    err = template(values={"mode": "sidecar"}, ok=False)
    assert "set sidecar.podSelector" in err


@pytest.mark.e2e
def test_deployment_mode_needs_a_log_volume():
    err = template(values={"mode": "deployment"}, ok=False)
    assert "set deployment.volume" in err


# ---------------------------------------------------------------------------------------------- monitoring objects


@pytest.mark.e2e
def test_all_off_renders_no_monitoring_objects():
    docs = template("all-off-values.yaml")
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "DaemonSet", "Pod", "Service"]
    assert not MONITORING_KINDS & {d["kind"] for d in docs}


# The operator's target labels of the exporter's own pod, kept under names of their own: an OOM page
# names the SGLang pod or source, never the exporter's pod (tests/test_operator_labels.py runs it).
KEEP_EXPORTER_IDENTITY = [
    {"sourceLabels": ["namespace"], "targetLabel": "exporter_namespace"},
    {"sourceLabels": ["pod"], "targetLabel": "exporter_pod"},
    {"sourceLabels": ["container"], "targetLabel": "exporter_container"},
]


@pytest.mark.e2e
def test_service_monitor_pins_the_job_and_honors_labels():
    docs = template("all-on-values.yaml")
    sm = one(docs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["jobLabel"] == "app.kubernetes.io/name"
    assert one(docs, "Service")["metadata"]["labels"]["app.kubernetes.io/name"] == "sglang-oom-exporter"
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint == {
        "port": "metrics",
        "path": "/metrics",
        "interval": "30s",
        "scrapeTimeout": "10s",
        "honorLabels": True,
        "relabelings": [*KEEP_EXPORTER_IDENTITY, {"action": "labeldrop", "regex": "(namespace|pod|container)"}],
    }
    service_labels = one(docs, "Service")["metadata"]["labels"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= service_labels.items()
    pm = one(template(values={"podMonitor": {"enabled": True}}), "PodMonitor")
    assert pm["spec"]["jobLabel"] == "app.kubernetes.io/name"
    assert pm["spec"]["podMetricsEndpoints"][0]["honorLabels"] is True
    assert pm["spec"]["podMetricsEndpoints"][0]["relabelings"] == endpoint["relabelings"]
    forced = one(template(values={"serviceMonitor": {"enabled": True, "honorLabels": False}}), "ServiceMonitor")
    assert forced["spec"]["endpoints"][0]["honorLabels"] is False


@pytest.mark.e2e
def test_both_monitors_fail():
    err = template(values={"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}, ok=False)
    assert "serviceMonitor.enabled and podMonitor.enabled are both true" in err


@pytest.mark.e2e
def test_default_prometheusrule_is_the_rendered_rules_file():
    needs_rules()
    pr = one(template(values={"prometheusRule": {"enabled": True}}), "PrometheusRule")
    assert pr["spec"]["groups"] == yaml.safe_load(RULES_FILE.read_text())["groups"]
    assert "release" not in pr["metadata"]["labels"]


def _alerts(pr) -> dict[str, dict]:
    return {r["alert"]: r for g in pr["spec"]["groups"] for r in g["rules"] if "alert" in r}


@pytest.mark.e2e
def test_per_alert_disable_overrides_and_labels():
    needs_rules()
    base = _alerts(one(template(values={"prometheusRule": {"enabled": True}}), "PrometheusRule"))
    names = sorted(base)
    assert len(names) >= 3
    dropped, changed = names[0], names[1]
    pr = one(
        template(
            values={
                "prometheusRule": {
                    "enabled": True,
                    "disabled": [dropped],
                    "additionalRuleLabels": {"team": "llm", "severity": "ignored"},
                    "rules": {changed: {"for": "7m", "severity": "info"}},
                }
            }
        ),
        "PrometheusRule",
    )
    alerts = _alerts(pr)
    assert sorted(alerts) == [n for n in names if n != dropped]
    assert alerts[changed]["for"] == "7m"
    assert alerts[changed]["labels"]["severity"] == "info"
    assert alerts[changed]["labels"]["team"] == "llm"
    for name, rule in alerts.items():
        assert rule["labels"]["team"] == "llm"
        if name != changed:
            # The rule's own severity wins over additionalRuleLabels; untouched keys stay as rendered.
            assert rule["labels"]["severity"] == base[name]["labels"]["severity"]
            assert rule.get("for") == base[name].get("for")
            assert rule["expr"] == base[name]["expr"]


@pytest.mark.e2e
def test_disabling_a_whole_group_drops_it():
    needs_rules()
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    first = [r["alert"] for r in groups[0]["rules"] if "alert" in r]
    pr = one(template(values={"prometheusRule": {"enabled": True, "disabled": first}}), "PrometheusRule")
    # Its recording rules stay (the dashboard reads them); its alerts go.
    assert [g["name"] for g in pr["spec"]["groups"]] == [g["name"] for g in groups]
    kept = pr["spec"]["groups"][0]["rules"]
    assert kept
    assert kept == [r for r in groups[0]["rules"] if "record" in r]


@pytest.mark.e2e
def test_runbook_and_grafana_url_swaps():
    needs_rules()
    defaults = yaml.safe_load(DEFAULTS_FILE.read_text())
    base = _alerts(one(template(values={"prometheusRule": {"enabled": True}}), "PrometheusRule"))
    assert all("dashboard_url" not in r["annotations"] for r in base.values())
    pr = one(
        template(values={"runbookBaseUrl": "https://rb.example/x/",
                         "prometheusRule": {"enabled": True, "grafanaUrl": "https://g.example/"}}),
        "PrometheusRule",
    )  # fmt: skip
    alerts = _alerts(pr)
    with_runbook = [n for n, r in base.items() if "runbook_url" in r["annotations"]]
    assert sorted(with_runbook) == sorted(base)  # every alert links its runbook
    for name in with_runbook:
        old = base[name]["annotations"]["runbook_url"]
        assert old.startswith(defaults["runbookBaseUrl"] + "/")
        assert (
            alerts[name]["annotations"]["runbook_url"]
            == "https://rb.example/x" + old[len(defaults["runbookBaseUrl"]) :]
        )
    for name, rule in alerts.items():
        if name in defaults["dashboardUrls"]:
            assert rule["annotations"]["dashboard_url"] == "https://g.example" + defaults["dashboardUrls"][name]
        else:
            assert "dashboard_url" not in rule["annotations"]
    assert defaults["dashboardUrls"], "the alert renderer sets no dashboard_url for any alert"


@pytest.mark.e2e
def test_reuse_values_with_null_subtrees_renders_with_defaults():
    needs_rules()
    docs = template("reuse-values-values.yaml")
    assert {d["kind"] for d in docs} >= {"DaemonSet", "ServiceMonitor", "PrometheusRule", "Service"}
    sm = one(docs, "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["interval"] == "30s"
    assert sm["spec"]["endpoints"][0]["honorLabels"] is True
    pr = one(docs, "PrometheusRule")
    assert pr["spec"]["groups"] == yaml.safe_load(RULES_FILE.read_text())["groups"]
    ds = workload(docs)
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == (
        f"ghcr.io/sglang-oom-exporter/sglang-oom-exporter:{__version__}"
    )


@pytest.mark.e2e
def test_dashboards_are_configmaps_with_the_sidecar_label_and_untouched_json():
    needs_dashboards()
    files = sorted((CHART / "files" / "dashboards").glob("*.json"))
    docs = template(values={"grafanaDashboards": {"enabled": True, "folder": "SGLang"}})
    maps = [d for d in by_kind(docs, "ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]]
    assert len(maps) == len(files)
    for cm, path in zip(sorted(maps, key=lambda d: next(iter(d["data"]))), files, strict=True):
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "SGLang"}
        assert cm["data"] == {path.name: path.read_text().rstrip("\n")}
        assert len(path.read_bytes()) < 256 * 1024
    assert not [d for d in by_kind(template(), "ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]]


@pytest.mark.e2e
def test_runbook_base_url_moves_every_link_of_the_rules_and_the_dashboards():
    needs_rules()
    needs_dashboards()
    old_base = yaml.safe_load(DEFAULTS_FILE.read_text())["runbookBaseUrl"]
    on = {"prometheusRule": {"enabled": True}, "grafanaDashboards": {"enabled": True}}
    default_text = yaml.safe_dump(template(values=on))
    moved_docs = template(values={**on, "runbookBaseUrl": "https://rb.example/x/"})
    moved_text = yaml.safe_dump(moved_docs)
    links = default_text.count(old_base)
    # 19 alerts' runbook_url and 28 dashboard links (the overview's runbook index, tiles, table rows, panels).
    assert links == 19 + 28
    assert old_base not in moved_text
    assert moved_text.count("https://rb.example/x/") == links  # each moved to the new base, none doubled
    assert "https://rb.example/x//" not in moved_text
    for cm in by_kind(moved_docs, "ConfigMap"):
        for name, text in cm["data"].items():
            if name.endswith(".json"):
                json.loads(text)  # still valid JSON


@pytest.mark.e2e
def test_runbook_base_url_is_refused_when_it_would_break_the_dashboard_json():
    for bad in ('https://rb.example/"x', "https://rb.example/a b", "https://rb.example/a\\b"):
        result = template(values={"runbookBaseUrl": bad}, ok=False)
        assert "runbookBaseUrl" in result, bad


@pytest.mark.e2e
def test_test_pod_fetches_metrics_with_a_restricted_security_context():
    pod = one(template(), "Pod")
    assert pod["metadata"]["annotations"] == {
        "helm.sh/hook": "test", "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded",
    }  # fmt: skip
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (c,) = pod["spec"]["containers"]
    assert c["securityContext"] == {"readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]}}  # fmt: skip
    assert "http://t-sglang-oom-exporter.monitoring.svc:9877/metrics" in c["command"][2]
    assert "sglang_oom_exporter_build_info" in c["command"][2]


# ---------------------------------------------------------------------------------------------- values schema


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"mode": "statefulset"}, "/mode"),
        ({"serviceMonitor": {"interval": "2 minutes"}}, "/serviceMonitor/interval"),
        ({"prometheusRule": {"rules": {"SGLangDecodeOOM": {"for": ""}}}}, "/prometheusRule/rules/SGLangDecodeOOM/for"),
        (
            {"prometheusRule": {"rules": {"SGLangDecodeOOM": {"severity": "page"}}}},
            "/prometheusRule/rules/SGLangDecodeOOM/severity",
        ),
        ({"prometheusRule": {"rules": {"SGLangDecodeOOM": {"fore": "1m"}}}}, "fore"),
        ({"serviceMonitor": {"enabeld": True}}, "enabeld"),
        ({"discovery": {"port": 70000}}, "/discovery/port"),
        ({"discovery": {"refreshInterval": "0"}}, "/discovery/refreshInterval"),  # the exporter wants a unit
        ({"bogus": 1}, "bogus"),
    ],
)
@pytest.mark.e2e
def test_schema_rejects_bad_values(values, where):
    err = template(values=values, ok=False)
    assert "values don't meet the specifications of the schema" in err
    assert where in err


# ---------------------------------------------------------------------------------------------- NOTES.txt


_notes = install_notes


@pytest.mark.e2e
def test_notes_show_the_check_and_warn_without_release():
    needs_rules()
    notes = _notes(values={"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}})
    assert "kubectl -n monitoring port-forward svc/t-sglang-oom-exporter 9877:9877" in notes
    assert "curl -s http://127.0.0.1:9877/metrics | grep sglang_oom_exporter_files_watched" in notes
    assert notes.count("WARNING:") == 2
    assert "serviceMonitor is enabled without a `release` label" in notes
    assert "prometheusRule is enabled without a `release` label" in notes
    good = _notes("all-on-values.yaml")
    assert "WARNING" not in good
    assert "serviceMonitor: labelled release=kube-prometheus-stack" in good
    off = _notes("all-off-values.yaml")
    assert "WARNING" not in off
    assert 'job="sglang-oom-exporter"' in off


def _node_lookup(text: str) -> tuple[dict[str, str], str]:
    """The pod selector and the forwarded port of the 'exporter on the paged pod's node' commands in a text."""
    (selector,) = re.findall(r"get pods -l (\S+) -o wide \\?\n?\s*--field-selector spec\.nodeName=\$node", text)
    (port,) = re.findall(r"port-forward pod/<that pod> (\S+)", text)
    assert "node=$(kubectl -n <namespace> get pod <pod> -o jsonpath='{.spec.nodeName}')" in text
    return dict(pair.split("=", 1) for pair in selector.split(",")), port


def _pod_labels_and_port(docs) -> tuple[dict[str, str], str]:
    pod = one(docs, "DaemonSet")["spec"]["template"]
    return pod["metadata"]["labels"], str(pod["spec"]["containers"][0]["ports"][0]["containerPort"])


@pytest.mark.e2e
def test_notes_and_readme_say_the_service_is_one_node_and_how_to_reach_the_paged_one():
    notes = _notes()
    assert "The Service forwards to one node's exporter, and each shows only its own\nnode's events." in notes
    selector, port = _node_lookup(notes)
    labels, container_port = _pod_labels_and_port(template())
    assert selector.items() <= labels.items()
    assert selector["app.kubernetes.io/instance"] == "t"
    assert port == f"{container_port}:{container_port}"
    # README: the same steps for its install (release and namespace sglang-oom-exporter).
    readme = (ROOT / "README.md").read_text()
    assert "Each node's\nexporter shows only its own node's events, and the Service forwards to one of them." in readme
    selector, port = _node_lookup(readme)
    labels, container_port = _pod_labels_and_port(
        template(release="sglang-oom-exporter", namespace="sglang-oom-exporter")
    )
    assert selector == {"app.kubernetes.io/instance": "sglang-oom-exporter"}
    assert selector.items() <= labels.items()
    assert port == container_port
    # One pod (a Deployment, the receiver): the Service reaches all there is, so nothing to say.
    assert "--field-selector" not in _notes("deployment-values.yaml")


@pytest.mark.e2e
def test_notes_say_nothing_pages_until_routed_and_where_the_dashboard_is():
    routing = (
        "Nothing pages until Alertmanager routes these alerts: merge alerts/alertmanager.example.yml into your "
        "routing (docs/alertmanager-routing.md)."
    )
    assert (ROOT / "alerts" / "alertmanager.example.yml").is_file()
    assert (ROOT / "docs" / "alertmanager-routing.md").is_file()
    off = _notes("all-off-values.yaml")
    assert off.count(routing) == 1
    assert (
        "Dashboard: import dashboards/sglang-oom-overview.json into Grafana (docs/dashboards.md), or set "
        "grafanaDashboards.enabled=true." in off
    )
    assert (ROOT / "dashboards" / "sglang-oom-overview.json").is_file()
    needs_dashboards()
    values = {"grafanaDashboards": {"enabled": True, "label": "my_dashboards", "labelValue": "yes"}}
    on = _notes(values=values)
    assert on.count(routing) == 1
    title = json.loads((ROOT / "dashboards" / "sglang-oom-overview.json").read_text())["title"]
    assert f'Dashboard: "{title}", a ConfigMap labelled my_dashboards=yes that Grafana\'s dashboard sidecar' in on
    (cm,) = [d for d in by_kind(template(values=values), "ConfigMap") if "my_dashboards" in d["metadata"]["labels"]]
    assert cm["metadata"]["labels"]["my_dashboards"] == "yes"
    assert routing in _notes(values={"mode": "receiver"})


@pytest.mark.e2e
def test_readme_uninstall_removes_the_state_directory_the_daemonset_leaves_on_each_node():
    readme = (ROOT / "README.md").read_text()
    install = readme.split("<!-- helm-install -->", 1)[1].split("<!-- /helm-install -->", 1)[0]
    argv = shlex.split(re.findall(r"```sh\n(.*?)\n```", install, re.S)[0].replace("\\\n", " "))
    release, namespace = argv[2], argv[argv.index("-n") + 1]
    block = readme.split("<!-- uninstall -->", 1)[1].split("<!-- /uninstall -->", 1)[0]
    commands = [shlex.split(c.replace("\\\n", " ")) for c in re.findall(r"```sh\n(.*?)\n```", block, re.S)]
    assert commands[0] == ["helm", "uninstall", release, "-n", namespace]
    volumes = one(template(release=release, namespace=namespace), "DaemonSet")["spec"]["template"]["spec"]["volumes"]
    (state,) = [v["hostPath"]["path"] for v in volumes if v["name"] == "state"]
    assert state == f"/var/lib/sglang-oom-exporter/{namespace}.{release}"
    assert f"`{state}`" in " ".join(block.split())
    script = " ".join(commands[1])
    assert f"rm -rf /host{state}" in script
    assert f"-n {namespace} debug" in script
    assert commands[1][-4:] == ["kubectl", "delete", "namespace", namespace]


# ---------------------------------------------------------------------------------------------- chart README


@pytest.mark.e2e
def test_chart_readme_sidecar_snippet_is_a_valid_exporter_command(tmp_path):
    pod = snippet_pod()
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    exporter = containers["oom-exporter"]
    assert exporter["securityContext"]["readOnlyRootFilesystem"] is True
    assert exporter["ports"] == [{"name": "oom-metrics", "containerPort": 9877}]
    args = exporter["args"]
    assert args[0] == "serve"
    assert "--sglang-url=http://127.0.0.1:30000" in args
    shared = {v["name"] for v in pod["spec"]["volumes"] if "emptyDir" in v}
    assert (
        {m["name"] for m in exporter["volumeMounts"]}
        & {m["name"] for m in containers["sglang"]["volumeMounts"]}
        & shared
    )
    # The exporter accepts exactly these arguments (the state dir and log path made local).
    local = [a.replace("/var/lib/sglang-oom-exporter", str(tmp_path)) for a in args[1:]]
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_oom_exporter", "serve", "--check-config", *local],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "configuration ok: 1 path(s), kubernetes=off" in proc.stdout


def test_sidecar_snippet_has_no_probe_that_could_make_the_sglang_pod_unready():
    # A pod is Ready only when all its containers are: an exporter probe failing on an exporter-side problem
    # (/healthz is 503 while the state dir cannot be written) would take SGLang out of its Service.
    text = (CHART / "README.md").read_text()
    containers = {c["name"]: c for c in snippet_pod()["spec"]["containers"]}
    probes = {"readinessProbe", "livenessProbe", "startupProbe"}
    assert sorted(probes & set(containers["oom-exporter"])) == []
    assert "**The exporter can never make SGLang unready.**" in text


@pytest.mark.e2e
def test_readme_install_command_renders_what_a_kube_prometheus_stack_user_needs():
    needs_rules()
    needs_dashboards()
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- helm-install -->", 1)[1].split("<!-- /helm-install -->", 1)[0]
    (command,) = re.findall(r"```sh\n(.*?)\n```", block, re.S)
    argv = shlex.split(command.replace("\\\n", " "))
    # Nothing is published yet: the chart of the clone, with the image README builds from it.
    assert argv[:4] == ["helm", "install", "sglang-oom-exporter", "./helm/sglang-oom-exporter"]
    assert "image.repository=registry.example.com/sglang-oom-exporter" in argv
    # Once released, the same flags on the published chart at this version (minus the self-built image).
    released = readme.split("<!-- helm-install-released -->", 1)[1].split("<!-- /helm-install-released -->", 1)[0]
    (later,) = re.findall(r"```sh\n(.*?)\n```", released, re.S)
    later_argv = shlex.split(later.replace("\\\n", " "))
    assert later_argv[:4] == ["helm", "install", "sglang-oom-exporter", OCI_CHART]
    at = later_argv.index("--version")
    assert later_argv[at + 1] == __version__
    own_image = argv.index("image.repository=registry.example.com/sglang-oom-exporter")
    assert [*later_argv[4:at], *later_argv[at + 2 :]] == [*argv[4 : own_image - 1], *argv[own_image + 1 :]]
    local = argv[2:]
    proc = subprocess.run([helm(), "template", *local], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.load_all(proc.stdout, Loader=YAML_LOADER) if d]
    assert one(docs, "ServiceMonitor")["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert one(docs, "PrometheusRule")["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert one(docs, "ClusterRole")["rules"][0]["verbs"] == ["list"]
    assert [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    ds = one(docs, "DaemonSet")
    namespace = argv[argv.index("-n") + 1]
    assert ds["metadata"]["namespace"] == namespace == "sglang-oom-exporter"
    # The namespace README creates first is labelled for the DaemonSet's uid 0 and hostPaths.
    assert f"kubectl label namespace {namespace} pod-security.kubernetes.io/enforce=privileged" in readme
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == (
        f"registry.example.com/sglang-oom-exporter:{__version__}"
    )
    assert f"podman build -t registry.example.com/sglang-oom-exporter:{__version__}" in readme
    assert "ghcr.io/sglang-oom-exporter/sglang-oom-exporter" in readme


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("missing", "files/sglang-oom.rules.yaml is missing from the chart: run `sglang-oom-exporter render`"),
        ("broken", "files/sglang-oom.rules.yaml is not valid YAML"),
        ("empty", "files/sglang-oom.rules.yaml has no rule groups"),
    ],
)
@pytest.mark.e2e
def test_prometheusrule_fails_on_a_missing_or_broken_rules_file(tmp_path, damage, message):
    # fromYaml never fails by itself (a missing file gives {}, bad YAML {"Error": ...}): the template must.
    needs_rules()
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    rules = chart / "files" / "sglang-oom.rules.yaml"
    if damage == "missing":
        rules.unlink()
    elif damage == "broken":
        rules.write_text("groups:\n  - name: x\n   rules: [\n")
    else:
        rules.write_text("# nothing here\nfoo: 1\n")
    argv = [helm(), "template", "t", str(chart), "--set", "prometheusRule.enabled=true"]
    proc = run_tool(*argv)
    assert proc.returncode != 0
    assert message in proc.stderr
    # Without the PrometheusRule the chart does not need the file.
    assert run_tool(*argv[:-2]).returncode == 0


@pytest.mark.e2e
def test_the_exporter_never_follows_its_own_log():
    # Its log quotes OOM lines; the default container filter leaves out names containing "oom-exporter".
    from sglang_oom_exporter.sources.discover import KubernetesFilter

    (container,) = workload(template("all-off-values.yaml"))["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "oom-exporter"
    assert KubernetesFilter().matches_container(container["name"]) is False
    assert KubernetesFilter().matches_container("sglang") is True


@pytest.mark.e2e
def test_the_packaged_chart_carries_the_rules_and_dashboards(tmp_path):
    needs_rules()
    needs_dashboards()
    proc = run_tool(helm(), "package", str(CHART), "-d", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    (package,) = tmp_path.glob("sglang-oom-exporter-*.tgz")
    assert package.name == f"sglang-oom-exporter-{__version__}.tgz"
    proc = run_tool(helm(), "template", "t", str(package), "--set", "prometheusRule.enabled=true",
                "--set", "grafanaDashboards.enabled=true")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.load_all(proc.stdout, Loader=YAML_LOADER) if d]
    assert one(docs, "PrometheusRule")["spec"]["groups"] == yaml.safe_load(RULES_FILE.read_text())["groups"]
    dashboards = [d for d in by_kind(docs, "ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]]
    assert len(dashboards) == len(list((CHART / "files" / "dashboards").glob("*.json")))
