"""The stand-in's one trick: a module __getattr__ whose every name is a function raising NotImplementedError."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def stub_names(module: str) -> Callable[[str], Any]:
    """A module-level __getattr__ for `module`: any public name is a callable that raises when called."""

    def getattr_(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        def stub(*args: object, **kwargs: object) -> None:
            raise NotImplementedError(f"{module}.{name}: the live test's torchvision stand-in is import-only")

        return stub

    return getattr_
