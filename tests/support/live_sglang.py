"""A real SGLang 0.5.23 on this CPU-only machine, for the live tests (tests/test_live_sglang.py, `make live-sglang`)
and for recording real fixtures (`python -m tests.support.live_sglang record`).

    install()   the pinned requirements (live-sglang-requirements.txt) into a cached Python 3.11 virtualenv,
                .cache/live-sglang/<hash of the pins>/venv, with `pip install --no-deps`; the tiny model beside it
    Server      one `sglang.launch_server` writing its log to a file, ready when /health_generate answers, stopped
                by pid (SIGTERM, then SIGKILL of its process group after a deadline)
    SCENARIOS   the server flags, the one-call fault (sglang_cpu/sitecustomize.py) and the requests of each case
    record      run every scenario once and write its real log, /metrics and /server_info under tests/data

What runs SGLang on a CPU (docs in /work/shared/LIVE-SGLANG.md's facts, our own code): SGLANG_USE_CPU_ENGINE=1, the
torch_native attention backend, and three stand-ins first on PYTHONPATH (tests/support/sglang_cpu/): `sgl_kernel`
(its one CPU op on this path, in torch), an import-only `torchvision`, and the fault injection.

One server at a time on the machine (it busy-polls a core and takes about 2.9 GB): Server.start takes a file lock
that the xdist workers of a run share, and stop releases it. Every wait polls with a deadline sized for a loaded
machine (SGLang took 90 s to start at load 7). Nothing here talks to anything but loopback, except pip.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

SUPPORT = Path(__file__).resolve().parent
ROOT = SUPPORT.parent.parent
STANDINS = SUPPORT / "sglang_cpu"
REQUIREMENTS = SUPPORT / "live-sglang-requirements.txt"
CACHE = Path(os.environ.get("LIVE_SGLANG_CACHE", ROOT / ".cache" / "live-sglang"))
PYTHON_VERSION = "3.11"  # the SGLang wheel's tag
RELEASE = "0.5.23"
# Hang guards for a loaded machine, never speed assertions.
INSTALL_TIMEOUT = 1500.0
READY_TIMEOUT = 240.0  # 20-30 s on a quiet machine, 90 s at load 7
EXIT_TIMEOUT = 120.0  # a fatal OOM's teardown: about 6 s, 65 s for req_slots (it waits for CUDA coredumps)
STOP_TIMEOUT = 180.0  # SIGTERM drains the running requests, then exits 0 (8-20 s idle)
BASE_FLAGS = (
    "--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph", "--enable-metrics",
    "--log-level", "info", "--max-total-tokens", "256", "--disable-radix-cache", "--skip-server-warmup",
    "--max-running-requests", "8",
)  # fmt: skip
# The log lines the scenarios wait for, as SGLang 0.5.23 prints them.
RETRACT_LINE = re.compile(r"KV cache pool is full\. Retract requests\. #retracted_reqs: (\d+)")
DECODE_LINE = re.compile(r"\] Decode batch, #running-req: [1-9]")


class UnavailableError(Exception):
    """SGLang cannot be installed or run here: the tests skip with this reason (fail under CI=true)."""


def pins_hash() -> str:
    """The cache key: the requirement pins and the Python version, so a changed pin builds a new virtualenv."""
    return hashlib.sha256(f"{PYTHON_VERSION}\n{REQUIREMENTS.read_text()}".encode()).hexdigest()[:16]


def home() -> Path:
    """This pin set's directory: venv/, model/ and the markers that say each is complete."""
    return CACHE / pins_hash()


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _base_python() -> str:
    if sys.version_info[:2] == (3, 11):
        return sys.executable
    found = shutil.which(f"python{PYTHON_VERSION}")
    if found is None:
        raise UnavailableError(f"no python{PYTHON_VERSION} on PATH: SGLang {RELEASE}'s wheel is built for CPython 3.11")
    return found


def _run(argv: list[str], what: str, timeout: float, env: dict[str, str] | None = None) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired:
        raise UnavailableError(f"{what}: no result after {timeout:g} s") from None
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise UnavailableError(f"{what} failed (exit {done.returncode}):\n{tail}")


def _offline_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(STANDINS)}


def install(log: Callable[[str], None] = print) -> Path:
    """The cached virtualenv's Python, installed first if this pin set has none (one installer at a time, across
    processes); then the tiny model. Raises UnavailableError with the reason when either step fails."""
    try:
        return _install(log)
    except OSError as exc:  # the cache directory cannot be written, a program cannot be started
        raise UnavailableError(f"{CACHE}: {exc}") from None


def _install(log: Callable[[str], None]) -> Path:
    base, venv, model = home(), home() / "venv", home() / "model"
    with _locked("install"):
        if not (base / "venv.done").exists():
            shutil.rmtree(venv, ignore_errors=True)
            started = time.monotonic()
            log(f"live SGLang: installing {REQUIREMENTS.name} into {venv}")
            _run([_base_python(), "-m", "venv", str(venv)], "python3.11 -m venv", 120.0)
            pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--no-deps", "--disable-pip-version-check"]
            _run([*pip, "-q", "-r", str(REQUIREMENTS)], "pip install -r live-sglang-requirements.txt", INSTALL_TIMEOUT)
            (base / "venv.done").write_text(f"{time.monotonic() - started:.0f} s\n")
            log(f"live SGLang: installed in {time.monotonic() - started:.0f} s")
        if not (base / "model.done").exists():
            shutil.rmtree(model, ignore_errors=True)
            # Not through PYTHONPATH's stand-ins: a script's own directory comes first on sys.path anyway.
            _run([str(venv / "bin" / "python"), str(STANDINS / "make_tiny_model.py"), str(model)], "the tiny model",
                 300.0, env=_offline_env())  # fmt: skip
            (base / "model.done").write_text("made\n")
    return venv / "bin" / "python"


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - a loopback URL of our own
        return bytes(r.read())


@dataclass
class Server:
    """One real SGLang server on 127.0.0.1:port, its stdout and stderr appended to `log` (a restart appends to the
    same file, as a container runtime's log does)."""

    python: Path
    log: Path
    port: int
    flags: tuple[str, ...] = ()
    fault: str = ""  # a name of sglang_cpu/sitecustomize.py's FAULTS, or "" for none
    proc: subprocess.Popen[bytes] | None = None
    _out: IO[bytes] | None = None
    _lock: IO[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        model = self.python.parent.parent.parent / "model"
        return [str(self.python), "-m", "sglang.launch_server", "--model-path", str(model), "--host", "127.0.0.1",
                "--port", str(self.port), *BASE_FLAGS, *self.flags]  # fmt: skip

    def start(self, ready_timeout: float = READY_TIMEOUT) -> Server:
        """Start it (after any other live server of this machine's test runs has stopped) and wait until
        /health_generate answers 200; raise with the log's tail if it exits first or never answers."""
        CACHE.mkdir(parents=True, exist_ok=True)
        self._lock = open(CACHE / "server.lock", "w")  # held until stop()
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        env = {**_offline_env(), "SGLANG_USE_CPU_ENGINE": "1", "LIVE_SGLANG_FAULT": self.fault}
        self._out = open(self.log, "ab")  # the server's output until it exits
        self.proc = subprocess.Popen(self.command(), stdout=self._out, stderr=subprocess.STDOUT, env=env,
                                     stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + ready_timeout
        while not self.ready():
            if self.proc.poll() is not None:
                self.stop()
                raise AssertionError(f"SGLang exited {self.proc.returncode} before ready:\n{self.tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"SGLang not ready after {ready_timeout:g} s:\n{self.tail()}")
            time.sleep(0.5)
        return self

    def ready(self) -> bool:
        try:
            return _get(f"{self.url}/health_generate", timeout=10.0) is not None
        except (OSError, urllib.error.URLError):
            return False

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def metrics(self) -> bytes:
        return _get(f"{self.url}/metrics")

    def server_info(self) -> bytes:
        return _get(f"{self.url}/server_info")

    def generate(self, input_ids: list[int], max_new_tokens: int, *, ignore_eos: bool = True) -> dict[str, Any]:
        """One /generate call: its JSON answer, or {"error": why} when the server dropped it (a crash)."""
        body = {"input_ids": input_ids, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0,
                                                            "ignore_eos": ignore_eos}}  # fmt: skip
        headers = {"Content-Type": "application/json"}
        request = urllib.request.Request(f"{self.url}/generate", json.dumps(body).encode(), headers)  # noqa: S310
        try:
            with urllib.request.urlopen(request, timeout=READY_TIMEOUT) as r:  # noqa: S310 - loopback
                return dict(json.loads(r.read()))
        except (OSError, urllib.error.URLError, ValueError) as exc:
            return {"error": str(exc)}

    def abort_all(self) -> None:
        """Abort every request (POST /abort_request {"abort_all": true}): a stop then has nothing to drain."""
        request = urllib.request.Request(f"{self.url}/abort_request", b'{"abort_all": true}',  # noqa: S310
                                         {"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as r:  # noqa: S310 - loopback
            r.read()

    def generate_many(self, count: int, prompt: int, max_new_tokens: int, *, ignore_eos: bool = True) -> Requests:
        """`count` concurrent /generate calls of `prompt` tokens each, in threads; join() waits for them all."""
        return Requests(self, count, prompt, max_new_tokens, ignore_eos)

    def wait_exit(self, timeout: float = EXIT_TIMEOUT) -> int:
        """Wait for the server to exit on its own (after a fatal OOM); its exit code."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"SGLang still running {timeout:g} s later:\n{self.tail()}") from None
        finally:
            self._release()

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM to the server's pid, then SIGKILL to its process group (ours: start_new_session) after the
        deadline; any child left in the group is killed too. Its exit code (None if it never started)."""
        if self.proc is None:
            self._release()
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._release()
        return self.proc.returncode

    def _release(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # a child the server's own teardown left behind
        if self._out is not None:
            self._out.close()
            self._out = None
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Requests:
    """Concurrent /generate calls, each in its own thread; `results` once joined."""

    def __init__(self, server: Server, count: int, prompt: int, max_new_tokens: int, ignore_eos: bool) -> None:
        self.results: list[dict[str, Any]] = [{} for _ in range(count)]

        def call(i: int) -> None:
            ids = [5 + (i * 7 + j) % 300 for j in range(prompt)]
            self.results[i] = server.generate(ids, max_new_tokens, ignore_eos=ignore_eos)

        self.threads = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(count)]
        for t in self.threads:
            t.start()

    def join(self, timeout: float = READY_TIMEOUT) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self.threads), f"requests still open after {timeout:g} s"
        return self.results


def wait_for_line(log: Path, pattern: re.Pattern[str], timeout: float, server: Server | None = None) -> str:
    """The first line of the log matching pattern, polled with a deadline (and failing early if the server exits)."""
    deadline = time.monotonic() + timeout
    while True:
        for line in log.read_text(errors="replace").splitlines():
            if pattern.search(line):
                return line
        if server is not None and server.proc is not None and server.proc.poll() is not None:
            raise AssertionError(f"SGLang exited before a line matching {pattern.pattern!r}:\n{server.tail()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no line matching {pattern.pattern!r} after {timeout:g} s")
        time.sleep(0.2)


@dataclass
class Recording:
    """What one run of a scenario captured while the server was up (besides its log file)."""

    metrics: bytes = b""
    server_info: bytes = b""
    exit_codes: list[int | None] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)


# A scenario's driver: given a started server, make it do its thing; it returns once the server has exited or
# the scenario has stopped it. `up` is called while the server is up and idle, before the scenario's load: a live
# test compares the daemon's mirrored gauges with the real /metrics there.
Driver = Callable[[Server, Recording, Callable[[Server], None]], None]


def _crash(prompt: int, max_new_tokens: int, count: int = 1) -> Driver:
    """Requests that meet the injected fault: the server logs its OOM, tears itself down and exits."""

    def drive(server: Server, rec: Recording, up: Callable[[Server], None]) -> None:
        rec.metrics, rec.server_info = server.metrics(), server.server_info()
        up(server)
        requests = server.generate_many(count, prompt, max_new_tokens)
        rec.exit_codes.append(server.wait_exit())
        rec.results = requests.join()

    return drive


def _retract(server: Server, rec: Recording, up: Callable[[Server], None]) -> None:
    """8 concurrent requests of 20 tokens in, 200 out, under --schedule-conservativeness 0.1: SGLang admits more than
    the pool can grow into and retracts one while they decode (real pressure, no injection; ignore_eos off: with it
    on, SGLang reserves the whole output at admission and never retracts). At the first retraction the scenario
    scrapes /metrics (its counters moved) and stops the server: finishing 1600 tokens took minutes under load."""
    rec.server_info = server.server_info()
    up(server)
    requests = server.generate_many(8, 20, 200, ignore_eos=False)
    wait_for_line(server.log, RETRACT_LINE, READY_TIMEOUT, server)
    rec.metrics = server.metrics()
    server.abort_all()  # SIGTERM drains: the rest of 1600 tokens took minutes at load 12
    rec.exit_codes.append(server.stop())
    rec.results = requests.join()


def _graceful(server: Server, rec: Recording, up: Callable[[Server], None]) -> None:
    """A graceful stop under load: SIGTERM while 8 requests decode; SGLang drains them and exits 0, with no OOM.
    40 tokens out each, so that the drain (a few at a time in a 256-token pool) ends within the stop's deadline."""
    rec.server_info = server.server_info()
    up(server)
    requests = server.generate_many(8, 20, 40)
    wait_for_line(server.log, DECODE_LINE, READY_TIMEOUT, server)
    rec.metrics = server.metrics()
    rec.exit_codes.append(server.stop())
    rec.results = requests.join()


@dataclass(frozen=True)
class Scenario:
    name: str
    flags: tuple[str, ...]
    fault: str
    drive: Driver
    what: str


SCENARIOS = {s.name: s for s in (
    Scenario("generic", (), "generic", _crash(120, 4),
             "page size 1, one request of 120 tokens: the generic `Out of memory. Try to lower your batch size.`"),
    Scenario("prefill", ("--page-size", "16"), "prefill", _crash(120, 4),
             "page size 16, one request of 120 tokens: `Prefill out of memory.`"),
    Scenario("decode", ("--page-size", "16"), "decode", _crash(20, 40),
             "page size 16, one request of 20 tokens in, 40 out: `Decode out of memory.` at 30 tokens"),
    Scenario("req_slots", (), "req_slots", _crash(10, 4, count=6),
             "six concurrent requests of 10 tokens: `alloc_req_slots runs out of memory.` for a batch of 3+"),
    Scenario("retract", ("--schedule-conservativeness", "0.1"), "", _retract,
             "8 x (20 in, 200 out), schedule conservativeness 0.1: a real retraction, no injection"),
    Scenario("graceful", (), "", _graceful, "SIGTERM while 8 requests of 20 in, 40 out decode: drains, exits 0, no OOM"),
)}  # fmt: skip


def run(
    python: Path, scenario: Scenario, log: Path, port: int, up: Callable[[Server], None] = lambda s: None
) -> Recording:
    """Start a server for the scenario (appending to `log`), drive it, and make sure it is gone afterwards."""
    rec = Recording()
    server = Server(python, log, port, scenario.flags, scenario.fault)
    try:
        server.start()
        scenario.drive(server, rec, up)
    finally:
        server.stop()
    return rec


# Where `record` writes: the fast goldens' logs and the scraper's fixtures.
LOGS = ROOT / "tests" / "data" / "logs"
SCRAPE = ROOT / "tests" / "data" / "scrape"


def recorded_log(name: str) -> Path:
    return LOGS / f"live_{RELEASE.replace('.', '_')}_{name}.log"


def recorded_metrics(name: str) -> Path:
    return SCRAPE / f"v{RELEASE}-live-{name.replace('_', '-')}.prom"


def recorded_server_info(name: str) -> Path:
    return SCRAPE / f"server_info_live_{RELEASE.replace('.', '_')}_{name}.json"


# The servers' ports: below the kernel's ephemeral range and above the slices the suite's xdist workers take
# (tests/support/helpers.free_port: 400 a worker from 10000). SGLang binds its port a minute or more after it was
# chosen, and on a machine where other test runs take ports from those slices one was taken in between.
LIVE_PORTS = range(30000, 30400)


def free_port() -> int:
    """A port of LIVE_PORTS free on 127.0.0.1 now, tried from an offset of this process's own."""
    from tests.support.helpers import bindable

    for i in range(len(LIVE_PORTS)):
        port = LIVE_PORTS[(os.getpid() * 7 + i) % len(LIVE_PORTS)]
        if bindable(port):
            return port
    raise UnavailableError(f"no free port in {LIVE_PORTS}")


def record(names: list[str]) -> None:
    """Run each scenario once and write its real log, /metrics and /server_info where the fast tests read them.
    The expected files beside them are the author's to write and check (CONTRIBUTING.md "A new SGLang release")."""
    python = install()
    for name in names:
        started = time.monotonic()
        log = recorded_log(name)
        log.unlink(missing_ok=True)
        rec = run(python, SCENARIOS[name], log, free_port())
        recorded_metrics(name).write_bytes(rec.metrics)
        recorded_server_info(name).write_bytes(rec.server_info)
        print(f"{name}: {time.monotonic() - started:.0f} s, exit {rec.exit_codes}, log {log.relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.live_sglang", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install", help="install the pinned SGLang and make the tiny model (cached)")
    rec = sub.add_parser("record", help="run scenarios and write their real log, /metrics and /server_info")
    rec.add_argument("names", nargs="*", metavar="NAME", help=f"scenarios (default: all): {', '.join(SCENARIOS)}")
    args = parser.parse_args(argv)
    unknown = sorted(set(getattr(args, "names", [])) - set(SCENARIOS))
    if unknown:
        parser.error(f"no such scenario: {', '.join(unknown)}")
    try:
        if args.command == "install":
            print(install())
        else:
            record(args.names or list(SCENARIOS))
    except UnavailableError as exc:
        print(f"live SGLang unavailable: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
