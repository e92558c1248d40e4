"""SGLang by what it writes: the real `serve` process on a real /var/log/pods tree (CRI files).

Every container of the node is followed; a generic CUDA OOM counts only with SGLang evidence, a source that never
shows SGLang has no series, and the identification survives a rotation, the container's next run and a daemon
restart. The same cases through `scan`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.support.daemon import Daemon, settle
from tests.support.helpers import wait_until
from tests.support.logs import append, cri, oom_block

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TORCH_OOM = """\
Epoch 3 step 1200 loss=1.234
Traceback (most recent call last):
  File "/workspace/train.py", line 88, in <module>
    loss.backward()
  File "/usr/local/lib/python3.11/dist-packages/torch/_tensor.py", line 522, in backward
    torch.autograd.backward(
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.14 GiB
"""
BANNER = "[2026-03-14 22:00:00] server_args=ServerArgs(model_path='Qwen/Qwen2.5-7B', mem_fraction_static=0.88)\n"
BARE_CUDA_OOM = "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported\n\n"
FRAMED_CUDA_OOM = """\
[2026-03-14 22:05:00 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", line 2804, in run_batch
    x()
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.95 GiB. GPU 0 has a total capacity of 79.19 GiB

"""
FILLER = "".join(
    f'[2026-03-14 21:00:00] INFO:     10.0.0.1:5000 - "GET /health HTTP/1.1" 200 OK {i}\n' for i in range(4000)
)
UID = "0d7c1f2e"


def series_of(d: Daemon, container: str) -> list[str]:
    """Names of the series on the page that carry this container label."""
    return sorted({name for name, labels in d.metrics() if ("container", container) in labels})


def gauge(d: Daemon, name: str) -> float:
    return d.metrics(name)[(name, ())]


def pod_dir(root, namespace: str, pod: str, container: str):
    path = root / f"{namespace}_{pod}_{UID}" / container
    path.mkdir(parents=True)
    return path


def test_a_pytorch_cuda_oom_in_a_foreign_container_counts_nothing_and_costs_no_series(tmp_path, daemon_factory):
    root = tmp_path / "pods"
    ray = pod_dir(root, "training", "ray-job-0", "ray-worker")
    sglang = pod_dir(root, "llm", "sglang-0", "sglang")
    # The CUDA OOM waits this long for SGLang evidence after it (none comes), then it is a foreign event.
    d = daemon_factory("--kubernetes-logs", str(root), "--evidence-wait", "1s")
    # Files that appear after the first look are read from their start.
    (ray / "0.log").write_text(cri(TORCH_OOM))
    wait_until(
        lambda: gauge(d, "sglang_oom_exporter_foreign_events_total") == 1, what="the foreign CUDA OOM", timeout=15.0
    )
    (sglang / "0.log").write_text(cri(BANNER + oom_block()))
    settle(d, 1)
    assert d.total("cuda_oom") == 0
    assert series_of(d, "ray-worker") == []
    assert gauge(d, "sglang_oom_exporter_files_watched") == 2
    assert gauge(d, "sglang_oom_exporter_sglang_sources") == 1
    assert gauge(d, "sglang_oom_exporter_foreign_events_total") == 1
    assert d.count("prefill", namespace="llm", pod="sglang-0", container="sglang") == 1


def test_sglang_under_any_container_name_survives_rotation_next_run_and_restart(tmp_path, daemon_factory):
    root = tmp_path / "pods"
    kserve = pod_dir(root, "kserve-test", "qwen-predictor-0", "kserve-container")
    main = pod_dir(root, "team-a", "chat-0", "main")
    model = pod_dir(root, "team-b", "rag-0", "model")
    d = daemon_factory("--kubernetes-logs", str(root))
    kserve_labels = {"namespace": "kserve-test", "pod": "qwen-predictor-0", "container": "kserve-container"}
    main_labels = {"namespace": "team-a", "pod": "chat-0", "container": "main"}
    model_labels = {"namespace": "team-b", "pod": "rag-0", "container": "model"}
    # kserve-container: the banner, then a CUDA OOM without frames: counted, the source is SGLang's.
    (kserve / "0.log").write_text(cri(BANNER + BARE_CUDA_OOM))
    # main: health checks past the head a restarted daemon would probe, then SGLang's own KV-pool text.
    (main / "0.log").write_text(cri(FILLER))
    wait_until(lambda: d.total("cuda_oom") == 1, what="the kserve-container CUDA OOM", timeout=15.0)
    assert series_of(d, "main") == []  # not (yet) shown to be SGLang: no series
    append(main / "0.log", cri(oom_block()))
    # model: no banner, a CUDA OOM whose traceback runs through sglang/srt.
    (model / "0.log").write_text(cri(FRAMED_CUDA_OOM))
    settle(d, 1)
    settle(d, 2, kind="cuda_oom")
    assert d.count("cuda_oom", **kserve_labels) == 1
    assert d.count("prefill", **main_labels) == 1
    assert d.count("cuda_oom", **model_labels) == 1
    assert gauge(d, "sglang_oom_exporter_sglang_sources") == 3
    # Rotation: the next generation of kserve-container's 0.log keeps the identification.
    d.send(signal.SIGSTOP)
    os.rename(kserve / "0.log", kserve / "0.log.20260314-220733")
    (kserve / "0.log").write_text(cri(BARE_CUDA_OOM.replace("memory", "memory ")))
    d.send(signal.SIGCONT)
    settle(d, 3, kind="cuda_oom")
    # The container's next run (1.log) inherits it, before its own banner.
    (kserve / "1.log").write_text(cri("[2026-03-14 22:09:00] Uvicorn running\n" + BARE_CUDA_OOM + BANNER))
    settle(d, 4, kind="cuda_oom")
    assert d.count("cuda_oom", **kserve_labels) == 3
    assert d.stop() == 0
    # A daemon restart: main's evidence lies beyond the head it would probe; the state file says it is SGLang.
    append(main / "0.log", cri(BARE_CUDA_OOM))
    d2 = daemon_factory("--kubernetes-logs", str(root))
    settle(d2, 5, kind="cuda_oom")
    assert d2.count("cuda_oom", **main_labels) == 1
    assert d2.metrics("sglang_oom_exporter_foreign_events_total")[("sglang_oom_exporter_foreign_events_total", ())] == 0


def scan_json(*paths: str) -> dict[str, object]:
    proc = subprocess.run([sys.executable, "-m", "sglang_oom_exporter", "scan", "--format", "json", *paths],
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return dict(json.loads(proc.stdout))


def test_scan_counts_a_cuda_oom_only_with_sglang_evidence(tmp_path):
    torch_log = tmp_path / "train.log"
    torch_log.write_text(cri(TORCH_OOM))
    sglang_log = tmp_path / "sglang.log"
    sglang_log.write_text(cri(BANNER + BARE_CUDA_OOM))
    framed = tmp_path / "framed.log"
    framed.write_text(FRAMED_CUDA_OOM)
    late = tmp_path / "late.log"
    late.write_text(cri("Loading model\n" + BARE_CUDA_OOM + BANNER))  # evidence a few lines after the event
    got = scan_json(str(torch_log), str(sglang_log), str(framed), str(late))
    assert [(e["kind"], e["source"]) for e in got["events"]] == [  # type: ignore[union-attr]
        ("cuda_oom", f"{sglang_log}:2"),
        ("cuda_oom", f"{framed}:1"),
        ("cuda_oom", f"{late}:2"),
    ]
    assert [i["foreign_events"] for i in got["inputs"]] == [1, 0, 0, 0]  # type: ignore[union-attr, index]
    # The same excerpt piped in (`kubectl logs --previous … | scan -`), and the training log: once, and none.
    for text, events, foreign in ((late.read_text(), 1, 0), (torch_log.read_text(), 0, 1)):
        piped = subprocess.run([sys.executable, "-m", "sglang_oom_exporter", "scan", "--format", "json", "-"],
                               input=text, capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
        doc = json.loads(piped.stdout)
        assert (doc["counts"]["cuda_oom"], doc["inputs"][0]["foreign_events"]) == (events, foreign)


def otel_echo(text: str) -> str:
    """An OpenTelemetry Collector's debug exporter echoing these lines, one log record each (Body: Str(...))."""
    records = [f"LogRecord #{i}\nSeverityNumber: Unspecified(0)\nBody: Str({line})\nTrace ID: \n"
               for i, line in enumerate(text.splitlines())]  # fmt: skip
    return "2026-05-28T20:26:44.001Z\tinfo\tResourceLog #0\n" + "".join(records)


def test_a_log_forwarder_echoing_sglang_s_lines_counts_no_event_and_is_not_sglang(tmp_path, daemon_factory):
    """The collector's pod echoes the SGLang pod's banner, usage lines, OOM block and traceback, and a CUDA OOM:
    SGLang's pod counts its OOM once; the collector's echoes are 3 foreign events (the block, the exception line,
    the CUDA OOM) and give it no series, though its lines carry every sign SGLang's do."""
    root = tmp_path / "pods"
    otel = pod_dir(root, "observability", "otel-collector-agent-x7k2p", "otc-container")
    sglang = pod_dir(root, "llm", "sglang-0", "sglang")
    usage = "".join(f"[2026-05-28 20:26:4{i} TP0] Decode batch, #running-req: 3, #token: 900, token usage: 0.01\n"
                    for i in range(3))  # fmt: skip
    own = BANNER + usage + oom_block()
    d = daemon_factory("--kubernetes-logs", str(root))
    (otel / "0.log").write_text(cri(otel_echo(own + TORCH_OOM)))
    (sglang / "0.log").write_text(cri(own))
    wait_until(
        lambda: gauge(d, "sglang_oom_exporter_foreign_events_total") == 3, what="the collector's echoes", timeout=15.0
    )
    settle(d, 1)
    assert d.count("prefill", namespace="llm", pod="sglang-0", container="sglang") == 1
    assert d.total("cuda_oom") == 0
    assert series_of(d, "otc-container") == []
    assert gauge(d, "sglang_oom_exporter_sglang_sources") == 1
    assert gauge(d, "sglang_oom_exporter_files_watched") == 2
    assert gauge(d, "sglang_oom_exporter_foreign_events_total") == 3
    # scan, offline, over the same two files: the same event and the same foreign events per input.
    got = scan_json(str(otel / "0.log"), str(sglang / "0.log"))
    assert [(e["kind"], e["source"]) for e in got["events"]] == [  # type: ignore[union-attr]
        ("prefill", f"{sglang / '0.log'}:5")
    ]
    assert [i["foreign_events"] for i in got["inputs"]] == [3, 0]  # type: ignore[union-attr, index]


def saved_offset(d: Daemon, path: os.PathLike[str]) -> int | None:
    """The offset the daemon's state file says a restart reads `path` from (None: not saved yet)."""
    try:
        with open(os.path.join(d.state_dir, "state.json")) as fh:
            entry = json.load(fh)["data"]["files"].get(str(path))
    except (OSError, ValueError, KeyError):
        return None  # not written yet (or being replaced: the rename is atomic, a reader may come between)
    return None if entry is None else int(entry["position"]["offset"])


def held_and_saved(d: Daemon, path: os.PathLike[str], offset: int) -> None:
    """Wait until the daemon read the CUDA OOM at `offset`, holds it and saved the state there: the position a
    restart re-reads from stays at the OOM (past it, a restart would lose it; before it, nothing was read)."""
    wait_until(lambda: saved_offset(d, path) == offset, what="the held CUDA OOM's position saved", timeout=15.0)
    assert d.total("cuda_oom") == 0
    assert gauge(d, "sglang_oom_exporter_foreign_events_total") == 0


def test_serve_counts_a_cuda_oom_whose_banner_follows_once_across_a_restart_between_them(tmp_path, daemon_factory):
    """The CUDA OOM, then the daemon restarts, then SGLang's banner a few lines later: counted once, as SGLang's."""
    root = tmp_path / "pods"
    model = pod_dir(root, "team-b", "rag-0", "model")
    log = model / "0.log"
    args = ("--kubernetes-logs", str(root), "--evidence-wait", "10m")  # the wait must not end within the test
    d = daemon_factory(*args)
    head = cri("Loading model\n")
    log.write_text(head + cri(BARE_CUDA_OOM))
    held_and_saved(d, log, len(head))
    assert d.stop() == 0
    assert saved_offset(d, log) == len(head)  # the final save keeps the held OOM to re-read
    append(log, cri(BANNER))
    d2 = daemon_factory(*args)
    settle(d2, 1, kind="cuda_oom")
    assert d2.count("cuda_oom", namespace="team-b", pod="rag-0", container="model") == 1
    assert gauge(d2, "sglang_oom_exporter_foreign_events_total") == 0
    assert gauge(d2, "sglang_oom_exporter_sglang_sources") == 1


def test_serve_counts_a_cuda_oom_whose_banner_follows_once_when_killed_before_the_next_save(tmp_path, daemon_factory):
    """Counted on the banner, then SIGKILL before a save holds the count: the restart re-reads the OOM and its
    banner and counts it once; a later restart, from a save that holds the count, counts nothing more."""
    root = tmp_path / "pods"
    model = pod_dir(root, "team-b", "rag-0", "model")
    log = model / "0.log"
    args = ("--kubernetes-logs", str(root), "--evidence-wait", "10m")
    d = daemon_factory(*args)
    head = cri("Loading model\n")
    log.write_text(head + cri(BARE_CUDA_OOM))
    held_and_saved(d, log, len(head))
    state = tmp_path / "state" / "state.json"
    before_banner = state.read_bytes()
    append(log, cri(BANNER))
    settle(d, 1, kind="cuda_oom")
    assert d.stop(signal.SIGKILL) == -signal.SIGKILL
    # The disk as a SIGKILL before the next save leaves it (the daemon saves soon after a count: put it back).
    state.write_bytes(before_banner)
    d2 = daemon_factory(*args)
    settle(d2, 1, kind="cuda_oom")
    assert gauge(d2, "sglang_oom_exporter_foreign_events_total") == 0
    assert d2.stop() == 0
    d3 = daemon_factory(*args)
    settle(d3, 1, kind="cuda_oom")
    assert d3.count("cuda_oom", namespace="team-b", pod="rag-0", container="model") == 1
