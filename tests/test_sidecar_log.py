"""The sidecar snippet's SGLang container, run here as its script runs in the pod (bash and python3, as the
SGLang image has them), with a stand-in program in place of SGLang: its PID 1 passes SIGTERM on and drains the
last lines into the log, and its writer rotates the log at LOG_MAX_BYTES keeping LOG_BACKUPS generations.
tests/test_chart_pods.py plays the same pod in podman beside the exporter."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.helpers import wait_until
from tests.support.sidecar import LOG, container, env, snippet_pod, with_stand_in

SGLANG = container(snippet_pod(), "sglang")


def _writer(tmp_path: Path, data: bytes, path: Path, cap: int, backups: int = 3) -> subprocess.CompletedProcess[bytes]:
    environ = {**os.environ, "LOG_MAX_BYTES": str(cap), "LOG_BACKUPS": str(backups)}
    return subprocess.run([sys.executable, "-c", env(SGLANG)["LOG_WRITER"], str(path)], input=data, env=environ,
                          capture_output=True, timeout=60, check=False, cwd=tmp_path)  # fmt: skip


def test_the_snippet_states_its_cap_and_generations():
    assert env(SGLANG)["LOG_MAX_BYTES"] == str(64 * 2**20)
    assert env(SGLANG)["LOG_BACKUPS"] == "3"
    (volume,) = [v for v in snippet_pod()["spec"]["volumes"] if v["name"] == "sglang-log"]
    # Four generations of 64 MiB, plus the one the exporter may still drain: well inside the eviction limit.
    assert volume["emptyDir"] == {"sizeLimit": "512Mi"}
    assert (3 + 2) * 64 < 512


def test_the_writer_rotates_at_the_cap_keeps_three_generations_and_copies_every_line(tmp_path):
    lines = [f"{i:05d} {'x' * 93}\n".encode() for i in range(450)]  # 100 bytes each
    assert {len(line) for line in lines} == {100}
    log = tmp_path / "sglang.log"
    done = _writer(tmp_path, b"".join(lines), log, cap=10_000)
    assert (done.returncode, done.stderr) == (0, b"")
    assert done.stdout == b"".join(lines)  # kubectl logs sees everything
    # 100 lines fill a generation exactly; rotations at lines 100, 200, 300 and 400; lines 0-99 rotated away.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sglang.log", "sglang.log.1", "sglang.log.2", "sglang.log.3"]
    assert log.read_bytes() == b"".join(lines[400:])
    for n, start in ((1, 300), (2, 200), (3, 100)):
        assert (tmp_path / f"sglang.log.{n}").read_bytes() == b"".join(lines[start : start + 100]), n


def test_the_writer_splits_a_line_longer_than_a_mebibyte_and_appends_to_an_existing_log(tmp_path):
    log = tmp_path / "sglang.log"
    log.write_bytes(b"before\n")
    done = _writer(tmp_path, b"y" * (2**20 + 5) + b"\nlast\n", log, cap=2**30)
    assert done.returncode == 0
    assert log.read_bytes() == b"before\n" + b"y" * (2**20 + 5) + b"\nlast\n"
    # A line over the cap in a fresh file is written whole rather than rotated forever.
    log.unlink()
    assert _writer(tmp_path, b"z" * 50 + b"\n", log, cap=10).returncode == 0
    assert log.read_bytes() == b"z" * 50 + b"\n"


def test_the_writer_keeps_copying_to_stdout_when_the_log_cannot_be_written(tmp_path):
    data = b"".join(f"line {i}\n".encode() for i in range(100))
    done = _writer(tmp_path, data, tmp_path / "missing" / "sglang.log", cap=1000)
    assert done.returncode == 0
    assert done.stdout == data  # SGLang is never blocked by its log
    assert done.stderr.count(b"log writer: ") == 100
    assert b"No such file or directory" in done.stderr


STAND_IN = (
    "python3 -u -c 'import signal, sys, threading\n"
    "def stop(*_):\n"
    '    print("last line, written after SIGTERM")\n'
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    'print("ready")\n'
    "threading.Event().wait()'"
)


def test_pid_1_passes_sigterm_on_and_exits_once_the_last_line_is_in_the_log(tmp_path):
    log = tmp_path / "sglang.log"
    script = with_stand_in(SGLANG["args"][0], STAND_IN).replace(LOG, str(log))
    assert SGLANG["command"] == ["bash", "-c"]
    (tmp_path / "sglang.log.closed").write_text("")  # left by the container's previous run
    proc = subprocess.Popen(["bash", "-c", script], env={**os.environ, **env(SGLANG)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    try:
        wait_until(lambda: log.is_file() and log.read_text() == "ready\n", timeout=30, what="the stand-in's first line")
        assert not (tmp_path / "sglang.log.closed").exists()
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
        seconds = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, stderr) == (0, b"")  # SGLang's exit status
    assert seconds < 5, seconds  # the grace period is 30 s
    assert log.read_text() == "ready\nlast line, written after SIGTERM\n"
    assert stdout == b"ready\nlast line, written after SIGTERM\n"
    assert (tmp_path / "sglang.log.closed").is_file()


def test_pid_1_exits_with_sglangs_status_when_sglang_dies_by_itself(tmp_path):
    log = tmp_path / "sglang.log"
    crash = "python3 -u -c 'import sys; print(\"RuntimeError: Prefill out of memory.\"); sys.exit(3)'"
    script = with_stand_in(SGLANG["args"][0], crash).replace(LOG, str(log))
    done = subprocess.run(["bash", "-c", script], env={**os.environ, **env(SGLANG)}, capture_output=True, timeout=30,
                          check=False)  # fmt: skip
    assert done.returncode == 3
    assert log.read_text() == "RuntimeError: Prefill out of memory.\n"
    assert (tmp_path / "sglang.log.closed").is_file()


def test_pid_1_exits_with_sglangs_status_when_sglang_is_gone_before_the_trap_returns(tmp_path):
    # The interleaving a loaded node gives: SIGTERM interrupts `wait` (its status is then 128 + 15, the signal's),
    # and SGLang has exited and been reaped before the loop looks again. A `kill` that returns only once the
    # stand-in is gone makes that order certain; PID 1 must still report the stand-in's 0, not 143.
    log = tmp_path / "sglang.log"
    slow_kill = (
        'kill() { builtin kill "$@"; local rc=$?; if [ "$1" = -TERM ]; then '
        'while builtin kill -0 "$2" 2>/dev/null; do sleep 0.01; done; fi; return "$rc"; }\n'
    )
    script = slow_kill + with_stand_in(SGLANG["args"][0], STAND_IN).replace(LOG, str(log))
    proc = subprocess.Popen(["bash", "-c", script], env={**os.environ, **env(SGLANG)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    try:
        wait_until(lambda: log.is_file() and log.read_text() == "ready\n", timeout=30, what="the stand-in's first line")
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, stderr) == (0, b"")
    assert log.read_text() == "ready\nlast line, written after SIGTERM\n"
    assert (tmp_path / "sglang.log.closed").is_file()
