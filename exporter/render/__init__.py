"""Render: catalog -> the generated files of the alert pack (rules, runbooks, dashboards, chart copies), and
the settings table -> the configuration reference (docs/configuration-reference.md).

Every generated file is a pure function of the catalog and a few options, written under one output root
(the repository root by default). `render --check` compares a fresh render with the files on disk and names
each stale one, so CI fails when someone edits the catalog and forgets to re-render, or edits an output by hand.

Each renderer is a function `(catalog, options) -> {relative path: text}` listed in RENDERERS; later ones may
read what earlier ones produced (the chart copies the rules and dashboards).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ..catalog import Catalog, default_catalog_path
from .options import (
    Files,
    Renderer,
    RenderOptions,
)


def renderers() -> list[Renderer]:
    """The renderers in order; imported lazily so that `serve` and `scan` never load them."""
    from .alerts import render_alerts
    from .chart import render_chart
    from .dashboards import render_dashboards
    from .runbooks import render_runbooks
    from .settingsdoc import render_settings_reference

    # The chart copies what the others wrote: it stays last.
    return [render_alerts, render_runbooks, render_dashboards, render_settings_reference, render_chart]


def render_all(catalog: Catalog, options: RenderOptions | None = None) -> Files:
    """Every generated file, keyed by its path relative to the output root."""
    options = options or RenderOptions()
    files: Files = {}
    for renderer in renderers():
        for path, text in renderer(catalog, options, dict(files)).items():
            if path in files:
                raise ValueError(f"two renderers write {path}")
            files[path] = text
    return files


def is_checkout(catalog: Catalog, out_dir: str | Path) -> bool:
    """Whether out_dir is the checkout whose built-in catalog this is."""
    ours = Path(out_dir) / "exporter" / "catalog" / "catalog.yaml"
    try:
        return ours.samefile(catalog.path) and catalog.path == default_catalog_path()
    except OSError:
        return False


def checkout_files(catalog: Catalog, out_dir: str | Path) -> Files:
    """The package's own generated files when out_dir is the checkout this catalog is the built-in one of:
    the project URL from pyproject.toml (render/projecturl.py). A render into any other folder does not get it."""
    from . import projecturl

    if not is_checkout(catalog, out_dir):
        return {}
    files: Files = {}
    url = projecturl.checkout_project_url(out_dir)
    if url is not None:
        files[projecturl.REPO_PATH] = projecturl.render_text(url)
    return files


def write_files(files: Mapping[str, str], out_dir: str | Path) -> list[str]:
    """Write the files under out_dir (creating folders); return the paths whose content changed."""
    root = Path(out_dir)
    changed = stale_files(files, root)
    for rel in changed:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[rel], encoding="utf-8")
    return changed


def stale_files(files: Mapping[str, str], out_dir: str | Path) -> list[str]:
    """The paths under out_dir that are missing or differ from a fresh render."""
    root = Path(out_dir)
    stale = []
    for rel, text in sorted(files.items()):
        path = root / rel
        try:
            current = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            stale.append(rel)
            continue
        if current != text:
            stale.append(rel)
    return stale
