"""The fake Kubernetes API server over TLS, as the discovery and Events tests start it, and a client for it.

The `tls` fixture (conftest.py) makes the certificate, its key and the token file; `api` serves no pods until a
test adds some (`api.pods`), `fake_api` serves the pods given.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sglang_oom_exporter.sources.kubeclient import ApiClient
from tests.support.fake_kubeapi import FakeKubeApi

NODE = "gpu-node-1"  # the node fake_kubeapi.pod() puts a pod on unless told otherwise

Tls = tuple[Path, Path, Path]


@contextlib.contextmanager
def fake_api(tls: Tls, pods: list[dict[str, Any]] | None = None) -> Iterator[FakeKubeApi]:
    """A started FakeKubeApi with the `tls` certificate, stopped on the way out."""
    cert, key, _ = tls
    server = FakeKubeApi(cert, key, pods=pods).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def api(tls: Tls) -> Iterator[FakeKubeApi]:
    """A FakeKubeApi on 127.0.0.1 over TLS, with no pods yet."""
    with fake_api(tls) as server:
        yield server


def api_client(api: FakeKubeApi, tls: Tls, **kwargs: Any) -> ApiClient:
    """An ApiClient of the fake, trusting its certificate and reading the `tls` token file."""
    cert, _, token = tls
    return ApiClient("127.0.0.1", api.port, token_file=str(token), ca_file=str(cert), **kwargs)
