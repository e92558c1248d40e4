"""The NUL run of a copytruncate hole is skipped in bulk, not byte by byte.

A writer without O_APPEND leaves a hole of NULs up to its offset after a copytruncate; a 1 GiB hole read at
18 MB/s delayed the OOM behind it by a minute. Measured in CPU seconds of this process (not wall time, which
other work on the machine stretches), with a bound far above the fix's cost and far below the old one.
"""

from __future__ import annotations

import time

import pytest

from sglang_oom_exporter.detect.pipeline import Pipeline
from tests.support.helpers import CATALOG, MATCHER

BLOCK = b"[2026-03-14 22:07:01 TP0] Decode out of memory. Try to lower your batch size.\nTry to allocate 5 tokens.\n\n"
RUN = 128 << 20  # 128 MiB: 8.7 s of CPU at the old 15 MB/s on this machine, 0.3 s now


def _feed(data: bytes, chunk: int) -> tuple[list, float]:
    events: list = []
    pipe = Pipeline(CATALOG, MATCHER, source="s", location="s", sink=events.append)
    began = time.process_time()
    for i in range(0, len(data), chunk):
        pipe.feed(data[i : i + chunk], 0.0)
    pipe.finish()
    return events, time.process_time() - began


@pytest.mark.parametrize("behind", ["text", "newline"])
def test_a_128_mib_nul_run_is_read_in_bulk_and_the_oom_behind_it_counted(behind):
    head = b"text before\nsome text" if behind == "text" else b"text before\n"
    second = BLOCK.replace(b":01 ", b":09 ")
    data = head + b"\x00" * RUN + BLOCK + b"\x00" * 4097 + second
    events, cpu = _feed(data, 1 << 20)
    # Behind text, the run's first NUL ends that line ("some text" is line 2); either way the OOMs keep their lines.
    assert [e.location for e in events] == (["s:3", "s:6"] if behind == "text" else ["s:2", "s:5"])
    assert cpu < 3.0, f"{len(data) / cpu / 1e6:.0f} MB/s"  # was 15 MB/s: 8.7 s


@pytest.mark.parametrize("chunk", [1, 3, 7, 64, 4096])
def test_nul_runs_split_anywhere_give_the_same_lines(chunk):
    data = b"a\nbb" + b"\x00" * 300 + BLOCK + b"\x00" * 17 + b"c\n" + b"\x00" * 5 + BLOCK.replace(b":01 ", b":09 ")
    events, _ = _feed(data, chunk)
    whole, _ = _feed(data, len(data))
    assert [e.location for e in events] == [e.location for e in whole]
    assert len(whole) == 2
