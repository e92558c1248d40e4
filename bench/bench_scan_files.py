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

from bench_scan import OUT_DIR, check_ours, mtail_lines
from benchlib import Timed, mtail_oneshot_argv, parallel_headroom, print_table, ratio_line, time_rounds, warm_cache
from gen_scheduler_log import generate


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
    want = {**truth, "retract": "-"}
    ours = f"ours (--jobs {cpus})"
    commands = [
        Timed(ours, [*scan, *paths], lambda r: check_ours(r.stdout, want)),
        Timed("ours --jobs 1", [*scan, "--jobs", "1", *paths], lambda r: check_ours(r.stdout, want)),
    ]
    if Path(args.mtail).exists():
        commands.append(Timed("mtail", mtail_oneshot_argv(args.mtail, str(folder / "*.log")), mtail_lines))
    failed = not time_rounds(commands, args.runs, args.timeout)
    print(f"\n{len(paths)} files, {size / 1e6:.1f} MB, best of {args.runs}, {cpus} CPUs, "
          f"two-process headroom {parallel_headroom():.2f}x (2 = two free cores)")  # fmt: skip
    print_table(commands, size / 1e6)
    best = {c.name: c.best for c in commands if c.times}
    ratio = None
    if "mtail" in best and ours in best:
        ratio = best["mtail"] / best[ours]
        print(ratio_line("mtail / ours", ratio, args.target))
        if "ours --jobs 1" in best:
            print(ratio_line("mtail / ours --jobs 1", best["mtail"] / best["ours --jobs 1"]))
    if generated and not args.keep:
        shutil.rmtree(folder)
    if failed:
        return 1
    return 1 if args.check_target and (ratio is None or ratio < args.target) else 0


if __name__ == "__main__":
    sys.exit(main())
