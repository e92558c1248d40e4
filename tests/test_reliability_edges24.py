"""Issue 24, defect 7 (the smaller ones): a state file nested 100,000 levels deep; `--check-config` on a non-UTF-8
file and on an empty config.
"""

from __future__ import annotations

import glob
import os

import pytest

from tests.test_app import _app
from tests.test_reliability_state import _state_path, _write_state
from tests.test_serve_e2e import Daemon

DEEP = 100_000


@pytest.mark.parametrize("raw", ["[" * DEEP + "]" * DEEP, '{"a":' * DEEP + "1" + "}" * DEEP], ids=["lists", "objects"])
def test_a_state_file_nested_100000_levels_deep_is_moved_aside(tmp_path, raw):
    _write_state(tmp_path, None, raw=raw)
    app, _ = _app(tmp_path)
    app.keeper.load()  # was: RecursionError out of json.loads, at every start
    assert app.keeper.errors == 1
    assert not os.path.exists(_state_path(tmp_path))
    assert len(glob.glob(_state_path(tmp_path) + ".corrupt-*")) == 1


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_serve_starts_on_a_state_file_nested_100000_levels_deep(tmp_path):
    (tmp_path / "a.log").write_text("")
    _write_state(tmp_path, None, raw="[" * DEEP + "]" * DEEP)
    d = Daemon([str(tmp_path / "*.log")], str(tmp_path / "state")).start()  # waits for /healthz
    try:
        assert d.metrics("sglang_oom_exporter_state_errors")[("sglang_oom_exporter_state_errors_total", ())] == 1
    finally:
        assert d.stop() == 0
