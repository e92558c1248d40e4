"""10,000 files: how soon `serve` answers, how much memory it holds, and how fast a new event counts; beside mtail.

Usage::

    python bench/bench_scale.py [--files 10000] [--content empty|small] [--settle 10] [--events 5]

The target: with 10,000 followed files, /metrics answers within 10 s of the start, RSS stays at or under
256 MiB, and a new event is counted with normal latency (about 1 s). The script writes --files log files into
one directory (`empty`: zero bytes, a node whose pods have not logged yet; `small`: about 4 KB of scheduler
lines each, no OOM), then, one after the other on the same files:

- ours: `serve --state-dir S 'DIR/*.log'`. Measured from the start: when /metrics first answers 200, when
  /healthz says ready with every file watched; VmHWM (peak RSS since start) and VmRSS after --settle idle
  seconds; the state file's size; then --events OOM blocks (with traceback) appended one at a time to random
  files, each timed from the write until the daemon has recorded it (/events, polled every 20 ms: the sink
  records an event and its counter together, and /metrics is checked to hold every one at the end);
  VmHWM (peak RSS since start) at the end.
- mtail (the baseline): `--logs 'DIR/*.log'`; when /metrics first answers and when it holds every file open,
  VmHWM and VmRSS after the same settle.

Both get RLIMIT_NOFILE raised to fit the files. Timings depend on the machine's load; memory does not much.
Exit status 1 when a daemon fails to start or an event is not counted within --event-timeout;
with --check-target also when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as bl
import gen_scheduler_log as gen

SEED = 20260314
EVENT = (
    "[{ts} TP0] Prefill out of memory. Try to lower your batch size.\nTry to allocate {n} tokens.\n"
    "[{ts} TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    '  File "/usr/lib/python3/dist-packages/sglang/srt/managers/scheduler.py", line 9, in prepare_for_extend\n'
    "    x()\nRuntimeError: Prefill out of memory. Try to lower your batch size.\nTry to allocate {n} tokens.\n\n"
)


@dataclass
class Result:
    name: str
    metrics_s: float = float("nan")  # start -> /metrics answers 200
    ready_s: float = float("nan")  # start -> ready with every file watched (ours) / open (mtail)
    hwm_kib: int = 0
    rss_kib: int = 0
    latencies_s: list[float] = field(default_factory=list)
    state_bytes: int = 0


def make_files(root: Path, n: int, content: str) -> int:
    """Write the files; returns the total bytes."""
    total = 0
    for i in range(n):
        path = root / f"sglang-{i:05d}.log"
        if content == "empty":
            path.touch()
            continue
        gen.generate(path, 30, 0, SEED + i)  # about 4 KB of scheduler lines, no OOM
        total += path.stat().st_size
    return total


def _first(pred: object, t0: float, timeout: float, what: str) -> float:
    bl.wait_for(pred, timeout=timeout, interval=0.05, what=what)  # type: ignore[arg-type]
    return time.perf_counter() - t0


def _metrics_answer(port: int) -> bool:
    r = bl.http_get(port, "/metrics", timeout=5.0)
    return r is not None and r[0] == 200


def run_ours(args: argparse.Namespace, root: Path, tmp: Path, children: bl.Children) -> Result:
    res = Result("ours")
    port = bl.free_port()
    state = tmp / "state"
    t0 = time.perf_counter()
    child = children.start("ours", bl.ours_argv(port, [str(root / "*.log")], state_dir=str(state),
                                                extra=args.ours_arg), tmp / "ours.out")  # fmt: skip
    try:

        def answers() -> bool:
            bl.check_alive(child)
            return _metrics_answer(port)

        def ready() -> bool:
            bl.check_alive(child)
            return bl.ours_ready(port, files=args.files)

        res.metrics_s = _first(answers, t0, args.ready_timeout, "ours' /metrics")
        res.ready_s = _first(ready, t0, args.ready_timeout, "ours ready with every file watched")
        time.sleep(args.settle)  # idle: what it holds at rest
        st = bl.proc_status(child.pid)
        res.rss_kib = st.get("VmRSS", 0)
        state_file = state / "state.json"
        res.state_bytes = state_file.stat().st_size if state_file.exists() else 0
        rng = random.Random(SEED)
        for n in range(1, args.events + 1):
            path = root / f"sglang-{rng.randrange(args.files):05d}.log"
            ts = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(1_780_000_000 + 10 * n))
            wrote = time.perf_counter()
            with open(path, "a") as fh:
                fh.write(EVENT.format(ts=ts, n=n))

            def counted(n: int = n) -> bool:
                # /events, not /metrics: the sink records the event and its counter together, and a 10,000-file
                # page fetched every 20 ms would load the daemon it measures.
                r = bl.http_get(port, "/events", timeout=5.0)
                return r is not None and r[0] == 200 and len(json.loads(r[1])["events"]) >= n

            bl.wait_for(counted, timeout=args.event_timeout, interval=0.02, what=f"event {n} counted")
            res.latencies_s.append(time.perf_counter() - wrote)
            time.sleep(1.0)  # apart, so each is its own event and the loop is idle again
        r = bl.http_get(port, "/metrics", timeout=30.0)
        total = bl.metric(bl.parse_prom(r[1]), "sglang_oom_events_total", kind="prefill") if r else None
        if total != args.events:
            raise RuntimeError(f"/metrics counts {total} prefill events, {args.events} were written")
        res.hwm_kib = bl.proc_status(child.pid).get("VmHWM", 0)
        return res
    finally:
        children.stop(child)


def run_mtail(args: argparse.Namespace, root: Path, tmp: Path, children: bl.Children) -> Result:
    res = Result("mtail")
    port = bl.free_port()
    t0 = time.perf_counter()
    child = children.start("mtail", bl.mtail_argv(args.mtail, port, str(root / "*.log")), tmp / "mtail.out")
    try:

        def answers() -> bool:
            bl.check_alive(child)
            return bl.mtail_answers(port)

        def all_open() -> bool:
            bl.check_alive(child)
            return bl.open_fds_under(child.pid, str(root)) >= args.files

        res.metrics_s = _first(answers, t0, args.ready_timeout, "mtail's /metrics")
        res.ready_s = _first(all_open, t0, args.ready_timeout, "mtail holding every file open")
        time.sleep(args.settle)
        st = bl.proc_status(child.pid)
        res.rss_kib, res.hwm_kib = st.get("VmRSS", 0), st.get("VmHWM", 0)
        return res
    finally:
        children.stop(child)


def report(args: argparse.Namespace, ours: Result, mtail: Result | None) -> bool:
    mib = 1024.0
    print(f"\n{args.files} files ({args.content}); settle {args.settle:g}s; {args.events} events")
    print(f"{'':6s} {'/metrics s':>10s} {'ready s':>8s} {'peak MiB':>9s} {'RSS MiB':>8s} {'event p50/max s':>16s}")
    for r in (ours, mtail):
        if r is None:
            continue
        lat = f"{bl.percentile(r.latencies_s, 50):.2f}/{max(r.latencies_s):.2f}" if r.latencies_s else "-"
        print(f"{r.name:6s} {r.metrics_s:10.2f} {r.ready_s:8.2f} {r.hwm_kib / mib:9.1f} {r.rss_kib / mib:8.1f} "
              f"{lat:>16s}")  # fmt: skip
    print(f"ours state file: {ours.state_bytes / 1e6:.2f} MB ({ours.state_bytes / args.files:.0f} bytes per file)")
    if mtail is not None and mtail.hwm_kib:
        print(f"peak RSS ours / mtail: {ours.hwm_kib / mtail.hwm_kib:.2f}x")
    worst = max(ours.latencies_s, default=float("inf"))
    checks = {
        f"/metrics within {args.metrics_target:g} s of the start": ours.metrics_s <= args.metrics_target,
        f"peak RSS <= {args.rss_mib:g} MiB": ours.hwm_kib / mib <= args.rss_mib,
        f"every event counted within {args.latency_target:g} s": worst <= args.latency_target,
    }
    for what, ok in checks.items():
        print(f"target: {what}: {'MET' if ok else 'NOT MET'}")
    return all(checks.values())


def main(argv: list[str] | None = None) -> int:
    """Run ours, then mtail, on the same files and print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--content", choices=("empty", "small"), default="empty")
    ap.add_argument("--settle", type=float, default=10.0, help="idle seconds after ready before RSS is read")
    ap.add_argument("--events", type=int, default=5, help="OOMs appended one at a time, each timed")
    ap.add_argument("--ready-timeout", type=float, default=300.0)
    ap.add_argument("--event-timeout", type=float, default=60.0)
    ap.add_argument("--metrics-target", type=float, default=10.0)
    ap.add_argument("--rss-mib", type=float, default=256.0)
    ap.add_argument("--latency-target", type=float, default=1.5, help="seconds (normal latency: about 1 s)")
    ap.add_argument("--check-target", action="store_true", help="exit 1 if a target is missed")
    ap.add_argument("--mtail", default="/usr/bin/mtail", help="mtail binary (skipped when missing)")
    ap.add_argument("--ours-arg", action="append", default=[], help="extra flag for ours (repeatable)")
    ap.add_argument("--results", type=Path, help="also write the figures as JSON here")
    args = ap.parse_args(argv)
    bl.raise_on_signals()
    print(f"ours: sglang_oom_exporter {bl.ours_provenance()}")
    soft, hard = bl.raise_nofile(max(8192, 2 * args.files + 1024))
    print(f"RLIMIT_NOFILE: soft {soft}, hard {hard}", file=sys.stderr)
    tmp = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    root = tmp / "logs"
    root.mkdir()
    children = bl.Children()
    try:
        size = make_files(root, args.files, args.content)
        print(f"wrote {args.files} files, {size / 1e6:.1f} MB", file=sys.stderr)
        ours = run_ours(args, root, tmp, children)
        mtail = run_mtail(args, root, tmp, children) if Path(args.mtail).exists() else None
        if mtail is None:
            print(f"{args.mtail} not found: no baseline", file=sys.stderr)
        ok = report(args, ours, mtail)
        if args.results:
            args.results.write_text(json.dumps({"files": args.files, "content": args.content, "ours": vars(ours),
                                                "mtail": vars(mtail) if mtail else None}, indent=1) + "\n")  # fmt: skip
        return 1 if args.check_target and not ok else 0
    except (RuntimeError, TimeoutError) as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        for out in sorted(tmp.glob("*.out")):
            print(f"--- {out.name} (tail) ---\n{out.read_bytes()[-2000:].decode('utf-8', 'replace')}", file=sys.stderr)
        return 1
    finally:
        children.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
