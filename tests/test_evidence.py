"""The SGLang evidence rule (detect/evidence.py): what identifies a source, and that positions, not chunking or
a parallel scan's cuts, decide what a generic CUDA OOM needs."""

from __future__ import annotations

import io
import json
import os

import pytest

from sglang_oom_exporter.config.model import KubernetesConfig
from sglang_oom_exporter.detect.evidence import HOLD_LINES, Evidence, EvidenceScanner, probe
from sglang_oom_exporter.detect.model import OomEvent
from sglang_oom_exporter.detect.pipeline import Pipeline
from sglang_oom_exporter.scan.run import scan_paths
from sglang_oom_exporter.scan.serial import scan_stream
from tests.support.app import make_app, run_app
from tests.support.helpers import CATALOG, MATCHER, scan_bytes

BARE = b"RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported\n\n"
WEAK = b"[2026-03-14 22:00:0%d TP0] Load weight begin. avail mem=78.1 GB\n"


def bare(n: int) -> bytes:
    """A torch CUDA OOM alone: no frames (each n a different body, so none dedupes into another)."""
    return b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate %d.00 MiB.\n\n" % n


PAD = b"".join(b"INFO: GET /health 200 %d\n" % i for i in range(40))


@pytest.mark.parametrize(
    ("head", "counted"),
    [
        (b"", 0),
        (b"[2026-03-14 22:00:00] server_args=ServerArgs(model_path='m')\n", 1),
        (b"[2026-12-07 23:51:25] server_args={'model_path': 'm', 'chunked_prefill_size': 4096}\n", 1),  # 0.5.23
        (b"Body: Str([2026-12-07 23:51:25] server_args={'model_path': 'm'})\n", 0),
        (b"[2026-03-14 22:00:00 TP0] max_total_num_tokens=401408, max_prefill_tokens=16384\n", 1),
        (b"[2026-03-14 22:00:00] Decode batch. #running-req: 3, #token: 900, token usage: 0.01\n", 1),
        (b'  File "/usr/lib/python3/dist-packages/sglang/srt/server.py", line 9, in f\n', 1),
        (
            b"[2026-03-14 22:00:00] Prefill out of memory. Try to lower your batch size.\nTry to allocate 9 tokens.\n\n",
            2,
        ),
        (WEAK % 1 + WEAK % 2, 0),  # the rank prefix is weak: two lines are not enough
        (WEAK % 1 + WEAK % 2 + WEAK % 3, 1),
        (b"2026-03-14T22:00:00.1Z stderr F " + WEAK % 1 + b"x TP0 y\n" * 5, 0),  # TP0 outside a prefix is nothing
        # SGLang's prefix starting the line once the runtime's framing (CRI, docker json-file, compose) is off.
        (b"".join(b"2026-03-14T22:00:00.1Z stderr F " + WEAK % i for i in range(3)), 1),
        (b"".join(b'{"log":"%s\\n","stream":"stderr"}\n' % (WEAK % i).strip() for i in range(3)), 1),
        (b"".join(b"sglang-1  | " + WEAK % i for i in range(3)), 1),
        # The same signs echoed inside a log forwarder's own records: its source is not SGLang by them.
        (b"".join(b"Body: Str(" + (WEAK % i).strip() + b")\n" for i in range(3)), 0),
        (b"".join(b'{"date":1.0,"log":"' + (WEAK % i).strip() + b'"}\n' for i in range(3)), 0),
        (b"Body: Str([2026-03-14 22:00:00] server_args=ServerArgs(model_path='m'))\n", 0),
        (b'{"message":"[2026-03-14 22:00:00] Decode batch. #running-req: 3, #token: 900, token usage: 0.01"}\n', 0),
        (b'[0] kube.log: [1.0, {"log"=>"[2026-03-14 22:00:00 TP0] max_total_num_tokens=401408"}]\n', 0),
        (b'Body: Str(  File "/usr/lib/python3/dist-packages/sglang/srt/server.py", line 9, in f)\n', 0),
        (b'{"level":"info","line":"[2026-03-14 22:00:00] Prefill out of memory. Try to lower your batch size."}\n', 0),
        # The parent's SIGQUIT lines after a child died (launch phase, running phase): SGLang's own words.
        (b"[2026-03-14 22:00:00] Received sigquit from a child process. It usually means the child failed.\n", 1),
        (b"Received sigquit from a child process. It usually means the child failed.\n", 1),
        (b"[2026-03-14 22:00:00] SIGQUIT received. signum=None, frame=None. It usually means one child failed.\n", 1),
        (
            b'{"msg":"[2026-03-14 22:00:00] Received sigquit from a child process. It usually means the child failed."}\n',
            0,
        ),
    ],
)
def test_what_identifies_a_source_before_a_bare_cuda_oom(head, counted):
    events = scan_bytes(head + PAD + BARE)
    assert len(events) == counted
    assert sum(1 for e in events if e.kind == "cuda_oom") == (1 if counted else 0)
    assert probe(head) == (counted == 1)  # the signs alone (a KV-pool message identifies as an event, not a sign)


def test_a_bare_cuda_oom_after_the_real_0_5_23_banner_counts_as_after_the_old_banner():
    # The recorded real banner of a 0.5.23 server (a dict since 0.5.23, 20 kB on one line), then a bare CUDA OOM.
    with open(os.path.join(os.path.dirname(__file__), "data", "logs", "live_0_5_23_prefill.log"), "rb") as fh:
        head = fh.readlines()[12]
    assert head.rstrip().endswith(b"}")
    assert head.startswith(b"[2026-12-07 23:51:25] server_args={'model_path'")
    old = b"[2026-12-07 23:51:25] server_args=ServerArgs(model_path='m', chunked_prefill_size=4096)\n"
    for banner in (head, old):
        events = scan_bytes(banner + PAD + BARE)
        line = banner.count(b"\n") + 41
        assert [(e.kind, e.location) for e in events] == [("cuda_oom", f"t.log:{line}")]
    assert probe(head) is True


def test_evidence_after_the_event_qualifies_it_in_scan_and_chunking_changes_nothing():
    data = BARE + PAD + b"[2026-03-14 22:00:00] server_args=ServerArgs(x=1)\n" + PAD + bare(1)
    whole = [(e.kind, e.location) for e in scan_bytes(data)]
    assert whole == [("cuda_oom", "t.log:1"), ("cuda_oom", "t.log:85")]  # the second: 3 + 40 + 1 + 40 lines before it
    for chunk in (1, 3, 17, 64):
        assert [(e.kind, e.location) for e in scan_bytes(data, chunk=chunk)] == whole, chunk


def test_a_line_longer_than_a_read_is_judged_whole():
    scanner_evidence = Evidence()
    scanner = EvidenceScanner(scanner_evidence, "bytes.find")
    line = b"[2026-03-14 22:00:00] " + b"x" * 5000 + b" server_args=ServerArgs(a=1)\n"  # SGLang's line: prefixed
    for i in range(0, len(line), 7):
        scanner.feed(line[i : i + 7], i)
    assert scanner_evidence.at == (0, 0)
    assert probe(b"hello\n" + line)
    assert not probe(b"hello\nworld\n")


def test_a_parallel_scan_admits_what_the_serial_scan_admits(tmp_path):
    # Evidence in the first range; bare CUDA OOMs in later ranges; three weak lines spread over cuts.
    parts = [BARE, PAD, WEAK % 1, PAD, WEAK % 2, PAD, bare(1), PAD, WEAK % 3, PAD]
    for i in range(6):
        parts += [bare(i + 2), PAD * 3]
    path = tmp_path / "big.log"
    path.write_bytes(b"".join(parts))
    serial = scan_paths(CATALOG, [str(path)]).to_json()
    assert serial["counts"]["cuda_oom"] == 8  # the two before the third weak line too: evidence anywhere in the file
    assert serial["inputs"][0]["foreign_events"] == 0
    for range_size in (300, 2000):
        got = scan_paths(CATALOG, [str(path)], jobs=2, range_size=range_size, min_parallel_bytes=0).to_json()
        assert json.dumps(got) == json.dumps(serial), range_size


def _pods(tmp_path, body: bytes) -> str:
    container = tmp_path / "pods" / "llm_sglang-0_0d7c" / "model"
    container.mkdir(parents=True)
    (container / "0.log").write_bytes(body)
    return str(container / "0.log")


def test_a_file_followed_from_its_end_is_judged_by_its_head(tmp_path):
    path = _pods(tmp_path, b"[2026-03-14 22:00:00] server_args=ServerArgs(model_path='m')\n" + PAD)
    app, clock = make_app(tmp_path, paths=(), kubernetes=KubernetesConfig(str(tmp_path / "pods")))
    run_app(app, clock)
    with open(path, "ab") as fh:
        fh.write(BARE)
    run_app(app, clock)
    assert app.counts.total("cuda_oom") == 1
    assert app.sources.get(path).state()["sglang"] is True  # type: ignore[index]


def test_an_old_state_file_without_the_identification_is_tolerated(tmp_path):
    # Saved by an older version (no "sglang" key), at an offset past a head that shows nothing: the content decides.
    path = _pods(tmp_path, PAD)
    app, clock = make_app(tmp_path, paths=(), kubernetes=KubernetesConfig(str(tmp_path / "pods")))
    run_app(app, clock)
    app.keeper.save()
    app.sources.close()
    state_file = os.path.join(str(tmp_path / "state"), os.listdir(str(tmp_path / "state"))[0])
    with open(state_file) as fh:
        doc = json.load(fh)
    text = json.dumps(doc)
    assert '"sglang": false' in text
    with open(state_file, "w") as fh:
        fh.write(text.replace('"sglang": false, ', "").replace(', "sglang": false', ""))
    with open(path, "ab") as fh:
        fh.write(BARE)
    app2, clock2 = make_app(tmp_path, paths=(), kubernetes=KubernetesConfig(str(tmp_path / "pods")))
    app2.keeper.load()
    run_app(app2, clock2)
    pipeline = app2.sources.get(path).pipeline
    assert app2.counts.total("cuda_oom") == 0
    assert (pipeline.holding(), pipeline.stats().foreign_events) == (1, 0)  # held: evidence may still follow
    run_app(app2, clock2, app2.config.evidence_wait)
    assert app2.counts.total("cuda_oom") == 0
    assert (pipeline.holding(), pipeline.stats().foreign_events) == (0, 1)
    assert app2.sources.facts().bad_positions == 0
    assert app2.keeper.errors == 0


def test_both_finders_stop_at_the_same_first_line():
    pytest.importorskip("hyperscan")
    from sglang_oom_exporter.detect.finder import BytesFinder, HyperscanFinder

    literals = (b"server_args=ServerArgs(", b"#running-req: ", b"TP0")
    finders = (BytesFinder(literals), HyperscanFinder(literals))
    rng = __import__("random").Random(7)
    words = [b"x", b"TP0", b"#running-req: ", b"server_args=ServerArgs(", b"\n", b"ServerArgs(", b"TP"]
    for _ in range(300):
        buf = b"".join(rng.choice(words) for _ in range(rng.randrange(1, 30)))
        lo = rng.randrange(len(buf) + 1)
        lines = set()
        for f in finders:
            hit = f.first(buf, lo, len(buf))
            lines.add(-1 if hit < 0 else buf.count(b"\n", 0, hit))
        assert len(lines) == 1, (buf, lo)


# Evidence that comes after the OOM: a crash pasted from `kubectl logs --previous`, a file scanned from mid-run.
BANNER = b"[2026-03-14 22:00:00] server_args=ServerArgs(model_path='m')\n"
LINES = b"".join(b"INFO: GET /health 200 %d\n" % i for i in range(HOLD_LINES))  # lines that show nothing


def _serve_pipeline(events: list[object], wait: float = 60.0) -> Pipeline:
    """A pipeline as serve builds it: the hold bounded by HOLD_LINES and the evidence wait."""
    return Pipeline(CATALOG, MATCHER, source="s", location="p", sink=events.append,
                    hold_lines=HOLD_LINES, hold_seconds=wait)  # fmt: skip


def _serve_events(data: bytes, chunk: int) -> tuple[list[str], int, int]:
    """(event locations, foreign events, reports still held) of `data` fed to serve's pipeline in `chunk`s at
    one instant (a backlog), then ticked past the rank window."""
    events: list[OomEvent] = []
    pipe = _serve_pipeline(events)  # type: ignore[arg-type]
    for i in range(0, len(data), chunk):
        pipe.feed(data[i : i + chunk], 0.0)
    pipe.tick(1.0)
    return [f"{e.kind}@{e.location}" for e in events], pipe.stats().foreign_events, pipe.holding()


@pytest.mark.parametrize("chunk", [1, 7, 64, 4096, 1 << 20])
def test_serve_counts_a_cuda_oom_once_when_evidence_follows_within_its_lines_whatever_the_chunking(chunk):
    # BARE is lines 1-3; evidence on line 1 + HOLD_LINES is within the bound, one line later it is not.
    within = BARE + LINES[: LINES.index(b"INFO: GET /health 200 997\n")] + BANNER
    assert within.count(b"\n") == 1 + HOLD_LINES
    assert _serve_events(within, chunk) == (["cuda_oom@p:1"], 0, 0)
    beyond = BARE + LINES[: LINES.index(b"INFO: GET /health 200 998\n")] + BANNER
    assert _serve_events(beyond, chunk) == ([], 1, 0)
    # Past the bound with no evidence at all: decided (foreign) by position, not by the clock.
    assert _serve_events(BARE + LINES, chunk) == ([], 1, 0)
    # Within the bound and nothing yet: still held.
    assert _serve_events(BARE + PAD, chunk) == ([], 0, 1)


def test_serve_holds_a_cuda_oom_for_the_evidence_wait_and_no_longer():
    events: list[OomEvent] = []
    pipe = _serve_pipeline(events, wait=60.0)  # type: ignore[arg-type]
    pipe.feed(b"Loading model\n" + BARE, 100.0)
    assert pipe.resume_point() == (14, 2)  # a restart re-reads the held report
    pipe.tick(159.9)
    assert (pipe.holding(), pipe.stats().foreign_events) == (1, 0)
    pipe.feed(BANNER, 159.95)
    pipe.tick(160.5)
    assert [(e.kind, e.location) for e in events] == [("cuda_oom", "p:2")]
    assert (pipe.holding(), pipe.stats().foreign_events) == (0, 0)
    assert pipe.resume_point() == (14 + len(BARE) + len(BANNER), 6)

    late: list[OomEvent] = []
    pipe = _serve_pipeline(late, wait=60.0)  # type: ignore[arg-type]
    pipe.feed(b"Loading model\n" + BARE, 100.0)
    pipe.tick(160.0)
    assert (pipe.holding(), pipe.stats().foreign_events) == (0, 1)  # a foreign torch OOM
    pipe.feed(BANNER, 161.0)
    pipe.tick(170.0)
    assert late == []


@pytest.mark.parametrize(
    "echo",
    [
        b"Body: Str([2026-03-14 22:00:00] server_args=ServerArgs(model_path='m'))\n",
        b'{"message":"[2026-03-14 22:00:00] Decode batch. #running-req: 3, #token: 900, token usage: 0.01"}\n',
        b'{"level":"info","line":"[2026-03-14 22:00:00] Prefill out of memory. Try to lower your batch size."}\n',
    ],
)
def test_an_echo_of_sglang_after_a_cuda_oom_is_no_evidence_in_scan_or_serve(echo, tmp_path):
    data = BARE + PAD + echo + PAD
    path = tmp_path / "train.log"
    path.write_bytes(data)
    got = scan_paths(CATALOG, [str(path)]).to_json()
    assert (got["counts"]["cuda_oom"], got["inputs"][0]["events"]) == (0, 0)
    foreign = 2 if b"Prefill" in echo else 1  # the echoed block is a foreign event of its own
    assert got["inputs"][0]["foreign_events"] == foreign
    assert _serve_events(data, 1 << 20) == ([], foreign - 1, 1)  # still waiting: an echo decides nothing


def _one_oom_file(tmp_path, name: str, evidence: bytes) -> str:
    """A log of 14 KB: health checks, a bare CUDA OOM near the middle, `evidence` a few lines later, more checks."""
    checks = b"".join(b"INFO: GET /health 200 %d\n" % i for i in range(300))
    path = tmp_path / name
    path.write_bytes(checks + BARE + b"Loading weights\n" + evidence + checks + checks)
    return str(path)


def test_scan_counts_a_cuda_oom_with_evidence_after_it_once_serially_and_cut_into_ranges_near_it(tmp_path):
    sglang = _one_oom_file(tmp_path, "sglang.log", BANNER)
    foreign = _one_oom_file(tmp_path, "train.log", b"Epoch 3 step 1200 loss=1.234\n")
    serial = scan_paths(CATALOG, [sglang, foreign]).to_json()
    assert [(e["kind"], e["source"]) for e in serial["events"]] == [("cuda_oom", f"{sglang}:301")]
    assert [(i["events"], i["foreign_events"]) for i in serial["inputs"]] == [(1, 0), (0, 1)]
    oom = open(sglang, "rb").read().index(BARE)
    # Range sizes whose cuts fall just before, inside and just after the OOM, and between it and the banner.
    for range_size in (97, 211, 389, 1201, 2000, 4001):
        got = scan_paths(CATALOG, [sglang, foreign], jobs=2, range_size=range_size, min_parallel_bytes=0).to_json()
        assert json.dumps(got) == json.dumps(serial), (range_size, oom)


def test_serve_counts_a_held_cuda_oom_when_the_container_s_next_run_shows_sglang(tmp_path):
    # A crash-looping pod: run 0 ends in a bare CUDA OOM (its head shows nothing), run 1 starts with the banner.
    path = _pods(tmp_path, b"")
    app, clock = make_app(tmp_path, paths=(), kubernetes=KubernetesConfig(str(tmp_path / "pods")))
    run_app(app, clock)
    with open(path, "ab") as fh:
        fh.write(PAD + BARE)
    run_app(app, clock)
    assert (app.counts.total("cuda_oom"), app.sources.get(path).pipeline.holding()) == (0, 1)
    with open(os.path.join(os.path.dirname(path), "1.log"), "wb") as fh:
        fh.write(BANNER)
    run_app(app, clock, 2 * app.config.discover_interval)  # found at the next discovery, read from 0
    assert app.counts.total("cuda_oom") == 1
    assert app.sources.get(path).pipeline.stats().foreign_events == 0


VLLM_CRASH = """\
ERROR 10-30 12:00:00 [core.py:710] EngineCore encountered a fatal error.
ERROR 10-30 12:00:00 [core.py:710] Traceback (most recent call last):
ERROR 10-30 12:00:00 [core.py:710]   File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 701, in run_engine_core
ERROR 10-30 12:00:00 [core.py:710]     engine_core.run_busy_loop()
ERROR 10-30 12:00:00 [core.py:710] RuntimeError: CUDA error: an illegal memory access was encountered

Scheduler hit an exception: Traceback (most recent call last):
  File "/opt/app/jobs/mem_cache/pool.py", line 12, in alloc_batch
    pool.take(n)
  File "/opt/app/jobs/scheduler.py", line 40, in tick
    job.run()
RuntimeError: job 17 has no worker

Traceback (most recent call last):
  File "/workspace/train.py", line 88, in <module>
    main()
  File "/workspace/mem_cache/alloc.py", line 80, in alloc_buffers
    loss.backward()
RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!
"""


def test_another_programs_crash_counts_nothing_whatever_its_header_and_frames():
    # vLLM's engine crash, a job scheduler that happens to print SGLang's crash header over frames in a mem_cache/
    # directory and an alloc_ function, a training script's traceback: no SGLang evidence, so no event, and the
    # header's look-alike is a report withheld as foreign.
    events, stats = scan_stream(CATALOG, MATCHER, "t.log", io.BytesIO(VLLM_CRASH.encode()))
    assert events == []
    assert stats.foreign_events == 1
    sglang = b"[2026-03-14 22:00:00] server_args=ServerArgs(model_path='m')\n"
    (event,) = scan_bytes(sglang + VLLM_CRASH.encode())  # in SGLang's own container the header is SGLang's
    assert (event.kind, event.message, event.inferred) == ("unknown", "RuntimeError: job 17 has no worker", True)
