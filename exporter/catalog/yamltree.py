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


class KeyLineLoader(LineLoader):
    """LineLoader that also keeps the line of every key (`__keys__`: key -> line)."""


def construct_mapping_with_keys(loader: KeyLineLoader, node: yaml.MappingNode) -> dict[str, Any]:
    """A mapping with its first line under `__line__` and each key's under `__keys__`."""
    mapping = construct_mapping(loader, node)
    mapping["__keys__"] = {str(k.value): k.start_mark.line + 1 for k, _ in node.value}
    return mapping


KeyLineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping_with_keys)


def parse_tree(text: str, path: str, *, key_lines: bool = False) -> Any:
    """The tree of a catalog's YAML text; CatalogError (with file:line) when it is not YAML.

    key_lines: keep each key's own line too (`__keys__`), so that an error about one key of a block mapping
    names its line (render --overrides).
    """
    try:
        return yaml.load(text, Loader=KeyLineLoader if key_lines else LineLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        raise CatalogError([f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}"]) from exc
