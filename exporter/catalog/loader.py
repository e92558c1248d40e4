"""Load catalog.yaml into a Catalog: read the YAML with the line of every mapping, then validate.py checks it.

The catalog is data; this package is the only code that reads it. Every problem found is collected into
one CatalogError whose lines say `file:line: key.path: what is wrong`, so a broken override file is fixed
in one pass rather than one error at a time. The closed lists an entry may use are in vocabulary.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from .model import Catalog, OomKind, Pattern, RemediationStep
from .validate import CatalogError, Validator
from .vocabulary import EVENT_FIELDS, KV_PHASES, PHASE_GROUPS, PHASES, SEVERITIES, SUGGEST_RULES

# The value types live in model.py; they are imported from here by most of the code.
__all__ = [
    "EVENT_FIELDS", "KV_PHASES", "PHASES", "PHASE_GROUPS", "SEVERITIES", "SUGGEST_RULES", "Catalog", "CatalogError",
    "OomKind", "Pattern", "RemediationStep", "default_catalog_path", "load_catalog",
]  # fmt: skip

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
    return Validator(path).catalog(data)
