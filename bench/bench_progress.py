"""What scan's progress line costs at start-up, and what tqdm or rich would have cost (docs/scan-progress.md).

Usage::

    python bench/bench_progress.py [--runs 25] [--with DIR]

Two measurements, each the median CPU time (user + sys of the child, from getrusage) of whole processes run
round-robin, because CPU time moves much less than wall time on a shared machine:

1. `python -c "import <scan's modules>; <extra import>"` for each extra import: nothing, `os, time` (what
   exporter/progress.py imports), `from tqdm import tqdm`, `import rich.progress`. The libraries are not
   dependencies: install them into a scratch directory (`pip install --target DIR tqdm rich`) and pass
   `--with DIR`; a library that cannot be imported is reported as such.
2. `sglang-oom-exporter scan --sample --jobs 1 --format json` with `--progress` and with `--no-progress`,
   stdout and stderr to /dev/null: the line's whole cost on a small scan.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys

SCAN_MODULES = (
    "import sglang_oom_exporter.cli, sglang_oom_exporter.scan, sglang_oom_exporter.scan.parallel, "
    "sglang_oom_exporter.detect.pipeline"
)
EXTRAS = {
    "scan's own imports": "",
    "import os, time (progress.py)": "import os, time",
    "from tqdm import tqdm": "from tqdm import tqdm",
    "import rich.progress": "import rich.progress",
}


def cpu_of(argv: list[str], env: dict[str, str]) -> float | None:
    """CPU seconds of one run, or None when it failed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        return None
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def medians(commands: dict[str, list[str]], runs: int, env: dict[str, str]) -> dict[str, float | None]:
    """Median CPU seconds per command, run round-robin; None for a command that failed."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    failed: set[str] = set()
    for _ in range(runs):
        for name, argv in commands.items():
            if name in failed:
                continue
            took = cpu_of(argv, env)
            if took is None:
                failed.add(name)
            else:
                times[name].append(took)
    return {name: None if name in failed else statistics.median(t) for name, t in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=25)
    parser.add_argument("--with", dest="extra_path", default="", help="a directory holding tqdm and rich")
    args = parser.parse_args()
    env = dict(os.environ)
    if args.extra_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (args.extra_path, env.get("PYTHONPATH", "")) if p)
    imports = {name: [sys.executable, "-c", f"{SCAN_MODULES}; {code}" if code else SCAN_MODULES]
               for name, code in EXTRAS.items()}  # fmt: skip
    found = medians(imports, args.runs, env)
    base = found["scan's own imports"]
    print(f"import CPU, median of {args.runs} runs")
    for name, value in found.items():
        if value is None:
            print(f"  {name:<32} cannot be imported (pass --with DIR)")
        elif base is not None and name != "scan's own imports":
            print(f"  {name:<32} {value * 1000:7.1f} ms  ({(value - base) * 1000:+.1f} ms over scan's)")
        else:
            print(f"  {name:<32} {value * 1000:7.1f} ms")
    scan = [sys.executable, "-m", "sglang_oom_exporter", "scan", "--sample", "--jobs", "1", "--format", "json"]
    runs = medians({flag: [*scan, flag] for flag in ("--no-progress", "--progress")}, args.runs, env)
    print(f"scan --sample CPU, median of {args.runs} runs")
    for flag, value in runs.items():
        print(f"  {flag:<32} {'failed' if value is None else f'{value * 1000:7.1f} ms'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
