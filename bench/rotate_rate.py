"""Rename rotation at a fixed rate: how many generations `serve` counts, one fatal OOM each.

Usage::

    python bench/rotate_rate.py [--rate 10] [--rotations 30] [--tmpfs]

Starts the real daemon (tests/support/daemon.py Daemon: `serve --listen 127.0.0.1:P --state-dir S DIR/*.log`),
then --rotations times: appends one OOM block to DIR/r.log, holds it for one period (1 / --rate seconds),
renames it to r.log.<i> and creates a new empty r.log, as logrotate's rename does. It waits up to 15 s for
the count and 3 s more (a double count shows too), then prints the OOMs written and counted. Exit 0 when
exact. --tmpfs puts the logs and the state on /dev/shm, away from disk writeback (RELIABILITY.md: a stat or
open stalled by writeback longer than a generation lives can lose that generation).

The suite checks rotation step by step, waiting for the daemon to open each generation
(tests/test_reliability_files.py); this measures the fixed rates a loaded suite cannot promise
(RELIABILITY.md records 5, 10, 20, 50 and 200/s).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchlib import settled_total

from tests.support.daemon import Daemon
from tests.support.logs import append, oom_block


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=10.0, help="rotations a second")
    ap.add_argument("--rotations", type=int, default=30)
    ap.add_argument("--tmpfs", action="store_true", help="logs and state on /dev/shm")
    args = ap.parse_args()
    shm = "/dev/shm" if args.tmpfs else None  # noqa: S108 (mkdtemp makes a private directory there)
    root = tempfile.mkdtemp(prefix="rotate-rate-", dir=shm)
    logs = os.path.join(root, "logs")
    os.mkdir(logs)
    log = os.path.join(logs, "r.log")
    append(log, "[2026-03-14 22:00:00 TP0] started\n")
    d = Daemon([os.path.join(logs, "*.log")], os.path.join(root, "state")).start()
    hold = threading.Event()
    counted = -1.0
    alive = False
    try:
        period = 1.0 / args.rate
        for i in range(args.rotations):
            append(log, oom_block())
            hold.wait(period)
            os.rename(log, f"{log}.{i}")
            append(log, "")
        counted = settled_total(d.total, args.rotations, wait=15.0)
        alive = d.proc is not None and d.proc.poll() is None
        print(f"rate={args.rate}/s tmpfs={args.tmpfs} written={args.rotations} counted={counted:.0f} alive={alive}")
    finally:
        if d.proc is not None:
            d.proc.kill()
            d.proc.wait()
        shutil.rmtree(root, ignore_errors=True)
    return 0 if counted == args.rotations and alive else 1


if __name__ == "__main__":
    sys.exit(main())
