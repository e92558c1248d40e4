"""An OOM behind a copytruncate hole: how long `sglang-oom-exporter serve` takes to count it.

Usage::

    python bench/nul_hole.py [--hole-mib 1024]

A writer without O_APPEND keeps writing at its own offset after a copytruncate, so the file gets a hole of NULs
up to that offset, then its next line. The script starts ours on one log in a temp dir (`serve --listen
127.0.0.1:P --state-dir S FILE`), waits for /metrics, truncates the file and writes one decode OOM at offset
--hole-mib MiB (a sparse hole: no disk is written), and polls /metrics every 50 ms until the decode counter is 1.
It prints the seconds from the write to that scrape (before the fix: 100.6 s for 1 GiB before NUL runs were skipped
run by run, 3.1 s after). Exit status 1 when the count does not reach 1 within --timeout seconds.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as bl

BLOCK = b"[2026-03-14 22:07:01 TP0] Decode out of memory. Try to lower your batch size.\nTry to allocate 5 tokens.\n\n"


def _decode_count(port: int) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            body = r.read().decode()
    except OSError:
        return None
    for line in body.splitlines():
        if line.startswith('sglang_oom_events_total{kind="decode"'):
            return float(line.split()[-1])
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hole-mib", type=int, default=1024)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "a.log")
        Path(log).write_text("[2026-03-14 22:00:00 TP0] started\n")
        port = bl.free_port()
        proc = subprocess.Popen(bl.ours_argv(port, [log], state_dir=os.path.join(tmp, "state")),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while _decode_count(port) is None:
                if time.monotonic() > deadline or proc.poll() is not None:
                    print("ours did not start")
                    return 1
                time.sleep(0.1)
            with open(log, "r+b") as fh:
                fh.truncate(0)
                fh.seek(args.hole_mib << 20)
                fh.write(BLOCK)
            began = time.monotonic()
            while _decode_count(port) != 1.0:
                if time.monotonic() - began > args.timeout:
                    print(f"not counted within {args.timeout:.0f} s")
                    return 1
                time.sleep(0.05)
            print(f"{args.hole_mib} MiB hole, then an OOM: counted after {time.monotonic() - began:.1f} s")
        finally:
            proc.terminate()
            proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
