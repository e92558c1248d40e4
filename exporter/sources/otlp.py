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

import hashlib
import json
import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ScopeLogs

from .discover import pod_log_ref
from .otlpspool import FILE_DIR, NO_UID, POD_DIR, Line

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
CONTENT_TYPES = (PROTOBUF, JSON)
# Attributes that name a record's place in its file (the filelog receiver's include_file_record_number and
# include_file_record_offset) or its stream: part of the record's identity when present.
PLACE_ATTRIBUTES = ("log.file.record_number", "log.file.record_offset", "log.iostream")
# Keys a structured body (Fluent Bit sends its record map) keeps its log line under, in order of preference.
BODY_KEYS = ("log", "message", "msg", "body")
IDENTITY_ATTRIBUTES = ("k8s.namespace.name", "k8s.pod.name", "k8s.pod.uid", "k8s.container.name",
                       "k8s.container.restart_count", "log.file.path", "service.name", "host.name")  # fmt: skip
_WANTED = frozenset((*IDENTITY_ATTRIBUTES, *PLACE_ATTRIBUTES))
_WANTED_KEYS = frozenset(k.encode() for k in _WANTED)
_NONE: dict[str, str] = {}
MAX_RECORDS = 65536  # log records in one request; past it, 413 (a collector's batch is 8,192 by default)
CHUNK_BYTES = 256 * 1024  # wire bytes of records materialised at once
RECORD_COST = 600  # bytes a record takes while decoded and spooled, besides its text (measured: 330 to 450)
TEXT_COPIES = 3  # copies of a body's text held at once while decoded and spooled (the wire's own is apart)
JSON_VALUE_COST = 250  # bytes a JSON value takes once loaded and parsed, besides its text
NAME_MAX = 255  # bytes in a file name (Linux)
MAX_FILE_NAME_BYTES = 200  # a files/ source's name: NAME_MAX less ".log" and a rotated segment's suffix
_PLAIN = re.compile(r"[A-Za-z0-9.-]*")
_UNSAFE = re.compile(r"[^A-Za-z0-9.-]+")
_RESTART = re.compile(r"[0-9]{1,9}")
_RESTART_LOG = re.compile(r"[0-9]{1,9}\.log")


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


def decode(
    body: bytes,
    content_type: str | None,
    content_encoding: str | None,
    limit: int,
    reserve: Callable[[int], None] = lambda _n: None,
) -> Decoded:
    """The request in body, walked but not materialised yet (lines() does that a chunk of records at a time).

    OtlpError(400) when it does not parse, 413 when it inflates past limit bytes or holds more than MAX_RECORDS
    records. reserve(n) is called with the memory the request will take as it becomes known (the inflated
    body, then an estimate of the decoded records) before that memory is taken: it may refuse (raise OtlpError).
    """
    kind = media_type(content_type)
    encoding = (content_encoding or "identity").strip().lower()
    if encoding == "gzip":
        body = _gunzip(body, limit, reserve)
    elif encoding not in ("identity", ""):
        raise OtlpError(415, f"unsupported content encoding {encoding!r}: send gzip or none")
    if kind == PROTOBUF:
        decoded = _walk(body)
        reserve(decoded.records * RECORD_COST + TEXT_COPIES * len(body))
        return decoded
    # json.loads makes an object for every value: bound them by the bytes that open or separate one.
    values = body.count(b"{") + body.count(b"[") + body.count(b",") + 1
    held = values * JSON_VALUE_COST + TEXT_COPIES * len(body)
    reserve(held)
    try:
        raw = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise OtlpError(400, f"malformed JSON: {exc}") from exc
    except RecursionError as exc:
        raise OtlpError(400, "malformed JSON: nested too deeply") from exc
    if not isinstance(raw, dict):
        raise OtlpError(400, "malformed JSON: the request is not an object")
    request = ExportLogsServiceRequest()
    try:
        _drop_hex_ids(raw)
        json_format.ParseDict(raw, request, ignore_unknown_fields=True)
    except (json_format.ParseError, TypeError, ValueError) as exc:
        raise OtlpError(400, f"malformed OTLP JSON: {exc}") from exc
    except RecursionError as exc:
        raise OtlpError(400, "malformed OTLP JSON: nested too deeply") from exc
    decoded = Decoded.of(request)
    _check_records(decoded.records)
    reserve(max(0, decoded.records * RECORD_COST + TEXT_COPIES * len(body) - held))  # the lines, once raw is gone
    return decoded


def _gunzip(body: bytes, limit: int, reserve: Callable[[int], None]) -> bytes:
    """Inflate every member of a gzip body (RFC 1952: a body may be several members, as `cat a.gz b.gz` makes),
    refusing (413) past limit bytes in all, so a small bomb cannot take the memory, and (400) anything after the
    last member that is not a gzip member."""
    out: list[bytes] = []
    size = 0
    rest = body
    try:
        while True:
            inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            data = inflater.decompress(rest, limit - size + 1)
            size += len(data)
            if size > limit:
                raise OtlpError(413, f"the gzip body inflates past {limit} bytes")
            reserve(len(data))
            out.append(data)
            if not inflater.eof:
                raise OtlpError(400, "malformed gzip body: truncated")
            rest = inflater.unused_data
            if not rest:
                break
            if rest[:2] != b"\x1f\x8b":
                raise OtlpError(400, f"malformed gzip body: {len(rest)} bytes after the last gzip member")
    except zlib.error as exc:
        raise OtlpError(400, f"malformed gzip body: {exc}") from exc
    return out[0] if len(out) == 1 else b"".join(out)


def _check_records(records: int) -> None:
    if records > MAX_RECORDS:
        raise OtlpError(413, f"the request holds more than {MAX_RECORDS} log records; send smaller batches")


class Decoded:
    """A request's resources, each with its attributes (those that name a source or a record's place only) and
    its records, a chunk at a time: a walked protobuf body materialises CHUNK_BYTES of records at once."""

    def __init__(self, data: bytes = b"") -> None:
        self.data = data
        self.records = 0
        # (resource attributes, chunks): a chunk is a byte range of data encoding a ScopeLogs of records only,
        # or the records themselves (a request parsed whole: JSON, or a message a caller built).
        self.parts: list[tuple[dict[str, str], list[tuple[int, int] | Sequence[LogRecord]]]] = []

    @classmethod
    def of(cls, request: ExportLogsServiceRequest) -> Decoded:
        """A parsed request as a Decoded."""
        decoded = cls()
        for resource_logs in request.resource_logs:
            chunks: list[tuple[int, int] | Sequence[LogRecord]] = []
            for scope_logs in resource_logs.scope_logs:
                chunks.append(scope_logs.log_records)
                decoded.records += len(scope_logs.log_records)
            decoded.parts.append((_attributes(resource_logs.resource.attributes), chunks))
        return decoded

    def resources(self) -> Iterator[tuple[dict[str, str], Iterator[Sequence[LogRecord]]]]:
        """Each resource's attributes and its records, chunk by chunk."""
        for attrs, chunks in self.parts:
            yield attrs, self._records(chunks)

    def _records(self, chunks: list[tuple[int, int] | Sequence[LogRecord]]) -> Iterator[Sequence[LogRecord]]:
        for chunk in chunks:
            if isinstance(chunk, tuple):
                scope = ScopeLogs()
                try:
                    scope.ParseFromString(self.data[chunk[0] : chunk[1]])
                except (DecodeError, RuntimeError, ValueError) as exc:
                    raise OtlpError(400, f"malformed protobuf: {exc or 'cannot parse a LogRecord'}") from exc
                yield scope.log_records
            else:
                yield chunk


class _MalformedError(Exception):
    """The wire format breaks off or uses a wire type OTLP never sends."""


def _walk(data: bytes) -> Decoded:
    """An ExportLogsServiceRequest's wire format walked down to its records, without materialising them: the
    records are counted (413 past MAX_RECORDS) and cut into chunks, and only the resource attributes that
    name a source are parsed (a resource with 100,000 attributes costs a walk, not 100,000 objects)."""
    decoded = Decoded(data)
    try:
        for field, wire, _tag, start, end in _fields(data, 0, len(data)):
            if field != 1:
                continue
            _expect(wire, field, "ExportLogsServiceRequest")
            attrs: dict[str, str] = {}
            chunks: list[tuple[int, int] | Sequence[LogRecord]] = []
            for field2, wire2, _tag2, start2, end2 in _fields(data, start, end):
                if field2 == 1:
                    _expect(wire2, field2, "ResourceLogs")
                    attrs.update(_resource_attributes(data, start2, end2))
                elif field2 == 2:
                    _expect(wire2, field2, "ResourceLogs")
                    decoded.records += _scope_chunks(data, start2, end2, chunks)
                    _check_records(decoded.records)
            decoded.parts.append((attrs, chunks))
    except _MalformedError as exc:
        raise OtlpError(400, f"malformed protobuf: {exc}") from exc
    return decoded


def _expect(wire: int, field: int, message: str) -> None:
    if wire != 2:
        raise _MalformedError(f"{message} field {field} has wire type {wire}, not a message")


def _scope_chunks(data: bytes, start: int, end: int, chunks: list[tuple[int, int] | Sequence[LogRecord]]) -> int:
    """Cut a ScopeLogs' records into runs of at most CHUNK_BYTES (each a ScopeLogs of its own); their count."""
    count = 0
    run = -1
    for field, wire, tag, _start, value_end in _fields(data, start, end):
        if field == 2:
            _expect(wire, field, "ScopeLogs")
            count += 1
            if run < 0:
                run = tag
            elif value_end - run > CHUNK_BYTES:
                chunks.append((run, tag))
                run = tag
        elif run >= 0:
            chunks.append((run, tag))
            run = -1
    if run >= 0:
        chunks.append((run, end))
    return count


def _resource_attributes(data: bytes, start: int, end: int) -> dict[str, str]:
    """The attributes of a Resource that name a source or a place, parsed; the others only skipped."""
    out: dict[str, str] = {}
    for field, wire, _tag, kv_start, kv_end in _fields(data, start, end):
        if field != 1:
            continue
        _expect(wire, field, "Resource")
        key = b""
        for field2, wire2, _tag2, s, e in _fields(data, kv_start, kv_end):
            if field2 == 1 and wire2 == 2:
                key = data[s:e]
        if key in _WANTED_KEYS:
            kv = KeyValue()
            try:
                kv.ParseFromString(data[kv_start:kv_end])
            except (DecodeError, RuntimeError, ValueError) as exc:
                raise _MalformedError(f"a resource attribute: {exc}") from exc
            out.update(_attributes((kv,)))
    return out


def _fields(data: bytes, pos: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, where its tag starts, where its value starts and ends) of each field."""
    while pos < end:
        tag_start = pos
        tag, pos = _varint(data, pos, end)
        wire = tag & 7
        if wire == 2:
            size, pos = _varint(data, pos, end)
            value_end = pos + size
        elif wire == 0:
            _value, value_end = _varint(data, pos, end)
        elif wire == 1:
            value_end = pos + 8
        elif wire == 5:
            value_end = pos + 4
        else:
            raise _MalformedError(f"wire type {wire} (groups) at byte {tag_start}")
        if value_end > end or tag < 8:
            raise _MalformedError(f"a field breaks off at byte {tag_start}")
        yield tag >> 3, wire, tag_start, pos, value_end
        pos = value_end


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    byte = data[pos] if pos < end else 256
    if byte < 0x80:
        return byte, pos + 1
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _MalformedError(f"a varint breaks off at byte {pos}")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


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


def lines(request: ExportLogsServiceRequest | Decoded) -> dict[str, list[Line]]:
    """Each record's body as a log line, by the spool path of its source, in the request's order.

    Two records of one source with the same time, body and place are told apart by their occurrence in the
    request, so a retried request gives the same identities and a repeated line within one is kept. A resource's
    source is named once; a record is looked at only for the few attributes of its own that name a source or a
    place. OtlpError(400) for a name no source may have (spool_path).
    """
    decoded = request if isinstance(request, Decoded) else Decoded.of(request)
    out: dict[str, list[Line]] = {}
    seen: dict[tuple[str, bytes], int] = {}
    named: dict[tuple[str, ...], str] = {}  # identity attributes -> spool path, for records that name their own
    for resource, chunks in decoded.resources():
        base: str | None = None
        for records in chunks:
            for record in records:
                own = _attributes(record.attributes) if record.attributes else _NONE
                if own and not own.keys().isdisjoint(IDENTITY_ATTRIBUTES):
                    attrs = {**resource, **own}
                    key = tuple(attrs.get(k, "") for k in IDENTITY_ATTRIBUTES)
                    path = named.get(key) or named.setdefault(key, spool_path(attrs))
                else:
                    if base is None:
                        base = spool_path(resource)
                    path = base
                text = body_text(record.body)
                data = text.encode("utf-8", "surrogateescape")
                data = data if data.endswith(b"\n") else data + b"\n"
                # A record without its own time (a filelog receiver that parses none) is told by when the shipper
                # saw it: a retried request carries the same, a re-read file does not.
                when = record.time_unix_nano or record.observed_time_unix_nano
                place = "\x00".join(own[k] if k in own else resource.get(k, "") for k in PLACE_ATTRIBUTES)
                key_ = hashlib.blake2b(f"{when}\x00{place}\x00".encode() + data, digest_size=16).digest()
                n = seen.get((path, key_), 0)
                seen[(path, key_)] = n + 1
                identity = key_ if n == 0 else hashlib.blake2b(key_ + n.to_bytes(4, "big"), digest_size=16).digest()
                out.setdefault(path, []).append(Line(data, identity))
    return out


def _attributes(values: Any) -> dict[str, str]:
    """The attributes that name a source or a place: key -> value as text (scalars only). Others are skipped."""
    out: dict[str, str] = {}
    for kv in values:
        if kv.key in _WANTED:
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
    """Where a source's lines are spooled, relative to the spool root: its identity as a path.

    One source, one path, and never one path for two sources: every name is escaped injectively (_escape), a
    file path and a service are told apart, and `host.name` is part of a name that is not a pod's. OtlpError(400)
    for a restart count that is not a number, or a name too long for a file name once escaped.
    """
    ns, pod = attrs.get("k8s.namespace.name", ""), attrs.get("k8s.pod.name", "")
    container = attrs.get("k8s.container.name", "")
    file_path = attrs.get("log.file.path", "")
    if not (ns and pod and container) and file_path:
        ref = _kubelet_ref(file_path)
        if ref is not None:  # a kubelet pod log read without the k8sattributes processor: its path names it
            return _pod_path(ref.namespace, ref.pod, ref.uid, ref.container, str(ref.restart))
    if ns and pod and container:
        restart = attrs.get("k8s.container.restart_count", "") or "0"
        return _pod_path(ns, pod, attrs.get("k8s.pod.uid", "") or NO_UID, container, restart)
    service, host = attrs.get("service.name", ""), attrs.get("host.name", "")
    # A file path and a service never share a name: "=" is escaped in both, and only a path's starts "path=".
    name = "path=" + _escape(file_path) if file_path else (_escape(service) if service else "unnamed=")
    if host:
        name += "@" + _escape(host)
    return f"{FILE_DIR}/{_fits(name, MAX_FILE_NAME_BYTES, 'log.file.path, service.name and host.name')}.log"


def _kubelet_ref(path: str) -> Any:
    parts = path.rstrip("/").split("/")
    if len(parts) < 4 or not _RESTART_LOG.fullmatch(parts[-1]):
        return None  # not <n>.log in ASCII digits: a file of another name, named by its path
    root = "/".join(parts[:-3]) or "/"
    return pod_log_ref(root, path)


def _pod_path(ns: str, pod: str, uid: str, container: str, restart: str) -> str:
    if not _RESTART.fullmatch(restart):
        shown = restart if len(restart) <= 40 else restart[:40] + "..."
        raise OtlpError(400, f"k8s.container.restart_count {shown!r} is not a restart count (0 to 999999999)")
    what = "k8s.namespace.name, k8s.pod.name and k8s.pod.uid"
    pod_dir = _fits(f"{_escape(ns)}_{_escape(pod)}_{_escape(uid)}", NAME_MAX, what)
    return f"{POD_DIR}/{pod_dir}/{_fits(_escape(container), NAME_MAX, 'k8s.container.name')}/{int(restart)}.log"


def _escape(name: str) -> str:
    """A name as a path component, injectively: A-Z, a-z, 0-9, "." and "-" stay, every other byte of its UTF-8
    is %XX (so "_", which splits a pod directory, "/" and "%" never appear bare); "." and ".." are %2E."""
    if _PLAIN.fullmatch(name) is None:
        raw = name.encode("utf-8", "surrogateescape")
        name = _UNSAFE.sub(lambda m: "".join(f"%{ord(c):02X}" for c in m.group()), raw.decode("latin-1"))
    return name.replace(".", "%2E") if name in (".", "..") else name


def _fits(name: str, limit: int, what: str) -> str:
    if len(name) > limit:
        raise OtlpError(400, f"{what} name a source of {len(name)} bytes once escaped ({name[:60]}...); a file "
                             f"name takes {limit} at most")  # fmt: skip
    return name


def status(kind: str, code: int, message: str) -> bytes:
    """A failure's body: google.rpc.Status in the request's encoding, as OTLP/HTTP answers errors."""
    answer = Status(code=code, message=message)
    if kind == JSON:
        return json.dumps(json_format.MessageToDict(answer), separators=(",", ":")).encode()
    return bytes(answer.SerializeToString())
