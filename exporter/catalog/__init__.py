"""The OOM catalog: catalog.yaml (the only place an OOM kind is defined) and its loader.

Everything downstream (matcher, metrics, suggestions, alerts, runbooks, dashboards) reads kinds from here.
"""

from __future__ import annotations

from .loader import Catalog, CatalogError, OomKind, Pattern, RemediationStep, default_catalog_path, load_catalog

__all__ = [
    "Catalog",
    "CatalogError",
    "OomKind",
    "Pattern",
    "RemediationStep",
    "default_catalog_path",
    "load_catalog",
]
