"""Render, configuration without forking the catalog: a small overrides file merged onto it (`render --overrides`).

The keys are kubernetes-mixin's `_config` for this pack: where the series come from, the label that keeps
clusters apart, and each alert's numbers, named by the alert and not by where the catalog keeps them:

    job_selector: 'job=~"sglang-oom.*"'   # any label matchers; default job="<alert_pack.job>"
    cluster_label: k8s_cluster            # default cluster
    alerts:
      SGLangKVCacheNearFull: {threshold: 0.95, for: 15m}
      SGLangPrefillOOM: {for: 1m, keep_firing_for: 30m}

An alert takes the keys its catalog block has (a fatal kind's for, window and keep_firing_for; a rate
alert's threshold_per_minute; a pack alert's severity and numbers). The file is checked like the catalog,
every problem at once as `file:line: key.path: what`, with the merged block checked by the catalog's own
rules (catalog/alert_fields.py): a Prometheus duration, a positive number, a ratio at most 1, `for` shorter
than the window. The merged tree then goes through the catalog's whole validation again.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from ..catalog import AlertFields, Catalog, CatalogError, Validator, default_catalog_path, load_tree, parse_tree
from ..catalog.vocabulary import SEVERITIES
from .alerts import alert_pack

TOP_KEYS = ("job_selector", "cluster_label", "alerts")


def _blocks(tree: dict[str, Any], catalog: Catalog) -> dict[str, dict[str, Any]]:
    """Each alert's block in the catalog tree, by alert name (the same dicts: changing one edits the tree)."""
    kinds = {raw.get("id"): raw for raw in tree.get("kinds") or [] if isinstance(raw, dict)}
    if isinstance(tree.get("crash"), dict):  # the non-memory crash: a kind-shaped entry outside `kinds`
        kinds[tree["crash"].get("id")] = tree["crash"]
    blocks: dict[str, dict[str, Any]] = {}
    for spec in alert_pack(catalog):
        if spec.kind is not None:
            alert = kinds[spec.kind.id]["alert"]
            nested = {"non_fatal": "non_fatal", "crash_loop_any": "loop"}.get(spec.role)
            blocks[spec.name] = alert[nested] if nested else alert
        else:
            blocks[spec.name] = tree["alert_pack"][spec.role]
    return blocks


def _settable(block: dict[str, Any]) -> set[str]:
    """The keys an override may set in a block: its numbers, durations and severity, not its name or parts."""
    return {k for k in block if k not in ("__line__", "name", "non_fatal", "loop")}


def _parse(text: str, path: str) -> Any:
    """The overrides' tree: the catalog's line-keeping YAML, plus each key's own line (`__keys__`), so that an
    error about one key names its line even in a block mapping."""
    return parse_tree(text, path, key_lines=True)


def _at(node: dict[str, Any], key: str) -> dict[str, Any]:
    """A stand-in node on the line of one key, for Validator.err."""
    return {"__line__": node.get("__keys__", {}).get(key, node.get("__line__"))}


def _strip(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip(v) for k, v in node.items() if k != "__keys__"}
    return node


def load_with_overrides(overrides_path: str, catalog_path: str | None = None) -> Catalog:
    """The catalog with the overrides file merged onto it; CatalogError lists every problem of either."""
    catalog_path = catalog_path or default_catalog_path()
    tree = load_tree(catalog_path)
    base = Validator(catalog_path).catalog(copy.deepcopy(tree))
    try:
        text = Path(overrides_path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogError([f"{overrides_path}: cannot read: {exc.strerror or exc}"]) from exc
    data = _parse(text, overrides_path)
    if data is None:
        data = {"__line__": 1}
    v = Validator(overrides_path)
    if not isinstance(data, dict):
        raise CatalogError([f"{overrides_path}:1: the overrides must be a mapping of {', '.join(TOP_KEYS)}"])
    for key in sorted(set(data) - {*TOP_KEYS, "__line__", "__keys__"}):
        v.err(_at(data, key), key, f"unknown key (use {', '.join(TOP_KEYS)})")
    fields = AlertFields(v, SEVERITIES)
    for key in ("job_selector", "cluster_label"):
        if key in data:
            fields.scope({key: data[key], **_at(data, key)}, "")
    pack = tree["alert_pack"]
    for key in ("job_selector", "cluster_label"):
        if key in data:
            pack[key] = data[key]
    alerts = data.get("alerts", {})
    if not isinstance(alerts, dict):
        v.err(data, "alerts", "must map alert names to their settings")
        alerts = {}
    blocks = _blocks(tree, base)
    for name, settings in alerts.items():
        if name in ("__line__", "__keys__"):
            continue
        where = f"alerts.{name}"
        if name not in blocks:
            v.err(_at(alerts, name), where, f"no such alert (one of {', '.join(sorted(blocks))})")
            continue
        if not isinstance(settings, dict):
            v.err(_at(alerts, name), where, "must be a mapping of the alert's settings")
            continue
        block = blocks[name]
        allowed = _settable(block)
        settings = _strip(settings)
        merged = {**block, **settings, "__line__": settings["__line__"]}
        fields.fields(merged, where, set(), allowed | {"name", "non_fatal", "loop"})
        # Unknown keys were reported as such; a key of the block that an override may not set is named here.
        for key in sorted(set(settings) & {"name", "non_fatal", "loop"}):
            v.err(settings, f"{where}.{key}", f"cannot be overridden (settable: {', '.join(sorted(allowed))})")
        block.update({k: val for k, val in settings.items() if k != "__line__"})
    if v.problems:
        raise CatalogError(v.problems)
    return Validator(catalog_path).catalog(tree)
