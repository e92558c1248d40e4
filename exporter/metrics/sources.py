"""Read statistics of the followed files, published by the loop as it reads, kept as cached families.

What a source costs: `file_lag_bytes` and `read_errors_total` per source (the dashboards filter and join on the
lag series), `last_read_timestamp_seconds` once it has read something; only for a source identified as SGLang
(detect/evidence.py): a node's foreign containers add to the totals and to `files_watched`, never a series of
their own. `sglang_sources` counts the sources (label sets) identified. Bytes, lines, records, matched records,
oversized lines and file resets are exporter-wide totals: one series each (resets one per reason), whatever the
number of files. The totals never go down: a file that is retired, or a source rebuilt by a reload, keeps what it
added, so `increase()` never sees a false reset.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..sources.fileid import RESET_REASONS
from .exposition import Page
from .names import SELF, Labels

_TOTALS = {  # SourceStats field -> (family name, help)
    "bytes_read": ("read_bytes", "Bytes read from the logs."),
    "lines_read": ("lines_read", "Lines read from the logs."),
    "records": ("records", "Log records (blocks, tracebacks, lines) near an anchor, assembled."),
    "matched_records": ("matched_records", "Records the catalog classified as an OOM report (before dedupe)."),
    "oversized_lines": ("oversized_lines", "Lines longer than the line limit, cut."),
    "foreign_events": ("foreign_events",
                       "OOM reports (before dedupe) not counted because neither their traceback nor their source "
                       "showed SGLang evidence (a generic CUDA OOM of another program)."),
}  # fmt: skip


@dataclass(slots=True)
class SourceStats:
    """Read statistics of one source (summed over the files that share its labels)."""

    labels: Labels
    files: int = 0
    bytes_read: float = 0.0
    lines_read: float = 0.0
    records: float = 0.0
    matched_records: float = 0.0
    read_errors: float = 0.0
    oversized_lines: float = 0.0
    lag_bytes: float = 0.0
    last_read: float | None = None
    foreign_events: float = 0.0
    sglang: bool = True  # identified as SGLang (or named by the user): only such a source has series of its own
    resets: dict[str, float] = field(default_factory=lambda: dict.fromkeys(RESET_REASONS, 0.0))


def _grown(new: float, old: float | None) -> float:
    """What a monotonic count added since old (a smaller value is a restart: all of it is new)."""
    return new if old is None or new < old else new - old


class SourceTable:
    """Per-file statistics, merged per source label set and summed exporter-wide; thread-safe (the page's lock)."""

    def __init__(self, page: Page, label_names: tuple[str, ...]) -> None:
        self._lock = page.lock
        self._by_path: dict[str, SourceStats] = {}
        self._groups: dict[Labels, set[str]] = {}
        self._f_files = page.family(f"{SELF}_files_watched", "gauge", "Log files being followed.")
        self._f_sglang = page.family(
            f"{SELF}_sglang_sources",
            "gauge",
            "Followed sources identified as SGLang (by their content or named by the user).",
        )
        self._sglang_groups: set[Labels] = set()
        self._f_totals = {key: page.family(f"{SELF}_{name}", "counter", doc) for key, (name, doc) in _TOTALS.items()}
        self._f_errors = page.family(f"{SELF}_read_errors", "counter", "Errors opening or reading log files.",
                                     label_names)  # fmt: skip
        self._f_resets = page.family(
            f"{SELF}_file_resets", "counter", "Rotations, truncations, re-creations and deletions seen.", ["reason"]
        )
        self._f_lag = page.family(
            f"{SELF}_file_lag_bytes",
            "gauge",
            "Bytes written to the logs but not read yet, at the loop's last look.",
            label_names,
        )
        self._f_last = page.family(f"{SELF}_last_read_timestamp_seconds", "gauge", "When new bytes were last read.",
                                   label_names)  # fmt: skip
        with self._lock:
            self._f_files.set((), 0.0)
            self._f_sglang.set((), 0.0)
            for fam in self._f_totals.values():
                fam.set((), 0.0)
            for reason in RESET_REASONS:
                self._f_resets.set((reason,), 0.0)

    def paths(self) -> set[str]:
        """The files published so far."""
        with self._lock:
            return set(self._by_path)

    def update(self, path: str, stats: SourceStats) -> None:
        """Publish one file's statistics (its own, not merged); only the lines whose value changed are re-encoded."""
        with self._lock:
            old = self._by_path.get(path)
            if old == stats:
                return
            if old is not None and old.labels != stats.labels:
                self._leave(path, old)
                old = None
            for key, fam in self._f_totals.items():
                grown = _grown(getattr(stats, key), None if old is None else getattr(old, key))
                if grown:
                    fam.add((), grown)
            for reason, n in stats.resets.items():
                grown = _grown(n, None if old is None else old.resets.get(reason))
                if grown:
                    self._f_resets.add((reason,), grown)
            self._by_path[path] = stats
            self._groups.setdefault(stats.labels, set()).add(path)
            self._f_files.add((), stats.files - (0 if old is None else old.files))
            self._merge(stats.labels)

    def remove(self, path: str) -> None:
        """A file no longer followed: its source's series go with its last file; the totals keep what it added."""
        with self._lock:
            old = self._by_path.get(path)
            if old is not None:
                self._leave(path, old)

    def _leave(self, path: str, old: SourceStats) -> None:
        del self._by_path[path]
        self._f_files.add((), -old.files)
        group = self._groups.get(old.labels, set())
        group.discard(path)
        if group:
            self._merge(old.labels)
            return
        self._groups.pop(old.labels, None)
        self._hide(old.labels)

    def _hide(self, labels: Labels) -> None:
        for fam in (self._f_errors, self._f_lag, self._f_last):
            fam.discard(labels)
        if labels in self._sglang_groups:
            self._sglang_groups.discard(labels)
            self._f_sglang.set((), float(len(self._sglang_groups)))

    def _merge(self, labels: Labels) -> None:
        members = [m for m in (self._by_path[p] for p in self._groups[labels]) if m.sglang]
        if not members:
            self._hide(labels)
            return
        if labels not in self._sglang_groups:
            self._sglang_groups.add(labels)
            self._f_sglang.set((), float(len(self._sglang_groups)))
        self._f_errors.set(labels, sum(s.read_errors for s in members))
        self._f_lag.set(labels, sum(s.lag_bytes for s in members))
        last = max((s.last_read for s in members if s.last_read is not None), default=None)
        if last is None:
            self._f_last.discard(labels)
        else:
            self._f_last.set(labels, last)
