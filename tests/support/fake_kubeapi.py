"""A fake Kubernetes API server for node-discovery and Events tests: HTTPS on 127.0.0.1, pods, events, bad modes.

    api = FakeKubeApi(cert, key, pods=[pod("llm", "llama-0", "10.0.0.5")]).start()
    ... ApiClient("127.0.0.1", api.port, token_file=..., ca_file=cert) ...
    api.stop()

It records every GET (path, Authorization header) in `requests` and every call in `calls`, and answers
- GET /api/v1/pods with a PodList of `pods`, filtered by the `spec.nodeName=<node>` field selector as the real
  server does (each pod dict may carry spec.nodeName); GET /api/v1/namespaces/<ns>/pods/<name> with that pod;
- POST /api/v1/namespaces/<ns>/events (201; 409 when the name exists; 422 for what the real server's legacy
  Event validation refuses: a namespace other than the involved object's, no name, no reason) and PATCH
  .../events/<name> (200 with the merged Event; 404 when there is none), kept in `events` by (namespace, name).
Modes: ok, unauthorized (401 Status), forbidden (403 for writes), conflict (409 for writes), invalid (422 for
writes), garbage (200 with a non-JSON body), huge (a 60 MiB Content-Length), not_a_list (200 with JSON that is no PodList), hang (accept, never
answer, until stop()). `busy` holds answers that the next writes get first, one each: (status, Retry-After or
None), a Status body (API Priority and Fairness's 429, an overloaded server's 500/503).
"""

from __future__ import annotations

import contextlib
import json
import re
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

_ONE_POD = re.compile(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)")
_EVENTS = re.compile(r"/api/v1/namespaces/([^/]+)/events(?:/([^/]+))?")


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "message": message,
            "code": code}  # fmt: skip


def pod(
    namespace: str,
    name: str,
    ip: str | None,
    *,
    node: str = "gpu-node-1",
    annotations: dict[str, str] | None = None,
    phase: str = "Running",
    uid: str = "",
    owner: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Pod object as the API returns it, reduced to the fields discovery and the Events poster read."""
    status: dict[str, Any] = {"phase": phase}
    if ip is not None:
        status["podIP"] = ip
    meta: dict[str, Any] = {"namespace": namespace, "name": name, "annotations": annotations or {}}
    if uid:
        meta["uid"] = uid
    if labels is not None:
        meta["labels"] = labels
    if owner is not None:
        meta["ownerReferences"] = [{**owner, "controller": True}]
    return {"metadata": meta, "spec": {"nodeName": node}, "status": status}


class FakeKubeApi:
    """A TLS ThreadingHTTPServer on 127.0.0.1 (port 0) in a thread."""

    def __init__(self, cert: Path, key: Path, pods: list[dict[str, Any]] | None = None) -> None:
        self.pods = pods or []
        self.mode = "ok"
        self.requests: list[tuple[str, str]] = []  # GETs: (raw path, Authorization header)
        self.calls: list[tuple[str, str, str, dict[str, Any] | None]] = []  # (method, path, Authorization, body)
        self.events: dict[tuple[str, str], dict[str, Any]] = {}  # (namespace, name) -> the stored Event
        self.busy: list[tuple[int, str | None]] = []  # (status, Retry-After) for the next writes, first in first out
        self.lock = threading.Lock()
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
        with fake.lock:
            fake.calls.append(("GET", self.path, self.headers.get("Authorization", ""), None))
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
        if fake.mode == "huge":  # a 60 MiB answer announced by its Content-Length; its first MiB sent
            with contextlib.suppress(OSError):
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(60 << 20))
                self.end_headers()
                self.wfile.write(b'{"items": [' + b" " * (1 << 20))
            self.close_connection = True
            return
        if fake.mode == "not_a_list":
            self._send(200, {"kind": "Status", "items": "nope"})
            return
        if fake.mode == "slow_drip":  # a whole pod list, one byte every 0.1 s: each read is quick, the answer is not
            body = json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": fake.pods}).encode()
            with contextlib.suppress(OSError):
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                for i in range(len(body)):
                    if fake._release.wait(0.1):
                        return
                    self.wfile.write(body[i : i + 1])
                    self.wfile.flush()
            return
        parts = urlsplit(self.path)
        one = _ONE_POD.fullmatch(parts.path)
        if one is not None:
            found = [p for p in fake.pods if (p["metadata"]["namespace"], p["metadata"]["name"]) == one.groups()]
            if found:
                self._send(200, {"kind": "Pod", "apiVersion": "v1", **found[0]})
            else:
                self._send(404, _status(404, "NotFound", f'pods "{one.group(2)}" not found'))
            return
        if parts.path != "/api/v1/pods":
            self._send(404, {"kind": "Status", "code": 404})
            return
        selector = parse_qs(parts.query).get("fieldSelector", [""])[0]
        node = selector.removeprefix("spec.nodeName=") if selector.startswith("spec.nodeName=") else None
        items = [p for p in fake.pods if node is None or p["spec"]["nodeName"] == node]
        self._send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})

    def do_POST(self) -> None:
        self._write("POST")

    def do_PATCH(self) -> None:
        self._write("PATCH")

    def _write(self, method: str) -> None:
        fake = self.server.fake
        length = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        with fake.lock:
            fake.calls.append((method, self.path, self.headers.get("Authorization", ""), body))
        if fake.mode == "hang":
            fake._release.wait(30)
            return
        with fake.lock:
            busy = fake.busy.pop(0) if fake.busy else None
        if busy is not None:
            status, after = busy
            self._send_raw(status, json.dumps(_status(status, "TooManyRequests", "busy (fake)")).encode(),
                           {} if after is None else {"Retry-After": after})  # fmt: skip
            return
        refusal = {"unauthorized": (401, "Unauthorized"), "forbidden": (403, "Forbidden"),
                   "conflict": (409, "AlreadyExists"), "invalid": (422, "Invalid")}.get(fake.mode)  # fmt: skip
        if refusal is not None:
            self._send(refusal[0], _status(refusal[0], refusal[1], f"{fake.mode} (fake)"))
            return
        match = _EVENTS.fullmatch(urlsplit(self.path).path)
        if match is None or not isinstance(body, dict):
            self._send(404 if match is None else 400, _status(404 if match is None else 400, "BadRequest", "no"))
            return
        namespace, name = match.group(1), match.group(2)
        with fake.lock:
            if method == "POST" and name is None:
                self._create(fake, namespace, body)
            elif method == "PATCH" and name is not None:
                stored = fake.events.get((namespace, name))
                if stored is None:
                    self._send(404, _status(404, "NotFound", f'events "{name}" not found'))
                    return
                stored.update(body)
                stored["metadata"]["resourceVersion"] = str(int(stored["metadata"]["resourceVersion"]) + 1)
                self._send(200, stored)
            else:
                self._send(405, _status(405, "MethodNotAllowed", method))

    def _create(self, fake: FakeKubeApi, namespace: str, body: dict[str, Any]) -> None:
        meta, involved = body.get("metadata") or {}, body.get("involvedObject") or {}
        problems = []
        if meta.get("namespace") not in (None, namespace) or involved.get("namespace") != namespace:
            problems.append("involvedObject.namespace: does not match event.namespace")
        if not meta.get("name"):
            problems.append("metadata.name: Required value")
        if not body.get("reason"):
            problems.append("reason: Required value")
        if problems:
            self._send(422, _status(422, "Invalid", "; ".join(problems)))
            return
        if (namespace, meta["name"]) in fake.events:
            self._send(409, _status(409, "AlreadyExists", f'events "{meta["name"]}" already exists'))
            return
        stored = {**body, "metadata": {**meta, "namespace": namespace, "resourceVersion": "1"}}
        fake.events[(namespace, meta["name"])] = stored
        self._send(201, stored)

    def _send(self, status: int, doc: dict[str, Any]) -> None:
        self._send_raw(status, json.dumps(doc).encode())

    def _send_raw(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        with contextlib.suppress(OSError):
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
        self.close_connection = True
