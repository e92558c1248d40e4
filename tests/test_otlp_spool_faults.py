"""The spool under write errors, through the real receiver path (daemon/receiver.py Receiver.accept, then the daemon
reading the spool): a write or an fsync of a batch fails, at each of them in turn, and the batch is retried as a
shipper retries what got no 2xx. Every record that got 2xx is counted exactly once; every record that did not is
counted once after the retry, whether the daemon goes on, or crashes and restarts before the retry, or the disk
stays full (a short write, then every write, fsync and truncate failing) until the crash."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sglang_oom_exporter.daemon.app import App
from sglang_oom_exporter.sources.otlpspool import Line, SpoolError
from tests.support.app import run_app, started_app
from tests.support.helpers import Clock
from tests.support.logs import BLOCK

POD = "pods/llm_sglang-0_u1/server/0.log"


@contextlib.contextmanager
def failing(at: int, *, full: bool = False) -> Iterator[list[int]]:
    """os.write and os.fsync raise ENOSPC at their `at`-th call (counted together); with `full`, that write
    writes half its bytes first (a short write), and every write, fsync and ftruncate after it fails too."""
    real = {name: getattr(os, name) for name in ("write", "fsync", "ftruncate")}
    calls = [0]

    def wrap(name: str) -> Callable[..., Any]:
        def call(fd: int, *args: Any) -> Any:
            if name != "ftruncate":
                calls[0] += 1
            hit = calls[0] == at and name != "ftruncate"
            if hit and full and name == "write" and len(args[0]) > 1:
                return real["write"](fd, bytes(args[0][: len(args[0]) // 2]))
            if hit or (full and calls[0] >= at):
                raise OSError(errno.ENOSPC, f"injected at call {calls[0]}: no space left on device")
            return real[name](fd, *args)

        return call

    for name in real:
        setattr(os, name, wrap(name))
    try:
        yield calls
    finally:
        for name, fn in real.items():
            setattr(os, name, fn)


def _batch(n: int) -> dict[str, list[Line]]:
    """Batch n: one decode OOM block for the pod (a source every batch writes to) and for a new service."""
    out = {}
    for rel in (POD, f"files/svc-{n}.log"):
        lines = BLOCK.format(s=n).encode().splitlines(keepends=True)
        out[rel] = [Line(data, hashlib.blake2b(b"%s %d %d" % (rel.encode(), n, i), digest_size=16).digest())
                    for i, data in enumerate(lines)]  # fmt: skip
    return out


def _start(tmp_path) -> tuple[App, Clock]:
    app, clock = started_app(tmp_path, otlp_listen="127.0.0.1:0", paths=())
    run_app(app, clock, 1.0)
    return app, clock


@pytest.mark.parametrize("mode", ["retry", "crash", "full-crash", "full-retry"])
def test_a_write_error_at_every_write_and_fsync_of_a_batch_loses_and_doubles_nothing(tmp_path, mode):
    app, clock = _start(tmp_path)
    assert app.receiver is not None
    sent: list[int] = []
    faults = 0
    for at in range(1, 40):
        n = len(sent)
        batch = _batch(n)
        with failing(at, full=mode.startswith("full")) as calls:
            try:
                app.receiver.accept(batch)
                acked = True
            except SpoolError:
                acked = False
        sent.append(n)
        if acked:
            assert calls[0] < at  # every write and fsync of a batch has failed once
            run_app(app, clock, 3.0)
            break
        faults += 1
        if not mode.startswith("full"):
            run_app(app, clock, 3.0)  # the daemon reads on: nothing of the failed batch may be there to read
        if "crash" in mode:
            app.sources.close()  # a SIGKILL: nothing saved since the last save
            app, clock = _start(tmp_path)
            assert app.receiver is not None
        app.receiver.accept(batch)  # the shipper's retry
        run_app(app, clock, 3.0)
        app.keeper.save()
    assert faults >= 7  # a new source's batch: log write and fsync, directory fsyncs, .ids write and fsync
    assert app.counts.total("decode") == 2 * len(sent)
    # Each source's spooled log holds each of its lines once, in order.
    for n in sent:
        want = b"".join(line.data for line in _batch(n)[f"files/svc-{n}.log"])
        assert open(app.receiver.spool.path(f"files/svc-{n}.log"), "rb").read() == want
    pod = b"".join(line.data for n in sent for line in _batch(n)[POD])
    assert open(app.receiver.spool.path(POD), "rb").read() == pod
    assert app.receiver.spool.stats.write_errors == (0 if "crash" in mode else faults)
