"""The command line as a user runs it: exit codes, stdin, --sample, JSON shape, --help.

Most tests call cli.main() in this process (a subprocess costs about 0.3 s of CPU to start); those about the
process itself (a stdin pipe, the exit status a shell sees) run `python -m sglang_oom_exporter`.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest

from sglang_oom_exporter.cli import main, sample_path
from tests.support.helpers import CATALOG

HERE = os.path.dirname(__file__)
OOM = "[2026-03-14 22:07:33 TP0] Prefill out of memory. Try to lower your batch size.\nTry to allocate 16384 tokens.\nAvailable tokens: 6100 (available_size=6000 + evictable_size=100)\n\n"
RETRACT = "[2026-03-14 22:01:05 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_token_ratio: 0.4 -> 0.5\n"


def _process(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "sglang_oom_exporter", *args], input=stdin, capture_output=True, timeout=60, check=False
    )


def test_sample_shows_every_fatal_kind_in_text(cli):
    proc = cli("scan", "--sample")
    assert proc.returncode == 0
    out = proc.stdout.decode()
    assert "fix: Lower --chunked-prefill-size" in out
    assert "requested_tokens=16384 available_tokens=6100" in out
    assert "total: 12 events (8 fatal), 3 retraction events retracting 6 requests, 125 lines read" in out


def test_sample_text_names_the_sample_and_says_each_fix_once(cli):
    out = cli("scan", "--sample").stdout.decode()
    heads = [line for line in out.splitlines() if " ranks=" in line]
    assert len(heads) == 12
    assert [h.rsplit(" ", 1)[1] for h in heads][:3] == ["sample.log:6", "sample.log:9", "sample.log:12"]
    assert sample_path() not in out
    assert out.count("    advice: Fix: ") == 0
    # Each event block: one fix line, and an advice line only where it says more (a suggested value).
    blocks = out.split(" ranks=")[1:]
    assert [b.count("    fix: ") for b in blocks] == [1] * 12
    assert sum("    advice: Suggested: " in b for b in blocks) == sum("    advice: " in b for b in blocks)


def test_sample_json_has_the_documented_shape(cli):
    proc = cli("scan", "--sample", "--format", "json")
    data = json.loads(proc.stdout)
    assert list(data["counts"]) == [*CATALOG.ids, "crash"]
    assert data["counts"] == {
        "prefill": 2, "decode": 2, "req_slots": 1, "unknown": 0, "retract": 3, "startup": 1,
        "cuda_oom": 1, "mamba": 1, "memory_leak": 1, "pd_prealloc": 0, "crash": 0,
    }  # fmt: skip
    assert data["retractions"] == {"events": 3, "retracted_requests": 6}
    decode = next(e for e in data["events"] if e["kind"] == "decode")
    assert decode["ranks"] == ["TP0", "TP1"]
    assert decode["source"] == f"{sample_path()}:12"
    assert (decode["requested_tokens"], decode["available_tokens"], decode["time"]) == (96, 40, "2026-03-14T22:07:33")
    assert decode["remediation"]["steps"][0]["flag"] == "--max-running-requests"


def test_fail_on_oom_exits_1_only_for_fatal_events(cli, tmp_path):
    fatal, benign = tmp_path / "fatal.log", tmp_path / "benign.log"
    fatal.write_text(OOM)
    benign.write_text(RETRACT)
    # A process: --fail-on-oom is for shells and CI, which see the real exit status.
    assert _process("scan", "--fail-on-oom", str(fatal)).returncode == 1
    assert cli("scan", "--fail-on-oom", str(benign)).returncode == 0
    assert cli("scan", str(fatal)).returncode == 0


def test_stdin_reports_dash_locations():
    # A process: '-' reads the real stdin pipe and the report goes to the real stdout.
    proc = _process("scan", "--format", "json", "-", stdin=(RETRACT + OOM).encode())
    assert proc.returncode == 0
    data = json.loads(proc.stdout)
    assert [e["source"] for e in data["events"]] == ["-:1", "-:2"]


def test_gz_input(cli, tmp_path):
    path = tmp_path / "old.log.gz"
    path.write_bytes(gzip.compress(OOM.encode()))
    data = json.loads(cli("scan", "--format", "json", str(path)).stdout)
    assert data["counts"]["prefill"] == 1


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (("scan",), "give at least one PATH"),
        (("scan", "/nonexistent/sglang.log"), "cannot read /nonexistent/sglang.log"),
        (("scan", "--prefix-regex", "(", "-"), "--prefix-regex"),
        ((), "usage"),
    ],
)
def test_usage_errors_exit_2_with_one_reason(cli, args, reason):
    proc = cli(*args, stdin=b"")
    assert proc.returncode == 2
    assert reason in proc.stderr.decode()


def test_a_directory_is_unreadable_input(cli, tmp_path):
    proc = cli("scan", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.decode().startswith("sglang-oom-exporter: cannot read")


def test_truncated_gzip_keeps_going_to_a_clear_error(cli, tmp_path):
    path = tmp_path / "cut.log.gz"
    path.write_bytes(gzip.compress((OOM * 50).encode())[:200])
    proc = cli("scan", str(path))
    assert proc.returncode == 2
    assert "error reading" in proc.stderr.decode()


def test_bad_catalog_exits_2_with_file_and_line(cli, tmp_path):
    bad = tmp_path / "catalog.yaml"
    bad.write_text("version: 1\nkinds:\n  - id: Bad-Id\n")
    proc = cli("scan", "--catalog", str(bad), "-", stdin=b"")
    assert proc.returncode == 2
    assert f"{bad}:3: kinds[0].id" in proc.stderr.decode()


def test_help_names_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["scan", "--help"])
    out = capsys.readouterr().out
    for option in ("--format", "--fail-on-oom", "--sample", "--catalog", "--prefix-regex", "--no-prefilter"):
        assert option in out


def test_server_args_turn_the_fix_into_numbers(cli, tmp_path):
    log, info = tmp_path / "a.log", tmp_path / "server_info.json"
    log.write_text(OOM)
    info.write_text(json.dumps({"chunked_prefill_size": 16384, "max_running_requests": 512, "version": "0.5.6"}))
    data = json.loads(cli("scan", "--format", "json", "--server-args", str(info), str(log)).stdout)
    (event,) = data["events"]
    assert event["context"]["server_args"]["chunked_prefill_size"] == 16384
    assert event["suggestions"][0] == {
        "flag": "--chunked-prefill-size", "current": 16384, "suggested": 4096, "when": "",
        "rule": "the largest power of two that fits the 6100 available tokens (the prefill asked for 16384), "
                "never below 512",
    }  # fmt: skip
    text = cli("scan", "--server-args", str(info), str(log)).stdout.decode()
    assert "suggest: --chunked-prefill-size 16384 -> 4096" in text


def test_server_args_that_are_not_json_exit_2(cli, tmp_path):
    info = tmp_path / "server_info.json"
    info.write_text("<html>nope</html>")
    proc = cli("scan", "--server-args", str(info), "-", stdin=b"")
    assert proc.returncode == 2
    assert "not server-info JSON" in proc.stderr.decode()


def test_catalog_without_the_fallback_kind_exits_2_with_a_clear_error(cli, tmp_path):
    # It used to pass the loader and die later with a cut-short traceback: KeyError: 'unknown'.
    import yaml

    from sglang_oom_exporter.catalog import default_catalog_path

    with open(default_catalog_path(), encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    data["kinds"] = [k for k in data["kinds"] if k["id"] != "unknown"]
    path = tmp_path / "no-unknown.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    cut = (
        "Traceback (most recent call last):\n"
        + '  File "/sglang/srt/mem_cache/allocator.py", line 9, in alloc_token_slots\n'
    )
    proc = cli("scan", "--catalog", str(path), "-", stdin=cut.encode())
    assert proc.returncode == 2
    err = proc.stderr.decode()
    assert f"{path}:1: fallback_kind: names unknown kind 'unknown'" in err
    assert "Traceback" not in err
