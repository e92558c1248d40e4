"""Kubernetes nodes for the chart's GPU placement: the scheduler's node selector term semantics, and a fake API
server that answers what `helm install --dry-run=server` asks (discovery, the node list, the release's objects)
so that NOTES.txt's `lookup` of the nodes runs against a node list of the test's choosing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support.helm import CHART, helm, helm_with_values

_INT = re.compile(r"-?[0-9]+")


def expression_matches(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """One NodeSelectorRequirement, as the scheduler evaluates it (k8s.io/component-helpers nodeaffinity).

    In: the label is set and its value is one of values; NotIn: unset, or not one of them; Exists/DoesNotExist;
    Gt/Lt: the label is set, and it and the one value are integers with label > (<) value."""
    key, op, values = expr["key"], expr["operator"], list(expr.get("values") or [])
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        if not present or len(values) != 1 or not _INT.fullmatch(labels[key]) or not _INT.fullmatch(values[0]):
            return False
        have, want = int(labels[key]), int(values[0])
        return have > want if op == "Gt" else have < want
    raise ValueError(f"unknown operator {op!r}")


def terms_match(terms: list[dict[str, Any]], labels: Mapping[str, str]) -> bool:
    """Whether a node with these labels satisfies nodeSelectorTerms: the terms are ORed, a term's expressions
    ANDed, and a term with no expressions matches nothing."""
    return any(
        bool(term.get("matchExpressions")) and all(expression_matches(e, labels) for e in term["matchExpressions"])
        for term in terms
    )


def _api_resources(group_version: str, resources: list[tuple[str, str, bool]]) -> dict[str, Any]:
    return {
        "kind": "APIResourceList",
        "groupVersion": group_version,
        "resources": [
            {"name": name, "singularName": kind.lower(), "namespaced": namespaced, "kind": kind,
             "verbs": ["get", "list", "create"]}
            for name, kind, namespaced in resources
        ],
    }  # fmt: skip


class FakeNodeApi:
    """A plain-HTTP Kubernetes API on 127.0.0.1 that lists the given nodes; every object the release would
    create is absent (404) and its release history empty, so `helm install --dry-run=server` renders."""

    def __init__(self, nodes: list[dict[str, str]]) -> None:
        node_list = {
            "kind": "NodeList",
            "apiVersion": "v1",
            "metadata": {"resourceVersion": "1"},
            "items": [{"metadata": {"name": f"node-{i}", "labels": dict(labels)}} for i, labels in enumerate(nodes)],
        }
        self.answers: dict[str, Any] = {
            "/version": {"major": "1", "minor": "31", "gitVersion": "v1.31.0"},
            "/api": {"kind": "APIVersions", "versions": ["v1"],
                     "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]},
            "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": [{
                "name": "apps", "versions": [{"groupVersion": "apps/v1", "version": "v1"}],
                "preferredVersion": {"groupVersion": "apps/v1", "version": "v1"}}]},
            "/api/v1": _api_resources("v1", [("nodes", "Node", False), ("configmaps", "ConfigMap", True),
                                             ("services", "Service", True), ("secrets", "Secret", True),
                                             ("pods", "Pod", True), ("serviceaccounts", "ServiceAccount", True)]),
            "/apis/apps/v1": _api_resources("apps/v1", [("daemonsets", "DaemonSet", True),
                                                        ("deployments", "Deployment", True)]),
            "/api/v1/nodes": node_list,
        }  # fmt: skip
        self.node_lists = 0
        answers = self.answers
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/api/v1/nodes":
                    api.node_lists += 1
                body = answers.get(path)
                if body is None and path.endswith("/secrets"):  # helm's release history: none
                    body = {"kind": "SecretList", "apiVersion": "v1", "metadata": {}, "items": []}
                code = 200 if body is not None else 404
                if body is None:
                    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                            "code": 404}  # fmt: skip
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-node-api", daemon=True)

    def start(self) -> FakeNodeApi:
        """Serve in a thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and wait for the thread."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self._server.server_address[1])

    def kubeconfig(self, directory: Path) -> Path:
        """A kubeconfig that points at this server."""
        path = directory / "kubeconfig"
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: fake, cluster: {{server: 'http://127.0.0.1:{self.port}'}}}}]\n"
            "users: [{name: fake, user: {token: fake}}]\n"
            "contexts: [{name: fake, context: {cluster: fake, user: fake, namespace: monitoring}}]\n"
            "current-context: fake\n"
        )
        return path


@contextlib.contextmanager
def node_api(nodes: list[dict[str, str]]) -> Iterator[FakeNodeApi]:
    """A started FakeNodeApi listing these nodes (their labels), stopped on the way out."""
    api = FakeNodeApi(nodes).start()
    try:
        yield api
    finally:
        api.stop()


def notes_against(nodes: list[dict[str, str]], tmp_path: Path, values: dict | None = None) -> str:
    """NOTES.txt as `helm install --dry-run=server` prints it against a cluster that has these nodes."""
    with node_api(nodes) as api:
        env = {**os.environ, "KUBECONFIG": str(api.kubeconfig(tmp_path)), "HELM_CACHE_HOME": str(tmp_path / "cache"),
               "HELM_CONFIG_HOME": str(tmp_path / "config"), "HELM_DATA_HOME": str(tmp_path / "data")}  # fmt: skip
        argv = [helm(), "install", "t", str(CHART), "-n", "monitoring", "--dry-run=server",
                "--disable-openapi-validation"]  # fmt: skip
        proc = helm_with_values(argv, (), values, env=env)
        assert proc.returncode == 0, proc.stderr
        assert api.node_lists == 1, "NOTES.txt did not look the nodes up"
    return proc.stdout.split("NOTES:\n", 1)[1]
