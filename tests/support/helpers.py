"""Test helpers: run the real pipeline over text or bytes, as scan does."""

from __future__ import annotations

import copy
import fcntl
import functools
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from sglang_oom_exporter.catalog import load_catalog
from sglang_oom_exporter.detect.match import Matcher
from sglang_oom_exporter.detect.model import OomEvent
from sglang_oom_exporter.scan.serial import scan_stream

CATALOG = load_catalog()
MATCHER = Matcher(CATALOG)
# A directory every xdist worker of this run shares (set by conftest.py); None outside xdist.
SHARED_DIR: Path | None = None


# libyaml's parser (PyYAML's same safe constructors) where built in: about ten times the pure-Python speed.
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


@functools.cache
def _parsed_yaml(path: str) -> Any:
    with open(path, encoding="utf-8") as fh:
        return yaml.load(fh, Loader=YAML_LOADER)  # noqa: S506 - a SafeLoader


def load_yaml(path: str | Path) -> Any:
    """A YAML file parsed once per process, handed out as a copy each call (tests edit what they get)."""
    return copy.deepcopy(_parsed_yaml(str(path)))


def load_toml(path: Path) -> dict[str, Any]:
    """A TOML file (pyproject.toml), read with tomllib, or on Python 3.10 with tomli, its backport (a dev
    dependency there), so that no test skips on the oldest Python that requires-python allows."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    with path.open("rb") as fh:
        return tomllib.load(fh)


def dump_yaml(data: object) -> str:
    """YAML text in the data's key order, through libyaml where built in."""
    return yaml.dump(data, Dumper=YAML_DUMPER, sort_keys=False)


def once_per_run(name: str, compute: Callable[[], Any]) -> Any:
    """compute() once per test run, however many xdist workers ask: the first computes under a file lock and
    stores the JSON, the rest read it. The value always comes back through JSON, so every worker sees the
    same types. For results of external tools that cost seconds (kubernetes-validate, helm template)."""
    if SHARED_DIR is None:
        return json.loads(json.dumps(compute()))
    SHARED_DIR.mkdir(parents=True, exist_ok=True)
    path = SHARED_DIR / f"{name}.json"
    with open(SHARED_DIR / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(compute()))
            os.replace(tmp, path)
        return json.loads(path.read_text())


class Clock:
    """A settable clock: a test moves `now` by hand instead of waiting for time to pass."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def scan_bytes(data: bytes, *, chunk: int = 1 << 20, prefilter: bool = True, name: str = "t.log") -> list[OomEvent]:
    """All events of one input, read in chunks of the given size."""
    events, _ = scan_stream(CATALOG, MATCHER, name, io.BytesIO(data), prefilter=prefilter, chunk=chunk)
    return events


def scan_text(text: str, **kwargs: object) -> list[OomEvent]:
    """scan_bytes for text."""
    return scan_bytes(text.encode(), **kwargs)  # type: ignore[arg-type]


def summary(events: list[OomEvent]) -> list[tuple[str, bool, tuple[str, ...], str]]:
    """What identifies an event: kind, fatal, ranks, location. Enough to compare two runs."""
    return [(e.kind, e.fatal, e.ranks, e.location) for e in events]


def frames(*funcs: str, path: str = "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py") -> str:
    """Traceback frame lines for these functions."""
    return "".join(f'  File "{path}", line {100 + i}, in {f}\n    do_it()\n' for i, f in enumerate(funcs))


OPENSSL_REQ = ("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
               "-days", "1")  # fmt: skip
SAN_127 = ("-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost")


def openssl_cert(directory: Path, name: str = "server") -> tuple[Path, Path]:
    """A throwaway self-signed certificate for 127.0.0.1; skips when the openssl CLI is missing."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI is needed to make a test certificate")
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        [*OPENSSL_REQ, "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={name}", *SAN_127],
        check=True,
        capture_output=True,
    )
    return cert, key


# The least time a wait is given. Its timeout is a hang guard, never a speed limit: at a load average of 12 on
# 2 cores a step that takes 1 s alone takes 6-10 s, so a smaller timeout is raised to this (a wait that succeeds
# returns as soon as its state holds, so an honest test is no slower for it).
WAIT_FLOOR_SECONDS = 60.0


def wait_until(condition: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.05) -> Any:
    """The tests' one wait: poll `condition` until it returns something truthy (returned) or `timeout` seconds
    (at least WAIT_FLOOR_SECONDS) pass (AssertionError naming `what`). Never sleep to synchronise; wait for the
    state instead."""
    timeout = max(timeout, WAIT_FLOOR_SECONDS)
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


@functools.cache
def port_slice() -> range:
    """This xdist worker's own ports, below the kernel's ephemeral range: a port the kernel hands out for `bind(0)`
    or for any outgoing connection can be taken between the test asking and its server (a podman pod, seconds
    later) binding it, which failed a pod with "Address already in use" on a loaded CI machine.

    The slice is held with a lock file for the worker's life, so that two test runs on one machine (CI beside a
    developer's loop) never share one: with slices picked by worker number alone, two runs' gw0 both started
    daemons on 10016 and one of them exited "Address already in use"."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    slices = max(1, (low - 10000) // PORTS_PER_WORKER)
    first = int(worker) if worker.isdigit() else 0
    locks = Path(os.environ.get("TMPDIR", "/tmp")) / f"sglang-oom-exporter-test-ports-{os.getuid()}"
    locks.mkdir(exist_ok=True)
    for i in range(slices):
        index = (first + i) % slices
        fh = open(locks / f"slice-{index}.lock", "w")  # held (and so the slice) until the worker exits
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.close()
            continue
        _HELD.append(fh)
        start = 10000 + index * PORTS_PER_WORKER
        return range(start, start + PORTS_PER_WORKER)
    raise AssertionError(f"every one of the {slices} test port slices is held by another test process")


_HELD: list[Any] = []  # the lock files of the slices this process holds
PORTS_PER_WORKER = 400
_next_port = 0


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, that nothing but this worker's next calls will be given: ports are handed
    out in turn from the worker's own slice (`port_slice`), skipping any that is bound."""
    global _next_port
    ports = port_slice()
    for _ in range(len(ports)):
        port = ports[_next_port % len(ports)]
        _next_port += 1
        if bindable(port):
            return port
    raise AssertionError(f"no free port in {ports}")


def bindable(port: int) -> bool:
    """Whether a TCP socket can bind this port on 127.0.0.1 now."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
