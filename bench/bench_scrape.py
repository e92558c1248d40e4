"""Cost of one /metrics scrape of `sglang-oom-exporter serve`, side by side with an mtail daemon, from one run.

Usage::

    python bench/bench_scrape.py [--files 1000,10000] [--scrapes 50] [--load-seconds 10] [--check-target]

The targets, each measured here:

- one /metrics scrape with 1,000 idle files: p50 <= 50 ms, p99 <= 100 ms;
- one /metrics scrape with 10,000 idle files: <= 250 ms (p99 here);
- scrape p99 while one writer appends about 1.5M lines/s to one of the files: <= 200 ms;
- series per source (printed; README says what a source costs).

For each --files count the script writes that many small scheduler logs (bench_idle.make_tree, flat layout, no
OOMs), starts ours (`serve --listen 127.0.0.1:P --state-dir S 'DIR/*.log'`) and mtail (`--logs 'DIR/*.log'`,
bench/oom.mtail) on them, waits until both follow every file (bench_idle's readiness: /healthz 200 with
files_watched == N, and N descriptors open under the tree), then scrapes each --scrapes times, alternating,
one scrape at a time. A scrape is a fresh connection sending what Prometheus sends (OpenMetrics Accept header,
`Accept-Encoding: gzip`), timed from connect to the last body byte; the CPU the daemon spent per scrape comes
from /proc/<pid>/stat over the idle scrapes. The page is then fetched once more as plain text to count its
series and its series per source (the lines that carry one source's label).

Under load (first --files count only): a writer process appends generated scheduler lines to one followed file
at --rate lines/s (in 1 MiB blocks, paced), while both daemons are scraped again for --load-seconds; the
achieved rate is printed. Exit status 1 when a daemon fails, or with --check-target when a target is missed.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import json
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_idle
import benchlib as bl
import gen_scheduler_log as gen

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def scrape(port: int, timeout: float = 30.0) -> tuple[float, int]:
    """One Prometheus-like scrape: (seconds from connect to the last body byte, compressed body bytes)."""
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(bl.LOOPBACK, port, timeout=timeout)
    try:
        conn.request("GET", "/metrics", headers={"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"})
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"/metrics on port {port} answered {resp.status}")
    finally:
        conn.close()
    return time.perf_counter() - t0, len(body)


def plain_page(port: int) -> str:
    """The page as plain text (for counting series)."""
    conn = http.client.HTTPConnection(bl.LOOPBACK, port, timeout=60)
    try:
        conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
        resp = conn.getresponse()
        body = resp.read()
        if resp.getheader("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return body.decode()
    finally:
        conn.close()


def series(text: str) -> list[str]:
    """The sample lines of a text exposition."""
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def write_load(path: str, rate: float, seconds: float, report: multiprocessing.Queue[int]) -> None:
    """Append generated scheduler lines to path at about rate lines/s for seconds; put the line count."""
    block_path = Path(path + ".block")
    gen.generate(block_path, 8000, 0, 7)
    block = block_path.read_bytes()
    block_path.unlink()
    per_block = block.count(b"\n")
    written, start = 0, time.perf_counter()
    with open(path, "ab") as fh:
        while (elapsed := time.perf_counter() - start) < seconds:
            ahead = written / rate - elapsed
            if ahead > 0:
                time.sleep(min(ahead, 0.01))
                continue
            fh.write(block)
            fh.flush()
            written += per_block
    report.put(written)


def timed_scrapes(procs: dict[str, tuple[bl.Child, int]], n: int) -> dict[str, dict[str, float]]:
    """n scrapes of each daemon, alternating; p50/p99/max, body size and CPU seconds per scrape."""
    times: dict[str, list[float]] = {name: [] for name in procs}
    sizes: dict[str, int] = {}
    cpu0 = {name: bl.cpu_seconds(c.pid) for name, (c, _) in procs.items()}
    for _ in range(n):
        for name, (child, port) in procs.items():
            bl.check_alive(child)
            took, size = scrape(port)
            times[name].append(took)
            sizes[name] = size
    out = {}
    for name, (child, _) in procs.items():
        ts = times[name]
        out[name] = {
            "p50_s": bl.percentile(ts, 50),
            "p99_s": bl.percentile(ts, 99),
            "max_s": max(ts),
            "gzip_bytes": float(sizes[name]),
            "cpu_s_per_scrape": (bl.cpu_seconds(child.pid) - cpu0[name]) / n,
        }
    return out


def run_count(files: int, args: argparse.Namespace, tmp: Path, children: bl.Children, load: bool) -> dict:
    root = tmp / f"files-{files}"
    root.mkdir()
    paths, size = bench_idle.make_tree(root, "flat", files, args.file_lines)
    print(f"[{files}] wrote {files} files, {size / 1e6:.1f} MB", file=sys.stderr)
    ours_port, mtail_port = bl.free_port(), bl.free_port()
    ours = children.start(
        "ours", bl.ours_argv(ours_port, [str(root / "*.log")], state_dir=str(tmp / f"state-{files}")),
        tmp / f"ours-{files}.out",
    )  # fmt: skip
    mtail = children.start("mtail", bl.mtail_argv(args.mtail, mtail_port, str(root / "*.log")), tmp / f"mt-{files}.out")
    try:
        t0 = time.perf_counter()
        bl.wait_for(
            lambda: bl.check_alive(ours, mtail) or (
                bl.ours_ready(ours_port, files=files) and bl.open_fds_under(ours.pid, str(root)) >= files
            ),
            args.ready_timeout, interval=0.5, what=f"ours to follow {files} files",
        )  # fmt: skip
        ours_ready = time.perf_counter() - t0
        bl.wait_for(
            lambda: bl.mtail_answers(mtail_port) and bl.open_fds_under(mtail.pid, str(root)) >= files,
            args.ready_timeout, interval=0.5, what=f"mtail to follow {files} files",
        )  # fmt: skip
        time.sleep(args.settle)
        procs = {"ours": (ours, ours_port), "mtail": (mtail, mtail_port)}
        result: dict = {"files": files, "ours_ready_s": ours_ready, "idle": timed_scrapes(procs, args.scrapes)}
        page = plain_page(ours_port)
        lines = series(page)
        one = "sglang-0000"
        per_source = sum(1 for line in lines if f'source="{one}"' in line)
        result.update(series=len(lines), page_bytes=len(page.encode()), series_per_source=per_source,
                      mtail_series=len(series(plain_page(mtail_port))))  # fmt: skip
        if load:
            queue: multiprocessing.Queue[int] = multiprocessing.Queue()
            writer = multiprocessing.Process(
                target=write_load, args=(str(paths[0]), args.rate, args.load_seconds + 2.0, queue), daemon=True
            )
            writer.start()
            try:
                time.sleep(1.0)  # the writer is up to speed before the first timed scrape
                deadline = time.perf_counter() + args.load_seconds
                loaded: dict[str, list[float]] = {"ours": [], "mtail": []}
                while time.perf_counter() < deadline:
                    for name, (child, port) in procs.items():
                        bl.check_alive(child)
                        loaded[name].append(scrape(port)[0])
                written = queue.get(timeout=args.load_seconds + 30)
            finally:
                writer.join(timeout=30)
            result["load"] = {
                name: {"n": len(ts), "p50_s": bl.percentile(ts, 50), "p99_s": bl.percentile(ts, 99), "max_s": max(ts)}
                for name, ts in loaded.items()
            }
            result["load"]["lines_per_s"] = written / (args.load_seconds + 2.0)
        return result
    finally:
        children.stop(ours)
        children.stop(mtail)


def report(r: dict, args: argparse.Namespace) -> bool:
    """Print one file count's rows; True when its targets hold."""
    files, idle = r["files"], r["idle"]
    o, m = idle["ours"], idle["mtail"]
    print(f"\n{files} idle files, {args.scrapes} scrapes each (Prometheus headers: OpenMetrics, gzip)")
    print(f"{'':6s} {'p50 ms':>8s} {'p99 ms':>8s} {'max ms':>8s} {'CPU ms/scrape':>14s} {'gzip KiB':>9s}")
    for name, x in (("ours", o), ("mtail", m)):
        print(f"{name:6s} {x['p50_s'] * 1e3:8.1f} {x['p99_s'] * 1e3:8.1f} {x['max_s'] * 1e3:8.1f} "
              f"{x['cpu_s_per_scrape'] * 1e3:14.1f} {x['gzip_bytes'] / 1024:9.1f}")  # fmt: skip
    print(f"ours: {r['series']} series, {r['page_bytes'] / 1e6:.2f} MB plain, {r['series_per_source']} series per "
          f"source; mtail: {r['mtail_series']} series")  # fmt: skip
    print(f"ours followed every file {r['ours_ready_s']:.1f}s after start")
    if files <= 1000:
        ok = o["p50_s"] <= 0.050 and o["p99_s"] <= 0.100
        print(f"target p50 <= 50 ms, p99 <= 100 ms: {'MET' if ok else 'NOT MET'}")
    else:
        ok = o["p99_s"] <= 0.250
        print(f"target <= 250 ms (p99): {'MET' if ok else 'NOT MET'}")
    if "load" in r:
        lo, lm = r["load"]["ours"], r["load"]["mtail"]
        print(f"under load: one writer at {r['load']['lines_per_s'] / 1e6:.2f}M lines/s (asked {args.rate / 1e6:.2f}M)")
        for name, x in (("ours", lo), ("mtail", lm)):
            print(f"{name:6s} n={x['n']:4d} p50 {x['p50_s'] * 1e3:7.1f} ms  p99 {x['p99_s'] * 1e3:7.1f} ms  "
                  f"max {x['max_s'] * 1e3:7.1f} ms")  # fmt: skip
        load_ok = lo["p99_s"] <= 0.200
        print(f"target p99 <= 200 ms under load: {'MET' if load_ok else 'NOT MET'}")
        ok = ok and load_ok
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", default="1000,10000", help="comma list of idle file counts (default 1000,10000)")
    ap.add_argument("--file-lines", type=int, default=30, help="lines per file (default 30, about 4 KB)")
    ap.add_argument("--scrapes", type=int, default=50, help="timed scrapes of each daemon per count (default 50)")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds between ready and the first scrape")
    ap.add_argument("--rate", type=float, default=1.5e6, help="writer lines/s under load (default 1.5M)")
    ap.add_argument("--load-seconds", type=float, default=10.0, help="scraping under load (default 10 s)")
    ap.add_argument("--ready-timeout", type=float, default=300.0, help="seconds for both to follow every file")
    ap.add_argument("--mtail", default="/usr/bin/mtail", help="mtail binary")
    ap.add_argument("--check-target", action="store_true", help="exit 1 if a target is missed")
    ap.add_argument("--results", type=Path, help="also write the results as JSON to this file")
    args = ap.parse_args(argv)
    counts = [int(x) for x in args.files.split(",") if x.strip()]
    if not Path(args.mtail).exists():
        print(f"{args.mtail} not found: this benchmark is a comparison with mtail", file=sys.stderr)
        return 1
    bl.raise_on_signals()
    print(f"ours: sglang_oom_exporter {bl.ours_provenance()}")
    bl.raise_nofile(max(8192, 4 * max(counts)))
    children = bl.Children()
    tmp = Path(tempfile.mkdtemp(prefix="bench-scrape-"))
    results = []
    with bl.BenchRun(children, tmp, tails=lambda: bl.out_file_tails(tmp)) as run:
        for i, files in enumerate(counts):
            r = run_count(files, args, tmp, children, load=i == 0)
            results.append(r)
            if not report(r, args) and args.check_target:
                run.status = 1
        if args.results:
            args.results.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return run.status


if __name__ == "__main__":
    sys.exit(main())
