"""An import-only stand-in for torchvision (test support for tests/support/live_sglang.py only).

PyPI's torchvision for torch 2.13 links CUDA and fails at import on a CPU-only machine. SGLang 0.5.23 imports
`torchvision.transforms` when its multimodal configs load, even for a text model; nothing here is ever called
on the live tests' path, and every name raises NotImplementedError if it is.
"""

from __future__ import annotations

__version__ = "0.0.0+import-only"
