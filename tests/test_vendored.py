"""The vendored validation data (tests/schemas/) is byte-identical to what its README records."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

SCHEMAS = Path(__file__).parent / "schemas"
_RECORDED = dict(
    (name, digest) for digest, name in re.findall(r"^([0-9a-f]{64})  (\S+)$", (SCHEMAS / "README.md").read_text(), re.M)
)


def test_the_readme_records_six_files():
    assert sorted(_RECORDED) == sorted(p.name for p in SCHEMAS.iterdir() if p.name != "README.md")
    assert len(_RECORDED) == 6


@pytest.mark.parametrize("name", sorted(_RECORDED))
def test_vendored_file_matches_its_recorded_hash(name):
    assert _RECORDED[name] == hashlib.sha256((SCHEMAS / name).read_bytes()).hexdigest()
