"""End to end: the real `serve` process on real files, scraped over loopback.

Each scenario writes OOM blocks with distinct timestamps and asserts the exact counter value. Nothing
sleeps to synchronise: the tests poll /metrics until a condition holds or a deadline passes. Where a
scenario needs the daemon not to look between two writes (a burst, a rename with unread blocks), the
daemon is paused with SIGSTOP and resumed with SIGCONT. The only sleeps are the scenario's own delays
(a path missing for a second, a line finished a second later).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.daemon import Daemon, settle
from tests.support.helpers import free_port, wait_until
from tests.support.logs import append, cri, oom_block

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_appends(tmp_path, daemon_factory):
    log = tmp_path / "server.log"
    log.write_text("[2026-03-14 22:00:00 TP0] started\n")
    d = daemon_factory(str(log))
    assert d.count(source="server") == 0  # zero-initialised before any event
    for _ in range(3):
        append(log, oom_block())
    settle(d, 3)


def test_new_file_burst_written_between_looks(tmp_path, daemon_factory):
    d = daemon_factory(str(tmp_path / "*.log"))
    d.send(signal.SIGSTOP)
    (tmp_path / "late.log").write_text("".join(oom_block() for _ in range(4)))
    d.send(signal.SIGCONT)
    settle(d, 4)
    assert d.count(source="late") == 4


def test_rename_and_create_with_five_unread_blocks(tmp_path, daemon_factory):
    log = tmp_path / "0.log"
    log.write_text(oom_block())
    d = daemon_factory("--from-beginning", str(tmp_path / "*.log"))
    settle(d, 1)
    d.send(signal.SIGSTOP)
    append(log, "".join(oom_block() for _ in range(5)))
    os.rename(log, tmp_path / "0.log.20260314-220733")
    log.write_text(oom_block() + oom_block())
    d.send(signal.SIGCONT)
    settle(d, 8)


def test_path_absent_for_a_second_then_recreated(tmp_path, daemon_factory):
    log = tmp_path / "server.log"
    log.write_text(oom_block())
    d = daemon_factory("--from-beginning", str(log))
    settle(d, 1)
    os.unlink(log)
    # The deletion is seen (the deleted file is kept while a writer may still hold it, so no reset yet).
    stamp = d.metrics()[("sglang_oom_exporter_loop_timestamp_seconds", ())]
    wait_until(
        lambda: d.metrics()[("sglang_oom_exporter_loop_timestamp_seconds", ())] > stamp, what="a pass", timeout=15.0
    )
    time.sleep(1.0)  # the scenario: the path stays missing for a second
    log.write_text(oom_block() + oom_block() + oom_block())
    settle(d, 4)


@pytest.mark.parametrize("larger", [False, True], ids=["smaller", "larger"])
def test_copytruncate(tmp_path, daemon_factory, larger):
    log = tmp_path / "server.log"
    log.write_text(oom_block() + oom_block())
    d = daemon_factory("--from-beginning", str(log))
    settle(d, 2)
    d.send(signal.SIGSTOP)
    with open(log, "r+") as fh:
        fh.truncate(0)
    # Smaller: one block. Larger: the new content outgrows the old offset before the next look.
    log.write_text("".join(oom_block() for _ in range(4 if larger else 1)))
    d.send(signal.SIGCONT)
    settle(d, 6 if larger else 3)


def test_line_split_across_two_writes_a_second_apart(tmp_path, daemon_factory):
    log = tmp_path / "server.log"
    log.write_text("")
    d = daemon_factory(str(log))
    block = oom_block(traceback=False)
    append(log, block[:30])
    time.sleep(1.0)  # the scenario: the rest of the line comes a second later
    append(log, block[30:])
    settle(d, 1)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_restart_counts_what_was_written_while_down_once(tmp_path, daemon_factory, sig):
    log = tmp_path / "server.log"
    log.write_text(oom_block() + oom_block())
    # A periodic save every second instead of the default 5 s: the scenario needs one, not the wait for it.
    d = daemon_factory("--from-beginning", str(log), env={"SGLANG_OOM_EXPORTER_STATE_INTERVAL": "1s"})
    settle(d, 2)
    if sig == signal.SIGKILL:
        # SIGKILL leaves only the periodic save; whatever came after it is re-read and
        # counted again from that save's counters, so one save is all the scenario needs.
        wait_until(
            lambda: d.metrics().get(("sglang_oom_exporter_state_saves_total", ()), 0) >= 1,
            what="a state save",
            timeout=15.0,
        )
    assert d.stop(sig) == (0 if sig == signal.SIGTERM else -signal.SIGKILL)
    append(log, "".join(oom_block() for _ in range(5)))
    d2 = daemon_factory(str(log))
    settle(d2, 7)  # the total, not just what the new process saw


def test_restart_between_a_block_and_its_traceback(tmp_path, daemon_factory):
    log = tmp_path / "server.log"
    block = oom_block()
    head, tail = block.split("[", 2)[1], "[" + block.split("[", 2)[2]
    log.write_text("[" + head)
    d = daemon_factory("--from-beginning", "--traceback-wait", "30s", str(log))
    # The block is seen: pending, or already counted (a block naming its kind counts after 0.15 s of quiet,
    # README "When an event counts"). Waiting for pending alone raced that 0.15 s on a loaded machine.
    wait_until(lambda: d.metrics().get(("sglang_oom_exporter_pending_events", ())) == 1 or d.total() == 1,
             what="the block, pending or counted", timeout=15.0)  # fmt: skip
    assert d.stop(signal.SIGTERM) == 0
    append(log, tail)
    d2 = daemon_factory(str(log))
    settle(d2, 1)


def test_cri_pod_logs_rotation_and_restart_in_kubernetes_mode(tmp_path, daemon_factory):
    root = tmp_path / "pods"
    container = root / "llm_sglang-0_0d7c" / "sglang"
    container.mkdir(parents=True)
    (root / "kube-system_coredns-1_aa" / "coredns").mkdir(parents=True)
    (root / "kube-system_coredns-1_aa" / "coredns" / "0.log").write_text(cri(oom_block()))  # filtered out
    log = container / "0.log"
    log.write_text(cri("[2026-03-14 22:00:00 TP0] Load weight end."))
    d = daemon_factory("--kubernetes-logs", str(root))
    labels = {"namespace": "llm", "pod": "sglang-0", "container": "sglang"}
    append(log, cri(oom_block()))
    settle(d, 1)
    # kubelet rotation: 0.log -> 0.log.<ts> with an unread block, then a restarted container writes 1.log.
    d.send(signal.SIGSTOP)
    append(log, cri(oom_block()))
    os.rename(log, container / "0.log.20260314-220733")
    (container / "1.log").write_text(cri(oom_block() + oom_block()))
    d.send(signal.SIGCONT)
    settle(d, 4)
    assert d.count(**labels) == 4
    assert d.stop(signal.SIGTERM) == 0
    append(container / "1.log", cri(oom_block(kind="Decode")))
    d2 = daemon_factory("--kubernetes-logs", str(root))
    settle(d2, 1, kind="decode")
    assert d2.count(**labels) == 4
    assert d2.count("decode", **labels) == 1


def test_stdin_passes_through_and_counts(tmp_path):
    port = free_port()
    cmd = [sys.executable, "-m", "sglang_oom_exporter", "serve", "--listen", f"127.0.0.1:{port}", "--poll-interval", "0.1s",
           "-"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        d = Daemon([], str(tmp_path))
        d.port, d.proc = port, proc
        wait_until(lambda: d.healthy() is not None, what="/healthz", timeout=15.0)
        text = oom_block() + oom_block(traceback=False)
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.write(text.encode())
        proc.stdin.flush()
        settle(d, 2)
        assert proc.stdout.read(len(text)).decode() == text
        assert d.stop(signal.SIGTERM) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream:
                stream.close()


def test_corrupt_state_file_is_a_warning_not_a_crash(tmp_path, daemon_factory):
    state = tmp_path / "state"
    state.mkdir()
    (state / "state.json").write_bytes(b"\x00{not json")
    log = tmp_path / "server.log"
    log.write_text(oom_block())
    d = daemon_factory(str(log))
    append(log, oom_block())
    settle(d, 1)  # the documented fallback: a first start, existing content read from its end
    assert d.metrics()[("sglang_oom_exporter_state_errors_total", ())] == 1
    assert any(name.startswith("state.json.corrupt") for name in os.listdir(state))


def test_check_config_and_bad_config(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("paths: ['/var/log/sglang/*.log']\npoll_interval: 2s\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("paths: ['/x']\npoll_interval: 2\ncolour: red\n")
    run = lambda *a: subprocess.run([sys.executable, "-m", "sglang_oom_exporter", "serve", *a],  # noqa: E731
                                    capture_output=True, timeout=30, check=False)  # fmt: skip
    ok = run("--check-config", "--config", str(good))
    assert ok.returncode == 0, ok.stderr
    assert b"configuration ok: 1 path(s)" in ok.stdout
    res = run("--check-config", "--config", str(bad))
    assert res.returncode == 1
    err = res.stderr.decode()
    assert "colour: unknown key" in err
    assert "poll_interval: '2' is not a duration with a unit" in err
    assert run("--config", str(bad)).returncode == 2


def test_sighup_reloads_the_config(tmp_path, daemon_factory):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (second / "b.log").write_text("")
    config = tmp_path / "exporter.yaml"
    config.write_text(f"paths: ['{first}/*.log']\n")
    d = daemon_factory("--config", str(config))
    assert d.healthy() is False  # nothing matches yet, and /healthz says so
    target = f"http://127.0.0.1:{free_port()}"  # nothing listens there: the new scraper reports it down
    config.write_text(f"paths: ['{second}/*.log']\ntargets: [{{url: '{target}'}}]\n")
    d.send(signal.SIGHUP)
    wait_until(lambda: d.healthy() is True, what="the reloaded paths to be followed", timeout=15.0)
    append(second / "b.log", oom_block())
    settle(d, 1)
    assert d.count(source="b") == 1
    metrics = d.metrics()
    assert metrics[("sglang_oom_target_up", (("target", target),))] == 0.0
    assert metrics[("sglang_oom_target_scrape_errors_total", (("reason", "refused"), ("target", target)))] >= 1.0
    assert metrics[("sglang_oom_exporter_config_reloads_total", (("result", "applied"),))] == 1.0
    config.write_text("paths: [\n")  # broken YAML: refused, the running configuration stays
    d.send(signal.SIGHUP)
    wait_until(lambda: d.metrics().get(("sglang_oom_exporter_config_reloads_total", (("result", "failed"),))) == 1.0,
             what="the failed reload to be counted", timeout=15.0)  # fmt: skip
    assert d.healthy() is True
