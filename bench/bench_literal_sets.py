"""One Hyperscan database for the reader's and the evidence scanner's literals, or two: what a pass costs.

Usage::

    python bench/bench_literal_sets.py [--mb 64] [--runs 5]

A source not yet shown to be SGLang is searched twice per chunk: by the evidence scanner (detect/evidence.py,
5 literals, a search that stops at the first) and by the line reader (detect/reader.py, the pipeline's 38).
This times, on a CRI log of another program's lines (no literal hits, as most of a GPU node's bytes), one pass
of each database over the same bytes in chunks of 8 KiB, 64 KiB and 4 MiB, and one pass of a database holding
both sets (the evidence literals flagged SINGLEMATCH, as one pass answering both would need). It prints CPU
seconds (best of --runs) and both / (reader + evidence): below 1 would mean one database saves work.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from sglang_oom_exporter.catalog import load_catalog
from sglang_oom_exporter.detect.assemble import TRACEBACK_OPENERS
from sglang_oom_exporter.detect.decode import CRI_PARTIAL_LITERALS, escaped_literals
from sglang_oom_exporter.detect.evidence import STRONG, WEAK
from sglang_oom_exporter.detect.finder import minimal_literals
from sglang_oom_exporter.detect.pipeline import FRAME_LITERALS

CHUNKS = (8 << 10, 64 << 10, 4 << 20)


def foreign_log(mb: int) -> bytes:
    """A web server's access log as the kubelet writes it: no literal of either set occurs."""
    line = b'2026-12-07T08:00:%02d.%06dZ stdout F 10.0.%d.%d - - "GET /api/v1/items/%d HTTP/1.1" 200 %d "-" "curl"\n'
    lines, size, i = [], 0, 0
    while size < mb * 1_000_000:
        lines.append(line % (i % 60, i % 1_000_000, i % 256, i * 7 % 256, i, 100 + i % 99_899))
        size += len(lines[-1])
        i += 1
    return b"".join(lines)


def database(hyperscan: Any, literals: tuple[bytes, ...], single: tuple[bytes, ...] = ()) -> Any:
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    every = (*literals, *single)
    db.compile(
        expressions=[b"".join(b"\\x%02x" % b for b in lit) for lit in every],
        ids=list(range(len(every))),
        elements=len(every),
        flags=[0] * len(literals) + [hyperscan.HS_FLAG_SINGLEMATCH] * len(single),
    )
    return db


def cpu_of_pass(db: Any, data: bytes, chunk: int, runs: int) -> float:
    """Best CPU seconds of one pass over data in chunks (matches collected as the finders collect them)."""
    view = memoryview(data)
    best = float("inf")
    for _ in range(runs):
        found: list[int] = []

        def on_match(_id: int, _start: int, end: int, _flags: int, _ctx: Any, found: list[int] = found) -> None:
            found.append(end)

        start = time.process_time()
        for lo in range(0, len(data), chunk):
            db.scan(view[lo : lo + chunk], match_event_handler=on_match)
        best = min(best, time.process_time() - start)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--mb", type=int, default=64, help="MB of log (default 64)")
    parser.add_argument("--runs", type=int, default=5, help="best of this many passes (default 5)")
    args = parser.parse_args()
    try:
        import hyperscan
    except ImportError:
        print("hyperscan is not installed here: the bytes.find finder has nothing to share", file=sys.stderr)
        return 2
    searched = (*load_catalog().anchors(), *FRAME_LITERALS, *CRI_PARTIAL_LITERALS)  # as the pipeline's reader
    searched = (*searched, *TRACEBACK_OPENERS)
    reader = minimal_literals((*searched, *escaped_literals(searched)))
    evidence = tuple(s.encode() for s in (*STRONG, WEAK))
    data = foreign_log(args.mb)
    dbs = {"reader": database(hyperscan, reader), "evidence": database(hyperscan, evidence),
           "both": database(hyperscan, reader, evidence)}  # fmt: skip
    sizes = f"reader {len(reader)} literals, evidence {len(evidence)}"
    print(f"{len(data) / 1e6:.1f} MB, {sizes}; CPU s, best of {args.runs}")
    print(f"{'chunk':>8} {'reader':>8} {'evidence':>9} {'both':>8} {'both/(r+e)':>11}")
    for chunk in CHUNKS:
        cpu = {name: cpu_of_pass(db, data, chunk, args.runs) for name, db in dbs.items()}
        ratio = cpu["both"] / (cpu["reader"] + cpu["evidence"])
        print(f"{chunk >> 10:>6}Ki {cpu['reader']:8.3f} {cpu['evidence']:9.3f} {cpu['both']:8.3f} {ratio:11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
