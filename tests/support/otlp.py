"""Sending logs as a shipper does: the OpenTelemetry SDK's own OTLP/HTTP log exporter (protobuf), and a hand-built
OTLP JSON request (the SDK has no JSON mode), both to a receiver on loopback.

`records()` turns a log file's lines into log records of one container run, with the attributes the collector's
k8sattributes processor and filelog receiver set; `export()` sends them through OTLPLogExporter.export().
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence

from opentelemetry._logs import LogRecord
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.sdk._logs import ReadableLogRecord
from opentelemetry.sdk.resources import Resource

T0 = 1_764_000_000_000_000_000  # the first record's time (ns); each next line one microsecond later


def pod_resource(ns: str, pod: str, container: str = "server", uid: str = "u1", restart: int = 0) -> Resource:
    """A container run's resource, as k8sattributes and the filelog container parser name it."""
    return Resource(
        {
            "k8s.namespace.name": ns,
            "k8s.pod.name": pod,
            "k8s.pod.uid": uid,
            "k8s.container.name": container,
            "k8s.container.restart_count": str(restart),
        }
    )


def log_lines(data: bytes) -> list[bytes]:
    """A log's lines without their newline (a last line without one is a line too)."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def records(resource: Resource, lines: Sequence[bytes], first: int = 0) -> list[ReadableLogRecord]:
    """One record per line (a string body, or bytes where the line is not UTF-8), numbered from `first`."""
    out = []
    for i, line in enumerate(lines, start=first):
        try:
            body: str | bytes = line.decode("utf-8")
        except UnicodeDecodeError:
            body = line
        record = LogRecord(
            timestamp=T0 + i * 1000, observed_timestamp=T0 + i * 1000, body=body,
            attributes={"log.iostream": "stderr", "log.file.record_number": i + 1},
        )  # fmt: skip
        out.append(ReadableLogRecord(record, resource=resource))
    return out


def exporter(url: str, timeout: float = 20.0, headers: dict[str, str] | None = None) -> OTLPLogExporter:
    """The SDK's OTLP/HTTP log exporter (protobuf) for a receiver's base URL."""
    return OTLPLogExporter(endpoint=f"{url}/v1/logs", timeout=timeout, headers=headers)


def export(url: str, batch: Sequence[ReadableLogRecord], timeout: float = 20.0) -> str:
    """Send one batch with the SDK exporter; its result's name (SUCCESS or FAILURE)."""
    sender = exporter(url, timeout)
    try:
        return str(sender.export(batch).name)
    finally:
        sender.shutdown()


def json_request(resource: dict[str, str], lines: Sequence[str], first: int = 0) -> bytes:
    """An OTLP JSON ExportLogsServiceRequest, written by hand as the specification's examples are."""
    attrs = [{"key": k, "value": {"stringValue": v}} for k, v in resource.items()]
    logs = [
        {"timeUnixNano": str(T0 + i * 1000), "body": {"stringValue": line},
         "traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174",
         "attributes": [{"key": "log.file.record_number", "value": {"intValue": str(i + 1)}}]}
        for i, line in enumerate(lines, start=first)
    ]  # fmt: skip
    request = {"resourceLogs": [{"resource": {"attributes": attrs}, "scopeLogs": [{"scope": {}, "logRecords": logs}]}]}
    return json.dumps(request).encode()


def post(url: str, body: bytes, headers: dict[str, str], path: str = "/v1/logs", method: str = "POST"):
    """(status, headers, body) of one raw request; an HTTP error's too."""
    data = body if method == "POST" else None
    request = urllib.request.Request(f"{url}{path}", data=data, method=method, headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=10) as r:  # noqa: S310 (a loopback http URL)
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def attributes(attrs: Mapping[str, str]) -> list[KeyValue]:
    """String attributes as OTLP KeyValues."""
    return [KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in attrs.items()]


def proto_request(resource: Mapping[str, str], bodies: Sequence[str], t: int = 5) -> ExportLogsServiceRequest:
    """A request of one resource whose records carry bodies, all at time t (ns)."""
    logs = [logs_pb2.LogRecord(time_unix_nano=t, body=AnyValue(string_value=b)) for b in bodies]
    rl = logs_pb2.ResourceLogs(scope_logs=[logs_pb2.ScopeLogs(log_records=logs)])
    rl.resource.attributes.extend(attributes(resource))
    return ExportLogsServiceRequest(resource_logs=[rl])
