"""The catalog's value types: a validated, compiled OomKind per entry and the Catalog that holds them.

loader.py builds them from catalog.yaml; everything downstream reads kinds and roles through them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import regex


@dataclass(frozen=True, slots=True)
class Pattern:
    """One message regex of a kind, compiled once."""

    regex: regex.Pattern[str]
    fatal: bool | None  # None: the kind's default
    versions: str
    suggest: str | None = None  # None: the kind's suggestion rule
    # Patterns of one kind with the same `joins` name are one failure on one rank when they name the same request
    # (rid): a logged warning and the assertion that follows it join as a block and its traceback do (R2).
    joins: str | None = None
    # Only in a traceback with one of these frames ("function" or "path-fragment:function"); () anywhere.
    frames: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RemediationStep:
    """One ordered step of a kind's fix."""

    flag: str
    action: str
    when: str


@dataclass(frozen=True, slots=True)
class OomKind:
    """A catalog entry after validation."""

    id: str
    title: str
    fatal: str  # "true" | "false" | "raised"
    severity: str
    phase: str
    join_on: str
    anchors: tuple[str, ...]
    patterns: tuple[Pattern, ...]
    extract: tuple[regex.Pattern[str], ...]
    summary: str
    steps: tuple[RemediationStep, ...]
    runbook: Mapping[str, str]
    alert: Mapping[str, Any]
    match_examples: tuple[str, ...]
    no_match_examples: tuple[str, ...]
    suggest: str = "none"  # the advise/rules.py rule that turns its events into flag values
    # Text any program can write (torch's CUDA OOM): counted only with SGLang evidence (detect/evidence.py).
    requires_sglang_evidence: bool = False

    def suggest_rule(self, message: str) -> str:
        """The suggestion rule for an event of this kind: a pattern's own rule when it matched, else the kind's.
        The message starts where SGLang's does (an exception's first sentence, a pool's name), so the pattern
        may match inside it, as it did in the log line."""
        for p in self.patterns:
            if p.suggest is not None and p.regex.search(message):
                return p.suggest
        return self.suggest

    def remediation(self) -> dict[str, Any]:
        """The remediation as plain data for JSON and HTML output."""
        return {
            "summary": self.summary,
            "steps": [{"flag": s.flag, "action": s.action, "when": s.when} for s in self.steps],
            "runbook_anchor": self.id,
        }


@dataclass(frozen=True, slots=True)
class Catalog:
    """All kinds, in file order (the order in which patterns are tried), plus the frame tables."""

    kinds: tuple[OomKind, ...]
    phase_frames: Mapping[str, tuple[str, ...]]
    allocator_frames: Mapping[str, str]
    path: str
    # Roles: which kind plays which part, so that no Python code names a kind (checked by the loader).
    fallback_kind: str = ""  # a KV failure whose phase nothing tells (and a cut-short alloc_token_slots)
    retraction_kind: str | None = None  # events whose retracted_requests feed the retracted-requests counter
    phase_kinds: Mapping[str, str] = field(default_factory=dict)  # resolved KV phase -> the kind it counts as
    # The alerts beyond one per kind (crash loop, near full, exporter guards) and the flags' SGLang versions.
    alert_pack: Mapping[str, Any] = field(default_factory=dict)
    # No SGLang crash is silent: the headers of a process that died, the frames that make an exception no kind
    # names a memory failure (CRASH_MEMORY) or a start-up one (CRASH_INIT), the kind a memory failure at
    # start-up counts as, and the non-memory crash, which is no kind of `kinds` (its own series).
    crash_headers: tuple[str, ...] = ()
    crash_exceptions: frozenset[str] = frozenset()  # never a memory failure by its frames
    crash_frames: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    startup_kind: str | None = None
    crash: OomKind | None = None

    @property
    def ids(self) -> tuple[str, ...]:
        """Kind ids in catalog order."""
        return tuple(k.id for k in self.kinds)

    @property
    def event_ids(self) -> tuple[str, ...]:
        """Every id an event can have: the kind ids, then the non-memory crash's (scan's counts list each)."""
        return self.ids + ((self.crash.id,) if self.crash is not None else ())

    def kind(self, kind_id: str) -> OomKind:
        """The kind with this id, or the non-memory crash entry (KeyError when there is none)."""
        for k in self.kinds:
            if k.id == kind_id:
                return k
        if self.crash is not None and self.crash.id == kind_id:
            return self.crash
        raise KeyError(kind_id)

    def is_crash(self, kind_id: str) -> bool:
        """Whether events of this id are non-memory crashes (sglang_oom_crashes_total), not OOM events."""
        return self.crash is not None and self.crash.id == kind_id

    def evidence_kinds(self) -> frozenset[str]:
        """Kinds whose text is not SGLang's alone: they count only with SGLang evidence (detect/evidence.py)."""
        return frozenset(k.id for k in self.kinds if k.requires_sglang_evidence)

    def anchors(self) -> tuple[str, ...]:
        """Every anchor literal of every kind, deduplicated, in catalog order."""
        seen: dict[str, None] = {}
        for k in self.kinds:
            for a in k.anchors:
                seen.setdefault(a, None)
        return tuple(seen)
