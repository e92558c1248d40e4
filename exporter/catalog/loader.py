"""Load and validate catalog.yaml into OomKind objects: the first box of the pipeline's configuration.

The catalog is data; this module is the only code that reads it. Every problem found is collected into
one CatalogError whose lines say `file:line: key.path: what is wrong`, so a broken override file is fixed
in one pass rather than one error at a time.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import regex
import yaml

from ..errors import ProblemsError
from .alert_fields import AlertFields
from .model import Catalog, OomKind, Pattern, RemediationStep

# The value types live in model.py; they are imported from here by most of the code.
__all__ = [
    "EVENT_FIELDS", "KV_PHASES", "PHASES", "PHASE_GROUPS", "SEVERITIES", "SUGGEST_RULES", "Catalog", "CatalogError",
    "OomKind", "Pattern", "RemediationStep", "default_catalog_path", "load_catalog",
]  # fmt: skip

# Named groups a pattern may capture: the numeric and textual fields of an event. Anything else is a typo.
EVENT_FIELDS = frozenset(
    {
        "requested_tokens",
        "available_tokens",
        "req_slots_available",
        "req_slots_requested",
        "retracted_requests",
        "aborted_retracted_requests",
        "new_tokens_gained",
        "mamba_num_gained",
        "new_token_ratio_from",
        "new_token_ratio_to",
        "rid",
        "mem_fraction_static",
        "tried_to_allocate",
        "leak_available",
        "leak_total",
        "leaked_full_pages",
        "leaked_mamba_pages",
    }
)
SEVERITIES = ("critical", "warning", "info")
PHASES = ("prefill", "decode", "frames", "none")
PHASE_GROUPS = ("spec_verify", "decode", "prefill")
# The phases a KV failure is resolved to; `phase_kinds` in the catalog names the kind each one counts as.
KV_PHASES = ("prefill", "decode")
# Suggestion rules a kind (or one of its patterns) may name in `suggest:`; advise/rules.py implements each.
SUGGEST_RULES = (
    "none",
    "chunked_prefill",
    "running_requests",
    "prefill_or_decode",
    "request_slots",
    "conservativeness",
    "mem_fraction_up",
    "mem_fraction_down",
    "cuda_graph_bs",
    "mamba_cache",
)
_ID_RE = re.compile(r"^[a-z][a-z0-9_]*$")
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
        "__line__",
    }
)
_TOP_KEYS = frozenset(
    {"version", "phase_frames", "allocator_frames", "fallback_kind", "retraction_kind", "phase_kinds", "kinds",
     "alert_pack", "__line__"}
)  # fmt: skip
_PATTERN_KEYS = frozenset({"regex", "versions", "fatal", "suggest", "__line__"})


class CatalogError(ProblemsError):
    """Every problem found in a catalog file, one per line."""


try:  # libyaml's parser: the built-in catalog loads in a tenth of the pure-Python time
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # PyYAML built without libyaml
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]


class _LineLoader(_SafeLoader):
    """A SafeLoader that remembers the line of every mapping, for file:line error messages.

    The C loader gives every node the same marks as the Python one, so the lines are the same.
    """


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> dict[str, Any]:
    mapping = loader.construct_mapping(node, deep=True)
    mapping["__line__"] = node.start_mark.line + 1
    return mapping  # type: ignore[return-value]


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def default_catalog_path() -> str:
    """The catalog shipped inside the package."""
    return str(Path(__file__).with_name("catalog.yaml"))


def load_catalog(path: str | None = None) -> Catalog:
    """Read, validate and compile a catalog file; raise CatalogError listing every problem."""
    path = path or default_catalog_path()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogError([f"{path}: cannot read: {exc.strerror or exc}"]) from exc
    try:
        data = yaml.load(text, Loader=_LineLoader)  # noqa: S506 - _LineLoader is a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        raise CatalogError([f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}"]) from exc
    return _Validator(path).catalog(data)


class _Validator:
    """Turns the raw YAML tree into a Catalog, collecting problems instead of stopping at the first."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.problems: list[str] = []

    def err(self, node: Any, where: str, what: str) -> None:
        line = node.get("__line__") if isinstance(node, dict) else None
        self.problems.append(f"{self.path}:{line or '?'}: {where}: {what}")

    def catalog(self, data: Any) -> Catalog:
        if not isinstance(data, dict):
            raise CatalogError([f"{self.path}:1: the catalog must be a mapping with a 'kinds' list"])
        for key in sorted(set(data) - _TOP_KEYS):
            self.err(data, key, "unknown key")
        if data.get("version") != 1:
            self.err(data, "version", "must be 1")
        phase_frames = self._phase_frames(data)
        allocators = self._allocators(data)
        raw_kinds = data.get("kinds")
        kinds: list[OomKind] = []
        if not isinstance(raw_kinds, list) or not raw_kinds:
            self.err(data, "kinds", "must be a non-empty list")
        else:
            for i, raw in enumerate(raw_kinds):
                kind = self._kind(raw, f"kinds[{i}]")
                if kind is not None:
                    kinds.append(kind)
        ids = [k.id for k in kinds]
        for dup in sorted({i for i in ids if ids.count(i) > 1}):
            self.err(data, "kinds", f"duplicate id {dup!r}")
        for fn, target in allocators.items():
            if target != "frames" and target not in ids:
                self.err(data, f"allocator_frames.{fn}", f"names unknown kind {target!r}")
        roles = self._roles(data, ids)
        alert_pack = AlertFields(self, SEVERITIES).check(data)
        if self.problems:
            raise CatalogError(self.problems)
        return Catalog(tuple(kinds), phase_frames, allocators, self.path, **roles, alert_pack=alert_pack)

    def _roles(self, data: dict[str, Any], ids: list[str]) -> dict[str, Any]:
        """fallback_kind, retraction_kind and phase_kinds: each must name a kind of this catalog."""
        fallback = self._role(data, "fallback_kind", ids, required=True)
        retraction = self._role(data, "retraction_kind", ids, required=False) or None
        raw = data.get("phase_kinds")
        phase_kinds: dict[str, str] = {}
        if not isinstance(raw, dict) or set(raw) - {"__line__"} != set(KV_PHASES):
            self.err(data, "phase_kinds", f"must map each of {', '.join(KV_PHASES)} to a kind id")
        else:
            phase_kinds = {p: self._role(raw, p, ids, required=True, where=f"phase_kinds.{p}") for p in KV_PHASES}
        if fallback and fallback in ids and self._kind_phase(data, fallback) != "frames":
            self.err(data, "fallback_kind", f"kind {fallback!r} must have phase: frames (its phase is undecided)")
        return {"fallback_kind": fallback, "retraction_kind": retraction, "phase_kinds": phase_kinds}

    def _role(self, raw: dict[str, Any], key: str, ids: list[str], *, required: bool, where: str = "") -> str:
        value = raw.get(key)
        if value is None and not required:
            return ""
        if not isinstance(value, str) or value not in ids:
            what = "missing" if value is None else f"names unknown kind {value!r}"
            self.err(raw, where or key, f"{what}: it must be one of this catalog's kind ids")
            return ""
        return value

    @staticmethod
    def _kind_phase(data: dict[str, Any], kind_id: str) -> str:
        for raw in data.get("kinds") or []:
            if isinstance(raw, dict) and raw.get("id") == kind_id:
                return str(raw.get("phase"))
        return ""

    def _phase_frames(self, data: dict[str, Any]) -> dict[str, tuple[str, ...]]:
        raw = data.get("phase_frames")
        out: dict[str, tuple[str, ...]] = {}
        if not isinstance(raw, dict):
            self.err(data, "phase_frames", "must be a mapping")
            return out
        for group in sorted(set(raw) - set(PHASE_GROUPS) - {"__line__"}):
            self.err(raw, f"phase_frames.{group}", f"unknown group (use {', '.join(PHASE_GROUPS)})")
        for group in PHASE_GROUPS:
            names = raw.get(group)
            if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
                self.err(raw, f"phase_frames.{group}", "must be a list of frame names")
                continue
            out[group] = tuple(names)
        return out

    def _allocators(self, data: dict[str, Any]) -> dict[str, str]:
        raw = data.get("allocator_frames")
        if not isinstance(raw, dict):
            self.err(data, "allocator_frames", "must be a mapping of function name to kind id")
            return {}
        return {str(k): str(v) for k, v in raw.items() if k != "__line__"}

    def _str(self, raw: dict[str, Any], key: str, where: str, choices: tuple[str, ...] = ()) -> str:
        value = raw.get(key)
        if isinstance(value, bool) and key == "fatal":
            value = "true" if value else "false"
        if not isinstance(value, str) or not value.strip():
            self.err(raw, f"{where}.{key}", "missing or not a string")
            return ""
        if choices and value not in choices:
            self.err(raw, f"{where}.{key}", f"{value!r} is not one of {', '.join(choices)}")
        return value

    def _regex(self, raw: Any, text: Any, where: str) -> regex.Pattern[str] | None:
        if not isinstance(text, str) or not text:
            self.err(raw, where, "must be a non-empty regex string")
            return None
        try:
            compiled = regex.compile(text)
        except regex.error as exc:
            self.err(raw, where, f"bad regex: {exc}")
            return None
        for name in compiled.groupindex:
            if name not in EVENT_FIELDS:
                self.err(raw, where, f"named group {name!r} is not an event field ({', '.join(sorted(EVENT_FIELDS))})")
        return compiled

    def _kind(self, raw: Any, where: str) -> OomKind | None:
        if not isinstance(raw, dict):
            self.problems.append(f"{self.path}:?: {where}: must be a mapping")
            return None
        for key in sorted(set(raw) - _KIND_KEYS):
            self.err(raw, f"{where}.{key}", "unknown key")
        kid = self._str(raw, "id", where)
        if kid and not _ID_RE.match(kid):
            self.err(raw, f"{where}.id", f"{kid!r} is not snake_case")
        where = f"kinds[{kid or where}]"
        fatal = self._str(raw, "fatal", where, ("true", "false", "raised"))
        severity = self._str(raw, "severity", where, SEVERITIES)
        phase = self._str(raw, "phase", where, PHASES)
        join_on = self._str(raw, "join_on", where, ("body", "anchor"))
        anchors = raw.get("anchors")
        if not isinstance(anchors, list) or not anchors or not all(isinstance(a, str) and a for a in anchors):
            self.err(raw, f"{where}.anchors", "must be a non-empty list of literals")
            anchors = []
        patterns = self._patterns(raw, where)
        extract = []
        for j, text in enumerate(raw.get("extract") or []):
            compiled = self._regex(raw, text, f"{where}.extract[{j}]")
            if compiled is not None:
                extract.append(compiled)
        summary, steps = self._remediation(raw, where)
        examples = raw.get("examples")
        match_ex: list[str] = []
        no_match_ex: list[str] = []
        if not isinstance(examples, dict):
            self.err(raw, f"{where}.examples", "missing: every kind needs match and no_match examples")
        else:
            match_ex = [e for e in examples.get("match") or [] if isinstance(e, str)]
            no_match_ex = [e for e in examples.get("no_match") or [] if isinstance(e, str)]
            if not match_ex or not no_match_ex:
                self.err(examples, f"{where}.examples", "needs at least one match and one no_match line")
        runbook = raw.get("runbook")
        if not isinstance(runbook, dict) or not {"meaning", "impact"} <= set(runbook):
            self.err(raw, f"{where}.runbook", "needs meaning and impact")
            runbook = {}
        alert = raw.get("alert")
        if not isinstance(alert, dict):
            self.err(raw, f"{where}.alert", "missing")
            alert = {}
        suggest = self._suggest(raw, where) or "none"
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
            runbook={k: str(v) for k, v in runbook.items() if k != "__line__"},
            alert={k: v for k, v in alert.items() if k != "__line__"},
            match_examples=tuple(match_ex),
            no_match_examples=tuple(no_match_ex),
            suggest=suggest,
        )

    def _suggest(self, raw: dict[str, Any], where: str) -> str | None:
        """A `suggest:` rule name, checked against SUGGEST_RULES; None when absent or wrong."""
        value = raw.get("suggest")
        if value is None:
            return None
        if value not in SUGGEST_RULES:
            self.err(raw, f"{where}.suggest", f"{value!r} is not a suggestion rule ({', '.join(SUGGEST_RULES)})")
            return None
        return str(value)

    def _patterns(self, raw: dict[str, Any], where: str) -> list[Pattern]:
        out: list[Pattern] = []
        items = raw.get("patterns")
        if not isinstance(items, list) or not items:
            self.err(raw, f"{where}.patterns", "must be a non-empty list")
            return out
        for j, item in enumerate(items):
            pwhere = f"{where}.patterns[{j}]"
            if not isinstance(item, dict):
                self.err(raw, pwhere, "must be a mapping with a regex")
                continue
            for key in sorted(set(item) - _PATTERN_KEYS):
                self.err(item, f"{pwhere}.{key}", "unknown key")
            compiled = self._regex(item, item.get("regex"), f"{pwhere}.regex")
            fatal = item.get("fatal")
            if fatal is not None and not isinstance(fatal, bool):
                self.err(item, f"{pwhere}.fatal", "must be true or false")
                fatal = None
            if compiled is not None:
                out.append(Pattern(compiled, fatal, str(item.get("versions", "")), self._suggest(item, pwhere)))
        return out

    def _remediation(self, raw: dict[str, Any], where: str) -> tuple[str, list[RemediationStep]]:
        rem = raw.get("remediation")
        if not isinstance(rem, dict):
            self.err(raw, f"{where}.remediation", "missing")
            return "", []
        summary = self._str(rem, "summary", f"{where}.remediation")
        steps: list[RemediationStep] = []
        for j, step in enumerate(rem.get("steps") or []):
            if not isinstance(step, dict) or not all(isinstance(step.get(k), str) for k in ("flag", "action", "when")):
                self.err(rem, f"{where}.remediation.steps[{j}]", "needs flag, action and when strings")
                continue
            steps.append(RemediationStep(step["flag"], step["action"], step["when"]))
        if not steps:
            self.err(rem, f"{where}.remediation.steps", "needs at least one step")
        return summary, steps
