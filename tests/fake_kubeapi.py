"""A fake Kubernetes API server for node-discovery tests: HTTPS on 127.0.0.1, one pod list, bad modes.

    api = FakeKubeApi(cert, key, pods=[pod("llm", "llama-0", "10.0.0.5")]).start()
    ... ApiClient("127.0.0.1", api.port, token_file=..., ca_file=cert) ...
    api.stop()

It records every request (path, Authorization header) and answers /api/v1/pods with a PodList of `pods`,
filtered by the `spec.nodeName=<node>` field selector as the real server does (each pod dict may carry
spec.nodeName). Modes: ok, unauthorized (401 Status), garbage (200 with a non-JSON body), not_a_list (200 with
JSON that is no PodList), hang (accept, never answer, until stop()).
"""

from __future__ import annotations

import contextlib
import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit


def pod(
    namespace: str,
    name: str,
    ip: str | None,
    *,
    node: str = "gpu-node-1",
    annotations: dict[str, str] | None = None,
    phase: str = "Running",
) -> dict[str, Any]:
    """A Pod object as the API returns it, reduced to the fields discovery reads."""
    status: dict[str, Any] = {"phase": phase}
    if ip is not None:
        status["podIP"] = ip
    return {
        "metadata": {"namespace": namespace, "name": name, "annotations": annotations or {}},
        "spec": {"nodeName": node},
        "status": status,
    }


class FakeKubeApi:
    """A TLS ThreadingHTTPServer on 127.0.0.1 (port 0) in a thread."""

    def __init__(self, cert: Path, key: Path, pods: list[dict[str, Any]] | None = None) -> None:
        self.pods = pods or []
        self.mode = "ok"
        self.requests: list[tuple[str, str]] = []  # (raw path, Authorization header)
        self._release = threading.Event()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake kube api", daemon=True)

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self._server.server_address[1])

    def start(self) -> FakeKubeApi:
        """Serve in a thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Release hanging handlers and stop serving."""
        self._release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> FakeKubeApi:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Server(ThreadingHTTPServer):
    daemon_threads = False
    block_on_close = True
    fake: FakeKubeApi

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that gave up (timeout tests) is not an error here


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        fake = self.server.fake
        fake.requests.append((self.path, self.headers.get("Authorization", "")))
        if fake.mode == "hang":
            fake._release.wait(30)
            return
        if fake.mode == "unauthorized":
            self._send(401, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Unauthorized",
                             "code": 401})  # fmt: skip
            return
        if fake.mode == "garbage":
            self._send_raw(200, b"<html>this is not JSON</html>")
            return
        if fake.mode == "not_a_list":
            self._send(200, {"kind": "Status", "items": "nope"})
            return
        parts = urlsplit(self.path)
        if parts.path != "/api/v1/pods":
            self._send(404, {"kind": "Status", "code": 404})
            return
        selector = parse_qs(parts.query).get("fieldSelector", [""])[0]
        node = selector.removeprefix("spec.nodeName=") if selector.startswith("spec.nodeName=") else None
        items = [p for p in fake.pods if node is None or p["spec"]["nodeName"] == node]
        self._send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})

    def _send(self, status: int, doc: dict[str, Any]) -> None:
        self._send_raw(status, json.dumps(doc).encode())

    def _send_raw(self, status: int, body: bytes) -> None:
        with contextlib.suppress(OSError):
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
        self.close_connection = True
