"""A time-boxed fuzz run of the whole pipeline: the properties of tests/test_fuzz_pipeline.py, for N seconds.

Each round runs every property with fresh random examples (hypothesis, not derandomized) until the time is
up; a failure prints hypothesis' shrunk example and exits 1. Run from the repository root:

    python bench/fuzz.py --seconds 600
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `tests` is importable from the repo root

from hypothesis import HealthCheck, given, settings

from tests.support.fuzz import FUZZ_PROPERTIES


def main(argv: list[str] | None = None) -> int:
    """Run the fuzz properties round after round until --seconds have passed; 0 when none failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to fuzz (default 60)")
    parser.add_argument("--examples", type=int, default=200, help="examples per property per round (default 200)")
    args = parser.parse_args(argv)
    fuzz = settings(
        max_examples=args.examples, deadline=None, database=None, derandomize=False,
        suppress_health_check=list(HealthCheck),
    )  # fmt: skip
    end = time.monotonic() + args.seconds
    start, rounds, examples = time.monotonic(), 0, 0
    while time.monotonic() < end:
        for check, strategies in FUZZ_PROPERTIES:
            try:
                fuzz(given(*strategies)(check))()
            except Exception as exc:
                print(f"FAILED {check.__name__} after {rounds} round(s): {exc!r}", file=sys.stderr)
                return 1
            examples += args.examples
        rounds += 1
    elapsed = time.monotonic() - start
    print(f"fuzz ok: {rounds} round(s), {examples} examples over {len(FUZZ_PROPERTIES)} properties in {elapsed:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
