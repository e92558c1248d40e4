"""What a megabyte costs: the daemon following a node at 1, 10 and 50 MB/s beside mtail and grep, and `scan` vs grep.

Usage::

    python bench/bench_cost.py [--rates 1,10,50] [--window 20] [--scan-lines 2000000,10000000] [--runs 3]
                               [--no-follow] [--no-scan] [--results FILE]

One command, two tables.

Following (bench_foreign.py's node, once per rate): a /var/log/pods tree of --foreign (100) foreign containers
writing RATE MB/s in all, beside --sglang (3) SGLang pods at `--log-level info` rate (a prefill batch line and an
access line per request, 4 requests a second, a decode batch line a second, a fatal prefill OOM every 10 s), the
last of which also runs with `--log-requests` (each request's `Receive:` and `Finish:` lines, a few KB each).
Ours (`serve --kubernetes-logs`) and mtail (bench/oom.mtail) follow the same files from before the window. The
table gives each daemon's CPU milliseconds per MB written (utime + stime over the window until it has read
everything), peak RSS (VmHWM) and RSS at the end, and the floor: `grep -c -F 'out of memory'` over the same files
afterwards, whole process, in CPU ms per MB. Ours must count exactly what was written (exit 1 otherwise).

Scanning: bench_scan.py's generated scheduler logs (bench/out/sched-<lines>-every10000.log: 2,000,000 lines are
288 MB, 10,000,000 lines 1.44 GB; generated and kept when missing), page-cached, each command a whole process
timed round-robin after a warm-up: `scan --format json` (every CPU), `scan --jobs 1`, and `grep -c -F 'out of
memory'`. Our counts must equal the truth file's exactly.

Ratios printed: mtail / ours and ours / grep per rate; ours / grep per file (wall and CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_foreign as bf
import benchlib as bl
from bench_scan import check_ours, ensure_log

NEEDLE = "out of memory"


def follow(args: argparse.Namespace) -> list[dict[str, Any]]:
    """bench_foreign's measurement at each rate, in a fresh tree and fresh daemons each time."""
    out = []
    for rate in args.rates:
        fargs = bf.parser().parse_args(["--mb-per-s", f"{rate:g}", "--window", f"{args.window:g}",
                                        "--foreign", str(args.foreign), "--sglang", str(args.sglang)])  # fmt: skip
        print(f"--- following at {rate:g} MB/s for {args.window:g}s ---", file=sys.stderr)
        children = bl.Children()
        tmp = Path(tempfile.mkdtemp(prefix="bench-cost-"))
        result: dict[str, Any] = {}
        with bl.BenchRun(children, tmp, tails=lambda tmp=tmp: bl.out_file_tails(tmp)) as run:
            result = bf.measure(fargs, children, tmp)
        if run.status:
            raise SystemExit(run.status)
        out.append(result)
    return out


def follow_table(rows: list[dict[str, Any]]) -> None:
    print(f"\nFollowing a node: {rows[0]['foreign']} foreign containers, {rows[0]['sglang']} SGLang pods "
          f"(info rate, {rows[0]['log_requests']} with --log-requests), {rows[0]['window']:g} s per rate")  # fmt: skip
    head = (f"{'MB/s':>6s} {'MB':>7s} | {'ours ms/MB':>10s} {'RSS MiB':>8s} {'peak':>6s} | {'mtail ms/MB':>11s} "
            f"{'peak':>6s} | {'grep ms/MB':>10s} | {'mtail/ours':>10s} {'ours/grep':>9s}")  # fmt: skip
    print(head)
    for r in rows:
        ours = 1000 * r["ours_cpu_s"] / r["mb"]
        mtail = 1000 * r["mtail_cpu_s"] / r["mb"]
        grep = 1000 * r["grep_cpu_s"] / r["tree_mb"]
        lag = "" if r["mtail_caught_up"] else " (mtail behind)"
        print(f"{r['mb'] / r['window']:6.1f} {r['mb']:7.1f} | {ours:10.2f} {r['ours_rss_kib'] / 1024:8.1f} "
              f"{r['ours_hwm_kib'] / 1024:6.1f} | {mtail:11.2f} {r['mtail_hwm_kib'] / 1024:6.1f} | {grep:10.3f} | "
              f"{mtail / ours:9.1f}x {ours / max(grep, 1e-9):8.1f}x{lag}")  # fmt: skip


def scan(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    cpus = len(os.sched_getaffinity(0))
    base = [sys.executable, "-m", "sglang_oom_exporter", "scan", "--format", "json"]
    for lines in args.scan_lines:
        log, truth, _ = ensure_log(lines, 10_000)
        bl.warm_cache(log)

        def ours_ok(r: bl.Run, truth: dict[str, Any] = truth) -> tuple[bool, str]:
            return check_ours(r.stdout, truth)

        def grep_ok(r: bl.Run, truth: dict[str, Any] = truth) -> tuple[bool, str]:
            got = int(r.stdout.strip() or -1)
            want = truth["lines_with_out_of_memory"]
            return got == want, f"{got} lines (truth {want})"

        commands = [
            bl.Timed(f"scan (--jobs {cpus})", [*base, str(log)], ours_ok),
            bl.Timed("scan --jobs 1", [*base, "--jobs", "1", str(log)], ours_ok),
            bl.Timed("grep -c -F", ["grep", "-c", "-F", NEEDLE, str(log)], grep_ok),
        ]
        print(f"--- scan of {log.name} ---", file=sys.stderr)
        if not bl.time_rounds(commands, args.runs, 1800.0, gnu_time="/usr/bin/time"):
            raise SystemExit(1)
        out.append({
            "file": log.name, "mb": log.stat().st_size / 1e6, "lines": lines,
            "commands": {c.name: {"best_s": c.best, "cpu_s": min(c.cpu), "rss_kib": max(c.rss_kib), "note": c.note}
                         for c in commands},
        })  # fmt: skip
    return out


def scan_table(rows: list[dict[str, Any]]) -> None:
    print(f"\nScanning a file (whole process, page-cached, best of the timed runs, {os.cpu_count()} CPUs)")
    print(f"{'file':32s} {'MB':>7s} {'command':>16s} {'best s':>7s} {'CPU s':>7s} {'RSS MiB':>8s} "
          f"{'/grep wall':>10s} {'/grep CPU':>9s}")  # fmt: skip
    for r in rows:
        grep = r["commands"]["grep -c -F"]
        for name, c in r["commands"].items():
            print(f"{r['file']:32s} {r['mb']:7.0f} {name:>16s} {c['best_s']:7.3f} {c['cpu_s']:7.3f} "
                  f"{c['rss_kib'] / 1024:8.1f} {c['best_s'] / grep['best_s']:9.1f}x "
                  f"{c['cpu_s'] / max(grep['cpu_s'], 1e-3):8.1f}x")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 10.0, 50.0],
                    help="total MB/s of container log to follow, comma-separated (default 1,10,50)")  # fmt: skip
    ap.add_argument("--window", type=float, default=20.0, help="seconds of writing per rate (default 20)")
    ap.add_argument("--foreign", type=int, default=100, help="foreign containers (default 100)")
    ap.add_argument("--sglang", type=int, default=3, help="SGLang pods (default 3; the last logs requests)")
    ap.add_argument("--scan-lines", type=lambda s: [int(x) for x in s.split(",")], default=[2_000_000, 10_000_000],
                    help="lines of the scanned logs, comma-separated (default 2000000,10000000)")  # fmt: skip
    ap.add_argument("--runs", type=int, default=3, help="timed scan runs per command (default 3)")
    ap.add_argument("--no-follow", action="store_true", help="skip the daemons")
    ap.add_argument("--no-scan", action="store_true", help="skip the scans")
    ap.add_argument("--results", type=Path, help="also write the results as JSON to this file")
    args = ap.parse_args(argv)
    bl.raise_on_signals()
    print(f"ours: sglang_oom_exporter {bl.ours_provenance()}; load average {os.getloadavg()[0]:.2f}")
    results: dict[str, Any] = {"load_before": os.getloadavg()}
    if not args.no_follow:
        results["follow"] = follow(args)
    if not args.no_scan:
        results["scan"] = scan(args)
    results["load_after"] = os.getloadavg()
    if "follow" in results:
        follow_table(results["follow"])
    if "scan" in results:
        scan_table(results["scan"])
    print(f"load average (1 min) before {results['load_before'][0]:.2f}, after {results['load_after'][0]:.2f}")
    if args.results:
        args.results.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
