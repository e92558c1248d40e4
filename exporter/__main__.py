"""`python -m sglang_oom_exporter`: the same entry point as the console script."""

from __future__ import annotations

import sys

from sglang_oom_exporter.cli import main

sys.exit(main())
