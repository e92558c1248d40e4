"""A name from the filesystem as the daemon shows it: labels, /events, the page, logs and Kubernetes Events.

Linux names are bytes; Python reads the ones that are not UTF-8 with `os.fsdecode`'s surrogateescape (b"caf\\xe9"
-> "caf\\udce9"), a string that opens the file again but that no UTF-8 encoder takes (the exposition, a JSON
answer, an Event). `shown` turns each such byte into the visible escape `\\xNN`, as bash's `$'...'` and
Python's backslashreplace write it; a name that is UTF-8 is shown as it is. The path itself (opening, state.json
keys: JSON keeps the surrogates exactly) stays the one `os` returned.

    "caf\\udce9.log" --shown--> "caf\\\\xe9.log" (the eight characters c a f \\ x e 9 .log)
"""

from __future__ import annotations

import logging
import re
import urllib.parse

_ESCAPED = re.compile(r"[\udc80-\udcff]")  # the bytes 0x80-0xff that surrogateescape kept


def shown(name: str) -> str:
    """name with each byte that is not UTF-8 written as \\xNN; a name that is UTF-8 is returned unchanged.

    A lone surrogate that no byte explains (U+D800-U+DFFF outside surrogateescape's range, only in a name made
    from a string, never from a directory listing) is written \\udNNN, so the result always encodes as UTF-8.
    """
    if name.isascii():
        return name
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        escaped = _ESCAPED.sub(lambda m: f"\\x{ord(m.group()) - 0xDC00:02x}", name)
        return escaped.encode("utf-8", "backslashreplace").decode("utf-8")
    return name


class ShownFormatter(logging.Formatter):
    """The daemon's log lines with file names shown as labels show them (stderr's own backslashreplace would
    write \\udce9 where a label has \\xe9)."""

    def format(self, record: logging.LogRecord) -> str:
        return shown(super().format(record))


# A spooled source's file name (sources/otlp.py `spool_path`) as a person reads it. The spool writes every byte of
# a name but A-Z a-z 0-9 . - as %XX, so a file name never merges two sources; what a person reads is the name
# decoded, with only the characters kept escaped that would make two names read the same: "%" everywhere, "@"
# (which comes before the host) in a path or service, "/" and "=" in a service (so no service reads as a path,
# which starts "/" or "path="), control characters, and bytes that are not UTF-8. One name, one reading.
_KEEP_ESCAPED = {"path": "%@", "service": "%@/=", "host": "%"}


def received(stem: str) -> str:
    """The name of a spooled non-pod source from its file's stem: `path=%2Fvar%2Flog%2Fa.log@node%2D1` ->
    "/var/log/a.log@node-1", a service `sglang%5Fdecode` -> "sglang_decode"; a relative path keeps its `path=`."""
    name, at, host = stem.partition("@")
    if name.startswith("path="):
        path = _decoded(name[5:], _KEEP_ESCAPED["path"])
        name = path if path.startswith("/") else "path=" + path
    elif name != "unnamed=":
        name = _decoded(name, _KEEP_ESCAPED["service"])
    return name + (at + _decoded(host, _KEEP_ESCAPED["host"]) if at else "")


def _decoded(escaped: str, keep: str) -> str:
    text = urllib.parse.unquote_to_bytes(escaped).decode("utf-8", "surrogateescape")
    out = []
    for c in text:
        if c in keep or ord(c) < 0x20 or ord(c) == 0x7F or "\udc80" <= c <= "\udcff":
            out.append("".join(f"%{b:02X}" for b in c.encode("utf-8", "surrogateescape")))
        else:
            out.append(c)
    return "".join(out)
