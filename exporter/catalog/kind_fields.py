"""The catalog's kinds: one entry of `kinds:` checked field by field and compiled into an OomKind.

validate.py calls KindFields for each entry; every problem goes to the same reporter (file:line: key.path: what).
"""

from __future__ import annotations

from typing import Any

import regex

from .alert_fields import Reporter
from .model import OomKind, Pattern, RemediationStep
from .vocabulary import EVENT_FIELDS, ID_RE, PHASES, SEVERITIES, SUGGEST_RULES

_KIND_KEYS = frozenset(
    {
        "id",
        "title",
        "fatal",
        "severity",
        "phase",
        "join_on",
        "anchors",
        "patterns",
        "extract",
        "remediation",
        "runbook",
        "alert",
        "examples",
        "suggest",
        "requires_sglang_evidence",
        "__line__",
    }
)
_PATTERN_KEYS = frozenset({"regex", "versions", "fatal", "suggest", "joins", "frames", "__line__"})


class KindFields:
    """Checks one kind entry at a time, reporting to the catalog validator."""

    def __init__(self, validator: Reporter) -> None:
        self.v = validator

    def _str(self, raw: dict[str, Any], key: str, where: str, choices: tuple[str, ...] = ()) -> str:
        value = raw.get(key)
        if isinstance(value, bool) and key == "fatal":
            value = "true" if value else "false"
        if not isinstance(value, str) or not value.strip():
            self.v.err(raw, f"{where}.{key}", "missing or not a string")
            return ""
        if choices and value not in choices:
            self.v.err(raw, f"{where}.{key}", f"{value!r} is not one of {', '.join(choices)}")
        return value

    def _regex(self, raw: Any, text: Any, where: str) -> regex.Pattern[str] | None:
        if not isinstance(text, str) or not text:
            self.v.err(raw, where, "must be a non-empty regex string")
            return None
        try:
            compiled = regex.compile(text)
        except regex.error as exc:
            self.v.err(raw, where, f"bad regex: {exc}")
            return None
        for name in compiled.groupindex:
            if name not in EVENT_FIELDS:
                fields = ", ".join(sorted(EVENT_FIELDS))
                self.v.err(raw, where, f"named group {name!r} is not an event field ({fields})")
        return compiled

    def kind(self, raw: Any, where: str) -> OomKind | None:
        """One entry of `kinds:` as an OomKind, or None if it is not even a mapping."""
        if not isinstance(raw, dict):
            self.v.err(raw, where, "must be a mapping")
            return None
        for key in sorted(set(raw) - _KIND_KEYS):
            self.v.err(raw, f"{where}.{key}", "unknown key")
        kid = self._str(raw, "id", where)
        if kid and not ID_RE.match(kid):
            self.v.err(raw, f"{where}.id", f"{kid!r} is not snake_case")
        where = f"kinds[{kid or where}]"
        fatal = self._str(raw, "fatal", where, ("true", "false", "raised"))
        severity = self._str(raw, "severity", where, SEVERITIES)
        phase = self._str(raw, "phase", where, PHASES)
        join_on = self._str(raw, "join_on", where, ("body", "anchor"))
        anchors = self._anchors(raw, where)
        patterns = self._patterns(raw, where)
        extract = self._extract(raw, where)
        summary, steps = self._remediation(raw, where)
        match_ex, no_match_ex = self._examples(raw, where)
        runbook, alert = self._blocks(raw, where)
        suggest = self._suggest(raw, where) or "none"
        evidence = raw.get("requires_sglang_evidence", False)
        if not isinstance(evidence, bool):
            self.v.err(raw, f"{where}.requires_sglang_evidence", "must be true or false")
            evidence = False
        return OomKind(
            id=kid,
            title=self._str(raw, "title", where),
            fatal=fatal,
            severity=severity,
            phase=phase,
            join_on=join_on,
            anchors=tuple(anchors),
            patterns=tuple(patterns),
            extract=tuple(extract),
            summary=summary,
            steps=tuple(steps),
            runbook=runbook,
            alert=alert,
            match_examples=tuple(match_ex),
            no_match_examples=tuple(no_match_ex),
            suggest=suggest,
            requires_sglang_evidence=evidence,
        )

    def _anchors(self, raw: dict[str, Any], where: str) -> list[str]:
        anchors = raw.get("anchors")
        if not isinstance(anchors, list) or not anchors or not all(isinstance(a, str) and a for a in anchors):
            self.v.err(raw, f"{where}.anchors", "must be a non-empty list of literals")
            return []
        return anchors

    def _extract(self, raw: dict[str, Any], where: str) -> list[regex.Pattern[str]]:
        extract = []
        for j, text in enumerate(raw.get("extract") or []):
            compiled = self._regex(raw, text, f"{where}.extract[{j}]")
            if compiled is not None:
                extract.append(compiled)
        return extract

    def _blocks(self, raw: dict[str, Any], where: str) -> tuple[dict[str, str], dict[str, Any]]:
        """The `runbook` (meaning and impact at least) and `alert` blocks, without line keys."""
        runbook = raw.get("runbook")
        if not isinstance(runbook, dict) or not {"meaning", "impact"} <= set(runbook):
            self.v.err(raw, f"{where}.runbook", "needs meaning and impact")
            runbook = {}
        alert = raw.get("alert")
        if not isinstance(alert, dict):
            self.v.err(raw, f"{where}.alert", "missing")
            alert = {}
        text = {k: str(v) for k, v in runbook.items() if k != "__line__"}
        return text, {k: v for k, v in alert.items() if k != "__line__"}

    def _examples(self, raw: dict[str, Any], where: str) -> tuple[list[str], list[str]]:
        """The kind's `match` and `no_match` example lines; at least one of each."""
        examples = raw.get("examples")
        if not isinstance(examples, dict):
            self.v.err(raw, f"{where}.examples", "missing: every kind needs match and no_match examples")
            return [], []
        match_ex = [e for e in examples.get("match") or [] if isinstance(e, str)]
        no_match_ex = [e for e in examples.get("no_match") or [] if isinstance(e, str)]
        if not match_ex or not no_match_ex:
            self.v.err(examples, f"{where}.examples", "needs at least one match and one no_match line")
        return match_ex, no_match_ex

    def _suggest(self, raw: dict[str, Any], where: str) -> str | None:
        """A `suggest:` rule name, checked against SUGGEST_RULES; None when absent or wrong."""
        value = raw.get("suggest")
        if value is None:
            return None
        if value not in SUGGEST_RULES:
            self.v.err(raw, f"{where}.suggest", f"{value!r} is not a suggestion rule ({', '.join(SUGGEST_RULES)})")
            return None
        return str(value)

    def _patterns(self, raw: dict[str, Any], where: str) -> list[Pattern]:
        out: list[Pattern] = []
        items = raw.get("patterns")
        if not isinstance(items, list) or not items:
            self.v.err(raw, f"{where}.patterns", "must be a non-empty list")
            return out
        for j, item in enumerate(items):
            pwhere = f"{where}.patterns[{j}]"
            if not isinstance(item, dict):
                self.v.err(raw, pwhere, "must be a mapping with a regex")
                continue
            for key in sorted(set(item) - _PATTERN_KEYS):
                self.v.err(item, f"{pwhere}.{key}", "unknown key")
            compiled = self._regex(item, item.get("regex"), f"{pwhere}.regex")
            fatal = item.get("fatal")
            if fatal is not None and not isinstance(fatal, bool):
                self.v.err(item, f"{pwhere}.fatal", "must be true or false")
                fatal = None
            joins = item.get("joins")
            if joins is not None and not (isinstance(joins, str) and ID_RE.match(joins)):
                self.v.err(item, f"{pwhere}.joins", "must be a snake_case name")
                joins = None
            frames = item.get("frames", [])
            if not isinstance(frames, list) or not all(isinstance(f, str) and f.strip(":") for f in frames):
                self.v.err(item, f"{pwhere}.frames", 'must be a list of "function" or "path-fragment:function"')
                frames = []
            if compiled is not None:
                suggest = self._suggest(item, pwhere)
                out.append(Pattern(compiled, fatal, str(item.get("versions", "")), suggest, joins, tuple(frames)))
        return out

    def _remediation(self, raw: dict[str, Any], where: str) -> tuple[str, list[RemediationStep]]:
        rem = raw.get("remediation")
        if not isinstance(rem, dict):
            self.v.err(raw, f"{where}.remediation", "missing")
            return "", []
        summary = self._str(rem, "summary", f"{where}.remediation")
        steps: list[RemediationStep] = []
        for j, step in enumerate(rem.get("steps") or []):
            if not isinstance(step, dict) or not all(isinstance(step.get(k), str) for k in ("flag", "action", "when")):
                self.v.err(rem, f"{where}.remediation.steps[{j}]", "needs flag, action and when strings")
                continue
            steps.append(RemediationStep(step["flag"], step["action"], step["when"]))
        if not steps:
            self.v.err(rem, f"{where}.remediation.steps", "needs at least one step")
        return summary, steps
