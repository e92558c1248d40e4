"""The golden fixtures' helpers: tests/data/logs/<case>.log and <case>.expected.yaml.

test_golden.py checks each case with them, write_golden writes a new one from what its author expects (CONTRIBUTING.md
"Add an OOM kind"), and load_expected hands any test the parsed expectation.

A golden event states the whole event `scan --format json` gives, minus what does not come from the log: every field
in GOLDEN_FIELDS (the location as `line`, requested_tokens and available_tokens once, under `numbers`), none of
NOT_FROM_THE_LOG. test_golden compares the two whole, so a field the golden leaves out, or a new field scan gives that
neither list names, fails every case; a new kind touches only its own fixtures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.helpers import CATALOG, dump_yaml, load_yaml

LOGS_DIR = Path(__file__).parent.parent / "data" / "logs"
# What every golden event states, all of it read from the log: the fields of scan's JSON event, `source` as its line.
GOLDEN_FIELDS = ("kind", "line", "fatal", "ranks", "time", "phase", "subphase", "inferred", "message", "numbers", "pools",
                 "excerpt")  # fmt: skip
# The fields of scan's JSON event a golden never states, and why: none is read from the log.
NOT_FROM_THE_LOG = {
    "title": "the kind's title in catalog.yaml",
    "remediation": "the kind's remediation in catalog.yaml",
    "suggestions": "the catalog's suggest rule applied to the stated numbers by advise/ (tests/test_suggest.py)",
    "context": "the server args or KV snapshot scan and serve are handed, not the log",
    "explanation": "the stated numbers, pools and suggestions in words by advise/explain.py (tests/test_explain.py)",
}
# event_json repeats these entries of `numbers` at the top level: a golden states them once, under numbers.
COPIES_OF_NUMBERS = ("requested_tokens", "available_tokens")


def load_expected(path: str | Path) -> dict[str, Any]:
    """The parsed <case>.expected.yaml of a <case>.log (parsed once per process, through libyaml: both finders'
    cases, the golden-fields check and test_scan_lookback read it), a copy each call."""
    return dict(load_yaml(str(path)[: -len(".log")] + ".expected.yaml"))


def golden_event(log: str | Path, stated: dict[str, Any]) -> dict[str, Any]:
    """The JSON event (without NOT_FROM_THE_LOG) that a golden event states, for the log at this path."""
    event = {key: value for key, value in stated.items() if key != "line"}
    event["source"] = f"{log}:{stated['line']}"
    for key in COPIES_OF_NUMBERS:
        event[key] = stated.get("numbers", {}).get(key)
    return event


def from_the_log(event: dict[str, Any]) -> dict[str, Any]:
    """A JSON event of scan without the fields that do not come from the log (NOT_FROM_THE_LOG)."""
    return {key: value for key, value in event.items() if key not in NOT_FROM_THE_LOG}


def golden_foreign(expected: dict[str, Any]) -> int:
    """The input's foreign_events a golden means: stated only when not 0, so a missing one is 0."""
    if "foreign_events" not in expected:
        return 0
    stated = expected["foreign_events"]
    if isinstance(stated, bool) or not isinstance(stated, int) or stated < 1:
        raise ValueError(f"a golden states foreign_events only as a positive count, not {stated!r}")
    return stated


def golden_counts(stated: dict[str, int] | None) -> dict[str, int]:
    """The full counts dict a golden's `counts:` means: it lists only non-zero counts, so a missing kind is 0.
    A kind id the catalog does not have, or a stated zero, is an error (the file would say something false or
    something redundant)."""
    stated = dict(stated or {})
    unknown = sorted(set(stated) - set(CATALOG.event_ids))
    if unknown:
        raise ValueError(f"unknown kind id(s) {unknown} in a golden's counts")
    zeros = sorted(k for k, v in stated.items() if v == 0)
    if zeros:
        raise ValueError(f"a golden lists only non-zero counts, not {zeros}")
    return {k: stated.get(k, 0) for k in CATALOG.event_ids}


def write_golden(
    case: str,
    log: str,
    description: str,
    events: list[dict[str, Any]],
    directory: Path = LOGS_DIR,
    *,
    foreign_events: int = 0,
) -> tuple[Path, Path]:
    """Write a golden case, <case>.log and <case>.expected.yaml, from what its author expects: the facts.

    The expected file is built from `events` alone (the non-zero counts per catalog kind, in catalog order, and
    the retraction totals are derived from them), never from a scan of the log, so a golden can disagree with the parser: that is its
    job. Each event states every field of GOLDEN_FIELDS and nothing else (numbers, requested_tokens included, go
    under `numbers:`). foreign_events is what the input's `foreign_events` must be (OOM text seen and not counted:
    no SGLang evidence, or SGLang's text inside another program's record), stated only when not 0.
    CONTRIBUTING.md "Add an OOM kind" shows its use.
    """
    kinds = set(CATALOG.event_ids)
    counts: dict[str, int] = {}
    for i, event in enumerate(events):
        missing = [key for key in GOLDEN_FIELDS if key not in event]
        extra = [key for key in event if key not in GOLDEN_FIELDS]
        wrong = [f"missing {missing}"] if missing else []
        wrong += [f"not a golden field {extra}"] if extra else []
        wrong += [f"unknown kind {event['kind']!r}"] if "kind" in event and event["kind"] not in kinds else []
        if wrong:
            raise ValueError(f"event {i}: {'; '.join(wrong)}")
        counts[event["kind"]] = counts.get(event["kind"], 0) + 1
    retract = [e for e in events if e["kind"] == CATALOG.retraction_kind]
    expected = {
        "description": description,
        "counts": {k: counts[k] for k in CATALOG.event_ids if k in counts},
        "retractions": {
            "events": len(retract),
            "retracted_requests": sum(int(e["numbers"].get("retracted_requests", 0)) for e in retract),
        },
        **({"foreign_events": foreign_events} if foreign_events else {}),
        "events": events,
    }
    log_path, expected_path = directory / f"{case}.log", directory / f"{case}.expected.yaml"
    log_path.write_text(log if log.endswith("\n") else log + "\n", encoding="utf-8")
    expected_path.write_text(dump_yaml(expected), encoding="utf-8")
    return log_path, expected_path
