"""The offline `scan`: serial.py (one input through one pipeline), parallel.py and join.py (`--jobs N`: files in
worker processes, big files cut into ranges and joined exactly), report.py (the result and its text and JSON),
run.py (scan_paths, which picks serial or parallel). The CLI and the tests import from here.
"""

from __future__ import annotations

from .report import ScanResult, format_text
from .run import MIN_PARALLEL_BYTES, load_server_args, scan_paths
from .serial import CHUNK, InputError, check_readable, input_size, open_input, scan_stream

__all__ = [
    "CHUNK",
    "MIN_PARALLEL_BYTES",
    "InputError",
    "ScanResult",
    "check_readable",
    "format_text",
    "input_size",
    "load_server_args",
    "open_input",
    "scan_paths",
    "scan_stream",
]
