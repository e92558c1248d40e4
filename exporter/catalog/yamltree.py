"""catalog.yaml as a tree: PyYAML (libyaml's parser where built in) with the line of every mapping."""

from __future__ import annotations

from typing import Any

import yaml

from .validate import CatalogError

try:  # libyaml's parser: the built-in catalog loads in a tenth of the pure-Python time
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # PyYAML built without libyaml
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]


class LineLoader(_SafeLoader):
    """A SafeLoader that remembers the line of every mapping (key `__line__`), for file:line errors.

    The C loader gives every node the same marks as the Python one, so the lines are the same.
    """


def construct_mapping(loader: LineLoader, node: yaml.MappingNode) -> dict[str, Any]:
    """A mapping with its first line under `__line__`."""
    mapping = loader.construct_mapping(node, deep=True)
    mapping["__line__"] = node.start_mark.line + 1
    return mapping  # type: ignore[return-value]


LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)


def parse(text: str, path: str) -> Any:
    """The tree of a catalog's YAML text; CatalogError (with file:line) when it is not YAML."""
    try:
        return yaml.load(text, Loader=LineLoader)  # noqa: S506 - LineLoader is a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        raise CatalogError([f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}"]) from exc
