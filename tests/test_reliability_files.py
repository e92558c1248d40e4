"""Issue 10, files half: deleted and renamed files are drained through the handle already open, rotation is
exact up to the rate RELIABILITY.md states, and the open-file limit never makes the daemon deaf.

The real daemon on real files, scraped over loopback; conditions are polled with deadlines. SIGSTOP/SIGCONT
hold the daemon still where a scenario needs the writes to land between two of its looks.
"""

from __future__ import annotations

import os
import signal

import pytest

from tests import test_serve_e2e
from tests.test_serve_e2e import Daemon, oom_block, settle, wait_for

daemon_factory = test_serve_e2e.daemon_factory  # the real daemon on real files, killed after each test

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


def _append(path, text: str) -> None:
    with open(path, "a") as fh:
        fh.write(text)


def _opened(d: Daemon, n: int = 1) -> bool:
    return d.metrics().get(("sglang_oom_exporter_files_watched", ()), 0) >= n and d.healthy() is True


def test_five_events_written_to_a_file_deleted_while_open_count_five(tmp_path, daemon_factory):
    log = tmp_path / "doomed.log"
    log.write_text("[2026-03-14 22:00:00 TP0] started\n")
    d = daemon_factory(str(tmp_path / "*.log"))
    settle(d, 0)
    d.send(signal.SIGSTOP)  # the writes and the unlink land between two looks of the daemon
    try:
        _append(log, "".join(oom_block() for _ in range(5)))
        os.unlink(log)
    finally:
        d.send(signal.SIGCONT)
    settle(d, 5)


def test_five_events_then_delete_with_the_daemon_running(tmp_path, daemon_factory):
    log = tmp_path / "doomed.log"
    log.write_text("[2026-03-14 22:00:00 TP0] started\n")
    d = daemon_factory(str(tmp_path / "*.log"))
    settle(d, 0)
    with open(log, "a") as fh:
        for _ in range(5):
            fh.write(oom_block())
            fh.flush()
    os.unlink(log)
    settle(d, 5)


def _passes(d: Daemon, n: int) -> None:
    """Wait until the daemon's loop has completed n more passes (each looks at every changed directory)."""
    key = ("sglang_oom_exporter_loop_timestamp_seconds", ())
    seen = [d.metrics()[key]]

    def moved() -> bool:
        stamp = d.metrics()[key]
        if stamp > seen[-1]:
            seen.append(stamp)
        return len(seen) > n

    wait_for(moved, what=f"{n} passes of the loop")


def test_events_a_writer_adds_after_its_file_was_deleted_are_drained(tmp_path, daemon_factory):
    """rm of a log a process still writes: its handle keeps the file, and so does ours until it goes quiet."""
    log = tmp_path / "doomed.log"
    log.write_text("[2026-03-14 22:00:00 TP0] started\n")
    d = daemon_factory(str(tmp_path / "*.log"))
    settle(d, 0)
    with open(log, "a") as writer:
        os.unlink(log)
        _passes(d, 2)  # the daemon has seen the deletion
        for _ in range(5):
            writer.write(oom_block())
            writer.flush()
        settle(d, 5)
