"""Catastrophic backtracking: every catalog, prefix and detection regex against adversarial inputs, under a deadline.

Log-line regexes see lines of up to MAX_LINE (64 KiB) written by anyone who can write to a followed log: each
is searched in adversarial 16 KiB lines (one character or a short unit repeated, with a tail that makes the
match fail) with the `regex` module's per-call timeout. 16 KiB is enough to tell: a linear regex needs about
0.3 ms there, while a quadratic one needs 268M steps (seconds at the `regex` module's 10 ns or more a step,
against a 0.5 s deadline); 64 KiB lines took four times the suite's CPU for the same verdicts. Regexes over file names (at most 255 bytes) and over
configuration values are checked at their own bounds; stdlib `re` has no timeout, so those run in a child
process with a deadline.
"""

from __future__ import annotations

import string
import subprocess
import sys

import pytest
import regex

from sglang_oom_exporter.config.values import parse_duration
from sglang_oom_exporter.detect import assemble, decode, match, prefix, reader
from tests.support.helpers import CATALOG

LINE = 16 * 1024
DEADLINE = 0.5  # seconds per search: a linear regex needs about 0.3 ms for 16 KiB
UNITS = [c for c in string.printable if c not in "\n\r\x0b\x0c"] + [
    "TP0 ", "DP1 ", "a=1, ", "a = -1, ", "1.", "0 ", ' File "', "[TP0 ", "ab ", "x_", "1:", "=1", "e ",
    "(a) ", "[a] ", "0:0", "2026-03-14 ", "\x1b[0", "\x00", "é", "Error", "out of ",
]  # fmt: skip


def _log_regexes() -> dict[str, regex.Pattern[str] | regex.Pattern[bytes]]:
    found: dict[str, regex.Pattern[str] | regex.Pattern[bytes]] = {}
    for module in (assemble, decode, match, prefix, reader):
        for name, value in vars(module).items():
            if isinstance(value, regex.Pattern):
                found[f"{module.__name__.rsplit('.', 1)[-1]}.{name}"] = value
    for i, pattern in enumerate(prefix.BUILTIN_PATTERNS):
        found[f"prefix.BUILTIN_PATTERNS[{i}]"] = regex.compile(pattern)
    for kind in CATALOG.kinds:
        for i, p in enumerate(kind.patterns):
            found[f"catalog.{kind.id}[{i}]"] = p.regex
    return found


LOG_REGEXES = _log_regexes()
# Quadratic in a line of blanks (about 1.3 s for 5,000 spaces, hours for a 256 KiB line): detect/assemble.py
# belongs to the detection work; the test stays strict, so it fails the day the regex is fixed and this goes.
KNOWN_SLOW: set[str] = set()  # assemble._DETAIL was quadratic on blank lines until its \s became possessive


def test_every_kind_and_prefix_is_covered():
    assert sum(name.startswith("catalog.") for name in LOG_REGEXES) == sum(len(k.patterns) for k in CATALOG.kinds)
    assert sum(name.startswith("prefix.BUILTIN") for name in LOG_REGEXES) == len(prefix.BUILTIN_PATTERNS) == 4


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.xfail(strict=True, raises=TimeoutError)) if n in KNOWN_SLOW else n
     for n in sorted(LOG_REGEXES)],
)  # fmt: skip
def test_log_regex_is_not_catastrophic_on_adversarial_lines(name):
    pattern = LOG_REGEXES[name]
    for unit in UNITS:
        text = (unit * (LINE // len(unit)))[:LINE] + "!\t"
        subject = text if isinstance(pattern.pattern, str) else text.encode("utf-8", "replace")
        pattern.search(subject, timeout=DEADLINE)  # type: ignore[call-overload]
        pattern.match(subject, timeout=DEADLINE)  # type: ignore[call-overload]


@pytest.mark.parametrize("text", ["0" * 5000 + "x", "1" * 5000, "1." * 3000 + "s", "1s" * 3000 + "x"])
def test_a_long_duration_is_refused_at_once(text):
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)


STDLIB_CHECK = r"""
import string, sys
from sglang_oom_exporter.sources import discover
from sglang_oom_exporter.web import webconfig
from sglang_oom_exporter.render import alertspec
from sglang_oom_exporter.catalog import vocabulary, alert_fields
from sglang_oom_exporter.config import values
units = [c for c in string.printable if c not in "\n\r\x0b\x0c"] + ["1.", ".1", "-1", ".gz", "0-", "T1"]
names = [(discover._ROTATED_NAME, 255), (discover._POD_LOG_NAME, 255), (webconfig._BCRYPT_RE, 4096),
         (alertspec.NAME_RE, 4096), (vocabulary.ID_RE, 4096), (alert_fields._PROM_DURATION, 4096),
         (values._DURATION, 4096), (values.URL, 4096)]  # _DURATION_PART only sees what _DURATION accepted
for pattern, size in names:
    for unit in units:
        text = (unit * size)[:size]
        pattern.search(text); pattern.fullmatch(text); pattern.match(text)
print("ok", len(names))
"""


def test_stdlib_regexes_over_names_and_settings_finish_within_a_deadline():
    proc = subprocess.run([sys.executable, "-c", STDLIB_CHECK], capture_output=True, text=True, timeout=20)
    assert (proc.returncode, proc.stdout) == (0, "ok 8\n"), proc.stderr
