"""The chart's options for hardened and large installs, rendered by helm v4 and checked against the vendored CRD
schemas: the web config Secret (TLS, basic auth: mounted and passed as --web-config, with probes, the helm test
and the monitors that still work), extra volumes, the monitors' namespace, relabelings, scheme, tlsConfig and
basicAuth, nameOverride/fullnameOverride, priorityClassName and the DaemonSet's rollout.

ci/options-values.yaml sets them all (helm lint --strict, kubernetes-validate and the CRD schemas run on it in
tests/test_helm.py); the tests here read its render, or render one option at a time.
"""

from __future__ import annotations

import pytest

from tests.support.helm import by_kind, crd_validate, one, template, workload

OPTIONS = "options-values.yaml"


def _container(docs) -> dict:
    (container,) = workload(docs)["spec"]["template"]["spec"]["containers"]
    return container


def _test_pod(docs) -> dict:
    (pod,) = [d for d in by_kind(docs, "Pod") if d["metadata"]["annotations"].get("helm.sh/hook") == "test"]
    return pod


def test_web_config_secret_is_mounted_and_passed_as_the_flag():
    docs = template(OPTIONS)
    spec = workload(docs)["spec"]["template"]["spec"]
    container = _container(docs)
    assert "--web-config=/etc/sglang-oom-exporter-web/web-config.yml" in container["args"]
    assert {"name": "web-config", "mountPath": "/etc/sglang-oom-exporter-web", "readOnly": True} in container[
        "volumeMounts"
    ]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "web-config"]
    assert volume == {"name": "web-config", "secret": {"secretName": "oom-web", "defaultMode": 0o440}}
    # Nothing of it without a Secret.
    plain = template()
    assert not [a for a in _container(plain)["args"] if a.startswith("--web-config")]
    assert "web-config" not in {v["name"] for v in workload(plain)["spec"]["template"]["spec"]["volumes"]}


def test_web_config_key_names_the_file():
    docs = template(values={"webConfig": {"secretName": "w", "key": "exporter.yml"}})
    assert "--web-config=/etc/sglang-oom-exporter-web/exporter.yml" in _container(docs)["args"]


@pytest.mark.parametrize(
    ("web", "probe"),
    [
        ({}, {"httpGet": {"path": "/metrics", "port": "metrics"}}),
        ({"secretName": "w", "tls": True}, {"httpGet": {"path": "/metrics", "port": "metrics", "scheme": "HTTPS"}}),
        ({"secretName": "w", "basicAuth": True}, {"tcpSocket": {"port": "metrics"}}),
        ({"secretName": "w", "tls": True, "basicAuth": True}, {"tcpSocket": {"port": "metrics"}}),
    ],
)
def test_probes_work_with_the_web_config(web, probe):
    container = _container(template(values={"webConfig": web}))
    for kind in ("readinessProbe", "livenessProbe"):
        got = {k: v for k, v in container[kind].items() if k in ("httpGet", "tcpSocket")}
        assert got == probe, kind


def test_helm_test_pod_follows_the_web_config():
    plain = _test_pod(template())["spec"]["containers"][0]["command"][2]
    assert plain.startswith("wget -q -T 10 -O - http://t-sglang-oom-exporter.monitoring.svc:9877/metrics")
    tls = _test_pod(template(values={"webConfig": {"secretName": "w", "tls": True}}))["spec"]["containers"][0]
    assert "--no-check-certificate https://t-sglang-oom-exporter.monitoring.svc:9877/metrics" in tls["command"][2]
    assert "build_info" in tls["command"][2]
    auth = _test_pod(template(OPTIONS))["spec"]["containers"][0]["command"][2]
    assert "--no-check-certificate https://t-oom.monitoring.svc:9877/metrics 2>&1" in auth
    assert auth.endswith("| grep -q '401 Unauthorized'")


def test_extra_volumes_and_mounts():
    docs = template(OPTIONS)
    spec = workload(docs)["spec"]["template"]["spec"]
    assert spec["volumes"][-1] == {"name": "corp-ca", "configMap": {"name": "corp-ca"}}
    assert _container(docs)["volumeMounts"][-1] == {"name": "corp-ca", "mountPath": "/etc/corp-ca", "readOnly": True}
    dep = template("deployment-values.yaml", values={"extraVolumes": [{"name": "x", "emptyDir": {}}],
                                                     "extraVolumeMounts": [{"name": "x", "mountPath": "/x"}]})  # fmt: skip
    assert workload(dep)["spec"]["template"]["spec"]["volumes"][-1] == {"name": "x", "emptyDir": {}}
    assert _container(dep)["volumeMounts"][-1] == {"name": "x", "mountPath": "/x"}


def test_service_monitor_options():
    docs = template(OPTIONS)
    sm = one(docs, "ServiceMonitor")
    crd_validate(sm)
    assert sm["metadata"]["namespace"] == "prometheus"
    assert sm["spec"]["namespaceSelector"] == {"matchNames": ["monitoring"]}  # it still scrapes the release's
    (endpoint,) = sm["spec"]["endpoints"]
    # The user's relabelings come after the chart's, which keep the exporter's own pod as exporter_pod.
    assert endpoint["relabelings"][0] == {"sourceLabels": ["namespace"], "targetLabel": "exporter_namespace"}
    assert endpoint["relabelings"][-1] == {"targetLabel": "cluster", "replacement": "eu-west"}
    assert len(endpoint["relabelings"]) == 5
    assert endpoint["metricRelabelings"] == [
        {"sourceLabels": ["__name__"], "regex": "sglang_oom_exporter_file_lag_bytes", "action": "drop"}
    ]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {"ca": {"secret": {"name": "oom-web", "key": "tls.crt"}},
                                     "serverName": "sglang-oom-exporter"}  # fmt: skip
    assert endpoint["basicAuth"]["password"] == {"name": "oom-scrape", "key": "password"}


def test_pod_monitor_options():
    values = {
        "serviceMonitor": {"enabled": False},
        "podMonitor": {"enabled": True, "namespace": "prometheus", "relabelings": [{"targetLabel": "a", "replacement": "b"}],
                       "metricRelabelings": [{"action": "labeldrop", "regex": "x"}], "tlsConfig": {"insecureSkipVerify": True}},
    }  # fmt: skip
    pm = one(template(OPTIONS, values=values), "PodMonitor")
    crd_validate(pm)
    assert pm["metadata"]["namespace"] == "prometheus"
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["relabelings"][-1] == {"targetLabel": "a", "replacement": "b"}
    assert endpoint["metricRelabelings"] == [{"action": "labeldrop", "regex": "x"}]
    assert endpoint["scheme"] == "https"  # webConfig.tls
    assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}


def test_monitors_default_to_http_in_the_release_namespace():
    sm = one(template(values={"serviceMonitor": {"enabled": True}}), "ServiceMonitor")
    assert sm["metadata"]["namespace"] == "monitoring"
    (endpoint,) = sm["spec"]["endpoints"]
    assert not {"scheme", "tlsConfig", "basicAuth", "metricRelabelings"} & set(endpoint)
    assert len(endpoint["relabelings"]) == 4


def test_name_overrides():
    docs = template(OPTIONS)
    names = {d["metadata"]["name"] for d in docs if d["kind"] != "Pod"}
    assert names == {"t-oom"}
    # The name label stays: the monitors' jobLabel reads it and the rules match job="sglang-oom-exporter".
    assert workload(docs)["metadata"]["labels"]["app.kubernetes.io/name"] == "sglang-oom-exporter"
    full = template(values={"nameOverride": "oom", "fullnameOverride": "exporter"})
    assert workload(full)["metadata"]["name"] == "exporter"


def test_priority_class_name():
    assert workload(template(OPTIONS))["spec"]["template"]["spec"]["priorityClassName"] == "system-node-critical"


def test_daemonset_rollout_default_suits_big_clusters():
    assert workload(template())["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": "10%"},
    }
    assert workload(template(OPTIONS))["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": "25%"}
    on_delete = template(values={"daemonset": {"updateStrategy": {"type": "OnDelete", "rollingUpdate": None}}})
    assert workload(on_delete)["spec"]["updateStrategy"] == {"type": "OnDelete"}


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"webConfig": {"secret": "w"}}, "secret"),
        ({"webConfig": {"key": "../etc/passwd"}}, "/webConfig/key"),
        ({"serviceMonitor": {"scheme": "ftp"}}, "/serviceMonitor/scheme"),
        ({"podMonitor": {"relabelings": {"a": 1}}}, "/podMonitor/relabelings"),
        ({"daemonset": {"updateStrategy": {"rollingUpdate": {"maxUnavailable": "ten"}}}}, "maxUnavailable"),
        ({"daemonset": {"updateStrategy": {"type": "Recreate"}}}, "/daemonset/updateStrategy/type"),
        ({"extraVolumeMounts": [{"name": "x"}]}, "/extraVolumeMounts/0"),
    ],
)
def test_schema_rejects_bad_option_values(values, where):
    err = template(values=values, ok=False)
    assert "values don't meet the specifications of the schema" in err
    assert where in err
