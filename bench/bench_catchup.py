"""Catch-up after downtime: `sglang-oom-exporter serve` restarted on 300 MB written while it was down, vs
mtail --one_shot reading the same bytes.

Usage::

    python bench/bench_catchup.py [--lines 2000000] [--oom-every 10000] [--runs 3] [--keep] [--check-target]

The issue's target: after 300 MB was written while the daemon was down, it is counted at least 10x faster
than mtail reads the same bytes.

1. The log comes from bench_scan.py's cache (bench/out/sched-<lines>-every<n>.log and its truth file),
   generated with gen_scheduler_log.py when missing (deleted at the end unless --keep, like bench_scan.py).
2. Ours starts on an empty file in a temp dir, `serve --listen 127.0.0.1:P --state-dir S FILE`, with
   default flags; once /healthz is 200 and files_watched is 1 it is stopped with SIGTERM (it saves its
   state and exits 0). The state dir is copied aside.
3. The log's bytes are appended to the file (the same bytes, page cache warm).
4. Each run: the state dir is put back as it was at the stop, ours is started with the same command,
   and the clock runs from spawn until a /metrics scrape shows sglang_oom_events_total prefill and decode
   equal to the truth. The run then waits until sglang_oom_exporter_lines_read_total equals the file's
   lines and checks that the counts are still exact (no double count), then stops ours.
5. mtail: `mtail --one_shot` over the same file, spawn to reap, as in bench_scan.py. A running mtail
   starts at the end of files that exist when it starts, so it never reads bytes written while it was
   down; one_shot (read from the start to EOF, then exit) is its fastest way to read the same bytes.
   Its counts are line counts (2x events), checked with a warning only.

Each run times ours and then mtail back to back and prints that run's ratio, mtail's time over ours; the
target (>= 10) is checked on the median of the runs' ratios (best over best is printed too).
Exit status: 1 when ours counts wrong or fails; with --check-target also when the ratio is below --target.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_scan
import benchlib as bl


def append_bytes(src: Path, dst: Path) -> float:
    t = time.perf_counter()
    with open(src, "rb") as fi, open(dst, "ab") as fo:
        shutil.copyfileobj(fi, fo, 8 << 20)
    return time.perf_counter() - t


def ours_run(
    args: argparse.Namespace,
    log: Path,
    state: Path,
    snapshot: Path,
    truth: dict,
    tmp: Path,
    i: int,
    children: bl.Children,
) -> dict:
    shutil.rmtree(state, ignore_errors=True)
    shutil.copytree(snapshot, state)
    port = bl.free_port()
    stem = log.stem
    t0 = time.perf_counter()
    child = children.start(
        "ours", bl.ours_argv(port, [str(log)], state_dir=str(state), extra=args.ours_arg), tmp / f"ours-run{i}.out"
    )
    first_answer = counted = None
    want = {"prefill": float(truth["prefill"]), "decode": float(truth["decode"])}
    deadline = t0 + args.timeout
    got: dict[str, float | None] = {}
    peak = 0
    try:
        while True:
            bl.check_alive(child)
            r = bl.http_get(port, "/metrics", timeout=max(1.0, deadline - time.perf_counter()))
            now = time.perf_counter()
            if r is not None and r[0] == 200:
                first_answer = first_answer or now - t0
                s = bl.parse_prom(r[1])
                got = {k: bl.metric(s, "sglang_oom_events_total", kind=k, source=stem) for k in want}
                if any((got[k] or 0) > want[k] for k in want):
                    raise RuntimeError(f"WRONG COUNTS: ours {got} > truth {want}")
                if got == want:
                    counted = now - t0
                    break
            if now >= deadline:
                raise TimeoutError(f"ours did not reach {want} in {args.timeout:g}s (last {got})")
            time.sleep(args.poll)
        peak = bl.proc_status(child.pid).get("VmHWM", 0)
        cpu = bl.cpu_seconds(child.pid)

        def all_read() -> dict | None:
            bl.check_alive(child)
            r = bl.http_get(port, "/metrics", timeout=10)
            if r is None or r[0] != 200:
                return None
            s = bl.parse_prom(r[1])
            # One file is followed: the total, whether or not the exporter labels it per source.
            lines = bl.metric(s, "sglang_oom_exporter_lines_read_total") or 0
            return s if lines >= truth["lines"] else None

        s = bl.wait_for(all_read, 60, 0.1, "ours to read every line")
        time.sleep(args.settle)  # anything still pending would be emitted by now
        r = bl.http_get(port, "/metrics", timeout=10)
        s = bl.parse_prom(r[1]) if r is not None else s
        final = {k: bl.metric(s, "sglang_oom_events_total", kind=k, source=stem) for k in want}
        retract = bl.metric(s, "sglang_oom_events_total", kind="retract", source=stem)
        if final != want:
            raise RuntimeError(f"WRONG COUNTS after reading everything: ours {final}, truth {want}")
    finally:
        rc = children.stop(child)
    if rc != 0:
        raise RuntimeError(f"ours exited {rc} on SIGTERM:\n{child.tail()}")
    print(
        f"  run {i}: ours counted in {counted:.3f}s (first /metrics answer at {first_answer:.3f}s), "
        f"CPU {cpu:.2f}s, peak RSS {peak / 1024:.1f} MiB, retract={retract}",
        file=sys.stderr,
    )
    return {"seconds": counted, "first_answer": first_answer, "cpu_s": cpu, "hwm_kib": peak, "retract": retract}


def mtail_run(args: argparse.Namespace, log: Path, truth: dict) -> tuple[float, float, str]:
    """One `mtail --one_shot` over the file, spawn to reap: (seconds, CPU seconds, its counts as a note)."""
    argv = [args.mtail, "--one_shot", "--one_shot_format", "prometheus", "--logtostderr", "--address", bl.LOOPBACK,
            "--port", "0", "--progs", str(bl.MTAIL_PROG), "--logs", str(log)]  # fmt: skip
    r = bl.run_measured(argv, args.timeout)
    if r.returncode != 0:
        raise RuntimeError(f"mtail --one_shot exit {r.returncode}:\n{r.stderr[-3000:]}")
    c = bench_scan.parse_mtail(r.stdout)
    if c.get("prefill") != 2 * truth["prefill"] or c.get("decode") != 2 * truth["decode"]:
        print(f"warning: mtail line counts {c} are not 2x the truth", file=sys.stderr)
    return r.seconds, r.cpu_seconds, " ".join(f"{k}={v}" for k, v in sorted(c.items())) + " (lines)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=2_000_000, help="lines written while down (default 2000000)")
    ap.add_argument("--oom-every", type=int, default=10_000, help="one OOM event per this many lines")
    ap.add_argument("--runs", type=int, default=3, help="timed runs of each; the best counts (default 3)")
    ap.add_argument("--poll", type=float, default=0.02, help="scrape interval while ours catches up (default 0.02 s)")
    ap.add_argument("--settle", type=float, default=3.0, help="wait before the final count check (s)")
    ap.add_argument("--keep", action="store_true", help="keep a log generated by this run (bench/out/)")
    ap.add_argument("--check-target", action="store_true", help="exit 1 if mtail/ours is below --target")
    ap.add_argument("--target", type=float, default=10.0, help="required mtail/ours ratio (default 10)")
    ap.add_argument("--mtail", default="/usr/bin/mtail", help="mtail binary ('' to skip)")
    ap.add_argument("--timeout", type=float, default=900.0, help="per-run timeout in seconds")
    ap.add_argument("--tmpdir", help="where the temp copy of the log goes (default: the system temp dir)")
    ap.add_argument("--ours-arg", action="append", default=[], help="extra flag for ours (repeatable)")
    ap.add_argument("--results", type=Path, help="also write the results as JSON to this file")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    bl.raise_on_signals()
    print(f"ours: sglang_oom_exporter {bl.ours_provenance()}")
    children = bl.Children()
    src, truth, generated = bench_scan.ensure_log(args.lines, args.oom_every)
    tmp = Path(tempfile.mkdtemp(prefix="bench-catchup-", dir=args.tmpdir))
    try:
        with bl.BenchRun(children, tmp) as run:
            log = tmp / "sglang-0.log"
            log.touch()
            state, snapshot = tmp / "state", tmp / "state-at-stop"
            port = bl.free_port()
            first = children.start(
                "ours",
                bl.ours_argv(port, [str(log)], state_dir=str(state), extra=args.ours_arg),
                tmp / "ours-first.out",
            )

            def ready() -> bool:
                bl.check_alive(first)
                return bl.ours_ready(port, files=1)

            bl.wait_for(ready, 60, 0.1, "ours ready on the empty file")
            rc = children.stop(first)
            if rc != 0 or not (state / "state.json").exists():
                raise RuntimeError(
                    f"first ours exited {rc}, state.json exists: {(state / 'state.json').exists()}\n{first.tail()}"
                )
            shutil.copytree(state, snapshot)
            secs = append_bytes(src, log)
            size = log.stat().st_size
            mb = size / 1e6
            bl.warm_cache(log)
            print(
                f"appended {src.name} to {log}: {mb:.1f} MB, {truth['lines']} lines in {secs:.1f}s while ours was "
                f"down; truth prefill={truth['prefill']} decode={truth['decode']}",
                file=sys.stderr,
            )

            use_mtail = bool(args.mtail) and Path(args.mtail).exists()
            if not use_mtail:
                print(
                    "SKIP mtail: " + (f"{args.mtail} not found" if args.mtail else "off (--mtail '')"), file=sys.stderr
                )
            # Each run times ours and then mtail back to back, so that a run's ratio compares the two under the same
            # load (a shared machine's load moves between runs far more than between two neighbouring commands).
            ours_runs: list[dict] = []
            mtail_times: list[float] = []
            pair_ratios: list[float] = []
            cpu_ratios: list[float] = []
            mtail_note = ""
            for i in range(args.runs):
                ours_runs.append(ours_run(args, log, state, snapshot, truth, tmp, i + 1, children))
                if not use_mtail:
                    continue
                seconds, cpu, mtail_note = mtail_run(args, log, truth)
                mtail_times.append(seconds)
                pair_ratios.append(seconds / ours_runs[-1]["seconds"])
                # CPU seconds too: ours is one thread and mtail spreads over every core, so on a machine loaded by
                # other jobs the wall ratio moves with the load and the CPU ratio much less.
                cpu_ratios.append(cpu / ours_runs[-1]["cpu_s"])
                print(
                    f"  run {i + 1}: mtail --one_shot {seconds:.3f}s, CPU {cpu:.2f}s; "
                    f"mtail / ours {pair_ratios[-1]:.2f}x (CPU {cpu_ratios[-1]:.2f}x)",
                    file=sys.stderr,
                )

            o_times = [x["seconds"] for x in ours_runs]
            ob = min(o_times)
            print(
                f"\nfile: {log.name}  {truth['lines']} lines  {mb:.1f} MB written while ours was down; "
                f"{args.runs} run(s)"
            )
            print(f"{'':22s} {'best s':>8s} {'median s':>9s} {'MB/s':>7s}  notes")
            print(
                f"{'ours (restart)':22s} {ob:8.3f} {statistics.median(o_times):9.3f} {mb / ob:7.1f}  "
                f"prefill={truth['prefill']} decode={truth['decode']} exact; spawn to first /metrics answer "
                f"{min(x['first_answer'] for x in ours_runs):.3f}s; CPU {min(x['cpu_s'] for x in ours_runs):.2f}s; "
                f"peak RSS {max(x['hwm_kib'] for x in ours_runs) / 1024:.1f} MiB"
            )
            ratio = None
            if mtail_times:
                mb_ = min(mtail_times)
                print(
                    f"{'mtail --one_shot':22s} {mb_:8.3f} {statistics.median(mtail_times):9.3f} {mb / mb_:7.1f}  "
                    f"{mtail_note}"
                )
                ratio = statistics.median(pair_ratios)
                met = ratio >= args.target
                print(
                    "\nmtail / ours, each run side by side: "
                    + ", ".join(f"{r:.2f}x" for r in pair_ratios)
                    + f"; median {ratio:.2f}x (best / best {mb_ / ob:.2f}x); in CPU seconds "
                    + ", ".join(f"{r:.2f}x" for r in cpu_ratios)
                    + f"   (target >= {args.target:g}: {'MET' if met else 'NOT MET'})"
                )
            if args.results:
                args.results.write_text(
                    json.dumps(
                        {
                            "bytes": size,
                            "truth": truth,
                            "ours": ours_runs,
                            "mtail_one_shot": mtail_times,
                            "ratios": pair_ratios,
                            "cpu_ratios": cpu_ratios,
                            "ratio": ratio,
                        },
                        indent=2,
                    )
                    + "\n",
                    encoding="utf-8",
                )
            if args.check_target and (ratio is None or ratio < args.target):
                run.status = 1
    finally:
        if generated and not args.keep:
            src.unlink(missing_ok=True)
            Path(str(src) + ".truth.json").unlink(missing_ok=True)
    return run.status


if __name__ == "__main__":
    sys.exit(main())
