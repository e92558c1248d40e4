"""Hostile HTTP clients against a real `serve`: slowloris sockets, then a burst of concurrent scrapes.

Starts the daemon on 127.0.0.1 (a free port) with one log file, opens --slow sockets that send half a request
head and then nothing, times --scrapes sequential /metrics requests through them, then fires --burst
concurrent scrapes at once. Prints successes, the slowest request and the daemon's peak RSS (VmHWM), e.g.

    python bench/hostile_http.py --slow 200 --scrapes 80 --burst 500
"""

from __future__ import annotations

import argparse
import http.client
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int, timeout: float) -> tuple[int, float]:
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        response.read()
        return response.status, time.monotonic() - started
    except OSError:
        return -1, time.monotonic() - started
    finally:
        conn.close()


def _peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    """Run the scenario; exit 0 when every scrape succeeded."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow", type=int, default=200, help="slowloris sockets (default 200)")
    parser.add_argument("--scrapes", type=int, default=80, help="sequential scrapes through them (default 80)")
    parser.add_argument("--burst", type=int, default=500, help="concurrent scrapes afterwards (default 500)")
    parser.add_argument("--timeout", type=float, default=30.0, help="client timeout per scrape (default 30 s)")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="hostile-http-")
    log = os.path.join(work, "sglang.log")
    open(log, "w").close()
    port = _free_port()
    cmd = [sys.executable, "-m", "sglang_oom_exporter", "serve", "--listen", f"127.0.0.1:{port}", log]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    slow: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 30
        while _scrape(port, 2)[0] != 200:
            if time.monotonic() > deadline or proc.poll() is not None:
                print("the daemon did not start", file=sys.stderr)
                return 2
            time.sleep(0.1)
        for _ in range(args.slow):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            slow.append(s)
        time.sleep(1.5)  # older than the eviction age, as a real slowloris would be
        started = time.monotonic()
        seq = [_scrape(port, args.timeout) for _ in range(args.scrapes)]
        seq_time = time.monotonic() - started
        ok_seq = sum(1 for status, _ in seq if status == 200)
        print(f"slowloris: {args.slow} sockets, {ok_seq}/{args.scrapes} scrapes ok in {seq_time:.1f}s, "
              f"slowest {max(t for _, t in seq):.2f}s")  # fmt: skip
        barrier = threading.Barrier(args.burst, timeout=60)

        def burst_one(_i: int) -> tuple[int, float]:
            barrier.wait()
            return _scrape(port, args.timeout)

        with ThreadPoolExecutor(max_workers=args.burst) as pool:
            burst = list(pool.map(burst_one, range(args.burst)))
        ok_burst = sum(1 for status, _ in burst if status == 200)
        print(f"burst: {ok_burst}/{args.burst} concurrent scrapes ok, slowest {max(t for _, t in burst):.2f}s")
        print(f"peak RSS {_peak_rss_mb(proc.pid):.0f} MB")
        return 0 if ok_seq == args.scrapes and ok_burst == args.burst else 1
    finally:
        for s in slow:
            s.close()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)


if __name__ == "__main__":
    sys.exit(main())
