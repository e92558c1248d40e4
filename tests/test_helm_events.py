"""The chart's Kubernetes Events option (events.enabled): RBAC, NODE_NAME and the config only when it is on.

kubernetes-validate --strict checks the rendered RBAC with the option on through the all-on ci file
(tests/test_helm.py::test_kubernetes_validate_strict, which validates every ci render).
"""

from __future__ import annotations

import pytest
import yaml

from sglang_oom_exporter.config.load import load_config
from sglang_oom_exporter.config.model import EventsConfig
from tests.support.helm import by_kind, one, rendered_config, template, workload

pytestmark = pytest.mark.e2e

EVENTS_RULE = {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}
NODE_NAME = {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}


def _rules(docs) -> list[dict]:
    return [rule for role in by_kind(docs, "ClusterRole") for rule in role["rules"]]


def test_events_alone_render_an_account_that_may_write_events_and_get_pods():
    docs = template(values={"events": {"enabled": True}})
    role = one(docs, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}, EVENTS_RULE]
    account = one(docs, "ServiceAccount")
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": "monitoring"}]  # fmt: skip
    spec = workload(docs)["spec"]["template"]["spec"]
    assert (spec["serviceAccountName"], spec["automountServiceAccountToken"]) == (account["metadata"]["name"], True)
    assert spec["containers"][0]["env"] == [NODE_NAME]
    assert rendered_config(docs)["kubernetes"]["events"] == {"enabled": True, "nonfatal": False}


def test_with_discovery_too_the_role_has_both_and_nothing_twice():
    docs = template("all-on-values.yaml")
    assert _rules(docs) == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "get"]}, EVENTS_RULE]
    assert workload(docs)["spec"]["template"]["spec"]["containers"][0]["env"] == [NODE_NAME]


def test_without_events_no_rule_names_events():
    for docs in (
        template("all-off-values.yaml"),
        template(values={"discovery": {"enabled": True}}),
        template("reuse-values-values.yaml"),
    ):
        assert EVENTS_RULE not in _rules(docs)
        assert "events" not in (rendered_config(docs).get("kubernetes") or {})
    assert not {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"} & {
        d["kind"] for d in template("all-off-values.yaml")
    }


def test_events_are_a_daemonset_feature():
    docs = template("deployment-values.yaml", values={"events": {"enabled": True}})
    assert not {"ServiceAccount", "ClusterRole"} & {d["kind"] for d in docs}
    assert "kubernetes" not in rendered_config(docs)


def test_the_rendered_events_config_is_accepted_by_the_exporter(tmp_path):
    path = tmp_path / "config.yaml"
    values = {
        "events": {"enabled": True, "nonfatal": True},
        "runbookBaseUrl": "https://rb.example/x",
    }
    path.write_text(yaml.safe_dump(rendered_config(template(values=values))))
    config = load_config(str(path), env={})
    assert config.kubernetes is not None
    assert config.kubernetes.events == EventsConfig(nonfatal=True, runbook_base_url="https://rb.example/x")


def test_schema_rejects_a_misspelt_events_key():
    err = template(values={"events": {"enabeld": True}}, ok=False)
    assert "values don't meet the specifications of the schema" in err
    assert "enabeld" in err
