"""torchvision.transforms.functional, import only (see the package's docstring)."""

from __future__ import annotations

from torchvision._stub import stub_names
from torchvision.transforms import InterpolationMode

__all__ = ["InterpolationMode"]
__getattr__ = stub_names(__name__)
