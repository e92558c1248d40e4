"""Detection latency of `sglang-oom-exporter serve`, side by side with an mtail daemon on the same file.

Usage::

    python bench/bench_latency.py [--trials 50] [--block-trials 20] [--poll 0.02] [--check-target]

The targets: an OOM whose logged block names its kind is counted once the rank window
closed, not after the traceback wait. A prefill block with no traceback (0.3.x-0.4.3 have none) shows on
/metrics within 0.5 s (p99 over the trials); block plus traceback within 1.0 s (p99).

Both daemons follow one file in a temp dir, started once with their default timing flags (ours:
`serve --listen 127.0.0.1:P --state-dir DIR FILE`, no --traceback-wait; mtail: bench/oom.mtail, default
250 ms poll). Each trial appends one prefill OOM in a single write(2), with its own log timestamp 5 s of
log time after the previous one, and two threads poll the two /metrics pages every --poll seconds until
the counter moves: ours `sglang_oom_events_total{kind="prefill",source=STEM}` +1, mtail's
`sglang_oom_lines_total{kind="prefill"}` +2 (block head and RuntimeError line) or +1 (block only). The
latency runs from just before the write to the end of the first scrape that shows the new value.

Phase 1: --trials OOMs with block + traceback. Phase 2: --block-trials blocks with no traceback.
Exit status: 1 when ours over- or under-counts or a daemon dies; with --check-target also when
phase 1's p99 > --target-traceback or phase 2's p99 > --target-block, or a trial timed out.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib as bl
import gen_scheduler_log as gen

BASE_EPOCH = 1773526053  # 2026-03-14 22:07:33 UTC, as in gen_scheduler_log.py
LOG_STEP_SECONDS = 5  # log time between two trials' OOMs
DEFAULT_TRACEBACK_WAIT = 2.5  # the catalog's/daemon's default wait for a traceback (serve --help)


@dataclass
class Phase:
    name: str
    ours: list[float | None] = field(default_factory=list)
    mtail: list[float | None] = field(default_factory=list)

    @staticmethod
    def summary(values: list[float | None]) -> dict[str, float | int | None]:
        got = [v for v in values if v is not None]
        return {
            "n": len(values),
            "timeouts": len(values) - len(got),
            "p50": bl.percentile(got, 50) if got else None,
            "p95": bl.percentile(got, 95) if got else None,
            "p99": bl.percentile(got, 99) if got else None,
            "max": max(got) if got else None,
            "min": min(got) if got else None,
            "mean": statistics.fmean(got) if got else None,
        }


def oom_text(index: int, *, traceback: bool, rng: random.Random) -> bytes:
    """One prefill OOM as SGLang 0.5.x logs it: block (+ traceback), no SIGQUIT line."""
    ts = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(BASE_EPOCH + LOG_STEP_SECONDS * (index + 1)))
    lines = gen._oom_lines("prefill", ts, rng)[:-1]  # drop the main process's SIGQUIT line
    if not traceback:
        lines = lines[:4]  # head, Try to allocate, Available tokens, blank
    return ("\n".join(lines) + "\n").encode()


def preamble(n: int) -> bytes:
    ts = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(BASE_EPOCH))
    return "".join(
        f"[{ts} TP0] Decode batch, #running-req: 37, #token: 81234, token usage: 0.62, cuda graph: True, "
        f"gen throughput (token/s): 1834.{i:02d}, #queue-req: 0, \n"
        for i in range(n)
    ).encode()


def scrape(port: int, getter: Callable[[dict], float | None]) -> float | None:
    r = bl.http_get(port, "/metrics", timeout=2.0)
    if r is None or r[0] != 200:
        return None
    v = getter(bl.parse_prom(r[1]))
    return 0.0 if v is None else v


def watch(
    port: int,
    getter: Callable[[dict], float | None],
    want: float,
    t0: float,
    timeout: float,
    interval: float,
    out: list[float | None],
    slot: int,
) -> None:
    """Poll until getter >= want; store seconds since t0 (end of the scrape that showed it) or None."""
    deadline = t0 + timeout
    k = 0
    while True:
        v = scrape(port, getter)
        now = time.perf_counter()
        if v is not None and v >= want:
            out[slot] = now - t0
            return
        if now >= deadline:
            out[slot] = None
            return
        k += 1
        nxt = t0 + k * interval
        if nxt > now:
            time.sleep(min(nxt - now, deadline - now))


def run_phase(
    phase: Phase,
    trials: int,
    *,
    traceback: bool,
    fd: int,
    first_index: int,
    ours_port: int,
    mtail_port: int | None,
    stem: str,
    expect_ours: float,
    expect_mtail: float,
    args: argparse.Namespace,
    rng: random.Random,
    children: list[bl.Child],
) -> tuple[float, float]:
    def ours_get(s: dict) -> float | None:
        return bl.metric(s, "sglang_oom_events_total", kind="prefill", source=stem)

    def mtail_get(s: dict) -> float | None:
        return bl.metric(s, "sglang_oom_lines_total", kind="prefill")

    step = 2 if traceback else 1
    for i in range(trials):
        bl.check_alive(*children)
        # A random pause, so writes land at random phases of both daemons' loops and poll ticks.
        time.sleep(args.gap + rng.uniform(0, args.gap))
        data = oom_text(first_index + i, traceback=traceback, rng=rng)
        results: list[float | None] = [None, None]
        t0 = time.perf_counter()
        n = os.write(fd, data)
        if n != len(data):
            raise RuntimeError(f"short write {n}/{len(data)}")
        threads = [
            threading.Thread(
                target=watch, args=(ours_port, ours_get, expect_ours + 1, t0, args.trial_timeout, args.poll, results, 0)
            )
        ]
        if mtail_port is not None:
            threads.append(
                threading.Thread(
                    target=watch,
                    args=(mtail_port, mtail_get, expect_mtail + step, t0, args.trial_timeout, args.poll, results, 1),
                )
            )
        for t in threads:
            t.start()
        for t in threads:
            t.join(args.trial_timeout + 10)
        expect_ours += 1
        expect_mtail += step
        phase.ours.append(results[0])
        if mtail_port is not None:
            phase.mtail.append(results[1])
        got = scrape(ours_port, ours_get)
        if got is not None and got != expect_ours and results[0] is not None:
            raise RuntimeError(f"ours counts prefill={got}, expected {expect_ours} after trial {i + 1} ({phase.name})")
        if results[0] is None:
            expect_ours = got if got is not None else expect_ours  # keep going; the timeout is reported
        print(
            f"  {phase.name} {i + 1:3d}/{trials}: ours {bl.fmt_s(results[0])}s"
            + (f"  mtail {bl.fmt_s(results[1])}s" if mtail_port is not None else ""),
            file=sys.stderr,
        )
    return expect_ours, expect_mtail


def print_phase(phase: Phase, target: float, stat: str) -> bool:
    o, m = Phase.summary(phase.ours), Phase.summary(phase.mtail) if phase.mtail else None
    print(f"\n{phase.name}: {o['n']} trials")
    print(f"{'':8s} {'p50 s':>8s} {'p95 s':>8s} {'p99 s':>8s} {'max s':>8s} {'min s':>8s} {'timeouts':>9s}")
    for name, s in (("ours", o), ("mtail", m)):
        if s is None:
            continue
        print(
            f"{name:8s} {bl.fmt_s(s['p50']):>8s} {bl.fmt_s(s['p95']):>8s} {bl.fmt_s(s['p99']):>8s} "
            f"{bl.fmt_s(s['max']):>8s} {bl.fmt_s(s['min']):>8s} {s['timeouts']:9d}"
        )
    if m is not None and m["p50"]:
        ratios = "  ".join(f"{k} {o[k] / m[k]:.1f}x" for k in ("p50", "p95", "p99", "max") if o[k] is not None and m[k])
        print(f"ours / mtail: {ratios}  (above 1: ours is slower)")
    value = o[stat]
    met = value is not None and o["timeouts"] == 0 and value <= target
    print(
        f"target: ours {stat} <= {target:g} s: {bl.fmt_s(value)} s -> {'MET' if met else 'NOT MET'}"
        + (f" ({value - target:+.3f} s)" if value is not None and not met else "")
    )
    return met


class _HangingServer:
    """A TCP listener on loopback that accepts connections and never answers them."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = int(self.sock.getsockname()[1])
        self.held: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.held.append(conn)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2)
        for conn in self.held:
            conn.close()
        self.sock.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=50, help="OOMs with block + traceback (default 50)")
    ap.add_argument("--block-trials", type=int, default=20, help="blocks with no traceback (default 20)")
    ap.add_argument("--poll", type=float, default=0.02, help="scrape interval in seconds (default 0.02)")
    ap.add_argument("--gap", type=float, default=0.5, help="pause before each write: gap + U(0, gap) s")
    ap.add_argument("--trial-timeout", type=float, default=15.0, help="give up on a trial after this many s")
    ap.add_argument("--target-traceback", type=float, default=1.0, help="p99 bound with traceback (default 1)")
    ap.add_argument("--target-block", type=float, default=0.5, help="p99 bound with no traceback (default 0.5)")
    ap.add_argument("--check-target", action="store_true", help="exit 1 if a target is missed")
    ap.add_argument("--mtail", default="/usr/bin/mtail", help="mtail binary ('' to skip mtail)")
    ap.add_argument("--ours-arg", action="append", default=[], help="extra flag for ours (repeatable)")
    ap.add_argument("--seed", type=int, default=20260314)
    ap.add_argument(
        "--hanging-target",
        action="store_true",
        help="give ours an SGLang endpoint on loopback that accepts and never answers (tailing "
        "latency must not change while a target hangs)",
    )
    ap.add_argument("--keep-tmp", action="store_true", help="keep the temp dir (logs of both daemons)")
    ap.add_argument("--results", type=Path, help="also write the results as JSON to this file")
    args = ap.parse_args(argv)
    bl.raise_on_signals()
    print(f"ours: sglang_oom_exporter {bl.ours_provenance()}")
    rng = random.Random(args.seed)
    children = bl.Children()
    tmp = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    use_mtail = bool(args.mtail) and Path(args.mtail).exists()
    if args.mtail and not use_mtail:
        print(f"SKIP mtail: {args.mtail} not found", file=sys.stderr)
    fd = -1
    hang = None
    try:
        with bl.BenchRun(children, tmp, keep=args.keep_tmp, tails=lambda: bl.children_tails(children)) as run:
            if args.hanging_target:
                hang = _HangingServer()
                args.ours_arg += ["--sglang-url", f"http://127.0.0.1:{hang.port}", "--scrape-interval", "1s"]
                print(f"hanging SGLang target on 127.0.0.1:{hang.port} (accepts, never answers)")
            log = tmp / "sglang-0.log"
            log.write_bytes(preamble(20))
            state = tmp / "state"
            ours_port = bl.free_port()
            ours = children.start(
                "ours", bl.ours_argv(ours_port, [str(log)], state_dir=str(state), extra=args.ours_arg), tmp / "ours.out"
            )
            running = [ours]
            mtail_port = None
            if use_mtail:
                mtail_port = bl.free_port()
                running.append(
                    children.start("mtail", bl.mtail_argv(args.mtail, mtail_port, str(log)), tmp / "mtail.out")
                )

            def ready() -> bool:
                bl.check_alive(*running)
                return bl.ours_ready(ours_port, files=1) and (mtail_port is None or bl.mtail_answers(mtail_port))

            bl.wait_for(ready, 60, 0.1, "both daemons ready")
            fd = os.open(log, os.O_WRONLY | os.O_APPEND)
            # Liveness: one more ordinary line must reach both, so both are tailing before the first trial.
            os.write(fd, preamble(1))

            def both_read() -> bool:
                bl.check_alive(*running)
                o = bl.http_get(ours_port, "/metrics")
                ok = (
                    o is not None and (bl.metric(bl.parse_prom(o[1]), "sglang_oom_exporter_lines_read_total") or 0) >= 1
                )
                if mtail_port is not None:
                    m = bl.http_get(mtail_port, "/metrics")
                    ok = ok and m is not None and (bl.metric(bl.parse_prom(m[1]), "mtail_lines_total") or 0) >= 1
                return ok

            bl.wait_for(both_read, 30, 0.05, "both daemons to read a line appended after start")
            print(
                f"ready: ours pid {ours.pid} port {ours_port}; "
                + (f"mtail pid {running[1].pid} port {mtail_port}" if use_mtail else "no mtail"),
                file=sys.stderr,
            )

            full = Phase("block + traceback")
            block = Phase("block only (no traceback)")
            common = dict(
                fd=fd, ours_port=ours_port, mtail_port=mtail_port, stem=log.stem, args=args, rng=rng, children=running
            )
            eo, em = run_phase(
                full, args.trials, traceback=True, first_index=0, expect_ours=0.0, expect_mtail=0.0, **common
            )
            run_phase(
                block,
                args.block_trials,
                traceback=False,
                first_index=args.trials,
                expect_ours=eo,
                expect_mtail=em,
                **common,
            )
            bl.check_alive(*running)
            rss = bl.proc_status(ours.pid)

            print(
                f"\nfile: {log} (one write(2) per OOM, {LOG_STEP_SECONDS} s of log time apart); scrape every "
                f"{args.poll * 1000:.0f} ms; ours with default flags (traceback wait {DEFAULT_TRACEBACK_WAIT} s)"
                + (f" {' '.join(args.ours_arg)}" if args.ours_arg else "")
                + ("; mtail poll 250 ms (default)" if use_mtail else "")
            )
            ok1 = print_phase(full, args.target_traceback, "p99") if args.trials else True
            ok2 = print_phase(block, args.target_block, "p99") if args.block_trials else True
            now_mib, peak_mib = rss.get("VmRSS", 0) / 1024, rss.get("VmHWM", 0) / 1024
            print(f"\nours RSS at the end: {now_mib:.1f} MiB (peak {peak_mib:.1f} MiB)")
            if args.results:
                args.results.write_text(
                    json.dumps(
                        {
                            "trials": args.trials,
                            "block_trials": args.block_trials,
                            "poll": args.poll,
                            "phases": {
                                p.name: {
                                    "ours": p.ours,
                                    "mtail": p.mtail,
                                    "ours_summary": Phase.summary(p.ours),
                                    "mtail_summary": Phase.summary(p.mtail) if p.mtail else None,
                                }
                                for p in (full, block)
                            },
                            "targets_met": {"traceback_p99": ok1, "block_p99": ok2},
                        },
                        indent=2,
                    )
                    + "\n",
                    encoding="utf-8",
                )
            if args.check_target and not (ok1 and ok2):
                run.status = 1
    finally:
        if fd >= 0:
            os.close(fd)
        if hang is not None:
            hang.close()
    return run.status


if __name__ == "__main__":
    sys.exit(main())
