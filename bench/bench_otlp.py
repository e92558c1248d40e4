"""The OTLP receiver's cost beside the file path's: one scheduler log counted by `serve`, once sent as OTLP/HTTP
log records (protobuf, batches of --batch records, as a collector's batch processor sends them) and once appended
to a followed file.

Usage::

    python bench/bench_otlp.py [--lines 200000] [--oom-every 10000] [--batch 1000] [--gzip] [--keep]

1. The log comes from bench_scan.py's cache (bench/out/sched-<lines>-every<n>.log and its truth file), generated
   with gen_scheduler_log.py when missing (deleted at the end unless --keep).
2. The requests are encoded before the clock starts (the shipper's cost is not ours): one resource per request
   with the k8s.* attributes of one container run, each line a record with its time and log.file.record_number.
3. OTLP: `serve --state-dir S --otlp-listen 127.0.0.1:P`; the clock runs from the first request until
   /metrics shows prefill and decode equal to the truth; the requests go one after another over one kept-alive
   connection (each answered only once its records are fsynced in the spool). The daemon's CPU (utime+stime
   from /proc) is read before the first request and once the counts are exact.
4. File: `serve --state-dir S FILE` on an empty file; the log's bytes are appended at once; the same clock.

Printed: wall seconds, records per second (lines / wall), daemon CPU seconds, CPU seconds per MB received
(request bodies for OTLP, file bytes for the file path) and per MB of log text. Exit 1 on wrong counts.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_scan
import benchlib as bl
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs

RESOURCE = {"k8s.namespace.name": "llm", "k8s.pod.name": "sglang-0", "k8s.pod.uid": "u1",
            "k8s.container.name": "server", "k8s.container.restart_count": "0"}  # fmt: skip
T0 = 1_764_000_000_000_000_000


def encode(lines: list[bytes], batch: int, compress: bool) -> list[bytes]:
    """The requests' bodies, batch records each."""
    bodies = []
    for start in range(0, len(lines), batch):
        rl = ResourceLogs(scope_logs=[ScopeLogs()])
        rl.resource.attributes.extend(KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in RESOURCE.items())
        records = rl.scope_logs[0].log_records
        for i, line in enumerate(lines[start : start + batch], start=start):
            record = LogRecord(time_unix_nano=T0 + i, body=AnyValue(string_value=line.decode("utf-8", "replace")))
            record.attributes.append(KeyValue(key="log.file.record_number", value=AnyValue(int_value=i + 1)))
            records.append(record)
        body = ExportLogsServiceRequest(resource_logs=[rl]).SerializeToString()
        bodies.append(gzip.compress(body, 1) if compress else body)
    return bodies


def counted(port: int, truth: dict[str, int]) -> bool:
    r = bl.http_get(port, "/metrics", timeout=5.0)
    if r is None or r[0] != 200:
        return False
    samples = bl.parse_prom(r[1])
    got = {
        kind: sum(v for (name, labels), v in samples.items()
                  if name == "sglang_oom_events_total" and ("kind", kind) in labels)
        for kind in ("prefill", "decode")
    }  # fmt: skip
    return got == {"prefill": truth["prefill"], "decode": truth["decode"]}


def run_otlp(tmp: Path, bodies: list[bytes], truth: dict[str, int], compress: bool) -> tuple[float, float]:
    port, otlp_port = bl.free_port(), bl.free_port()
    argv = bl.ours_argv(port, [], state_dir=str(tmp / "otlp-state"), extra=["--otlp-listen", f"127.0.0.1:{otlp_port}"])
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        bl.wait_for(lambda: bl.ours_ready(port), 60, what="ours ready")
        cpu0, t0 = bl.cpu_seconds(proc.pid), time.perf_counter()
        conn = http.client.HTTPConnection("127.0.0.1", otlp_port, timeout=60)
        headers = {"Content-Type": "application/x-protobuf"}
        if compress:
            headers["Content-Encoding"] = "gzip"
        for body in bodies:
            while True:
                conn.request("POST", "/v1/logs", body, headers)
                answer = conn.getresponse()
                answer.read()
                if answer.status == 200:
                    break
                if answer.status not in (429, 503):
                    raise RuntimeError(f"OTLP answered {answer.status}")
                time.sleep(float(answer.headers.get("Retry-After", "1")))
        conn.close()
        bl.wait_for(lambda: counted(port, truth), 600, what="OTLP counts")
        return time.perf_counter() - t0, bl.cpu_seconds(proc.pid) - cpu0
    finally:
        proc.terminate()
        proc.wait(30)


def run_file(tmp: Path, log: Path, truth: dict[str, int]) -> tuple[float, float]:
    port = bl.free_port()
    target = tmp / "sglang.log"
    target.write_bytes(b"")
    argv = bl.ours_argv(port, [str(target)], state_dir=str(tmp / "file-state"))
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        bl.wait_for(lambda: bl.ours_ready(port), 60, what="ours ready")
        cpu0, t0 = bl.cpu_seconds(proc.pid), time.perf_counter()
        with open(log, "rb") as fi, open(target, "ab") as fo:
            shutil.copyfileobj(fi, fo, 8 << 20)
        bl.wait_for(lambda: counted(port, truth), 600, what="file counts")
        return time.perf_counter() - t0, bl.cpu_seconds(proc.pid) - cpu0
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--oom-every", type=int, default=10_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--gzip", action="store_true", help="gzip each request (level 1)")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    log, truth, generated = bench_scan.ensure_log(args.lines, args.oom_every)
    try:
        data = log.read_bytes()
        lines = data.splitlines()
        bodies = encode(lines, args.batch, args.gzip)
        sent = sum(len(b) for b in bodies)
        print(f"log: {len(lines)} lines, {len(data) / 1e6:.1f} MB; OTLP: {len(bodies)} requests, {sent / 1e6:.1f} MB"
              f"{' gzip' if args.gzip else ''}; truth prefill={truth['prefill']} decode={truth['decode']}")  # fmt: skip
        with tempfile.TemporaryDirectory() as tmp:
            rows = [("otlp", *run_otlp(Path(tmp), bodies, truth, args.gzip), sent),
                    ("file", *run_file(Path(tmp), log, truth), len(data))]  # fmt: skip
        print(f"{'path':6} {'wall s':>8} {'records/s':>10} {'CPU s':>7} {'CPU s/MB in':>12} {'CPU s/MB log':>13}")
        for name, wall, cpu, received in rows:
            print(f"{name:6} {wall:8.2f} {len(lines) / wall:10.0f} {cpu:7.2f} {cpu / (received / 1e6):12.3f} "
                  f"{cpu / (len(data) / 1e6):13.3f}")  # fmt: skip
    finally:
        if generated and not args.keep:
            log.unlink(missing_ok=True)
            Path(f"{log}.truth.json").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
