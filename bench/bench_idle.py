"""Idle cost of `sglang-oom-exporter serve` with many watched files, side by side with an mtail daemon.

Usage::

    python bench/bench_idle.py [--files 1000] [--window 30] [--layout flat,pods] [--check-target]

The issue's target: with 1,000 watched files and no writes, CPU is at most 1/5 of mtail's, and RSS is at
most 64 MiB.

For each layout, the script writes --files small scheduler logs (--file-lines lines each, about 4 KB, from
gen_scheduler_log.py, no OOMs) into a temp tree, then starts ours and mtail on the same files:

- flat: DIR/sglang-NNNN.log; ours `serve --listen 127.0.0.1:P --state-dir S 'DIR/*.log'`, mtail
  `--logs 'DIR/*.log'`.
- pods: ROOT/<ns>_<pod>_<uid>/sglang/0.log as under /var/log/pods; ours `serve --kubernetes-logs ROOT`
  (Kubernetes node mode, default filters), mtail `--logs 'ROOT/*/*/*.log'`.

Ready means: ours answers /healthz 200 with sglang_oom_exporter_files_watched == --files; mtail answers
/metrics; and each has --files descriptors open under the tree (/proc/<pid>/fd). Both then get --settle
seconds, and the idle window starts: CPU is utime + stime from /proc/<pid>/stat (all threads) at both
ends of --window seconds, nothing written and nothing scraped in between; RSS is VmRSS at the end and
the largest VmRSS seen once a second during the window, and VmHWM (peak since start) from
/proc/<pid>/status. Both daemons run with their default intervals (ours: 1 s safety poll and 5 s discovery,
with inotify wake-ups; mtail: 250 ms file poll and 250 ms glob poll).

Exit status: 1 when a daemon fails to start or dies; with --check-target also when, in any layout,
ours CPU > mtail CPU / --cpu-ratio or ours VmHWM > --rss-mib.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as bl
import gen_scheduler_log as gen

SEED = 20260314


@dataclass
class Measure:
    name: str
    cpu_s: float = 0.0
    window_s: float = 0.0
    rss_kib: int = 0
    rss_max_kib: int = 0
    hwm_kib: int = 0
    threads: int = 0
    ready_s: float = 0.0

    @property
    def core_pct(self) -> float:
        return 100.0 * self.cpu_s / self.window_s if self.window_s else float("nan")


def make_tree(root: Path, layout: str, files: int, lines: int) -> tuple[list[Path], int]:
    """Write the logs; returns (paths, total bytes)."""
    paths = []
    for i in range(files):
        if layout == "flat":
            path = root / f"sglang-{i:04d}.log"
        else:
            uid = f"{SEED + i:08x}-1c2d-4e5f-8a9b-{i:012x}"
            path = root / f"inference_sglang-{i:04d}-7d9f8c6b5-x{i % 97:02d}q_{uid}" / "sglang" / "0.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        # oom_every=0: no OOM in these files; a different seed per file.
        gen.generate(path, lines, 0, SEED + i)
        paths.append(path)
    return paths, sum(p.stat().st_size for p in paths)


def run_layout(layout: str, args: argparse.Namespace, tmp: Path, children: bl.Children) -> dict[str, Measure]:
    root = tmp / layout
    root.mkdir()
    t = time.perf_counter()
    _, size = make_tree(root, layout, args.files, args.file_lines)
    print(
        f"[{layout}] wrote {args.files} files, {size / 1e6:.1f} MB ({size / args.files / 1024:.1f} KiB each) "
        f"in {time.perf_counter() - t:.1f}s",
        file=sys.stderr,
    )
    if layout == "flat":
        ours_paths, ours_extra = [str(root / "*.log")], []
        mtail_glob = str(root / "*.log")
    else:
        ours_paths, ours_extra = [], ["--kubernetes-logs", str(root)]
        mtail_glob = str(root / "*" / "*" / "*.log")
    ours_port, mtail_port = bl.free_port(), bl.free_port()
    state = tmp / f"state-{layout}"
    t0 = time.perf_counter()
    ours = children.start(
        "ours",
        bl.ours_argv(ours_port, ours_paths, state_dir=str(state), extra=[*ours_extra, *args.ours_arg]),
        tmp / f"ours-{layout}.out",
    )
    mtail = children.start("mtail", bl.mtail_argv(args.mtail, mtail_port, mtail_glob), tmp / f"mtail-{layout}.out")
    out = {"ours": Measure("ours"), "mtail": Measure("mtail")}
    try:

        def ours_ok() -> bool:
            bl.check_alive(ours)
            return bl.ours_ready(ours_port, files=args.files) and bl.open_fds_under(ours.pid, str(root)) >= args.files

        def mtail_ok() -> bool:
            bl.check_alive(mtail)
            return bl.mtail_answers(mtail_port) and bl.open_fds_under(mtail.pid, str(root)) >= args.files

        pending = {"ours": ours_ok, "mtail": mtail_ok}
        deadline = time.monotonic() + args.ready_timeout
        while pending:
            for name, ok in list(pending.items()):
                if ok():
                    out[name].ready_s = time.perf_counter() - t0
                    del pending[name]
            if pending:
                if time.monotonic() > deadline:
                    fds = {n: bl.open_fds_under(c.pid, str(root)) for n, c in (("ours", ours), ("mtail", mtail))}
                    raise TimeoutError(
                        f"[{layout}] not ready after {args.ready_timeout:g}s: {sorted(pending)}; "
                        f"open fds under the tree: {fds}"
                    )
                time.sleep(0.1)
        print(
            f"[{layout}] ready: ours {out['ours'].ready_s:.1f}s, mtail {out['mtail'].ready_s:.1f}s after start; "
            f"settling {args.settle:g}s, then a {args.window:g}s idle window",
            file=sys.stderr,
        )
        time.sleep(args.settle)
        bl.check_alive(ours, mtail)
        procs = {"ours": ours, "mtail": mtail}
        cpu0 = {n: bl.cpu_seconds(c.pid) for n, c in procs.items()}
        w0 = time.perf_counter()
        end = w0 + args.window
        while (now := time.perf_counter()) < end:
            time.sleep(min(1.0, end - now))
            for n, c in procs.items():
                out[n].rss_max_kib = max(out[n].rss_max_kib, bl.proc_status(c.pid).get("VmRSS", 0))
        cpu1 = {n: bl.cpu_seconds(c.pid) for n, c in procs.items()}
        w1 = time.perf_counter()
        bl.check_alive(ours, mtail)
        for n, c in procs.items():
            st = bl.proc_status(c.pid)
            m = out[n]
            m.cpu_s, m.window_s = cpu1[n] - cpu0[n], w1 - w0
            m.rss_kib, m.hwm_kib, m.threads = st.get("VmRSS", 0), st.get("VmHWM", 0), st.get("Threads", 0)
        return out
    finally:
        children.stop(ours)
        children.stop(mtail)


def report(layout: str, res: dict[str, Measure], args: argparse.Namespace) -> tuple[bool, bool]:
    o, m = res["ours"], res["mtail"]
    print(
        f"\nlayout {layout}: {args.files} files, idle window {o.window_s:.1f}s (CPU from /proc/<pid>/stat, "
        f"{bl.CLK_TCK} ticks/s)"
    )
    print(
        f"{'':6s} {'CPU s':>7s} {'% core':>7s} {'RSS MiB':>8s} {'max RSS':>8s} {'VmHWM':>7s} {'threads':>8s} "
        f"{'ready s':>8s}"
    )
    for x in (o, m):
        print(
            f"{x.name:6s} {x.cpu_s:7.2f} {x.core_pct:7.2f} {x.rss_kib / 1024:8.1f} {x.rss_max_kib / 1024:8.1f} "
            f"{x.hwm_kib / 1024:7.1f} {x.threads:8d} {x.ready_s:8.1f}"
        )
    ratio = m.cpu_s / o.cpu_s if o.cpu_s > 0 else float("inf")
    cpu_ok = o.cpu_s * args.cpu_ratio <= m.cpu_s
    if o.cpu_s == 0:
        print("note: ours used no measurable CPU (10 ms ticks) in the window; lengthen --window for a real ratio")
    rss_ok = o.hwm_kib / 1024 <= args.rss_mib
    print(
        f"mtail CPU / ours CPU: {ratio:.2f}x   (target >= {args.cpu_ratio:g}: {'MET' if cpu_ok else 'NOT MET'}"
        + (
            ""
            if cpu_ok
            else f"; ours would need <= {m.cpu_s / args.cpu_ratio:.2f} CPU s, "
            f"{m.core_pct / args.cpu_ratio:.2f}% of a core"
        )
        + ")"
    )
    print(
        f"ours peak RSS (VmHWM): {o.hwm_kib / 1024:.1f} MiB   (target <= {args.rss_mib:g} MiB: "
        f"{'MET' if rss_ok else 'NOT MET'})"
    )
    return cpu_ok, rss_ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=1000, help="watched files (default 1000)")
    ap.add_argument("--file-lines", type=int, default=30, help="lines per file (default 30, about 4 KB)")
    ap.add_argument("--window", type=float, default=30.0, help="idle window in seconds (default 30)")
    ap.add_argument("--settle", type=float, default=5.0, help="seconds between ready and the window (default 5)")
    ap.add_argument("--layout", default="flat,pods", help="comma list of flat, pods (default both)")
    ap.add_argument("--ready-timeout", type=float, default=120.0, help="seconds for both to get ready")
    ap.add_argument("--cpu-ratio", type=float, default=5.0, help="required mtail/ours CPU ratio (default 5)")
    ap.add_argument("--rss-mib", type=float, default=64.0, help="ours peak RSS bound in MiB (default 64)")
    ap.add_argument("--check-target", action="store_true", help="exit 1 if a target is missed")
    ap.add_argument("--mtail", default="/usr/bin/mtail", help="mtail binary")
    ap.add_argument("--ours-arg", action="append", default=[], help="extra flag for ours (repeatable)")
    ap.add_argument("--keep-tmp", action="store_true", help="keep the temp tree and the daemons' output")
    ap.add_argument("--results", type=Path, help="also write the results as JSON to this file")
    args = ap.parse_args(argv)
    layouts = [x.strip() for x in args.layout.split(",") if x.strip()]
    if not layouts or any(x not in ("flat", "pods") for x in layouts):
        ap.error("--layout takes flat, pods or flat,pods")
    if not Path(args.mtail).exists():
        print(f"{args.mtail} not found: this benchmark is a comparison with mtail", file=sys.stderr)
        return 1
    bl.raise_on_signals()
    print(f"ours: sglang_oom_exporter {bl.ours_provenance()}")
    soft, hard = bl.raise_nofile(max(8192, 4 * args.files))
    print(f"RLIMIT_NOFILE for both daemons: soft {soft}, hard {hard}", file=sys.stderr)
    children = bl.Children()
    tmp = Path(tempfile.mkdtemp(prefix="bench-idle-"))
    all_results = {}
    with bl.BenchRun(children, tmp, keep=args.keep_tmp, tails=lambda: bl.out_file_tails(tmp)) as run:
        for layout in layouts:
            res = run_layout(layout, args, tmp, children)
            cpu_ok, rss_ok = report(layout, res, args)
            all_results[layout] = {
                "ours": vars(res["ours"]),
                "mtail": vars(res["mtail"]),
                "cpu_target_met": cpu_ok,
                "rss_target_met": rss_ok,
            }
            if args.check_target and not (cpu_ok and rss_ok):
                run.status = 1
        if args.results:
            args.results.write_text(
                json.dumps({"files": args.files, "window": args.window, "layouts": all_results}, indent=2) + "\n",
                encoding="utf-8",
            )
    return run.status


if __name__ == "__main__":
    sys.exit(main())
