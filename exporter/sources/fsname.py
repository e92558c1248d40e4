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
