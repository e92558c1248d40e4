"""A log path flipping between a regular file and a directory: how many generations `serve` counts.

Usage::

    python bench/flip_dir.py [--rate 10] [--flips 30] [--glob] [--no-dir]

Starts the real daemon (tests/support/daemon.py Daemon: `serve --listen 127.0.0.1:P --state-dir S PATH`) on one
path in a temp dir (or on `*.log` with --glob), then --flips times: writes a new file there holding one fatal
OOM block, holds it for half a period, removes it and makes a directory at the path (--no-dir: leaves it
missing), holds that for half a period, removes the directory. --rate is flips a second. It then waits up to
10 s for the count and 3 s more, and prints the OOMs written and counted, how many inodes the files had (ext4
reuses a freed one: what lost events before a generation was told by more than its inode), and the nonzero
resets and read errors.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchlib import settled_total

from tests.support.daemon import Daemon
from tests.support.logs import oom_block


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=10.0, help="flips a second")
    ap.add_argument("--flips", type=int, default=30)
    ap.add_argument("--glob", action="store_true", help="follow the directory's *.log, not the path")
    ap.add_argument("--no-dir", action="store_true", help="leave the path missing instead of a directory")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="flip-dir-")
    path = os.path.join(tmp, "flip.log")
    d = Daemon([os.path.join(tmp, "*.log") if args.glob else path], os.path.join(tmp, "state")).start()
    hold = threading.Event()
    try:
        half = 0.5 / args.rate
        inodes = set()
        for _ in range(args.flips):
            with open(path, "w") as fh:
                fh.write(oom_block())
            inodes.add(os.stat(path).st_ino)
            hold.wait(half)
            os.unlink(path)
            if not args.no_dir:
                os.mkdir(path)
            hold.wait(half)
            if not args.no_dir:
                os.rmdir(path)
        counted = settled_total(d.total, args.flips, wait=10.0)
        m = d.metrics("sglang_oom_exporter_read_errors", "sglang_oom_exporter_file_resets")
        alive = d.proc is not None and d.proc.poll() is None
        print(f"rate={args.rate}/s glob={args.glob} dir={not args.no_dir} written={args.flips} "
              f"counted={counted:.0f} inodes={len(inodes)} alive={alive}")  # fmt: skip
        for (name, labels), v in sorted(m.items()):
            if v and name.endswith("_total"):
                print(f"  {name}{dict(labels)} {v:.0f}")
    finally:
        if d.proc is not None:
            d.proc.kill()
            d.proc.wait()
    return 0 if counted == args.flips and alive else 1


if __name__ == "__main__":
    sys.exit(main())
