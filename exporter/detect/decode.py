"""RawLine -> LogLine: strip the container and tool wrappers around SGLang's own text. Pure.

Outer wrappers come off from the outside in (facts 4 and 7): CRI records (`<ts> <stream> <P|F> <text>`,
with consecutive P records of one stream joined up to their F), docker json-file objects, then a
docker-compose `service  | ` or a CI timestamp, then a Markdown blockquote's `> ` (a log pasted into a report, each
line quoted; nested quotes too), then a trailing CR. Invalid UTF-8 is replaced, never fatal.
Detection is per line, because a file can change format (a pasted log, a restarted runtime).

Each line keeps the wrapper stream it came from (the CRI or docker stream, the compose service): records
are assembled per stream, so another service's line never ends, splits or joins an SGLang record (facts
10.11).
"""

from __future__ import annotations

import json

import regex

from ..detect.model import LogLine, RawLine

MAX_JOINED = 256 * 1024  # a joined CRI line longer than this is cut (a giant line, not an OOM block)

# The CRI log format (containerd, CRI-O): "<RFC 3339 time> <stream> <tag> <text>", the tag P for a partial
# record (the line goes on in the stream's next record) and F for its last or only one. Its markers live here;
# the pipeline's reader literals are derived from them.
CRI_STREAMS = ("stdout", "stderr")
CRI_PARTIAL = "P"
CRI_FULL = "F"
# A CRI partial record can cut an anchor in two ("Out of mem" | "ory."): no piece holds the literal, so
# every partial record is a hit of its own; they are rare (long lines, or a write without its newline). No
# space after the tag: an empty partial ("... stdout P", a write that began with its newline) joins the next
# record too, and the record's first line is then the partial's.
CRI_PARTIAL_LITERALS = tuple(f" {s} {CRI_PARTIAL}" for s in CRI_STREAMS)
_CRI_TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)"
_CRI_STREAM = "|".join(CRI_STREAMS)
_CRI = regex.compile(
    rf"^({_CRI_TIME}) ({_CRI_STREAM}) ([{CRI_PARTIAL}{CRI_FULL}])(?: (.*))?$",
    regex.DOTALL,
)
# The same head in bytes, either tag: an ASCII match here is a match of _CRI (not the reverse: str's \d also
# takes other scripts' digits), so a line it names is one Decoder.decode reads as that stream's record (a line that
# only looks like one, with a date but no RFC 3339 time, is a plain line there, of no stream).
_CRI_HEAD_B = regex.compile(rf"^{_CRI_TIME} ({_CRI_STREAM}) ([{CRI_PARTIAL}{CRI_FULL}])(?: |$)".encode())
_CRI_FULL_TAG = CRI_FULL.encode()
_CI_TIME = regex.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z) ")
_COMPOSE = regex.compile(r"^([\w.-]+) +\| ?")
_ANSI = regex.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# A blockquote marker: ">" and one space, per level, so a quoted frame keeps its own indentation.
_QUOTE = regex.compile(r"^(?:> ?)+")
_COMPOSE_TAG = regex.compile(rb"^([\w.-]+) +\|")
_CI_TIME_B = regex.compile(_CI_TIME.pattern.encode())
# A docker json-file line exactly as docker writes it, its stream one of the two: a match is a line json.loads reads
# as that object (strict JSON strings: no raw control characters, only valid escapes).
_JSON_STR = rb'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"'
_DOCKER_B = regex.compile(
    rb'^\{"log":' + _JSON_STR + rb',"stream":"(' + _CRI_STREAM.encode() + rb')","time":' + _JSON_STR + rb"\}[ \t\r]*$"
)


class Decoder:
    """Per-source wrapper stripping; keeps the CRI partial records of each stream until their F."""

    def __init__(self) -> None:
        self._partials: dict[str, tuple[RawLine, str | None, list[str]]] = {}
        self.json_errors = 0

    def decode(self, raw: RawLine) -> LogLine | None:
        """Return the logical line, or None while a CRI partial record waits for the rest of its line."""
        text = raw.data.decode("utf-8", "replace")
        first = text[:1]
        if first == "{" and text.startswith('{"log":'):
            return self._docker(raw, text)
        if first.isdigit():
            m = _CRI.match(text)
            if m is not None:
                return self._cri(raw, m.group(1), m.group(2), m.group(3), m.group(4) or "")
            m = _CI_TIME.match(text)
            if m is not None:
                return LogLine(raw.lineno, _tail(text[m.end() :]), "", m.group(1), raw.offset)
        service, text = _strip_compose(text)
        if text[:1] == ">":
            text = text[_QUOTE.match(text).end() :]  # type: ignore[union-attr]
        return LogLine(raw.lineno, _tail(text), service, offset=raw.offset)

    def idle(self) -> bool:
        """No CRI partial record waiting for the rest of its line."""
        return not self._partials

    def quiet(self, stream: str) -> bool:
        """No CRI partial record of this stream waits for the rest of its line."""
        return stream not in self._partials

    def reset(self) -> None:
        """Forget partial records (a gap or a new file generation broke the sequence)."""
        self._partials.clear()

    def resume_point(self) -> tuple[int, int] | None:
        """(offset, lineno) of the oldest partial record still waiting for its F, if any."""
        firsts = [first for first, _, _ in self._partials.values()]
        return min(((r.offset, r.lineno) for r in firsts), default=None)

    def _cri(self, raw: RawLine, ts: str, stream: str, tag: str, content: str) -> LogLine | None:
        pending = self._partials.get(stream)
        if tag == CRI_PARTIAL:
            if pending is None:
                self._partials[stream] = (raw, ts, [content])
            elif sum(len(p) for p in pending[2]) < MAX_JOINED:
                pending[2].append(content)
            return None
        if pending is not None:
            del self._partials[stream]
            first, first_ts, parts = pending
            joined = "".join([*parts, content])[:MAX_JOINED]
            return LogLine(first.lineno, _tail(joined), stream, first_ts, first.offset)
        return LogLine(raw.lineno, _tail(content), stream, ts, raw.offset)

    def _docker(self, raw: RawLine, text: str) -> LogLine:
        lineno = raw.lineno
        try:
            obj = json.loads(text)
        except ValueError:
            self.json_errors += 1
            return LogLine(lineno, _tail(text), offset=raw.offset)
        if not isinstance(obj, dict) or not isinstance(obj.get("log"), str):
            self.json_errors += 1
            return LogLine(lineno, _tail(text), offset=raw.offset)
        line = obj["log"]
        if line.endswith("\n"):
            line = line[:-1]
        stream_value, time_value = obj.get("stream"), obj.get("time")
        stream = stream_value if isinstance(stream_value, str) else ""
        ts = time_value if isinstance(time_value, str) else None
        return LogLine(lineno, _tail(line), stream, ts, raw.offset)


def stream_of(data: bytes) -> str | None:
    """The wrapper stream Decoder.decode gives this raw line as one whole record ("" for a bare line): a CRI full (F)
    record's stream, a docker json-file line's, a compose service's; None for a line this cheap test cannot vouch for
    (a CRI partial record, an irregular JSON object, an ANSI-coloured or non-ASCII line), which the reader then passes.
    Exact: whenever it names a stream, decoding the line names the same one (property-tested)."""
    first = data[:1]
    if first.isdigit():
        m = _CRI_HEAD_B.match(data)
        if m is not None:
            return m.group(1).decode() if m.group(2) == _CRI_FULL_TAG else None
    elif first == b"{":
        m = _DOCKER_B.match(data)
        if m is not None:
            return m.group(1).decode()
        if data.startswith(b'{"log":'):
            return None
    if not data.isascii():  # str's \d and \w take other scripts' digits and letters: the bytes tests cannot vouch
        return None
    if first.isdigit() and _CI_TIME_B.match(data) is not None:
        return ""
    if b"\x1b" in data:
        return None
    if b"|" in data[:80]:
        m = _COMPOSE_TAG.match(data)
        if m is not None:
            return m.group(1).decode()
    return ""


def escaped_literals(literals: tuple[str, ...]) -> tuple[str, ...]:
    """The forms a docker json-file line writes these literals in, where they differ: `"` and `\\` escaped (JSON), and
    `<`, `>`, `&` as \\u00XX too (docker's encoder). A line's framing must not hide a literal from the prefilter."""
    out: list[str] = []
    for lit in literals:
        json_form = lit.replace("\\", "\\\\").replace('"', '\\"')
        html_form = json_form.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
        out += [form for form in (json_form, html_form) if form != lit]
    return tuple(dict.fromkeys(out))


def unwrap(data: bytes) -> str:
    """The text a program wrote on one raw line, its container framing off as Decoder.decode takes it off; a CRI
    partial record gives its own piece. Stateless: for judging one line alone (detect/evidence.py)."""
    if data[:1].isdigit():
        m = _CRI.match(data.decode("utf-8", "replace"))
        if m is not None:
            return _tail(m.group(4) or "")
    line = Decoder().decode(RawLine(0, data))
    return line.text if line is not None else ""


def _strip_compose(text: str) -> tuple[str, str]:
    """(service, text): the docker-compose service name ("" when none) and the line without its prefix."""
    if "\x1b" in text:  # compose colours its service prefix
        text = _ANSI.sub("", text)
    # A compose prefix never starts with "[" or a space, which SGLang lines and frames do; test the
    # cheap condition first so the regex only runs on lines that can carry one.
    if "|" in text[:80]:
        m = _COMPOSE.match(text)
        if m is not None:
            return m.group(1), text[m.end() :]
    return "", text


def _tail(text: str) -> str:
    return text[:-1] if text.endswith("\r") else text
