"""`scan`'s start-up costs: what a scan imports, how inputs are checked, when a pool of workers starts.

bench/bench_scan_files.py measures the time; these tests pin the mechanisms, so a change that brings a cost back
fails here rather than only showing up as a slower benchmark.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from sglang_oom_exporter.scan.run import scan_paths
from sglang_oom_exporter.scan.serial import InputError, check_readable
from tests.support.helpers import CATALOG

RETRACT = b"[2026-03-14 22:01:05 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_token_ratio: 0.4 -> 0.5\n"


def test_check_readable_names_the_input(tmp_path):
    ok = tmp_path / "ok.log"
    ok.write_bytes(b"")
    check_readable(str(ok))
    with pytest.raises(InputError, match=r"cannot read .*missing\.log: No such file or directory"):
        check_readable(str(tmp_path / "missing.log"))
    with pytest.raises(InputError, match=r"cannot read .*: Is a directory"):
        check_readable(str(tmp_path))


def test_scan_imports_no_serve_render_or_http_code(tmp_path):
    path = tmp_path / "r.log"
    path.write_bytes(RETRACT)
    code = (
        "import io, contextlib, json, sys\n"
        "from sglang_oom_exporter.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        f"    rc = main(['scan', '--format', 'json', '--jobs', '1', {str(path)!r}])\n"
        "print(json.dumps([rc, json.loads(out.getvalue())['counts']['retract'], sorted(sys.modules)]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, check=True)
    rc, retract, modules = json.loads(proc.stdout)
    assert (rc, retract) == (0, 1)
    ours = {m for m in modules if m.startswith("sglang_oom_exporter.")}
    for package in ("config", "render", "web", "metrics", "serve", "daemon.loop", "sources.http"):
        name = f"sglang_oom_exporter.{package}"
        assert not {m for m in ours if m == name or m.startswith(name + ".")}, package
    for heavy in ("prometheus_client", "http.client", "http.server", "urllib.request", "ssl", "watchdog"):
        assert heavy not in modules, heavy


def test_serve_help_still_quotes_the_default_listen_address():
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_oom_exporter", "serve", "--help"], capture_output=True, timeout=60, check=True
    )
    assert "HTTP listen address (default: :9877)" in proc.stdout.decode()


def _pool_calls(monkeypatch) -> list[int]:
    """Record every call of scan_parallel (made in this process, before any worker starts)."""
    from sglang_oom_exporter.scan import parallel as scanpar

    calls: list[int] = []
    real = scanpar.scan_parallel

    def spy(*args, **kwargs):
        calls.append(kwargs["jobs"])
        return real(*args, **kwargs)

    monkeypatch.setattr(scanpar, "scan_parallel", spy)
    return calls


def test_a_pool_starts_only_above_min_parallel_bytes(tmp_path, monkeypatch):
    calls = _pool_calls(monkeypatch)
    paths = []
    for i in range(3):
        path = tmp_path / f"{i}.log"
        path.write_bytes(b"noise\n" * 100 + RETRACT * (i + 1))
        paths.append(str(path))
    size = sum(os.path.getsize(p) for p in paths)
    serial = scan_paths(CATALOG, paths).to_json()
    assert scan_paths(CATALOG, paths, jobs=2, min_parallel_bytes=size + 1).to_json() == serial
    assert calls == []  # below the bound: read in this process
    assert scan_paths(CATALOG, paths, jobs=2, min_parallel_bytes=size).to_json() == serial
    assert calls == [2]
    assert serial["counts"]["retract"] == 6
    assert scan_paths(CATALOG, paths, jobs=2).to_json() == serial  # the default bound: 16 MiB
    assert calls == [2]


def test_stdin_between_files_in_a_pool_keeps_input_order(tmp_path, monkeypatch):
    calls = _pool_calls(monkeypatch)
    first, last = tmp_path / "a.log", tmp_path / "b.log"
    first.write_bytes(RETRACT)
    last.write_bytes(b"noise\n" + RETRACT * 2)
    piped = b"x\n" + RETRACT * 3 + b"y"

    def run(jobs: int) -> dict:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(piped)))
        return scan_paths(CATALOG, [str(first), "-", str(last)], jobs=jobs, min_parallel_bytes=0).to_json()

    serial, parallel = run(1), run(2)
    assert calls == [2]
    assert parallel == serial
    assert [(i["path"], i["lines_read"], i["events"]) for i in parallel["inputs"]] == [
        (str(first), 1, 1),
        ("-", 5, 3),
        (str(last), 3, 2),
    ]
