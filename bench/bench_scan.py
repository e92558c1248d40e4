"""Whole-process scan benchmark: `sglang-oom-exporter scan` vs mtail --one_shot, a bare Python loop, grep.

Usage::

    python bench/bench_scan.py [--lines 2000000] [--oom-every 10000] [--runs 3] [--keep] [--check-target]

Generates the synthetic scheduler log into bench/out/ (gitignored) unless it is already there with a
matching truth file and warms the page cache. Then one untimed warm-up round measures each command's peak
RSS (under /usr/bin/time -f %M), and K timed rounds run every command, round-robin, each as its own
subprocess reaped with os.wait4. It reports the best wall time, MB/s and peak RSS of each, and the ratios
of each baseline's best time to ours.

Exit status: 0, unless our prefill/decode counts differ from the truth file or our scan command fails (1),
or --check-target is given and mtail/ours is below --target (1). If the `scan` command is not available
yet, (a) is skipped with a message and the baselines are still measured (exit 0, or 1 with --check-target).
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchlib import (
    BENCH_DIR,
    Run,
    Timed,
    mtail_oneshot_argv,
    print_table,
    ratio_line,
    time_rounds,
    warm_cache,
)

OUT_DIR = BENCH_DIR / "out"
GENERATOR = BENCH_DIR / "gen_scheduler_log.py"
SEED = 20260314

# The baseline the issue names: a bare Python loop over the lines with a substring test.
PY_LOOP = """\
import sys
n = 0
with open(sys.argv[1], encoding="utf-8", errors="surrogateescape") as f:
    for line in f:
        if 'out of memory' in line:
            n += 1
print(n)
"""


def ensure_log(lines: int, oom_every: int) -> tuple[Path, dict[str, Any], bool]:
    """Return (log path, truth, generated_now)."""
    log = OUT_DIR / f"sched-{lines}-every{oom_every}.log"
    truth_path = Path(str(log) + ".truth.json")
    if log.exists() and truth_path.exists():
        truth = json.loads(truth_path.read_text(encoding="utf-8"))
        if (
            truth.get("lines") == lines
            and truth.get("oom_every") == oom_every
            and truth.get("seed") == SEED
            and truth.get("bytes") == log.stat().st_size
        ):
            print(f"using existing {log}", file=sys.stderr)
            return log, truth, False
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    print(f"generating {log} ...", file=sys.stderr)
    subprocess.run(
        [
            sys.executable,
            str(GENERATOR),
            str(log),
            "--lines",
            str(lines),
            "--oom-every",
            str(oom_every),
            "--seed",
            str(SEED),
        ],
        check=True,
    )
    return log, json.loads(truth_path.read_text(encoding="utf-8")), True


def scan_available() -> tuple[bool, str]:
    """Whether `python -m sglang_oom_exporter scan` exists, without importing it into this process."""
    try:
        r = subprocess.run(
            [sys.executable, "-m", "sglang_oom_exporter", "scan", "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False, "`scan --help` did not finish in 60 s"
    if r.returncode == 0:
        return True, ""
    why = (r.stderr.strip().splitlines() or ["(no stderr)"])[-1]
    return False, f"exit {r.returncode}: {why}"


def parse_mtail(text: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for m in re.finditer(r'^sglang_oom_lines_total\{kind="(\w+)"[^}]*\} (\d+)', text, re.M):
        counts[m.group(1)] = int(m.group(2))
    return counts


def check_ours(stdout: str, truth: dict[str, Any]) -> tuple[bool, str]:
    try:
        doc = json.loads(stdout)
        counts = doc["counts"]
        got = {k: int(counts.get(k, 0)) for k in ("prefill", "decode")}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return False, f"no counts.prefill/counts.decode in the scan JSON ({exc!r}); head: {stdout[:300]!r}"
    want = {"prefill": truth["prefill"], "decode": truth["decode"]}
    extra = ""
    if isinstance(counts, dict) and "retract" in counts:
        extra = f", retract={counts['retract']} (truth {truth['retract']}, not checked)"
    msg = f"prefill={got['prefill']} decode={got['decode']}{extra}"
    if got != want:
        return False, f"WRONG COUNTS: got {got}, truth {want}"
    return True, msg


def mtail_lines(r: Run) -> tuple[bool, str]:
    """mtail's per-kind line counts as a note (mtail counts matching lines, not events)."""
    return True, " ".join(f"{k}={v}" for k, v in sorted(parse_mtail(r.stdout).items())) + " (lines)"


def mtail_check(truth: dict[str, Any]) -> Callable[[Run], tuple[bool, str]]:
    """mtail counts lines: the block head and the RuntimeError line of each fatal event; warn if not 2x."""

    def check(r: Run) -> tuple[bool, str]:
        c = parse_mtail(r.stdout)
        want = {"prefill": 2 * truth["prefill"], "decode": 2 * truth["decode"], "retract": truth["retract"]}
        if any(c.get(k, 0) != v for k, v in want.items()):
            print(f"warning: mtail counts {c} != expected line counts {want}", file=sys.stderr)
        return mtail_lines(r)

    return check


def line_count_check(truth: dict[str, Any]) -> Callable[[Run], tuple[bool, str]]:
    """A baseline that prints how many lines hold `out of memory`; warn if that is not the truth."""

    def check(r: Run) -> tuple[bool, str]:
        n = int(r.stdout.strip() or 0)
        if n != truth["lines_with_out_of_memory"]:
            print(f"warning: counted {n}, expected {truth['lines_with_out_of_memory']}", file=sys.stderr)
        return True, f"{n} lines"

    return check


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=2_000_000, help="log length in lines (default 2000000)")
    ap.add_argument("--oom-every", type=int, default=10_000, help="one OOM event per this many lines")
    ap.add_argument("--runs", type=int, default=3, help="timed runs per command; the best counts")
    ap.add_argument("--keep", action="store_true", help="keep a log generated by this run")
    ap.add_argument("--check-target", action="store_true", help="exit 1 if mtail/ours is below --target")
    ap.add_argument("--target", type=float, default=10.0, help="required mtail/ours ratio (default 10)")
    ap.add_argument("--mtail", default="/usr/bin/mtail", help="mtail binary (default /usr/bin/mtail)")
    ap.add_argument(
        "--gnu-time",
        default="/usr/bin/time",
        help="GNU time for the peak-RSS warm-up run ('' to use os.wait4 only)",
    )
    ap.add_argument("--timeout", type=float, default=900.0, help="per-run timeout in seconds")
    ap.add_argument("--results", type=Path, help="also write the results as JSON to this file")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be >= 1")

    log, truth, generated = ensure_log(args.lines, args.oom_every)
    size = log.stat().st_size
    mb = size / 1e6
    print(
        f"log: {log} ({truth['lines']} lines, {mb:.1f} MB); truth: prefill={truth['prefill']} "
        f"decode={truth['decode']} retract={truth['retract']}",
        file=sys.stderr,
    )

    ok_scan, why = scan_available()
    benches: list[Timed] = []
    if ok_scan:
        scan = [sys.executable, "-m", "sglang_oom_exporter", "scan", "--format", "json", str(log)]
        benches.append(Timed("ours", scan, lambda r: check_ours(r.stdout, truth)))
    else:
        print(f"SKIP (a) ours: `python -m sglang_oom_exporter scan` is not available ({why})", file=sys.stderr)
    if Path(args.mtail).exists():
        benches.append(Timed("mtail", mtail_oneshot_argv(args.mtail, str(log)), mtail_check(truth)))
    else:
        print(f"SKIP (b) mtail: {args.mtail} not found", file=sys.stderr)
    benches.append(Timed("python-loop", [sys.executable, "-c", PY_LOOP, str(log)], line_count_check(truth)))
    grep = ["grep", "-c", "out of memory", str(log)]
    benches.append(Timed("grep -c", grep, line_count_check(truth), ok_status=(0, 1)))  # 1: no line matched

    warm_cache(log)
    gnu_time = args.gnu_time if args.gnu_time and Path(args.gnu_time).exists() else None
    if gnu_time is None:
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"note: no GNU time; peak RSS comes from os.wait4 and cannot read below this process's own {own:.1f} MiB",
            file=sys.stderr,
        )
    time_rounds(benches, args.runs, args.timeout, gnu_time=gnu_time)
    failed = any(b.failed for b in benches if b.name == "ours")
    ours_note = next((b.note for b in benches if b.name == "ours"), "")
    done = [b for b in benches if b.times and not b.failed]
    print()
    print(
        f"file: {log.name}  {truth['lines']} lines  {mb:.1f} MB  "
        f"prefill={truth['prefill']} decode={truth['decode']} retract={truth['retract']}  "
        f"best of {args.runs}"
    )
    print_table(done, mb)
    print(
        "peak RSS: "
        + (
            f"{gnu_time} -f %M, warm-up run"
            if gnu_time
            else "os.wait4 ru_maxrss (floored at this process's RSS at spawn)"
        )
    )
    by = {b.name: b for b in done}
    ratios: dict[str, float] = {}
    ours = by.get("ours")
    if ours is not None:
        print()
        for name in ("mtail", "python-loop", "grep -c"):
            if name in by:
                ratios[name] = by[name].best / ours.best
                print(ratio_line(f"{name} / ours", ratios[name], args.target if name == "mtail" else None))
    elif failed:
        print("\nours: FAILED (see above), no ratios")
    else:
        print("\nours: skipped, no ratios (baselines only)")
        if "mtail" in by:
            print(
                f"to meet the target, ours must take <= {by['mtail'].best / args.target:.3f}s "
                f"(mtail best / {args.target:g})"
            )

    if args.results:
        args.results.write_text(
            json.dumps(
                {
                    "file": str(log),
                    "bytes": size,
                    "truth": truth,
                    "runs": args.runs,
                    "results": {
                        b.name: {
                            "argv": b.argv,
                            "times": b.times,
                            "best": b.best,
                            "peak_rss_kib": max(b.rss_kib, default=None),
                            "note": b.note,
                        }
                        for b in done
                    },
                    "peak_rss_source": "gnu time" if gnu_time else "os.wait4",
                    "ratios_to_ours": ratios,
                },
                indent=2,
            )
            + "\n",
            encoding="utf-8",
        )

    if generated and not args.keep:
        log.unlink()
        Path(str(log) + ".truth.json").unlink()

    if failed:
        print(f"FAIL: ours: {ours_note}", file=sys.stderr)
        return 1
    if args.check_target:
        if "mtail" not in ratios:
            print("--check-target: no mtail/ours ratio (ours or mtail missing)", file=sys.stderr)
            return 1
        if ratios["mtail"] < args.target:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
