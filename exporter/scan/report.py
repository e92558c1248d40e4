"""What a scan found, and the two ways `scan` prints it: the readable text and the documented JSON object."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..advise.explain import skipped
from ..advise.memory import MAMBA_COST
from ..catalog import Catalog
from ..detect.model import OomEvent
from ..detect.pipeline import PipelineStats
from ..events.sink import event_json, explanation
from ..sources.fsname import shown


@dataclass(slots=True)
class ScanResult:
    """Events of every input, in input order and line order, plus what was read."""

    catalog: Catalog
    events: list[OomEvent] = field(default_factory=list)
    stats: list[tuple[str, PipelineStats]] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)  # inputs whose scan failed: (path, why)

    def counts(self) -> dict[str, int]:
        """Events per kind, every catalog kind (and the non-memory crash) present."""
        counts = dict.fromkeys(self.catalog.event_ids, 0)
        for e in self.events:
            counts[e.kind] = counts.get(e.kind, 0) + 1
        return counts

    def fatal_count(self) -> int:
        """How many events were fatal."""
        return sum(1 for e in self.events if e.fatal)

    def retractions(self) -> list[OomEvent]:
        """Events of the catalog's retraction kind."""
        return [e for e in self.events if e.kind == self.catalog.retraction_kind]

    def to_json(self) -> dict[str, Any]:
        """The documented `scan --format json` object."""
        retract = self.retractions()
        errors = {"errors": [{"path": shown(p), "error": why} for p, why in self.errors]} if self.errors else {}
        return {
            **errors,
            "counts": self.counts(),
            "retractions": {
                "events": len(retract),
                "retracted_requests": sum(int(e.numbers.get("retracted_requests", 0)) for e in retract),
            },
            "fatal_events": self.fatal_count(),
            "events": [event_json(e, self.catalog) for e in self.events],
            "inputs": [
                {
                    "path": shown(path),  # a name that is not UTF-8 as every output shows it (sources/fsname.py)
                    "lines_read": s.lines_read,
                    "events": s.events,
                    "oversized_lines": s.oversized_lines,
                    "json_errors": s.json_errors,
                    "foreign_events": s.foreign_events,
                }
                for path, s in self.stats
            ],
        }


def _shown(location: str, names: dict[str, str]) -> str:
    """An event's path:line with its path as names shows it."""
    path, sep, line = location.rpartition(":")
    return f"{names[path]}{sep}{line}" if sep and path in names else location


def format_text(result: ScanResult, names: dict[str, str] | None = None) -> str:
    """A readable report: one block per event with its numbers and fix, then the totals.

    names maps an input path to the name the report shows for it (the bundled sample: "sample.log")."""
    out: list[str] = []
    names = names or {}
    catalog = result.catalog
    for e in result.events:
        kind = catalog.kind(e.kind)
        n = e.numbers
        ranks = ",".join(e.ranks) or "-"
        where = _shown(e.location, names)
        head = f"{e.time or '-':<26} {e.kind:<12} {'FATAL' if e.fatal else 'warn ':<5} ranks={ranks:<12} {where}"
        out.append(head)
        facts = []
        if e.phase:
            facts.append(f"phase={e.phase}" + (f"/{e.subphase}" if e.subphase else ""))
        for key in (
            "requested_tokens",
            "available_tokens",
            "shortfall_tokens",
            "req_slots_available",
            "req_slots_requested",
            "retracted_requests",
            "new_token_ratio_from",
            "new_token_ratio_to",
            "tried_to_allocate",
            "mem_fraction_static",
            "rid",
        ):
            if n.get(key) is not None:
                facts.append(f"{key}={n[key]}")
        if n.get("shortfall_note"):
            facts.append(f"shortfall_tokens=none ({n['shortfall_note']})")
        if len(e.pools) > 1:
            facts.append("pools=" + " ".join(f"{p.name}:{p.available}" for p in e.pools))
        if e.inferred:
            facts.append("inferred-from-frames")
        told = explanation(e, catalog)
        out.append(f"    {kind.title}")
        if facts:
            out.append("    " + " ".join(facts))
        if told.sentence:
            out.append(f"    {told.sentence}")
        if told.fix:
            out.append(f"    fix: {told.fix}")
        levers = []
        for s in e.suggestions:
            when = f"; when {s.when}" if s.when else ""
            if s.suggested is not None:
                levers.append(f"    suggest: {s.flag} {s.change()}  ({s.rule}{when})")
            elif skipped(s):
                levers.append(f"    not {s.flag}: {s.rule}{when}")
        out.extend(levers)
        # The advice sums up the levers above (and repeats a fix line): shown when it says more than they do.
        if (not levers or MAMBA_COST in told.advice) and told.advice != f"Fix: {told.fix}":
            out.append(f"    advice: {told.advice}")
    counts = result.counts()
    out.append("")
    out.append("kind           events")
    for kid, count in counts.items():
        out.append(f"{kid:<14} {count}")
    retract = result.retractions()
    requests = sum(int(e.numbers.get("retracted_requests", 0)) for e in retract)
    lines = sum(s.lines_read for _, s in result.stats)
    out.append(
        f"total: {len(result.events)} events ({result.fatal_count()} fatal), "
        f"{len(retract)} retraction events retracting {requests} requests, {lines} lines read"
    )
    return "\n".join(out) + "\n"
