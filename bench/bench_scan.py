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
import os
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
OUT_DIR = BENCH_DIR / "out"
MTAIL_PROG = BENCH_DIR / "oom.mtail"
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


@dataclass
class Result:
    name: str
    argv: list[str]
    times: list[float] = field(default_factory=list)
    rss_kib: list[int] = field(default_factory=list)
    note: str = ""

    @property
    def best(self) -> float:
        return min(self.times)


@dataclass
class Run:
    seconds: float
    maxrss_kib: int
    returncode: int
    stdout: str
    stderr: str


def run_measured(argv: list[str], timeout: float, gnu_time: str | None = None) -> Run:
    """Run argv as one process; wall time from spawn to reap, peak RSS from the child's rusage (os.wait4).

    Caveat: a child spawned from this Python process inherits its RSS high-water mark (Linux carries the
    pre-exec mm's peak into the process's maxrss across exec, and subprocess uses vfork), so ru_maxrss from
    os.wait4 is never below this process's own RSS. With gnu_time (/usr/bin/time), argv runs under
    `time -f %M`, whose tiny process forks the command, and the returned maxrss is time's report instead.
    """
    rss_file = None
    if gnu_time:
        rss_fd, rss_file = tempfile.mkstemp(prefix="bench-rss-")
        os.close(rss_fd)
        argv = [gnu_time, "-f", "%M", "-o", rss_file, *argv]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        timer = threading.Timer(timeout, lambda: os.kill(proc.pid, signal.SIGKILL))
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        seconds = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)  # tell Popen the child is reaped
        out.seek(0)
        err.seek(0)
        maxrss = int(usage.ru_maxrss)  # KiB on Linux
        if rss_file:
            text = Path(rss_file).read_text(encoding="utf-8").strip()
            os.unlink(rss_file)
            # time(1) prints "Command exited with non-zero status N" before %M when the command fails.
            maxrss = int(text.splitlines()[-1]) if text else -1
        return Run(
            seconds=seconds,
            maxrss_kib=maxrss,
            returncode=proc.returncode,
            stdout=out.read().decode("utf-8", "replace"),
            stderr=err.read().decode("utf-8", "replace"),
        )


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


def warm_cache(path: Path) -> None:
    with open(path, "rb") as fh:
        while fh.read(1 << 20):
            pass


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


def check_run(b: Result, r: Run, truth: dict[str, Any]) -> bool:
    """Check one run's exit status and counts; set b.note. False means the run does not count."""
    if not (r.returncode == 0 or (b.name == "grep -c" and r.returncode == 1)):
        print(f"{b.name}: exit {r.returncode}\n{r.stderr[-3000:]}", file=sys.stderr)
        b.note = f"FAILED exit {r.returncode}"
        return False
    if b.name == "ours":
        good, msg = check_ours(r.stdout, truth)
        b.note = msg
        if not good:
            print(f"ours: {msg}", file=sys.stderr)
        return good
    if b.name == "mtail":
        c = parse_mtail(r.stdout)
        b.note = " ".join(f"{k}={v}" for k, v in sorted(c.items())) + " (lines)"
        want = {"prefill": 2 * truth["prefill"], "decode": 2 * truth["decode"], "retract": truth["retract"]}
        if any(c.get(k, 0) != v for k, v in want.items()):
            print(f"warning: mtail counts {c} != expected line counts {want}", file=sys.stderr)
        return True
    n = int(r.stdout.strip() or 0)
    b.note = f"{n} lines"
    if n != truth["lines_with_out_of_memory"]:
        print(f"warning: {b.name} counted {n}, expected {truth['lines_with_out_of_memory']}", file=sys.stderr)
    return True


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
    benches: list[Result] = []
    if ok_scan:
        benches.append(
            Result("ours", [sys.executable, "-m", "sglang_oom_exporter", "scan", "--format", "json", str(log)])
        )
    else:
        print(f"SKIP (a) ours: `python -m sglang_oom_exporter scan` is not available ({why})", file=sys.stderr)
    if Path(args.mtail).exists():
        benches.append(
            Result(
                "mtail",
                [
                    args.mtail,
                    "--one_shot",
                    "--one_shot_format",
                    "prometheus",
                    "--logtostderr",
                    "--address",
                    "127.0.0.1",
                    "--port",
                    "0",  # one_shot still opens an HTTP listener: ephemeral port
                    "--progs",
                    str(MTAIL_PROG),
                    "--logs",
                    str(log),
                ],
            )
        )
    else:
        print(f"SKIP (b) mtail: {args.mtail} not found", file=sys.stderr)
    benches.append(Result("python-loop", [sys.executable, "-c", PY_LOOP, str(log)]))
    benches.append(Result("grep -c", ["grep", "-c", "out of memory", str(log)]))

    warm_cache(log)
    gnu_time = args.gnu_time if args.gnu_time and Path(args.gnu_time).exists() else None
    if gnu_time is None:
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"note: no GNU time; peak RSS comes from os.wait4 and cannot read below this process's own {own:.1f} MiB",
            file=sys.stderr,
        )
    failed = False
    # Round 0 is an untimed warm-up that also takes each command's peak RSS (under /usr/bin/time if present);
    # rounds 1..K are timed, each command spawned directly and reaped with os.wait4.
    for i in range(args.runs + 1):
        for b in benches:
            if b.name == "ours" and failed:
                continue
            r = run_measured(b.argv, args.timeout, gnu_time if i == 0 else None)
            if not check_run(b, r, truth):
                if b.name == "ours":
                    failed = True
                continue
            if i == 0:
                b.rss_kib.append(r.maxrss_kib)
                label = "warm-up"
            else:
                b.times.append(r.seconds)
                if gnu_time is None:
                    b.rss_kib.append(r.maxrss_kib)
                label = f"run {i}/{args.runs}"
            rss = f"{r.maxrss_kib / 1024:8.1f} MiB" if (i == 0 or gnu_time is None) else ""
            print(f"  {label:9s} {b.name:12s} {r.seconds:8.3f}s  {rss}", file=sys.stderr)

    ours_note = next((b.note for b in benches if b.name == "ours"), "")
    done = [b for b in benches if b.times and not (b.name == "ours" and failed)]
    print()
    print(
        f"file: {log.name}  {truth['lines']} lines  {mb:.1f} MB  "
        f"prefill={truth['prefill']} decode={truth['decode']} retract={truth['retract']}  "
        f"best of {args.runs}"
    )
    print(f"{'command':12s} {'best s':>8s} {'median s':>9s} {'MB/s':>8s} {'peak RSS MiB':>13s}  counts")
    for b in done:
        peak = max(b.rss_kib) / 1024 if b.rss_kib else float("nan")
        print(f"{b.name:12s} {b.best:8.3f} {statistics.median(b.times):9.3f} {mb / b.best:8.1f} {peak:13.1f}  {b.note}")
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
                label = f"{name} / ours"
                met = "MET" if ratios[name] >= args.target else "NOT MET"
                tgt = f"   (target >= {args.target:g}: {met})" if name == "mtail" else ""
                print(f"{label:20s} {ratios[name]:8.2f}x{tgt}")
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
