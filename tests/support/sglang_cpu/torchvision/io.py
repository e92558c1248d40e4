"""torchvision.io, import only (see the package's docstring)."""

from __future__ import annotations

from torchvision._stub import stub_names

__getattr__ = stub_names(__name__)
