"""The exporter served from a container (tests/test_image.py, tests/test_chart_pods.py): Served reads its /metrics on
127.0.0.1 like a Daemon (settle, metrics, started), and a container that exited fails the wait with its log.
"""

from __future__ import annotations

from tests.support.daemon import Daemon
from tests.support.podman import Podman


class Served(Daemon):
    """An exporter serving on 127.0.0.1:port from the container `container`: support.daemon's metrics, settle and
    wait helpers, without a process of our own."""

    def __init__(self, port: int, podman: Podman, container: str) -> None:
        self.port = port
        self.proc = None
        self.podman = podman
        self.container = container

    def log_tail(self, size: int = 3000) -> str:
        """The end of the container's log."""
        return str(self.podman("logs", self.container, check=False).stderr[-size:])

    def assert_running(self) -> None:
        """Fail, with the container's log, if the container is no longer running."""
        state = self.podman("inspect", "--format={{.State.Status}}", self.container).stdout.strip()
        assert state == "running", f"{state}: {self.podman('logs', self.container, check=False).stderr[-3000:]}"
