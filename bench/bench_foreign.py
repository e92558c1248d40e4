"""What foreign containers cost: 100 of them writing 10 MB/s in all beside a few SGLang pods, ours vs mtail.

Usage::

    python bench/bench_foreign.py [--foreign 100] [--mb-per-s 10] [--sglang 3] [--window 30] [--check-target]

The exporter follows every container of the node (not only those whose name looks like
SGLang) and counts events only in sources that showed SGLang (docs/recognition.md). This measures what that
costs on a node shaped like a shared GPU node: a /var/log/pods tree (ROOT/<ns>_<pod>_<uid>/<container>/0.log,
CRI format) with --foreign containers (training workers, web apps, sidecars: Python logging, access lines,
JSON lines, a few Python tracebacks, and one PyTorch `torch.OutOfMemoryError` each) and --sglang SGLang pods
under names no filter would guess (`kserve-container`, `main`, `model`, ...), each writing its banner, scheduler
lines and one fatal prefill OOM (block and traceback) every --oom-every seconds.

The files exist (SGLang's with their banner) before both daemons start: ours `serve --kubernetes-logs ROOT`
with its default filters, mtail `--logs 'ROOT/*/*/*.log'` with bench/oom.mtail. Once both follow every file,
a writer appends --mb-per-s MB/s spread over the foreign files (one 10 KB piece per file every 0.1 s at the
defaults) and the SGLang lines, for --window seconds, with no scrape in between. CPU is utime + stime from
/proc/<pid>/stat of each daemon from the window's start until ours has caught up after it (no lag, no pending
event), plus --settle seconds for mtail; ours' foreign CUDA OOMs, held for SGLang evidence after them, are
waited for after that. Then both pages are fetched once: the series count is the number of
sample lines. Ours must have counted exactly the SGLang OOMs written, no cuda_oom, and one foreign event per
foreign CUDA OOM written (exit 1 otherwise); --check-target exits 1 when mtail CPU / ours CPU < --cpu-ratio (5).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as bl

SEED = 20260314
FOREIGN_NAMES = (
    ("training", "ray-job-{i}", "ray-worker"),
    ("web", "shop-{i}", "app"),
    ("web", "shop-{i}", "istio-proxy"),
    ("data", "etl-{i}", "main"),
    ("ml", "trainer-{i}", "pytorch"),
)
SGLANG_NAMES = (
    ("kserve-test", "qwen-predictor-{i}", "kserve-container"),
    ("team-a", "chat-{i}", "main"),
    ("team-b", "rag-{i}", "model"),
    ("llm", "sglang-{i}", "sglang"),
)
BANNER = "[2026-03-14 22:00:00] server_args=ServerArgs(model_path='Qwen/Qwen2.5-7B-Instruct', port=30000)\n"
TORCH_OOM = (
    "Traceback (most recent call last):\n"
    '  File "/workspace/train.py", line 88, in <module>\n'
    "    loss.backward()\n"
    '  File "/usr/local/lib/python3.11/dist-packages/torch/_tensor.py", line 522, in backward\n'
    "    torch.autograd.backward(\n"
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.14 GiB\n"
)


def cri(lines: str, stream: str = "stderr") -> bytes:
    """The lines as a containerd CRI log."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    return "".join(f"{stamp}.{i:09d}Z {stream} F {line}\n" for i, line in enumerate(lines.splitlines())).encode()


def foreign_line(rng: random.Random) -> str:
    """One line of some other program: Python logging, an access line, a JSON line, or a traceback frame."""
    r = rng.random()
    n = rng.randrange(1_000_000)
    if r < 0.35:
        return (
            f"2026-03-14 22:07:33,{n % 1000:03d} INFO trainer: step {n} loss={n % 97 / 31:.4f} lr=3e-05 grad_norm=0.{n}"
        )
    if r < 0.65:
        return (
            f'10.0.{n % 255}.{n % 13} - - [14/Mar/2026:22:07:33 +0000] "GET /api/v1/items/{n} HTTP/1.1" '
            f'200 {n % 9000} "-" "Go-http-client/1.1"'
        )
    if r < 0.90:
        return json.dumps({"level": "info", "ts": 1773526053.1 + n, "msg": "request served", "id": n, "ms": n % 300})
    if r < 0.999:
        return f"2026-03-14 22:07:33 WARNING  dataloader worker {n % 8} slow: {n % 500} ms for batch {n}"
    return f'  File "/workspace/lib/module_{n % 40}.py", line {n % 900}, in step_{n % 7}'


def foreign_pieces(rng: random.Random, piece: int, count: int) -> list[bytes]:
    """count distinct CRI pieces of about `piece` bytes each."""
    out = []
    for _ in range(count):
        lines: list[str] = []
        size = 0
        while size < piece:
            line = foreign_line(rng)
            lines.append(line)
            size += len(line) + 40
        out.append(cri("\n".join(lines), "stdout"))
    return out


REQUESTS_PER_S = 4  # requests a pod serves a second: one prefill batch line and one access line each
WORDS = ("the", "model", "answer", "cluster", "node", "please", "summarise", "report", "latency", "token", "queue",
         "budget", "weather", "python", "kernel", "batch", "shard", "vector", "prompt", "result")  # fmt: skip


def sglang_lines(rng: random.Random, t: int, log_requests: bool = False) -> str:
    """A second of SGLang scheduler output at `--log-level info` (prefill batch, decode batch and access lines);
    with log_requests, also each request's `Receive: obj=...` and `Finish: obj=..., out=...` lines
    (`--log-requests`, a prompt and an answer of a few hundred words each)."""
    ts = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(1_780_000_000 + t))
    out = []
    for r in range(REQUESTS_PER_S):
        rid = f"{t:08x}{r:02x}{rng.randrange(1 << 32):08x}"
        out.append(
            f"[{ts}] Prefill batch, #new-seq: 1, #new-token: {rng.randrange(50, 4000)}, #cached-token: "
            f"{rng.randrange(0, 2000)}, token usage: 0.{rng.randrange(10, 99)}, #running-req: {rng.randrange(1, 64)}, "
            "#queue-req: 0\n"
        )
        if log_requests:
            prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(150, 400)))
            answer = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(100, 300)))
            params = "sampling_params={'max_new_tokens': 512, 'temperature': 0.7}, stream=False"
            meta = f"'meta_info': {{'id': '{rid}', 'finish_reason': 'stop'}}"
            out.append(f"[{ts}] Receive: obj=GenerateReqInput(rid='{rid}', text='{prompt}', {params})\n")
            out.append(f"[{ts}] Finish: obj=GenerateReqInput(rid='{rid}', text='{prompt[:200]}'), "
                       f"out={{'text': '{answer}', {meta}}}\n")  # fmt: skip
        out.append(f'[{ts}] INFO:     10.0.{r}.7:41234 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n')
    out.append(
        f"[{ts}] Decode batch, #running-req: {rng.randrange(1, 64)}, #token: {rng.randrange(1000, 90000)}, "
        f"token usage: 0.{rng.randrange(10, 99)}, cuda graph: True, gen throughput (token/s): 2431.18, #queue-req: 0\n"
    )
    return "".join(out)


def oom_block(t: int, tokens: int) -> str:
    """A fatal prefill OOM: the logged block, then its traceback (one event)."""
    ts = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(1_780_000_000 + t))
    text = f"Prefill out of memory. Try to lower your batch size.\nTry to allocate {tokens} tokens.\n"
    return (
        f"[{ts} TP0] {text}\n"
        f"[{ts} TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/usr/lib/python3/dist-packages/sglang/srt/managers/scheduler.py", line 9, in prepare_for_extend\n'
        "    x()\n"
        f"RuntimeError: {text}\n\n"
    )


def make_tree(root: Path, foreign: int, sglang: int) -> tuple[list[Path], list[Path]]:
    """The pod log tree; SGLang's files start with their banner, the others with one line."""
    fpaths, spaths = [], []
    for i in range(foreign):
        ns, pod, container = FOREIGN_NAMES[i % len(FOREIGN_NAMES)]
        path = root / f"{ns}_{pod.format(i=i)}_{SEED + i:08x}-f0" / container / "0.log"
        path.parent.mkdir(parents=True)
        path.write_bytes(cri("starting", "stdout"))
        fpaths.append(path)
    for i in range(sglang):
        ns, pod, container = SGLANG_NAMES[i % len(SGLANG_NAMES)]
        path = root / f"{ns}_{pod.format(i=i)}_{SEED + i:08x}-5g" / container / "0.log"
        path.parent.mkdir(parents=True)
        path.write_bytes(cri(BANNER))
        spaths.append(path)
    return fpaths, spaths


def ours_page(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    r = bl.http_get(port, "/metrics", timeout=10.0)
    if r is None or r[0] != 200:
        raise RuntimeError("ours did not answer /metrics")
    return bl.parse_prom(r[1])


def series(port: int) -> int:
    """Sample lines on a /metrics page."""
    r = bl.http_get(port, "/metrics", timeout=10.0)
    if r is None or r[0] != 200:
        raise RuntimeError(f"no /metrics on port {port}")
    return sum(1 for line in r[1].splitlines() if line and not line.startswith("#"))


def write_window(args: argparse.Namespace, fpaths: list[Path], spaths: list[Path]) -> tuple[int, int, int, int]:
    """Append for --window seconds; returns (foreign bytes, SGLang bytes, SGLang OOMs, foreign CUDA OOMs) written.

    The last --log-requests of the SGLang pods also log every request (`--log-requests`)."""
    rng = random.Random(SEED)
    tick = 0.1
    piece = int(args.mb_per_s * 1e6 * tick / len(fpaths))
    pieces = foreign_pieces(rng, piece, 64)
    handles: list[IO[bytes]] = [open(p, "ab", buffering=0) for p in fpaths]  # noqa: SIM115 - closed below
    shandles: list[IO[bytes]] = [open(p, "ab", buffering=0) for p in spaths]  # noqa: SIM115 - closed below
    ticks = int(args.window / tick)
    # One PyTorch CUDA OOM per foreign container, at a tick of its own.
    torch_at = {i: rng.randrange(ticks) for i in range(len(fpaths))}
    written = swritten = ooms = torch_ooms = 0
    verbose = set(range(len(spaths) - args.log_requests, len(spaths)))
    start = time.perf_counter()
    try:
        for k in range(ticks):
            for i, fh in enumerate(handles):
                data = pieces[(k + i) % len(pieces)]
                if torch_at[i] == k:
                    data += cri(TORCH_OOM)
                    torch_ooms += 1
                fh.write(data)
                written += len(data)
            if k % 10 == 0:
                second = k // 10
                for j, fh in enumerate(shandles):
                    text = sglang_lines(rng, second, j in verbose)
                    if second % args.oom_every == args.oom_every - 1:
                        text += oom_block(second, 100 + 7 * j + second)
                        ooms += 1
                    data = cri(text)
                    fh.write(data)
                    swritten += len(data)
            delay = start + (k + 1) * tick - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
    finally:
        for fh in (*handles, *shandles):
            fh.close()
    took = time.perf_counter() - start
    print(
        f"wrote {written / 1e6:.1f} MB of foreign lines and {swritten / 1e6:.2f} MB of SGLang's in {took:.1f}s "
        f"({(written + swritten) / 1e6 / took:.2f} MB/s)",
        file=sys.stderr,
    )
    return written, swritten, ooms, torch_ooms


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--foreign", type=int, default=100, help="foreign containers (default 100)")
    ap.add_argument("--sglang", type=int, default=3, help="SGLang pods (default 3)")
    ap.add_argument("--log-requests", type=int, default=1, help="of which log every request (default 1)")
    ap.add_argument("--mb-per-s", type=float, default=10.0, help="foreign MB/s in all (default 10)")
    ap.add_argument("--window", type=float, default=30.0, help="seconds of writing (default 30)")
    ap.add_argument("--oom-every", type=int, default=10, help="an SGLang OOM per pod every N s (default 10)")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds mtail gets after both caught up")
    ap.add_argument("--ready-timeout", type=float, default=120.0)
    ap.add_argument("--cpu-ratio", type=float, default=5.0, help="required mtail/ours CPU ratio (default 5)")
    ap.add_argument("--check-target", action="store_true", help="exit 1 if the ratio is below --cpu-ratio")
    ap.add_argument("--mtail", default="/usr/bin/mtail", help="mtail binary")
    ap.add_argument("--ours-arg", action="append", default=[], help="extra flag for ours (repeatable)")
    ap.add_argument("--keep-tmp", action="store_true", help="keep the temp tree and the daemons' output")
    ap.add_argument("--results", type=Path, help="also write the results as JSON to this file")
    return ap


def grep_floor(paths: list[Path], runs: int = 3) -> float:
    """The least CPU seconds of `grep -c -F 'out of memory'` over every file of the tree (whole process)."""
    argv = ["grep", "-c", "-F", "out of memory", *map(str, paths)]
    return min(bl.run_measured(argv, 120.0).cpu_seconds for _ in range(runs))


def measure(args: argparse.Namespace, children: bl.Children, tmp: Path) -> dict[str, Any]:
    """One run: both daemons follow the tree while --window seconds are written; CPU, peak RSS and counts.

    Raises RuntimeError when ours counted anything but what was written."""
    root = tmp / "pods"
    fpaths, spaths = make_tree(root, args.foreign, args.sglang)
    files = len(fpaths) + len(spaths)
    ours_port, mtail_port = bl.free_port(), bl.free_port()
    argv_ours = bl.ours_argv(ours_port, [], state_dir=str(tmp / "state"),
                             extra=["--kubernetes-logs", str(root), *args.ours_arg])  # fmt: skip
    ours = children.start("ours", argv_ours, tmp / "ours.out")
    mtail = children.start("mtail", bl.mtail_argv(args.mtail, mtail_port, str(root / "*" / "*" / "*.log")),
                           tmp / "mtail.out")  # fmt: skip
    try:
        return _measure(args, ours, mtail, ours_port, mtail_port, fpaths, spaths, files)
    finally:
        children.stop(ours)
        children.stop(mtail)


def _measure(args: argparse.Namespace, ours: bl.Child, mtail: bl.Child, ours_port: int, mtail_port: int,
             fpaths: list[Path], spaths: list[Path], files: int) -> dict[str, Any]:  # fmt: skip
    root = fpaths[0].parents[2]

    def ready() -> bool:
        bl.check_alive(ours, mtail)
        return (
            bl.ours_ready(ours_port, files=files)
            and bl.mtail_answers(mtail_port)
            and bl.open_fds_under(mtail.pid, str(root)) >= files
        )

    bl.wait_for(ready, args.ready_timeout, interval=0.2, what="both daemons to follow every file")
    sglang_ready = bl.metric(ours_page(ours_port), "sglang_oom_exporter_sglang_sources")
    procs = {"ours": ours, "mtail": mtail}
    cpu0 = {n: bl.cpu_seconds(c.pid) for n, c in procs.items()}
    rss0 = {n: bl.proc_status(c.pid)["VmRSS"] for n, c in procs.items()}
    w0 = time.perf_counter()
    written, swritten, ooms, torch_ooms = write_window(args, fpaths, spaths)

    def caught_up() -> bool:
        bl.check_alive(ours, mtail)
        m = ours_page(ours_port)
        lag = bl.metric(m, "sglang_oom_exporter_file_lag_bytes") or 0.0
        return (
            lag == 0
            and bl.metric(m, "sglang_oom_exporter_pending_events") == 0
            and (bl.metric(m, "sglang_oom_events_total", kind="prefill") or 0) >= ooms
        )

    bl.wait_for(caught_up, 120.0, interval=0.5, what="ours to catch up")
    ours_cpu = bl.cpu_seconds(ours.pid) - cpu0["ours"]
    ours_wall = time.perf_counter() - w0

    # mtail counts lines: each OOM's block head and its RuntimeError line. Once it has both of the last one, it has
    # read (nearly) everything; at rates it cannot keep up with, its CPU until then is what reading it all cost.
    def mtail_caught_up() -> bool:
        r = bl.http_get(mtail_port, "/metrics", timeout=10.0)
        m = bl.parse_prom(r[1]) if r is not None and r[0] == 200 else {}
        return (bl.metric(m, "sglang_oom_lines_total", kind="prefill") or 0) >= 2 * ooms

    mtail_done = True
    try:
        bl.wait_for(mtail_caught_up, 180.0, interval=0.5, what="mtail to read the last OOM")
    except TimeoutError:
        mtail_done = False
    time.sleep(args.settle)
    mtail_cpu = bl.cpu_seconds(mtail.pid) - cpu0["mtail"]
    mtail_wall = time.perf_counter() - w0
    rss = {n: bl.proc_status(c.pid) for n, c in procs.items()}

    # A foreign CUDA OOM is held for SGLang evidence after it (up to 1,000 lines or --evidence-wait, 1m): the
    # last ones written are decided after the reading is done, so they are waited for after the CPU is taken.
    def decided() -> bool:
        return bl.metric(ours_page(ours_port), "sglang_oom_exporter_foreign_events_total") == torch_ooms

    bl.wait_for(decided, 180.0, interval=1.0, what="ours to decide every foreign CUDA OOM")
    m = ours_page(ours_port)
    got = {
        "prefill": bl.metric(m, "sglang_oom_events_total", kind="prefill"),
        "cuda_oom": bl.metric(m, "sglang_oom_events_total", kind="cuda_oom"),
        "foreign": bl.metric(m, "sglang_oom_exporter_foreign_events_total"),
        "sglang_sources": bl.metric(m, "sglang_oom_exporter_sglang_sources"),
        "files_watched": bl.metric(m, "sglang_oom_exporter_files_watched"),
    }
    want = {"prefill": ooms, "cuda_oom": 0, "foreign": torch_ooms, "sglang_sources": len(spaths),
            "files_watched": files}  # fmt: skip
    if any(got[k] != v for k, v in want.items()):
        raise RuntimeError(f"ours counted {got}, expected {want}")
    grep_cpu = grep_floor([*fpaths, *spaths])
    tree_mb = sum(p.stat().st_size for p in (*fpaths, *spaths)) / 1e6
    return {
        "mb_per_s": args.mb_per_s, "window": args.window, "foreign": len(fpaths), "sglang": len(spaths),
        "log_requests": args.log_requests, "foreign_mb": written / 1e6, "sglang_mb": swritten / 1e6,
        "mb": (written + swritten) / 1e6, "tree_mb": tree_mb, "sglang_ready": sglang_ready, "ooms": ooms,
        "ours_cpu_s": ours_cpu, "ours_wall_s": ours_wall, "mtail_cpu_s": mtail_cpu, "mtail_wall_s": mtail_wall,
        "mtail_caught_up": mtail_done, "grep_cpu_s": grep_cpu,
        "ours_rss_kib": rss["ours"]["VmRSS"], "ours_hwm_kib": rss["ours"]["VmHWM"], "ours_rss0_kib": rss0["ours"],
        "mtail_rss_kib": rss["mtail"]["VmRSS"], "mtail_hwm_kib": rss["mtail"]["VmHWM"],
        "ours_series": series(ours_port), "mtail_series": series(mtail_port), "counted": got,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not Path(args.mtail).exists():
        print(f"{args.mtail} not found: this benchmark is a comparison with mtail", file=sys.stderr)
        return 1
    bl.raise_on_signals()
    print(f"ours: sglang_oom_exporter {bl.ours_provenance()}")
    children = bl.Children()
    tmp = Path(tempfile.mkdtemp(prefix="bench-foreign-"))
    with bl.BenchRun(children, tmp, keep=args.keep_tmp, tails=lambda: bl.out_file_tails(tmp)) as run:
        r = measure(args, children, tmp)
        ours_cpu, mtail_cpu = r["ours_cpu_s"], r["mtail_cpu_s"]
        ratio = mtail_cpu / ours_cpu if ours_cpu > 0 else float("inf")
        met = ratio >= args.cpu_ratio
        print(
            f"\n{args.foreign} foreign containers ({r['foreign_mb']:.0f} MB in {args.window:g}s), {r['sglang']} SGLang "
            f"pods ({r['sglang_mb']:.1f} MB, {r['ooms']} OOMs); SGLang sources identified before the window: "
            f"{r['sglang_ready']:g}"
        )
        print(f"{'':6s} {'CPU s':>7s} {'% core':>7s} {'ms/MB':>7s} {'series':>7s}")
        for name in ("ours", "mtail"):
            cpu, wall = r[f"{name}_cpu_s"], r[f"{name}_wall_s"]
            print(f"{name:6s} {cpu:7.2f} {100 * cpu / wall:7.1f} {1000 * cpu / r['mb']:7.2f} {r[f'{name}_series']:7d}")
        print(f"{'grep':6s} {r['grep_cpu_s']:7.2f} {'':7s} {1000 * r['grep_cpu_s'] / r['tree_mb']:7.2f}")
        print(f"mtail CPU / ours CPU: {ratio:.2f}x   (target >= {args.cpu_ratio:g}: {'MET' if met else 'NOT MET'})")
        print(f"ours counted: {json.dumps(r['counted'])}")
        if args.check_target and not met:
            run.status = 1
        if args.results:
            args.results.write_text(json.dumps(r, indent=2) + "\n", encoding="utf-8")
    return run.status


if __name__ == "__main__":
    sys.exit(main())
