"""The catalog's top level: the raw YAML tree -> a Catalog, every problem collected into one CatalogError.

Checks the top-level keys, the phase frames and allocator frames, the roles (fallback_kind, retraction_kind,
phase_kinds) against the kinds this catalog defines; each kind goes to kind_fields.py, the alert blocks to
alert_fields.py.
"""

from __future__ import annotations

from typing import Any

from ..errors import ProblemsError
from .alert_fields import AlertFields
from .kind_fields import KindFields
from .model import Catalog, OomKind
from .vocabulary import CRASH_FRAME_GROUPS, KIND_GROUPS, KV_PHASES, PHASE_FRAMES, PHASE_GROUPS, SEVERITIES

_TOP_KEYS = frozenset(
    {"version", "phase_frames", "allocator_frames", "fallback_kind", "retraction_kind", "phase_kinds", "kinds",
     "alert_pack", "crash_headers", "crash_frames", "crash_exceptions", "startup_kind", "crash", "__line__"}
)  # fmt: skip


class CatalogError(ProblemsError):
    """Every problem found in a catalog file, one per line."""


class Validator:
    """Turns the raw YAML tree into a Catalog, collecting problems instead of stopping at the first."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.problems: list[str] = []

    def err(self, node: Any, where: str, what: str) -> None:
        """Note a problem at `where`, with the line of `node` when it has one."""
        line = node.get("__line__") if isinstance(node, dict) else None
        self.problems.append(f"{self.path}:{line or '?'}: {where}: {what}")

    def catalog(self, data: Any) -> Catalog:
        """The validated Catalog; CatalogError lists every problem."""
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
        kinds_check = KindFields(self)
        if not isinstance(raw_kinds, list) or not raw_kinds:
            self.err(data, "kinds", "must be a non-empty list")
        else:
            for i, raw in enumerate(raw_kinds):
                kind = kinds_check.kind(raw, f"kinds[{i}]")
                if kind is not None:
                    kinds.append(kind)
        ids = [k.id for k in kinds]
        for dup in sorted({i for i in ids if ids.count(i) > 1}):
            self.err(data, "kinds", f"duplicate id {dup!r}")
        for fn, target in allocators.items():
            if target != PHASE_FRAMES and target not in ids:
                self.err(data, f"allocator_frames.{fn}", f"names unknown kind {target!r}")
        roles = self._roles(data, ids)
        alert_pack = AlertFields(self, SEVERITIES).check(data)
        crash = self._crash(data, kinds_check, ids)
        if self.problems:
            raise CatalogError(self.problems)
        return Catalog(tuple(kinds), phase_frames, allocators, self.path, **roles, alert_pack=alert_pack, **crash)

    def _crash(self, data: dict[str, Any], kinds_check: KindFields, ids: list[str]) -> dict[str, Any]:
        """The crash rules (all optional; a catalog without them counts no crash): crash_headers, crash_frames,
        startup_kind and the `crash` entry, a kind-shaped mapping whose alert block adds `loop`."""
        headers = data.get("crash_headers", [])
        if not isinstance(headers, list) or not all(isinstance(h, str) and h for h in headers):
            self.err(data, "crash_headers", "must be a list of header texts")
            headers = []
        frames: dict[str, tuple[str, ...]] = {}
        raw = data.get("crash_frames", {})
        if not isinstance(raw, dict):
            self.err(data, "crash_frames", f"must map {', '.join(CRASH_FRAME_GROUPS)} to frame lists")
            raw = {}
        for group in sorted(set(raw) - set(CRASH_FRAME_GROUPS) - {"__line__"}):
            self.err(raw, f"crash_frames.{group}", f"unknown group (use {', '.join(CRASH_FRAME_GROUPS)})")
        for group in CRASH_FRAME_GROUPS:
            names = raw.get(group, [])
            if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
                self.err(raw, f"crash_frames.{group}", "must be a list of frames")
                continue
            frames[group] = tuple(names)
        exceptions = data.get("crash_exceptions", [])
        if not isinstance(exceptions, list) or not all(isinstance(e, str) and e.isidentifier() for e in exceptions):
            self.err(data, "crash_exceptions", "must be a list of exception class names")
            exceptions = []
        startup = self._role(data, "startup_kind", ids, required=False) or None
        crash = None
        if data.get("crash") is not None:
            crash = kinds_check.kind(data["crash"], "crash")
            if crash is not None and crash.id in ids:
                self.err(data, "crash.id", f"{crash.id!r} is also a kind: a crash is counted apart from the OOM kinds")
            loop = crash.alert.get("loop") if crash is not None else None
            if isinstance(loop, dict):
                loop.pop("__line__", None)
            if crash is not None and (not isinstance(loop, dict) or not {"severity", "count", "window"} <= set(loop)):
                self.err(data["crash"], "crash.alert.loop", "needs severity, count and window (the crash-loop page)")
        if headers and crash is None:
            self.err(data, "crash", "missing: crash_headers need the non-memory crash entry")
        return {
            "crash_headers": tuple(headers),
            "crash_frames": frames,
            "crash_exceptions": frozenset(exceptions),
            "startup_kind": startup,
            "crash": crash,
        }

    def _roles(self, data: dict[str, Any], ids: list[str]) -> dict[str, Any]:
        """fallback_kind, retraction_kind and phase_kinds: each must name a kind of this catalog."""
        fallback = self._role(data, "fallback_kind", ids, required=True)
        retraction = self._role(data, "retraction_kind", ids, required=False) or None
        raw = data.get("phase_kinds")
        phase_kinds: dict[str, str] = {}
        keys = set(raw) - {"__line__"} if isinstance(raw, dict) else set()
        if not isinstance(raw, dict) or not set(KV_PHASES) <= keys <= set(KV_PHASES) | set(KIND_GROUPS):
            self.err(data, "phase_kinds", f"must map each of {', '.join(KV_PHASES)} (and may map "
                     f"{', '.join(KIND_GROUPS)}) to a kind id")  # fmt: skip
        else:
            phase_kinds = {p: self._role(raw, p, ids, required=True, where=f"phase_kinds.{p}") for p in KV_PHASES}
            phase_kinds |= {g: self._role(raw, g, ids, required=True, where=f"phase_kinds.{g}") for g in KIND_GROUPS
                            if g in keys}  # fmt: skip
        if fallback and fallback in ids and self._kind_phase(data, fallback) != PHASE_FRAMES:
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
