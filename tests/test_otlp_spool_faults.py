"""The spool under write errors, through the real receiver path (daemon/receiver.py Receiver.accept, then the daemon
reading the spool): a write or an fsync of a batch fails, at each of them in turn, and the batch is retried as a
shipper retries what got no 2xx. Every record that got 2xx is counted exactly once; every record that did not is
counted once after the retry, whether the daemon goes on, or crashes and restarts before the retry, or the disk
stays full (a short write, then every write, fsync and truncate failing) until the crash. Then the same on a
real disk that fills (a 1 MiB tmpfs, as root): short writes tear .ids rows at page boundaries."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sglang_oom_exporter.daemon.app import App
from sglang_oom_exporter.sources.otlpspool import Line, SpoolError
from tests.support.app import run_app, started_app
from tests.support.helpers import Clock
from tests.support.logs import BLOCK

POD = "pods/llm_sglang-0_u1/server/0.log"
FILLER = 100  # short lines (and n more) before the pod's block on the small disk: its .ids file crosses a page
# most batches, each time at another place in a row


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


def _batch(n: int, filler: int = 0) -> dict[str, list[Line]]:
    """Batch n: one decode OOM block for the pod (a source every batch writes to, after `filler` lines) and for a
    new service."""
    out = {}
    for rel in (POD, f"files/svc-{n}.log"):
        lines = BLOCK.format(s=n).encode().splitlines(keepends=True)
        if rel == POD:
            lines = [b"%d\n" % i for i in range(filler)] + lines
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


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """tmp_path/state on a tmpfs of 1 MiB: the state directory on a disk that really fills (root only)."""
    state = tmp_path / "state"
    state.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(state)],
                                           capture_output=True).returncode:  # fmt: skip
        pytest.skip("mounting a small tmpfs needs root")
    try:
        yield state
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)


def test_a_disk_that_fills_and_frees_again_loses_and_doubles_nothing(tmp_path, small_disk):
    app, clock = _start(tmp_path)
    assert app.receiver is not None
    filler = small_disk / "filler"
    free = os.statvfs(small_disk)
    filler.write_bytes(b"f" * (free.f_bavail * free.f_frsize - 6 * 4096))  # a few pages left
    sent, refused = 0, 0
    for n in range(24):
        batch = _batch(n, FILLER + n)
        for _ in range(20):  # the shipper retries until the batch gets in
            try:
                app.receiver.accept(batch)
                break
            except SpoolError:
                refused += 1
            if refused % 7 == 0:  # now and then the daemon is killed before the disk frees and the retry comes
                app.sources.close()
                app, clock = _start(tmp_path)
                assert app.receiver is not None
            os.truncate(filler, max(0, filler.stat().st_size - 4096))  # a page frees
        else:
            raise AssertionError(f"batch {n} never got in")
        sent += 1
        run_app(app, clock, 3.0)
        app.keeper.save()
    assert refused >= 3
    assert app.counts.total("decode") == 2 * sent
    # A restart reads every source back whole (no torn row cuts a committed line), and every batch sent again
    # is a duplicate (no failed batch's identity was taken for a committed one, nor a committed one lost).
    app.sources.close()
    app, clock = _start(tmp_path)
    assert app.receiver is not None
    for n in range(sent):
        assert app.receiver.accept(_batch(n, FILLER + n)).written == 0
    run_app(app, clock, 3.0)
    assert app.counts.total("decode") == 2 * sent
    for n in range(sent):
        want = b"".join(line.data for line in _batch(n, FILLER + n)[f"files/svc-{n}.log"])
        assert open(app.receiver.spool.path(f"files/svc-{n}.log"), "rb").read() == want
    assert open(app.receiver.spool.path(POD), "rb").read() == b"".join(
        line.data for n in range(sent) for line in _batch(n, FILLER + n)[POD]
    )
