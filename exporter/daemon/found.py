"""What discovery found, in words and names: each new file's `source` label, saved files to follow again, the
problem /healthz reports, and a restarted file's place. Pure helpers of the source set (sourceset.py).

    config + paths found --source_name / saved_but_missing / discovery_problem--> SourceSet.discover()
    state file entry --restore--> LogSource (line number, epoch, dedupe memory) + TailPosition
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Mapping
from typing import Any

from ..config.model import Config
from ..sources import saved as checked
from ..sources.discover import FilterTimeouts, KubernetesFilter
from ..sources.fileid import TailPosition
from ..sources.fsname import shown
from .logsource import LogSource


def source_name(names: Mapping[str, str], path: str, taken: set[str]) -> str:
    """The `source` label of a plain file: its configured name, else its stem, else parent/stem when taken.

    A name that is not UTF-8 is shown with \\xNN escapes (sources/fsname.py), as every label must encode."""
    for pattern, name in names.items():
        if pattern == path:
            return shown(name)
    base = shown(os.path.basename(path))
    stem = base[:-4] if base.endswith(".log") else base
    if stem in taken:
        parent = shown(os.path.basename(os.path.dirname(path)))
        return f"{parent}/{stem}" if parent else shown(path)
    return stem


def saved_but_missing(patterns: tuple[str, ...], saved: Mapping[str, Any], found: Mapping[str, Any]) -> list[str]:
    """Saved files that the configured globs matched before and that have no file at their path now."""
    globs = [os.path.expanduser(p) for p in patterns if any(c in p for c in "*?[")]
    return [p for p in saved if p not in found and any(fnmatch.fnmatchcase(p, g) for g in globs)]


def discovery_problem(config: Config, found: Mapping[str, Any], stdin: bool) -> str:
    """Why nothing is followed ("" when something is, or stdin is)."""
    if stdin:
        return ""
    k = config.kubernetes
    if k is not None and not os.path.isdir(k.logs_root):
        return f"the Kubernetes log root {k.logs_root} does not exist"
    if not found and not config.paths and k is None:
        return "no log paths are configured"
    if not found:
        return "no log file matches the configured paths yet"
    return ""


def kubernetes_filter(config: Config, timeouts: FilterTimeouts) -> KubernetesFilter | None:
    """The pod log filter of the config's Kubernetes mode (None without it), counting its timeouts in `timeouts`."""
    k = config.kubernetes
    return None if k is None else KubernetesFilter(k.namespace, k.pod, k.container, timeouts)


def restore(source: LogSource, saved: Mapping[str, Any]) -> TailPosition:
    """Put a restarted (or rebuilt) source where the state says: its line number, epoch and dedupe memory; return
    the position to resume from. Raises KeyError, TypeError or ValueError for an unusable entry, and then leaves
    the source as new."""
    try:
        position = TailPosition.from_dict(saved["position"])
        # Each field by type and range (sources/saved.py): a string where a number was, or a dedupe memory of
        # the wrong shape, costs this entry (counted), never the start.
        lineno = checked.optional(checked.integer, saved.get("lineno", 1), "lineno")
        epoch = checked.integer(saved.get("epoch", 0), "epoch")
        dedupe = dict(checked.obj(saved.get("dedupe", {}), "dedupe"))
        source.resume_lineno = lineno
        source.resume_offset = position.offset
        source.epoch = epoch
        source.pipeline.restore_state(dedupe)
    except (KeyError, TypeError, ValueError):
        source.resume_lineno = source.resume_offset = None
        raise
    return position
