"""Shared helpers for the benchmarks: daemons (bench_latency.py, bench_idle.py, bench_catchup.py, ...) and
whole-process timing (bench_scan.py, bench_scan_big.py, bench_scan_files.py: warm-up, round-robin timed runs,
best-of table and ratios).

Processes: every child is started in its own session (its own process group) and registered, and
`Children.stop_all()` (called from each script's `finally`, and at exit) sends SIGTERM to each group it
started, by id, then SIGKILL after a deadline. Network: only 127.0.0.1, ports found by binding port 0.
/proc readers: CPU seconds (utime + stime of the whole process, all threads, exited ones included) and
VmRSS / VmHWM.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

BENCH_DIR = Path(__file__).resolve().parent
MTAIL_PROG = BENCH_DIR / "oom.mtail"
LOOPBACK = "127.0.0.1"
CLK_TCK = os.sysconf("SC_CLK_TCK")

T = TypeVar("T")


# --- ports and HTTP on loopback -----------------------------------------------------------------


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (bind port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def http_get(port: int, path: str, timeout: float = 5.0) -> tuple[int, str] | None:
    """GET http://127.0.0.1:port/path; (status, body), or None when nothing answers in time."""
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)", re.M)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_prom(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Prometheus text exposition -> {(name, labels): value}; comments are skipped."""
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for m in _SAMPLE.finditer(text):
        labels = frozenset(_LABEL.findall(m.group(2) or ""))
        try:
            out[(m.group(1), labels)] = float(m.group(3))
        except ValueError:
            continue
    return out


def metric(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float | None:
    """Sum of the samples named `name` whose labels include `labels`; None when there is none."""
    want = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and want <= ls]
    return sum(found) if found else None


# --- deadlines --------------------------------------------------------------------------------------


def wait_for(pred: Callable[[], T | None], timeout: float, interval: float = 0.05, what: str = "condition") -> T:
    """Call pred every `interval` until it returns a truthy value; TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        now = time.monotonic()
        if now >= deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(min(interval, deadline - now))


def settled_total(total: Callable[[], float], expected: float, wait: float, settle: float = 3.0) -> float:
    """total() once it reaches `expected` (or `wait` seconds pass) and `settle` seconds more: what a benchmark
    counting written events reports, a late double count included."""
    with contextlib.suppress(TimeoutError):
        wait_for(lambda: total() >= expected, wait, interval=0.1, what=f"a total of {expected:g}")
    time.sleep(settle)
    return total()


# --- child processes --------------------------------------------------------------------------------


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_fh: IO[bytes]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""


class Children:
    """The processes this benchmark started; stop_all() ends exactly those (their process groups)."""

    def __init__(self) -> None:
        self._children: list[Child] = []
        atexit.register(self.stop_all)

    def start(self, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> Child:
        fh = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        proc = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
        child = Child(name, proc, log_path, fh)
        self._children.append(child)
        return child

    def stop(self, child: Child, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        """Signal the child's process group, wait up to timeout, then SIGKILL it; returns the exit status."""
        rc = child.proc.poll()
        if rc is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, sig)
            try:
                rc = child.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.pid, signal.SIGKILL)
                rc = child.proc.wait(10)
        # Anything the child left in its group (it has none here, but be sure).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            child.log_fh.close()
        if child in self._children:
            self._children.remove(child)
        return rc

    def stop_all(self) -> None:
        for child in list(self._children):
            with contextlib.suppress(Exception):
                self.stop(child, timeout=5.0)


def out_file_tails(tmp: Path) -> Iterable[tuple[str, str]]:
    """The last 2,000 bytes of each daemon output file (*.out) in a benchmark's temp dir."""
    for out in sorted(tmp.glob("*.out")):
        yield f"{out.name} (tail)", out.read_bytes()[-2000:].decode("utf-8", "replace")


def children_tails(children: Children) -> Iterable[tuple[str, str]]:
    """The end of each running child's output."""
    for c in list(children._children):
        yield f"{c.name} output (tail)", c.tail()


class BenchRun:
    """How every daemon benchmark ends, in a `with` block around its body.

    A RuntimeError or TimeoutError is printed as FAIL (with the given output tails) and makes `status` 1; an
    interrupt (also SIGTERM/SIGHUP, see raise_on_signals) makes it 130. Either way, and on success, the
    children are stopped and the temp dir removed, or kept and named. The body sets `status` for a missed target.
    """

    def __init__(
        self,
        children: Children,
        tmp: Path,
        *,
        keep: bool = False,
        tails: Callable[[], Iterable[tuple[str, str]]] | None = None,
    ) -> None:
        self.status = 0
        self._children, self._tmp, self._keep, self._tails = children, tmp, keep, tails

    def __enter__(self) -> BenchRun:
        return self

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None, _tb: Any) -> bool:
        handled = False
        if typ is not None and issubclass(typ, (RuntimeError, TimeoutError)):
            print(f"FAIL: {exc}", file=sys.stderr)
            for header, text in self._tails() if self._tails else ():
                print(f"--- {header} ---\n{text}", file=sys.stderr)
            self.status, handled = 1, True
        elif typ is not None and issubclass(typ, KeyboardInterrupt):
            print("interrupted: stopping the daemons and removing the temp files", file=sys.stderr)
            self.status, handled = 130, True
        self._children.stop_all()
        if self._keep:
            print(f"kept {self._tmp}", file=sys.stderr)
        else:
            shutil.rmtree(self._tmp, ignore_errors=True)
        return handled


def raise_on_signals() -> None:
    """SIGTERM/SIGHUP become KeyboardInterrupt, so `finally` blocks clean up."""

    def handler(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


def raise_nofile(want: int = 8192) -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE (children inherit it); returns (soft, hard) after."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    new = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < new:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


# --- command lines ----------------------------------------------------------------------------------


def ours_argv(port: int, paths: Iterable[str], *, state_dir: str | None = None, extra: Sequence[str] = ()) -> list[str]:
    argv = [sys.executable, "-m", "sglang_oom_exporter", "serve", "--listen", f"{LOOPBACK}:{port}"]
    if state_dir:
        argv += ["--state-dir", state_dir]
    return [*argv, *extra, *paths]


def ours_provenance() -> str:
    """Which sglang_oom_exporter the daemon will import (set PYTHONPATH to benchmark another tree)."""
    try:
        r = subprocess.run(
            [sys.executable, "-c", "import sglang_oom_exporter as m; print(m.__version__, m.__file__)"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "unknown (import timed out)"
    return r.stdout.strip() if r.returncode == 0 else f"import failed: {r.stderr.strip().splitlines()[-1:]}"


def mtail_argv(mtail: str, port: int, logs: str) -> list[str]:
    """The daemon form of bench_scan.py's mtail: same program, loopback listener, glog to stderr."""
    return [
        mtail,
        "--progs",
        str(MTAIL_PROG),
        "--logs",
        logs,
        "--address",
        LOOPBACK,
        "--port",
        str(port),
        "--logtostderr",
    ]


def ours_ready(port: int, files: int | None = None) -> bool:
    """/healthz answers 200 and, if files is given, sglang_oom_exporter_files_watched == files."""
    r = http_get(port, "/healthz", timeout=2.0)
    if r is None or r[0] != 200:
        return False
    if files is None:
        return True
    m = http_get(port, "/metrics", timeout=5.0)
    if m is None or m[0] != 200:
        return False
    return metric(parse_prom(m[1]), "sglang_oom_exporter_files_watched") == files


def mtail_answers(port: int) -> bool:
    r = http_get(port, "/metrics", timeout=2.0)
    return r is not None and r[0] == 200 and "mtail_" in r[1]


def check_alive(*children: Child) -> None:
    for c in children:
        rc = c.proc.poll()
        if rc is not None:
            raise RuntimeError(f"{c.name} exited early with status {rc}; its output ends with:\n{c.tail()}")


# --- /proc -------------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of the whole process (every thread, including exited ones), in seconds."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM (KiB) and Threads from /proc/<pid>/status."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "Threads"):
            out[key] = int(value.split()[0])
    return out


def open_fds_under(pid: int, root: str) -> int:
    """How many of the process's open file descriptors point at files under root."""
    prefix = os.path.realpath(root) + os.sep
    n = 0
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0
    for name in names:
        try:
            if os.readlink(f"/proc/{pid}/fd/{name}").startswith(prefix):
                n += 1
        except OSError:
            continue
    return n


# --- statistics --------------------------------------------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (the smallest value with at least p% of the values at or below it)."""
    if not values:
        return math.nan
    s = sorted(values)
    k = max(1, math.ceil(p / 100.0 * len(s)))
    return s[k - 1]


def fmt_s(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


# --- whole-process timing (bench_scan.py, bench_scan_big.py, bench_scan_files.py) ------------------------


@dataclass
class Run:
    """One whole-process run: wall seconds from spawn to reap, peak RSS, exit status and output."""

    seconds: float
    maxrss_kib: int
    returncode: int
    stdout: str
    stderr: str
    cpu_seconds: float = 0.0  # user + system of the process and the children it reaped (a scan's workers)


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
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=bytecode_env())
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
            cpu_seconds=usage.ru_utime + usage.ru_stime,
        )


def bytecode_env() -> dict[str, str]:
    """This environment, with Python bytecode written and read (under bench/out/pycache), as an installed package has.

    A development shell may set PYTHONDONTWRITEBYTECODE: every timed `scan` would then compile its modules from
    source at each start (0.08 s of CPU of a 0.32 s start-up here), which no installed copy does.
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(BENCH_DIR / "out" / "pycache")
    return env


def warm_cache(path: Path) -> None:
    """Read the file once, so every timed command finds it in the page cache."""
    with open(path, "rb") as fh:
        while fh.read(1 << 20):
            pass


def mtail_oneshot_argv(mtail: str, logs: str) -> list[str]:
    """mtail reading `logs` from the start to EOF and printing its counters (`--one_shot`).

    --one_shot still opens its HTTP listener (3903 by default, exit 1 when taken): an ephemeral loopback port.
    """
    return [mtail, "--one_shot", "--one_shot_format", "prometheus", "--logtostderr", "--address", LOOPBACK,
            "--port", "0", "--progs", str(MTAIL_PROG), "--logs", logs]  # fmt: skip


@dataclass
class Timed:
    """A command timed round-robin with the others; check(run) says whether its output counts, and a note."""

    name: str
    argv: list[str]
    check: Callable[[Run], tuple[bool, str]] = lambda run: (True, "")
    timed_runs: int | None = None  # at most this many timed runs (mtail on gigabytes takes minutes)
    ok_status: tuple[int, ...] = (0,)
    times: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # CPU seconds of each timed run
    rss_kib: list[int] = field(default_factory=list)
    note: str = ""
    failed: bool = False

    @property
    def best(self) -> float:
        """The best wall time of the timed runs."""
        return min(self.times)


def time_rounds(commands: Sequence[Timed], runs: int, timeout: float, *, gnu_time: str | None = None) -> bool:
    """Round 0 is an untimed warm-up (each command's peak RSS, under GNU time when given); rounds 1..runs
    time every command round-robin as a whole process. A command whose run fails or whose check fails is not
    run again. Progress goes to stderr. Returns False when any command failed."""
    width = max(len(c.name) for c in commands)
    for i in range(runs + 1):
        for c in commands:
            if c.failed or (i and c.timed_runs is not None and i > c.timed_runs):
                continue
            r = run_measured(c.argv, timeout, gnu_time if i == 0 else None)
            if r.returncode not in c.ok_status:
                print(f"{c.name}: exit {r.returncode}\n{r.stderr[-3000:]}", file=sys.stderr)
                c.failed, c.note = True, f"FAILED exit {r.returncode}"
                continue
            good, c.note = c.check(r)
            if not good:
                print(f"{c.name}: {c.note}", file=sys.stderr)
                c.failed = True
                continue
            if i:
                c.times.append(r.seconds)
                c.cpu.append(r.cpu_seconds)
            if i == 0 or gnu_time is None:
                c.rss_kib.append(r.maxrss_kib)
            label = "warm-up" if i == 0 else f"run {i}/{runs}"
            rss = f"{r.maxrss_kib / 1024:8.1f} MiB" if (i == 0 or gnu_time is None) else ""
            cpu = f"cpu {r.cpu_seconds:7.3f}s" if i else ""
            print(f"  {label:9s} {c.name:{width}s} {r.seconds:8.3f}s {cpu} {rss}  {c.note}", file=sys.stderr)
    return not any(c.failed for c in commands)


def print_table(commands: Sequence[Timed], megabytes: float) -> None:
    """Best and median wall time, MB/s (10^6 bytes per second, best run), the least CPU seconds (user + system,
    workers included) of a run, peak RSS and note of each command."""
    width = max(12, *(len(c.name) for c in commands))
    print(f"{'command':{width}s} {'best s':>8s} {'median s':>9s} {'MB/s':>8s} {'CPU s':>8s} {'peak RSS MiB':>13s}  "
          "counts")  # fmt: skip
    for c in commands:
        if not c.times:
            continue
        peak = max(c.rss_kib) / 1024 if c.rss_kib else math.nan
        print(f"{c.name:{width}s} {c.best:8.3f} {statistics.median(c.times):9.3f} {megabytes / c.best:8.1f} "
              f"{min(c.cpu):8.3f} {peak:13.1f}  {c.note}")  # fmt: skip


def ratio_line(label: str, ratio: float, target: float | None = None, *, above: bool = False) -> str:
    """`label  12.34x   (target >= 10: MET)`; above=True makes the target strict (> instead of >=)."""
    if target is None:
        return f"{label:24s} {ratio:8.2f}x"
    met = ratio > target if above else ratio >= target
    return f"{label:24s} {ratio:8.2f}x   (target {'>' if above else '>='} {target:g}: {'MET' if met else 'NOT MET'})"


def _burn(n: int) -> int:
    s = 0
    for i in range(n):
        s += i
    return s


def parallel_headroom(n: int = 10_000_000) -> float:
    """How much faster two processes finish two equal CPU loops than one process: about 2 with two free
    cores, 1 or less when other work holds them (then a parallel scan cannot gain either)."""
    import multiprocessing

    t0 = time.perf_counter()
    _burn(n)
    _burn(n)
    serial = time.perf_counter() - t0
    with multiprocessing.get_context("fork").Pool(2) as pool:
        t0 = time.perf_counter()
        pool.map(_burn, [n, n])
        both = time.perf_counter() - t0
    return serial / both
