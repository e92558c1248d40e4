"""Many-files scan benchmark: `scan` over 1,000 files of about 100 KB vs `mtail --one_shot` on the same files.

Usage::

    python bench/bench_scan_files.py [--files 1000] [--file-lines 700] [--runs 3] [--keep] [--check-target]

Generates the files into bench/out/files-<n>x<lines>/ (gitignored; removed at the end unless --keep) with
gen_scheduler_log.generate(), each with its own seed; every 14th file holds one fatal prefill OOM (block and
traceback), about one per 10,000 lines as in bench_scan.py. Then, after an untimed warm-up round, it times
each command as a whole process, round-robin: ours with the default --jobs (every CPU), ours with --jobs 1,
and mtail. Our prefill/decode counts must equal the generator's truth exactly (exit 1 otherwise). It prints
the best times and mtail/ours from the same run; --check-target exits 1 when that ratio is below --target (15).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from bench_scan import OUT_DIR, check_ours, parse_mtail, run_measured, warm_cache
from gen_scheduler_log import generate

BENCH_DIR = Path(__file__).resolve().parent
MTAIL_PROG = BENCH_DIR / "oom.mtail"


def _burn(n: int) -> int:
    s = 0
    for i in range(n):
        s += i
    return s


def parallel_headroom(n: int = 10_000_000) -> float:
    """How much faster two processes finish two equal CPU loops than one process: about 2 with two free
    cores, 1 or less when other work holds them (then a parallel scan cannot gain either)."""
    import multiprocessing
    import time

    t0 = time.perf_counter()
    _burn(n)
    _burn(n)
    serial = time.perf_counter() - t0
    with multiprocessing.get_context("fork").Pool(2) as pool:
        t0 = time.perf_counter()
        pool.map(_burn, [n, n])
        both = time.perf_counter() - t0
    return serial / both


def make_files(n: int, lines: int) -> tuple[Path, dict[str, int], bool]:
    """The directory of n generated files and the summed truth; reuse it when its truth file matches."""
    out = OUT_DIR / f"files-{n}x{lines}"
    stamp = out / "truth.txt"
    if stamp.exists():
        prefill, decode = (int(x) for x in stamp.read_text(encoding="utf-8").split())
        return out, {"prefill": prefill, "decode": decode}, False
    out.mkdir(parents=True, exist_ok=True)
    truth = {"prefill": 0, "decode": 0}
    for i in range(n):
        t = generate(out / f"sglang-{i:04d}.log", lines, lines // 2 if i % 14 == 0 else 0, 1000 + i)
        truth["prefill"] += int(t["prefill"])
        truth["decode"] += int(t["decode"])
    stamp.write_text(f"{truth['prefill']} {truth['decode']}\n", encoding="utf-8")
    return out, truth, True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--file-lines", type=int, default=700, help="lines per file (700 is about 100 KB)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="keep the generated files in bench/out/")
    ap.add_argument("--check-target", action="store_true")
    ap.add_argument("--target", type=float, default=15.0, help="required mtail/ours (default 15)")
    ap.add_argument("--mtail", default="/usr/bin/mtail")
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args(argv)

    folder, truth, generated = make_files(args.files, args.file_lines)
    paths = sorted(str(p) for p in folder.glob("*.log"))
    size = sum(os.path.getsize(p) for p in paths)
    for p in paths:
        warm_cache(Path(p))
    cpus = len(os.sched_getaffinity(0))
    print(f"{len(paths)} files, {size / 1e6:.1f} MB, truth prefill={truth['prefill']} decode={truth['decode']}, "
          f"{cpus} CPUs", file=sys.stderr)  # fmt: skip
    scan = [sys.executable, "-m", "sglang_oom_exporter", "scan", "--format", "json"]
    commands = {
        f"ours (--jobs {cpus})": [*scan, *paths],
        "ours --jobs 1": [*scan, "--jobs", "1", *paths],
    }
    if Path(args.mtail).exists():
        commands["mtail"] = [args.mtail, "--one_shot", "--one_shot_format", "prometheus", "--logtostderr",
                             "--address", "127.0.0.1", "--port", "0", "--progs", str(MTAIL_PROG),
                             "--logs", str(folder / "*.log")]  # fmt: skip
    best: dict[str, float] = {}
    failed = False
    for i in range(args.runs + 1):
        for name, argv_ in commands.items():
            r = run_measured(argv_, args.timeout)
            if r.returncode != 0:
                print(f"{name}: exit {r.returncode}\n{r.stderr[-2000:]}", file=sys.stderr)
                failed = True
                continue
            note = ""
            if name.startswith("ours"):
                good, note = check_ours(r.stdout, {**truth, "retract": "-"})
                failed |= not good
            else:
                note = " ".join(f"{k}={v}" for k, v in sorted(parse_mtail(r.stdout).items())) + " (lines)"
            if i:
                best[name] = min(best.get(name, float("inf")), r.seconds)
            print(f"  {'warm-up' if i == 0 else f'run {i}'}: {name:18s} {r.seconds:7.3f}s  {note}", file=sys.stderr)
    print(f"\n{len(paths)} files, {size / 1e6:.1f} MB, best of {args.runs}, {cpus} CPUs, "
          f"two-process headroom {parallel_headroom():.2f}x (2 = two free cores)")  # fmt: skip
    for name, t in best.items():
        print(f"{name:18s} {t:7.3f} s")
    ratio = None
    ours = f"ours (--jobs {cpus})"
    if "mtail" in best and ours in best:
        ratio = best["mtail"] / best[ours]
        met = "MET" if ratio >= args.target else "NOT MET"
        print(f"mtail / ours       {ratio:7.2f}x   (target >= {args.target:g}: {met})")
        print(f"mtail / ours -j1   {best['mtail'] / best['ours --jobs 1']:7.2f}x")
    if generated and not args.keep:
        shutil.rmtree(folder)
    if failed:
        return 1
    return 1 if args.check_target and (ratio is None or ratio < args.target) else 0


if __name__ == "__main__":
    sys.exit(main())
