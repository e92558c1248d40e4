"""Reliability, files half: deleted and renamed files are drained through the handle already open, rotation is
exact up to the rate RELIABILITY.md states, and the open-file limit never makes the daemon deaf.

The real daemon on real files, scraped over loopback; conditions are polled with deadlines. SIGSTOP/SIGCONT
hold the daemon still where a scenario needs the writes to land between two of its looks.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile

import pytest

from sglang_oom_exporter.sources.fileid import TailChunk
from sglang_oom_exporter.sources.handles import HandleBudget
from sglang_oom_exporter.sources.tail import FileTailer
from tests.support.daemon import Daemon, settle
from tests.support.helpers import wait_until
from tests.support.logs import append, oom_block

pytestmark = [pytest.mark.slow]


def _opened(d: Daemon, n: int = 1) -> bool:
    return d.metrics().get(("sglang_oom_exporter_files_watched", ()), 0) >= n and d.healthy() is True


@pytest.mark.e2e
def test_five_events_written_to_a_file_deleted_while_open_count_five(tmp_path, daemon_factory):
    log = tmp_path / "doomed.log"
    log.write_text("[2026-03-14 22:00:00 TP0] started\n")
    d = daemon_factory(str(tmp_path / "*.log"))
    settle(d, 0)
    d.send(signal.SIGSTOP)  # the writes and the unlink land between two looks of the daemon
    try:
        append(log, "".join(oom_block() for _ in range(5)))
        os.unlink(log)
    finally:
        d.send(signal.SIGCONT)
    settle(d, 5)


@pytest.mark.e2e
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
    seen = [d.metrics(key[0])[key]]

    def moved() -> bool:
        stamp = d.metrics(key[0])[key]
        if stamp > seen[-1]:
            seen.append(stamp)
        return len(seen) > n

    wait_until(moved, what=f"{n} passes of the loop", timeout=15.0)


@pytest.mark.e2e
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


# --- defect 2: more files than the open-file limit -------------------------------------------------

_NOFILE = 128  # soft and hard: raising the soft limit to the hard one cannot help here


class LimitedDaemon(Daemon):
    """The daemon with RLIMIT_NOFILE lowered in the child before it starts."""

    def start(self) -> LimitedDaemon:
        import resource
        import subprocess

        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (_NOFILE, _NOFILE))

        cmd = self.command()
        # stderr to a file: 300 event lines would fill a pipe nobody reads and block the daemon.
        with open(os.path.join(self.state_dir + ".stderr"), "ab") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, preexec_fn=limit)
        wait_until(lambda: self.healthy() is not None, what="the daemon to answer /healthz", timeout=15.0)
        return self


@pytest.mark.e2e
def test_more_files_than_the_open_file_limit_are_all_counted_and_http_answers(tmp_path):
    files = [tmp_path / f"pod{i:03d}.log" for i in range(2 * _NOFILE + 44)]  # 300 files, limit 128
    for f in files:
        f.write_text("[2026-03-14 22:00:00 TP0] started\n")
    d = LimitedDaemon([str(tmp_path / "*.log")], str(tmp_path / "state")).start()
    try:
        wait_until(lambda: d.healthy() is True, timeout=30, what="/healthz 200")
        for f in files:
            append(f, oom_block())
        settle(d, len(files))
        m = d.metrics()
        assert m[("sglang_oom_exporter_files_watched", ())] == len(files)
        assert 0 < m[("sglang_oom_exporter_open_files", ())] <= _NOFILE - 64
        assert m[("sglang_oom_exporter_file_handle_parks_total", ())] > 0
        assert m[("sglang_oom_exporter_open_file_limit_hits_total", ())] == 0  # the bound kept it below the limit
        saves = m[("sglang_oom_exporter_state_saves_total", ())]
        assert saves >= 1
        assert m[("sglang_oom_exporter_state_errors_total", ())] == 0
        assert sum(v for (name, _), v in m.items() if name == "sglang_oom_exporter_read_errors_total") == 0
    finally:
        code = d.stop()
    assert code == 0
    # The clean stop saved every file's position: a restart under the same limit counts nothing twice.
    d2 = LimitedDaemon([str(tmp_path / "*.log")], str(tmp_path / "state")).start()
    try:
        for f in files[:10]:
            append(f, oom_block())
        settle(d2, len(files) + 10)
    finally:
        d2.stop()


# --- the handle budget at the tailer level: what happens to a file while it is parked -------------


def _items(tailer: FileTailer) -> list[bytes | str]:
    out: list[bytes | str] = []
    for item in tailer.poll():
        out.append(item.data if isinstance(item, TailChunk) else f"reset:{item.reason}")
    return out


@pytest.fixture
def pair(tmp_path):
    """Two tailers sharing a budget of one handle: reading one parks the other."""
    budget = HandleBudget(1)
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_bytes(b"a1\n")
    b.write_bytes(b"b1\n")
    ta, tb = FileTailer(str(a), budget=budget), FileTailer(str(b), budget=budget)
    assert _items(ta) == [b"a1\n"]
    assert _items(tb) == [b"b1\n"]  # a parked to make room
    assert budget.open_files == 1
    assert budget.parks == 1
    yield a, b, ta, tb, budget
    ta.close()
    tb.close()


def test_parked_file_resumes_where_it_was_with_a_partial_line(pair):
    a, _, ta, _, budget = pair
    append(a, "a2 no newline yet")
    assert _items(ta) == [b"a2 no newline yet"]  # b parks now
    assert ta.position is not None
    append(a, " ...now\n")
    assert _items(ta) == [b" ...now\n"]
    assert budget.open_files == 1


def test_parked_file_costs_a_stat_when_idle(pair):
    _, _, ta, _, budget = pair
    assert _items(ta) == []
    assert budget.parks == 1  # nothing changed: ta stayed parked, b kept its handle


def test_parked_file_renamed_is_drained_from_its_new_name(pair):
    a, _, ta, _, _ = pair
    append(a, "a2\n")
    os.rename(a, str(a) + ".1")
    a.write_bytes(b"new1\n")
    assert _items(ta) == [b"a2\n", "reset:rotated", b"new1\n"]


def test_parked_file_copytruncated_is_read_from_0(pair):
    a, _, ta, _, _ = pair
    with open(a, "r+b") as fh:
        fh.truncate(0)
    a.write_bytes(b"fresh\n")
    assert _items(ta) == ["reset:truncated", b"fresh\n"]


def test_parked_file_deleted_is_a_reset(pair):
    a, _, ta, _, _ = pair
    os.unlink(a)
    assert _items(ta) == ["reset:deleted"]
    a.write_bytes(b"again\n")
    assert _items(ta) == [b"again\n"]


def test_a_draining_deleted_file_keeps_its_handle_and_the_next_open_waits(tmp_path):
    budget = HandleBudget(1)
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_bytes(b"a1\n")
    b.write_bytes(b"b1\n")
    ta, tb = FileTailer(str(a), budget=budget), FileTailer(str(b), budget=budget)
    try:
        assert _items(ta) == [b"a1\n"]
        os.unlink(a)
        assert _items(ta) == []  # lingering: only its handle can still read it
        assert _items(tb) == []  # refused: nothing could park
        assert budget.limit_hits == 1
        assert budget.waiting == 1
        ta.close()
        assert _items(tb) == [b"b1\n"]
        assert budget.waiting == 0
    finally:
        ta.close()
        tb.close()


def test_copytruncate_drains_the_unread_end_from_the_copy(tmp_path):
    """logrotate's copytruncate: bytes not read before the truncate are still in the copy beside the file."""
    log = tmp_path / "app.log"
    log.write_bytes(b"a\n")
    tailer = FileTailer(str(log))
    try:
        assert _items(tailer) == [b"a\n"]
        append(log, "b\n")  # not read before the rotation
        shutil.copyfile(log, str(log) + ".1")
        with open(log, "r+b") as fh:
            fh.truncate(0)
        log.write_bytes(b"c\n")
        assert _items(tailer) == [b"b\n", "reset:truncated", b"c\n"]
    finally:
        tailer.close()


def _rotations(d: Daemon) -> float:
    """file_resets_total{reason="rotated"}: counted as the daemon opens the generation now at the path."""
    key = ("sglang_oom_exporter_file_resets_total", (("reason", "rotated"),))
    return d.metrics("sglang_oom_exporter_file_resets_total").get(key, 0.0)


@pytest.mark.e2e
def test_rename_rotation_right_after_each_write_is_exact(tmp_path, daemon_factory):
    """Each generation gets its OOM and is renamed away at once: the block is read from the renamed file.

    The writer waits for the daemon to open each new generation (its rotation counted) before writing to it, so
    the result never depends on how loaded the machine is. The fixed rates (a generation living 250 ms down to
    5 ms), where a loop stalled longer than a generation lives loses it, are measured by bench/rotate_rate.py
    (RELIABILITY.md)."""
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    root = tempfile.mkdtemp(prefix="sglang-oom-test-rotation-", dir=shm or str(tmp_path))
    try:
        logs = os.path.join(root, "logs")
        os.mkdir(logs)
        log = os.path.join(logs, "r.log")
        append(log, "[2026-03-14 22:00:00 TP0] started\n")
        d = daemon_factory(os.path.join(logs, "*.log"), nice=-10, state_dir=os.path.join(root, "state"))
        settle(d, 0)
        n = 20
        for i in range(n):
            append(log, oom_block())
            os.rename(log, f"{log}.{i}")
            append(log, "")
            wait_until(lambda k=i + 1: _rotations(d) >= k, what=f"generation {i + 2} opened", timeout=15.0)
        settle(d, n)
        assert _rotations(d) == n
        assert d.stop() == 0
    finally:
        shutil.rmtree(root)


@pytest.mark.e2e
def test_an_unended_last_line_is_held_not_lag_and_counts_once_its_line_ends(tmp_path, daemon_factory):
    # SGLang 0.5.23's exit can leave nanobind's reference-leak warning without its newline as a log's last bytes.
    # The daemon holds such a line until its end comes; it was counted as file_lag_bytes for ever, so a dead
    # server's log never looked caught up. Now the held line is no backlog, and the line it starts still counts.
    log = tmp_path / "server.log"
    log.write_text("[2026-03-14 22:00:00 TP0] started\n")
    d = daemon_factory(str(log))
    settle(d, 0)
    append(log, oom_block() + "nanobind: leaked 3 instances! For debugging hints see https://refleaks.html")
    settle(d, 1)  # caught up with the unended line held: file_lag_bytes 0
    append(log, "\n" + oom_block())
    settle(d, 2)
