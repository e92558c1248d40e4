"""The Kubernetes API call: one request as the pod's service account (its token, TLS verified with its CA) through
the one HTTP client (http.py). Node discovery lists the pods of one node and turns the PodList into each pod's
SGLang endpoint; the Kubernetes Events poster (kubeevents/) writes Events through the same request().

A failed call is an HttpError (http.LABELS gives its `reason` label); a discovery that cannot start (no node
name) is a DiscoveryError. REASONS is node discovery's label set; nodetargets.py counts them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from .http import HttpError, Reason, Response, bearer, request, tls_context

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
REASONS = ("no_node_name", "no_token", "refused", "timeout", "tls", "http_status", "bad_json", "too_large", "error")
# One node's pod list is far smaller (110 pods, kubelet's default maxPods, at 5-15 KB each: 0.5-1.7 MB; 250 at
# 30 KB: 7.5 MB), an Event or a pod well under 100 KB. Parsed, JSON takes about 4x its size (55 MiB of pods took
# 244 MiB more RSS), so a runaway answer is refused at this cap, unread.
MAX_BODY_BYTES = 8 << 20

PodKey = tuple[str, str]  # (namespace, pod)
LWS_PREFIX = "leaderworkerset.sigs.k8s.io/"


class DiscoveryError(Exception):
    """Node discovery that cannot list at all; reason is one of REASONS (a metric label)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason if reason in REASONS else "error"
        self.detail = detail


@dataclass(frozen=True, slots=True)
class PodEndpoint:
    """Where one pod's SGLang listens."""

    namespace: str
    pod: str
    ip: str
    port: int

    @property
    def url(self) -> str:
        """http://<ip>:<port>, with brackets around an IPv6 address."""
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"http://{host}:{self.port}"


class ApiClient:
    """Calls the API server as the pod's service account: node discovery's pod list, the Events poster's writes.

    timeout bounds the whole call (connect, TLS handshake, the answer): the callers are the discovery and the
    poster threads, so a slow API server delays only their next call.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        token_file: str,
        ca_file: str,
        timeout: float = 10.0,
        max_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self.host, self.port = host, port
        self.token_file, self.ca_file = token_file, ca_file
        self.timeout = timeout
        self.max_bytes = max_bytes

    @classmethod
    def in_cluster(
        cls, env: Mapping[str, str], service_account_dir: str = SERVICE_ACCOUNT_DIR, timeout: float = 10.0
    ) -> ApiClient:
        """The client a pod uses: the API server from the service env vars, the mounted token and CA."""
        host = env.get("KUBERNETES_SERVICE_HOST", "")
        try:
            port = int(env.get("KUBERNETES_SERVICE_PORT", "443"))
        except ValueError:
            port = 443
        return cls(
            host,
            port,
            token_file=os.path.join(service_account_dir, "token"),
            ca_file=os.path.join(service_account_dir, "ca.crt"),
            timeout=timeout,
        )

    def list_pods(self, node: str) -> dict[str, Any]:
        """The PodList of the pods scheduled on node; HttpError on any failure."""
        # resourceVersion=0: served from the API server's watch cache, not etcd; a thousand nodes listing every
        # interval stay cheap (what client-go's informers do for their lists).
        path = "/api/v1/pods?fieldSelector=" + quote(f"spec.nodeName={node}", safe="") + "&resourceVersion=0"
        try:
            answer = self.request("GET", path)
        except HttpError as exc:
            if exc.reason is not Reason.TOO_LARGE:
                raise
            raise HttpError(Reason.TOO_LARGE, f"the pod list of node {node} is over the {self.max_bytes >> 20} MiB "
                            f"cap, unread ({exc.detail}); a node's pods take far less") from None  # fmt: skip
        if answer.status != 200:
            detail = f"HTTP {answer.status}: {answer.body[:200].decode('utf-8', 'replace')}"
            raise HttpError(Reason.HTTP_STATUS, detail, answer.status)
        try:
            doc = json.loads(answer.body)
        except ValueError as exc:
            raise HttpError(Reason.BAD_BODY, f"pod list is not JSON: {exc}") from exc
        if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
            raise HttpError(Reason.BAD_BODY, "pod list has no items list")
        return doc

    def request(
        self, method: str, path: str, body: bytes | None = None, content_type: str = "application/json"
    ) -> Response:
        """One call as the service account; HttpError when there is no answer.

        Any status is an answer (the caller decides what a 404 means); no token, TLS, refused, timeout and a
        body over max_bytes are not. The token is read on every call: kubelet rotates projected tokens.
        """
        if not self.host:
            raise HttpError(Reason.ERROR, "KUBERNETES_SERVICE_HOST is not set (not running in a pod?)")
        headers = {**bearer(self.token_file), "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        host = f"[{self.host}]" if ":" in self.host else self.host
        return request(method, f"https://{host}:{self.port}{path}", timeout=self.timeout, max_bytes=self.max_bytes,
                       body=body, headers=headers, tls=tls_context(self.ca_file))  # fmt: skip


def endpoints(pod_list: Mapping[str, Any], default_port: int, port_annotation: str) -> dict[PodKey, PodEndpoint]:
    """Each pod with an IP -> its SGLang endpoint; the port from the annotation when it is a valid port."""
    found: dict[PodKey, PodEndpoint] = {}
    for item in pod_list.get("items") or []:
        if not isinstance(item, dict):
            continue
        meta, status = item.get("metadata") or {}, item.get("status") or {}
        namespace, name, ip = meta.get("namespace"), meta.get("name"), status.get("podIP")
        if not (isinstance(namespace, str) and isinstance(name, str) and isinstance(ip, str) and ip):
            continue  # pending pods have no IP yet
        if status.get("phase") in ("Succeeded", "Failed"):
            continue
        port = default_port
        raw = (meta.get("annotations") or {}).get(port_annotation)
        if isinstance(raw, str) and raw.strip().isdigit() and 0 < int(raw) < 65536:
            port = int(raw)
        found[(namespace, name)] = PodEndpoint(namespace, name, ip, port)
    return found


def lws_labels(pod_list: Mapping[str, Any]) -> dict[PodKey, dict[str, str]]:
    """Each LeaderWorkerSet pod -> its `leaderworkerset.sigs.k8s.io/*` labels (metrics/groups.py reads them)."""
    found: dict[PodKey, dict[str, str]] = {}
    for item in pod_list.get("items") or []:
        meta = item.get("metadata") if isinstance(item, dict) else None
        if not isinstance(meta, dict):
            continue
        namespace, name, labels = meta.get("namespace"), meta.get("name"), meta.get("labels")
        if isinstance(namespace, str) and isinstance(name, str) and isinstance(labels, dict):
            lws = {k: v for k, v in labels.items() if k.startswith(LWS_PREFIX) and isinstance(v, str)}
            if lws:
                found[(namespace, name)] = lws
    return found
