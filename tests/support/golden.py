"""The golden fixtures' helpers: tests/data/logs/<case>.log and <case>.expected.yaml.

test_golden.py checks each case with them, write_golden writes a new one from what its author expects (CONTRIBUTING.md
"Add an OOM kind"), and load_expected hands any test the parsed expectation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.helpers import CATALOG, dump_yaml, load_yaml

LOGS_DIR = Path(__file__).parent.parent / "data" / "logs"
# What every golden event states (tests/test_golden.py checks them): the rest (numbers, pools, suggestions) is optional.
GOLDEN_CORE = ("kind", "line", "fatal", "ranks", "time")


def load_expected(path: str | Path) -> dict[str, Any]:
    """The parsed <case>.expected.yaml of a <case>.log (parsed once per process, through libyaml: both finders'
    cases, the core-fields check and test_scan_lookback read it), a copy each call."""
    return dict(load_yaml(str(path)[: -len(".log")] + ".expected.yaml"))


def golden_counts(stated: dict[str, int] | None) -> dict[str, int]:
    """The full counts dict a golden's `counts:` means: it lists only non-zero counts, so a missing kind is 0.
    A kind id the catalog does not have, or a stated zero, is an error (the file would say something false or
    something redundant)."""
    stated = dict(stated or {})
    unknown = sorted(set(stated) - set(CATALOG.ids))
    if unknown:
        raise ValueError(f"unknown kind id(s) {unknown} in a golden's counts")
    zeros = sorted(k for k, v in stated.items() if v == 0)
    if zeros:
        raise ValueError(f"a golden lists only non-zero counts, not {zeros}")
    return {k: stated.get(k, 0) for k in CATALOG.ids}


def write_golden(
    case: str, log: str, description: str, events: list[dict[str, Any]], directory: Path = LOGS_DIR
) -> tuple[Path, Path]:
    """Write a golden case, <case>.log and <case>.expected.yaml, from what its author expects: the facts.

    The expected file is built from `events` alone (the non-zero counts per catalog kind, in catalog order, and
    the retraction totals are derived from them), never from a scan of the log, so a golden can disagree with the parser: that is its
    job. Each event states at least GOLDEN_CORE; numbers go under `numbers:` (or at the top level when
    `scan --format json` has them there, as requested_tokens). CONTRIBUTING.md "Add an OOM kind" shows its use.
    """
    kinds = {k.id for k in CATALOG.kinds}
    counts: dict[str, int] = {}
    for i, event in enumerate(events):
        missing = [key for key in GOLDEN_CORE if key not in event]
        if missing or event["kind"] not in kinds:
            raise ValueError(f"event {i}: missing {missing} or unknown kind {event.get('kind')!r}")
        counts[event["kind"]] = counts.get(event["kind"], 0) + 1
    retract = [e for e in events if e["kind"] == CATALOG.retraction_kind]
    expected = {
        "description": description,
        "counts": {k: counts[k] for k in CATALOG.ids if k in counts},
        "retractions": {
            "events": len(retract),
            "retracted_requests": sum(int(e.get("numbers", {}).get("retracted_requests", 0)) for e in retract),
        },
        "events": events,
    }
    log_path, expected_path = directory / f"{case}.log", directory / f"{case}.expected.yaml"
    log_path.write_text(log if log.endswith("\n") else log + "\n", encoding="utf-8")
    expected_path.write_text(dump_yaml(expected), encoding="utf-8")
    return log_path, expected_path
