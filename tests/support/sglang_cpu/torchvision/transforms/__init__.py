"""torchvision.transforms, import only (see the package's docstring)."""

from __future__ import annotations

import enum

from torchvision._stub import stub_names


class InterpolationMode(enum.Enum):
    """torchvision's members, by the same names and values."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


__getattr__ = stub_names(__name__)
