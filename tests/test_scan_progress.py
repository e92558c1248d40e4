"""`scan`'s progress line: on a terminal (a real pseudo-terminal from the pty module), not on a pipe, and the
parallel scan's workers counted in it."""

from __future__ import annotations

import gzip
import io
import json
import os
import pty
import re
import select
import subprocess
import sys
import time

from sglang_oom_exporter.progress import Progress
from sglang_oom_exporter.scan.run import scan_paths
from sglang_oom_exporter.scan.serial import input_size
from tests.support.helpers import CATALOG

RETRACT = "[2026-03-14 22:01:{s:02d} TP0] KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_token_ratio: 0.4 -> 0.5\n"
COMMAND = [sys.executable, "-m", "sglang_oom_exporter", "scan", "--jobs", "1"]


def _log(tmp_path, events: int = 7, noise: int = 20_000) -> str:
    """A log of about 5.6 MB (two of scan's 4 MiB chunks) with `events` retraction events."""
    path = tmp_path / "server.log"
    with open(path, "w") as fh:
        for s in range(events):
            fh.write("noise line of an ordinary scheduler log\n" * noise)
            fh.write(RETRACT.format(s=s))
    return str(path)


def _run_on_pty(args: list[str]) -> tuple[int, bytes, bytes]:
    """Run with stderr on a pseudo-terminal and stdout on a pipe; (exit status, stdout, what the terminal got)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    screen = b""
    deadline = time.monotonic() + 50
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if not ready:
            if proc.poll() is not None:
                break
            continue
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the slave side closed (the process exited)
            break
        if not data:
            break
        screen += data
    os.close(master)
    assert proc.stdout is not None
    out = proc.stdout.read()
    proc.stdout.close()
    return proc.wait(timeout=20), out, screen


def test_progress_is_shown_on_a_terminal(tmp_path):
    path = _log(tmp_path)
    code, out, screen = _run_on_pty([*COMMAND, path])
    assert code == 0
    text = screen.decode()
    lines = text.replace("\r\n", "\n").split("\r")
    size = os.path.getsize(path)
    assert lines[0] == ""  # each line is drawn over the last from column 0
    assert lines[1].rstrip() == f"scan: 0 B of {size / 1e6:.1f} MB (0%), -/s, file 1/1, 0 events"
    for line in lines[2:-1]:  # one per 4 MiB chunk at most
        assert re.fullmatch(rf"scan: [\d.]+ MB of {size / 1e6:.1f} MB \(\d+%\), [^,]+/s, file 1/1, \d+ events?(, .*left)?",
                            line.rstrip()), line  # fmt: skip
    assert lines[-1].startswith(f"scan: {size / 1e6:.1f} MB in ")
    assert lines[-1].rstrip().endswith(", 1 file, 7 events")
    assert text.endswith("\n")  # the report's own output never starts on the progress line
    assert b"total: 7 events" in out
    assert b"scan:" not in out


def test_no_progress_on_a_pipe_and_the_output_is_the_same(tmp_path):
    path = _log(tmp_path)
    piped = subprocess.run([*COMMAND, path], capture_output=True, timeout=60, check=True)
    assert piped.stderr == b""
    _, out, _ = _run_on_pty([*COMMAND, path])
    assert out == piped.stdout


def test_json_to_a_pipe_has_no_progress_even_on_a_terminal(tmp_path):
    path = _log(tmp_path)
    code, out, screen = _run_on_pty([*COMMAND, "--format", "json", path])
    assert (code, screen) == (0, b"")
    assert json.loads(out)["counts"]["retract"] == 7


def test_the_flags_override_what_the_terminal_decides(tmp_path):
    path = _log(tmp_path)
    forced = subprocess.run([*COMMAND, "--progress", path], capture_output=True, timeout=60, check=True)
    assert forced.stderr.startswith(b"\rscan: ")
    assert forced.stderr.rstrip().endswith(b", 1 file, 7 events")
    code, _, screen = _run_on_pty([*COMMAND, "--no-progress", path])
    assert (code, screen) == (0, b"")


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_line_says_bytes_rate_files_events_and_time_left():
    out, clock = io.StringIO(), _Clock()
    progress = Progress(out, clock=clock)
    progress.begin(3_000_000_000, 3)
    assert out.getvalue() == "\rscan: 0 B of 3.0 GB (0%), -/s, file 1/3, 0 events"
    clock.now += 10
    progress.update(1_000_000_000, 12, 1)
    assert progress.line(clock.now) == "scan: 1.0 GB of 3.0 GB (33%), 100.0 MB/s, file 2/3, 12 events, 20s left"
    progress.begin(None, 1)  # stdin: no total, so no percentage and no time left
    clock.now += 0.2
    progress.update(2_500, 1, 0)
    assert progress.line(clock.now) == "scan: 2.5 kB, -/s, file 1/1, 1 event"
    progress.finish(4)
    drawn = out.getvalue().split("\r")
    # Each line is padded with blanks over the longer one before it.
    assert drawn[-2] == "scan: 0 B, -/s, file 1/1, 0 events".ljust(len(drawn[-3]))
    assert drawn[-1] == "scan: 2.5 kB in 0.2s, 12.5 kB/s, 1 file, 4 events\n"


def test_a_gzip_file_counts_its_uncompressed_bytes(tmp_path):
    path = tmp_path / "old.log.gz"
    body = ("noise line\n" * 50_000).encode()
    path.write_bytes(gzip.compress(body))
    assert input_size(str(path)) == len(body)
    assert input_size(str(tmp_path / "missing.log")) == 0


def test_the_parallel_scan_counts_its_workers_bytes(tmp_path):
    paths = []
    for i in range(3):
        path = tmp_path / f"{i}.log"
        path.write_text(("noise line of an ordinary scheduler log\n" * 3000 + RETRACT.format(s=i)) * 20)  # 2.4 MB
        paths.append(str(path))
    total = sum(os.path.getsize(p) for p in paths)
    out = io.StringIO()
    progress = Progress(out, interval=0.0)
    result = scan_paths(CATALOG, paths, jobs=3, range_size=1 << 20, min_parallel_bytes=0, start_method="fork",
                        progress=progress)  # fmt: skip
    assert result.counts()["retract"] == 60
    # The parent reads about a third of the bytes itself: the rest came from the workers' shared counters.
    assert progress.done >= total
    assert (progress.events, progress.files_done) == (60, 3)
    assert progress.events_when_joined
    assert "events in done files" in out.getvalue()


def test_an_unreadable_input_is_reported_on_its_own_line(tmp_path):
    path = _log(tmp_path)
    proc = subprocess.run([*COMMAND, "--progress", path, str(tmp_path / "missing.log")], capture_output=True,
                          timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.endswith(b"\nsglang-oom-exporter: cannot read " + str(tmp_path / "missing.log").encode()
                                + b": No such file or directory\n")  # fmt: skip
