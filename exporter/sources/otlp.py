"""OTLP/HTTP logs as a source: an ExportLogsServiceRequest's bytes -> log lines per source, in order.

    POST /v1/logs body (protobuf or JSON, maybe gzip) --decode()--> ExportLogsServiceRequest
        --lines()--> {SpoolPath: [Line(body, identity)]} --> otlpspool.Spool (durable, deduplicated)

The decoding is the OpenTelemetry project's own (opentelemetry-proto's generated classes, and protobuf's
json_format for the JSON encoding the OTLP specification defines). Each record's source is named by its
attributes, the record's over its resource's: a container run by `k8s.namespace.name`, `k8s.pod.name`,
`k8s.pod.uid`, `k8s.container.name` and `k8s.container.restart_count` (what the collector's k8sattributes
processor and the filelog receiver's container parser set), else by a kubelet pod log path in `log.file.path`,
else by `log.file.path` itself, else by `service.name`. A container run is spooled under the kubelet's own
layout (<ns>_<pod>_<uid>/<container>/<restart>.log), so its events carry the labels /var/log/pods gives.
Nothing here touches the disk or the network: the HTTP edge (web/otlp.py) and the spool call it.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import zlib
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from .discover import pod_log_ref
from .otlpspool import FILE_DIR, POD_DIR, Line

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
CONTENT_TYPES = (PROTOBUF, JSON)
# Attributes that name a record's place in its file (the filelog receiver's include_file_record_number and
# include_file_record_offset) or its stream: part of the record's identity when present.
PLACE_ATTRIBUTES = ("log.file.record_number", "log.file.record_offset", "log.iostream")
# Keys a structured body (Fluent Bit sends its record map) keeps its log line under, in order of preference.
BODY_KEYS = ("log", "message", "msg", "body")
_UNSAFE = re.compile(r"[^A-Za-z0-9.-]+")


class OtlpError(Exception):
    """A request the client must fix (or cannot send at all): its HTTP status and the reason, for the answer."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def media_type(content_type: str | None) -> str:
    """The media type of a Content-Type header (lower case, parameters dropped); 415 for one OTLP has not."""
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    if kind not in CONTENT_TYPES:
        raise OtlpError(415, f"unsupported content type {kind or 'none'!r}: OTLP/HTTP sends {PROTOBUF} or {JSON}")
    return kind


def decode(body: bytes, content_type: str | None, content_encoding: str | None, limit: int) -> ExportLogsServiceRequest:
    """The request in body; OtlpError(400) when it does not parse, 413 when it inflates past limit bytes."""
    kind = media_type(content_type)
    encoding = (content_encoding or "identity").strip().lower()
    if encoding == "gzip":
        body = _gunzip(body, limit)
    elif encoding not in ("identity", ""):
        raise OtlpError(415, f"unsupported content encoding {encoding!r}: send gzip or none")
    request = ExportLogsServiceRequest()
    if kind == PROTOBUF:
        try:
            request.ParseFromString(body)
        except (DecodeError, RuntimeError, ValueError) as exc:
            raise OtlpError(400, f"malformed protobuf: {exc or 'cannot parse ExportLogsServiceRequest'}") from exc
        return request
    try:
        raw = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise OtlpError(400, f"malformed JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise OtlpError(400, "malformed JSON: the request is not an object")
    _drop_hex_ids(raw)
    try:
        json_format.ParseDict(raw, request, ignore_unknown_fields=True)
    except (json_format.ParseError, TypeError, ValueError) as exc:
        raise OtlpError(400, f"malformed OTLP JSON: {exc}") from exc
    return request


def _gunzip(body: bytes, limit: int) -> bytes:
    """Inflate a gzip body, refusing (413) past limit bytes: a small bomb must not take the memory."""
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        data = inflater.decompress(body, limit + 1)
        if len(data) > limit:
            raise OtlpError(413, f"the gzip body inflates past {limit} bytes")
        if not inflater.eof:
            raise OtlpError(400, "malformed gzip body: truncated")
    except (zlib.error, gzip.BadGzipFile) as exc:
        raise OtlpError(400, f"malformed gzip body: {exc}") from exc
    return data


def _drop_hex_ids(raw: dict[str, Any]) -> None:
    """OTLP JSON writes traceId and spanId in hex, not protobuf JSON's base64: unused here, so dropped unread."""
    for resource in _items(raw, "resourceLogs", "resource_logs"):
        for scope in _items(resource, "scopeLogs", "scope_logs"):
            for record in _items(scope, "logRecords", "log_records"):
                for key in ("traceId", "spanId", "trace_id", "span_id"):
                    record.pop(key, None)


def _items(parent: dict[str, Any], camel: str, snake: str) -> list[dict[str, Any]]:
    """The objects of a list field (either JSON name); anything else is left for the parser to refuse."""
    value = parent.get(camel, parent.get(snake))
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def response(kind: str, rejected: int = 0, message: str = "") -> bytes:
    """The ExportLogsServiceResponse of a success, in the request's encoding (partial success when rejected)."""
    answer = ExportLogsServiceResponse()
    if rejected or message:
        answer.partial_success.rejected_log_records = rejected
        answer.partial_success.error_message = message
    if kind == JSON:
        return json.dumps(json_format.MessageToDict(answer), separators=(",", ":")).encode()
    return bytes(answer.SerializeToString())


def lines(request: ExportLogsServiceRequest) -> dict[str, list[Line]]:
    """Each record's body as a log line, by the spool path of its source, in the request's order.

    Two records of one source with the same time, body and place are told apart by their occurrence in the
    request, so a retried request gives the same identities and a repeated line within one is kept.
    """
    out: dict[str, list[Line]] = {}
    seen: dict[tuple[str, bytes], int] = {}
    for resource_logs in request.resource_logs:
        resource = _attributes(resource_logs.resource.attributes)
        for scope_logs in resource_logs.scope_logs:
            for record in scope_logs.log_records:
                attrs = {**resource, **_attributes(record.attributes)} if record.attributes else resource
                path = spool_path(attrs)
                text = body_text(record.body)
                data = text.encode("utf-8", "surrogateescape")
                data = data if data.endswith(b"\n") else data + b"\n"
                # A record without its own time (a filelog receiver that parses none) is told by when the shipper
                # saw it: a retried request carries the same, a re-read file does not.
                when = record.time_unix_nano or record.observed_time_unix_nano
                place = "\x00".join(attrs.get(k, "") for k in PLACE_ATTRIBUTES)
                key = hashlib.blake2b(f"{when}\x00{place}\x00".encode() + data, digest_size=16).digest()
                n = seen.get((path, key), 0)
                seen[(path, key)] = n + 1
                identity = key if n == 0 else hashlib.blake2b(key + n.to_bytes(4, "big"), digest_size=16).digest()
                out.setdefault(path, []).append(Line(data, identity))
    return out


def _attributes(values: Any) -> dict[str, str]:
    """Attribute key -> its value as text (scalars only: a source is named by strings and numbers)."""
    out: dict[str, str] = {}
    for kv in values:
        if isinstance(kv, KeyValue):
            value = kv.value
            kind = value.WhichOneof("value")
            if kind in ("string_value", "int_value", "double_value", "bool_value"):
                out[kv.key] = str(getattr(value, kind))
    return out


def body_text(value: AnyValue) -> str:
    """A record body as the text of its log line: a string as it is, a map by its log key, else as JSON."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return str(value.string_value)
    if kind == "bytes_value":
        return value.bytes_value.decode("utf-8", "surrogateescape")
    if kind == "kvlist_value":
        fields = {kv.key: kv.value for kv in value.kvlist_value.values}
        for key in BODY_KEYS:
            if key in fields and fields[key].WhichOneof("value") == "string_value":
                return str(fields[key].string_value)
    if kind is None:
        return ""
    if kind in ("int_value", "double_value", "bool_value"):
        return str(getattr(value, kind))
    return json.dumps(json_format.MessageToDict(value), separators=(",", ":"))


def spool_path(attrs: dict[str, str]) -> str:
    """Where a source's lines are spooled, relative to the spool root: its identity as a path."""
    ns, pod = attrs.get("k8s.namespace.name", ""), attrs.get("k8s.pod.name", "")
    container = attrs.get("k8s.container.name", "")
    file_path = attrs.get("log.file.path", "")
    if not (ns and pod and container) and file_path:
        ref = _kubelet_ref(file_path)
        if ref is not None:  # a kubelet pod log read without the k8sattributes processor: its path names it
            return _pod_path(ref.namespace, ref.pod, ref.uid, ref.container, str(ref.restart))
    if ns and pod and container:
        restart = attrs.get("k8s.container.restart_count", "0")
        return _pod_path(ns, pod, attrs.get("k8s.pod.uid", "") or "nouid", container, restart)
    name = file_path.strip("/") or attrs.get("service.name", "") or "unnamed"
    return f"{FILE_DIR}/{_safe(name.replace('/', '_'))}.log"


def _kubelet_ref(path: str) -> Any:
    parts = path.rstrip("/").split("/")
    if len(parts) < 4:
        return None
    root = "/".join(parts[:-3]) or "/"
    return pod_log_ref(root, path)


def _pod_path(ns: str, pod: str, uid: str, container: str, restart: str) -> str:
    run = restart if restart.isdigit() else "0"
    return f"{POD_DIR}/{_safe(ns)}_{_safe(pod)}_{_safe(uid)}/{_safe(container)}/{int(run)}.log"


def _safe(part: str) -> str:
    """A path component from a name: no separator, no "_" (it splits a pod directory), never "." or ".."."""
    text = _UNSAFE.sub("-", part)[:200]
    return text if text.strip(".") else text.replace(".", "-") or "-"


def status(kind: str, code: int, message: str) -> bytes:
    """A failure's body: google.rpc.Status in the request's encoding, as OTLP/HTTP answers errors."""
    answer = Status(code=code, message=message)
    if kind == JSON:
        return json.dumps(json_format.MessageToDict(answer), separators=(",", ":")).encode()
    return bytes(answer.SerializeToString())
