"""The event sink's redaction: an excerpt never carries a logged request's prompt or output text.

    OomEvent.excerpt (the block's lines as logged) --redact_excerpt--> the excerpt /events, the page and scan show

An excerpt is the OOM block and its traceback as SGLang logged them. Request text can sit among those lines:
`--log-requests` prints `Receive: obj=GenerateReqInput(text='...', ...)` and `Finish: obj=..., out={'text':
'...'}`, an exception message may quote the request object (`GenerateReqInput(...)`, `input_ids=[...]`), a
JSON body may be logged with its `"prompt"`/`"messages"` keys, and an access log line may carry a prompt in
its query string (`GET /generate?text=...`). Each such line keeps what precedes the request text (its
prefix, the word `Receive:`) and loses the rest; lines without request text are untouched, so the OOM
message, the numbers and the traceback frames stay as logged.
"""

from __future__ import annotations

import re

REDACTED = "<request text redacted>"

# Where request text starts: a request object's repr, a request's `obj=`/`out=`, a key that holds text.
_TEXT_KEYS = r"text|prompt|prompts|messages|content|input_ids|output_ids|completion|query"
_REQUEST_TEXT = re.compile(
    r"(?:\b\w*ReqInput\(|\bobj=|\bout=\{|"  # GenerateReqInput(...), Receive: obj=..., Finish: ... out={...}
    rf"['\"](?:\w+_)?(?:{_TEXT_KEYS})['\"]\s*:|"  # 'text': '...' / "prompt": "..." in a logged dict or JSON body
    rf"\b(?:\w+_)?(?:{_TEXT_KEYS})=)"  # text='...', origin_input_text='...', input_ids=[...] in a repr
)
# An access log's request line: keep the method and path, drop the query string (GET /generate?text=...).
_QUERY = re.compile(r'("(?:GET|POST|PUT|PATCH|DELETE|HEAD|OPTIONS) [^ ?"]*)\?[^ "]*')


def redact_line(line: str) -> str:
    """The line up to where request text starts, then REDACTED; a line without request text as it is."""
    line = _QUERY.sub(rf"\1?{REDACTED}", line)
    found = _REQUEST_TEXT.search(line)
    if found is None:
        return line
    return line[: found.end()] + REDACTED


def redact_excerpt(excerpt: str) -> str:
    """Every line of an excerpt redacted (see the module docstring)."""
    return "\n".join(redact_line(line) for line in excerpt.split("\n"))
