"""Load catalog.yaml into a Catalog: read the YAML with the line of every mapping (yamltree.py), then
validate.py checks it.

The catalog is data; this package is the only code that reads it. Every problem found is collected into
one CatalogError whose lines say `file:line: key.path: what is wrong`, so a broken override file is fixed
in one pass rather than one error at a time. The closed lists an entry may use are in vocabulary.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import yamltree
from .model import Catalog
from .validate import CatalogError, Validator


def default_catalog_path() -> str:
    """The catalog shipped inside the package."""
    return str(Path(__file__).with_name("catalog.yaml"))


def load_catalog(path: str | None = None) -> Catalog:
    """Read, validate and compile a catalog file; raise CatalogError listing every problem."""
    path = path or default_catalog_path()
    return Validator(path).catalog(load_tree(path))


def load_tree(path: str) -> Any:
    """A catalog file's raw tree, with the line of every mapping (`__line__`), not yet validated."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogError([f"{path}: cannot read: {exc.strerror or exc}"]) from exc
    return yamltree.parse_tree(text, path)
