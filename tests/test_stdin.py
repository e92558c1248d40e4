"""The stdin pump: every byte passes through unchanged, and the loop is woken for each chunk."""

from __future__ import annotations

import io
import os
import time

from sglang_oom_exporter.sources.stdin import StdinPump


def test_bytes_pass_through_and_reach_the_pipeline_with_a_wake_per_chunk():
    read_fd, write_fd = os.pipe()
    out = io.BytesIO()
    wakes = []
    with os.fdopen(read_fd, "rb") as stream:
        pump = StdinPump(stream, out, lambda: wakes.append(1))
        pump.start()
        os.write(write_fd, b"[2026-03-14 22:07:33 TP0] hello\n")
        os.close(write_fd)
        deadline = time.monotonic() + 60  # a hang guard: the loop ends once the pump is done
        got: list[bytes] = []
        done = False
        while not done and time.monotonic() < deadline:
            chunks, done = pump.drain()
            got += chunks
            time.sleep(0.01)
        pump._thread.join(60)
    assert done
    assert b"".join(got) == out.getvalue() == b"[2026-03-14 22:07:33 TP0] hello\n"
    assert len(wakes) == len(got) + 1  # one per chunk, and one for the end
