"""The real daemon as the end-to-end tests run it: a `serve` process on a free loopback port (Daemon), its
/metrics read back, `settle` to wait until it has counted exactly what a test wrote, and `daemon_factory`, the
fixture that starts as many as a test needs and reaps them all.

Nothing sleeps to synchronise: every wait polls the daemon's own report with a deadline (helpers.wait_until).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import IO

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.helpers import free_port, wait_until


class Daemon:
    """A running `sglang-oom-exporter serve` process."""

    def __init__(self, args: list[str], state_dir: str, env: dict[str, str] | None = None, nice: int = 0) -> None:
        self.args = args
        self.state_dir = state_dir
        self.env = env or {}  # extra environment variables, e.g. SGLANG_OOM_EXPORTER_STATE_INTERVAL
        # A negative nice for a test of a rate: the suite runs two workers per CPU, and a daemon that waits
        # 100 ms for a CPU under that load is the suite's artifact, not the daemon's (where allowed: root).
        self.nice = nice
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        # What the process writes goes to unnamed files, never to pipes nobody reads: a daemon that logs an event
        # per OOM fills a 64 KiB pipe after a few hundred events and then blocks in its logger, mid-request.
        self._out: IO[bytes] | None = None
        self._err: IO[bytes] | None = None

    def command(self) -> list[str]:
        """The serve command line: this port and state dir, test intervals, then the test's own arguments."""
        # A 0.1 s tick: file events wake the loop anyway; the tick only bounds how soon a test sees the loop
        # pass that proves it caught up (settle), so a longer one would only make every test wait.
        return [sys.executable, "-m", "sglang_oom_exporter", "serve", "--listen", f"127.0.0.1:{self.port}",
                "--state-dir", self.state_dir, "--poll-interval", "0.1s", "--traceback-wait", "1s", *self.args]  # fmt: skip

    def start(self) -> Daemon:
        env = {**os.environ, **self.env} if self.env else None
        self._close_output()
        self._out, self._err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        self.proc = subprocess.Popen(self.command(), stdout=self._out, stderr=self._err, env=env,
                                     preexec_fn=self._renice if self.nice else None)  # fmt: skip
        wait_until(self.started, what="the daemon to answer /healthz with its starting positions saved", timeout=15.0)
        return self

    def _renice(self) -> None:
        with contextlib.suppress(PermissionError):  # not root: the default priority
            os.nice(self.nice)

    def started(self) -> bool:
        """/healthz answers, and no longer with `starting` (the positions every file is read from are saved)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as r:
                body = r.read()
        except urllib.error.HTTPError as exc:
            body = exc.read()
        except OSError:
            self.assert_running()
            return False
        return not body.startswith(b"starting")

    def healthy(self) -> bool | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except urllib.error.HTTPError:
            return False
        except OSError:
            self.assert_running()
            return None

    def assert_running(self) -> None:
        """Fail, with what it wrote to stderr, if the process has exited (/healthz did not answer)."""
        assert self.proc is not None
        assert self.proc.poll() is None, self.stderr()

    def metrics(self, *families: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """The samples of the /metrics page, or only of the families named (by name prefix): polling loops
        name theirs, because parsing a page of hundreds of sources 20 times a second is most of a test's CPU."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            text = r.read().decode()
        if families:
            text = "".join(
                line for line in text.splitlines(keepends=True)
                if (line[7:] if line.startswith(("# HELP ", "# TYPE ")) else line).startswith(families)
            )  # fmt: skip
        out = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
        return out

    def count(self, kind: str = "prefill", **labels: str) -> float:
        key = ("sglang_oom_events_total", tuple(sorted({"kind": kind, **labels}.items())))
        return self.metrics("sglang_oom_events_total").get(key, -1.0)

    def total(self, kind: str = "prefill") -> float:
        return sum(
            v for (name, labels), v in self.metrics("sglang_oom_events_total").items()
            if name == "sglang_oom_events_total" and dict(labels)["kind"] == kind
        )  # fmt: skip

    def send(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=20)

    def __enter__(self) -> Daemon:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        """Stop it (SIGTERM) if it still runs, and close its output files."""
        if self.proc is not None and self.proc.poll() is None:
            self.stop()
        self.reap()

    def reap(self) -> None:
        """Kill the process if it still runs and close its output files: a fixture's clean-up after any outcome."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close_output()

    def _close_output(self) -> None:
        for stream in (self._out, self._err):
            if stream is not None:
                stream.close()
        self._out = self._err = None

    def log_tail(self, size: int = 3000) -> str:
        """The end of what the daemon has logged so far (a failed wait's explanation), without waiting for it."""
        return self._logged()[-size:]

    def stderr(self) -> str:
        """Everything the process wrote to stderr, once it has exited ("" while it runs)."""
        if self.proc is None or self.proc.poll() is None:
            return ""
        return self._logged()

    def _logged(self) -> str:
        if self._err is None or self._err.closed:
            return ""
        return os.pread(self._err.fileno(), os.fstat(self._err.fileno()).st_size, 0).decode(errors="replace")


def caught_up(daemon: Daemon) -> float | None:
    """The daemon's loop timestamp when it has nothing left to do (no pending event, no open record, no
    unread byte), else None."""
    m = daemon.metrics(
        "sglang_oom_exporter_pending_events",
        "sglang_oom_exporter_busy_sources",
        "sglang_oom_exporter_file_lag_bytes",
        "sglang_oom_exporter_loop_timestamp_seconds",
    )
    idle = (
        m.get(("sglang_oom_exporter_pending_events", ())) == 0
        and m.get(("sglang_oom_exporter_busy_sources", ())) == 0
        and all(v == 0 for (name, _), v in m.items() if name == "sglang_oom_exporter_file_lag_bytes")
    )
    return m[("sglang_oom_exporter_loop_timestamp_seconds", ())] if idle else None


def settle(daemon: Daemon, expected: float, kind: str = "prefill") -> None:
    """Wait until the total reaches expected and the daemon has caught up, then check it is exactly expected.

    Caught up for one whole pass of its loop: a late double count would need a pending event, an open
    record or unread bytes, and the daemon reports all three. The deadlines are hang guards (a wait returns
    as soon as its condition holds): 15 s ran out for a daemon in a podman pod at load average 6.
    """
    try:
        wait_until(lambda: daemon.total(kind) >= expected, what=f"{kind} total {expected}", timeout=60.0)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the daemon's log ends:\n{daemon.log_tail()}") from None
    first: list[float] = []

    def passed_a_whole_pass() -> bool:
        stamp = caught_up(daemon)
        if stamp is None:
            first.clear()
            return False
        first[:1] = first[:1] or [stamp]
        return stamp > first[0]

    wait_until(passed_a_whole_pass, what="the daemon to catch up", timeout=60.0)
    assert daemon.total(kind) == expected


@pytest.fixture
def daemon_factory(tmp_path) -> Iterator[Callable[..., Daemon]]:
    """Start a `serve` process per call (its arguments after the harness's own), every one reaped after the test."""
    started: list[Daemon] = []

    def make(*args: str, env: dict[str, str] | None = None, nice: int = 0, state_dir: str | None = None) -> Daemon:
        d = Daemon(list(args), state_dir or str(tmp_path / "state"), env, nice)
        started.append(d)
        return d.start()

    yield make
    for d in started:
        d.reap()
