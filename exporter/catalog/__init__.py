"""The OOM catalog: catalog.yaml (the only place an OOM kind is defined), its loader and its values.

Everything downstream (matcher, metrics, suggestions, alerts, runbooks, dashboards) reads kinds from here. This
package is the one way in: code outside catalog/ imports these names from `sglang_oom_exporter.catalog`, and the
closed lists an entry may use from `catalog.vocabulary` (tests/test_architecture.py checks). Its modules, one line
each, are in docs/architecture.md, the one code map.
"""

from __future__ import annotations

from .alert_fields import AlertFields
from .loader import default_catalog_path, load_catalog, load_tree
from .model import Catalog, OomKind, Pattern, RemediationStep
from .validate import CatalogError, Validator
from .yamltree import parse_tree

__all__ = [
    "AlertFields",
    "Catalog",
    "CatalogError",
    "OomKind",
    "Pattern",
    "RemediationStep",
    "Validator",
    "default_catalog_path",
    "load_catalog",
    "load_tree",
    "parse_tree",
]
