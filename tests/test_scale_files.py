"""The 10,000-files target: an idle followed file costs no pipeline, and what discovery and the open-file
bound do per file does not grow with the number of files. Driven with the fake clock (tests/test_app.py).
"""

from __future__ import annotations

import pytest

from sglang_oom_exporter.daemon.lazypipe import LazyPipeline
from sglang_oom_exporter.sources.handles import HandleBudget
from tests.support.app import make_app, run_app, started_app
from tests.support.logs import BLOCK

FILES = 500


def _files(tmp_path, n: int = FILES, text: str = "") -> None:
    for i in range(n):
        (tmp_path / f"s{i:04d}.log").write_text(text)


def _built(app) -> int:
    pipes = [s.pipeline for s in app.sources.followed()]
    assert all(isinstance(p, LazyPipeline) for p in pipes)
    return sum(1 for p in pipes if p.built)


def test_idle_files_build_no_pipeline_until_their_first_byte(tmp_path):
    _files(tmp_path)
    app, clock = started_app(tmp_path)
    run_app(app, clock, 2.0)
    assert len(app.sources.paths()) == FILES
    assert _built(app) == 0
    with open(tmp_path / "s0007.log", "a") as fh:
        fh.write(BLOCK.format(s=1))
    app.loop.mark_changed({str(tmp_path)})
    run_app(app, clock, 3.0)
    assert app.counts.total("decode") == 1
    assert _built(app) == 1


def test_a_restart_keeps_idle_files_unbuilt_and_counts_once(tmp_path):
    _files(tmp_path, text="[2026-03-14 22:00:00 TP0] Load weight end.\n")  # history: read from the end
    app, clock = started_app(tmp_path)
    with open(tmp_path / "s0003.log", "a") as fh:
        fh.write(BLOCK.format(s=2))
    app.loop.mark_changed({str(tmp_path)})
    run_app(app, clock, 3.0)
    assert app.counts.total("decode") == 1
    app.keeper.save()
    app.sources.close()
    app, clock = started_app(tmp_path)
    run_app(app, clock, 3.0)
    assert app.counts.total("decode") == 1  # restored, not re-counted
    assert _built(app) == 1  # only the file with dedupe memory to restore


def test_discovery_names_clashing_stems_apart(tmp_path):
    """The names in use are a set built once per discovery; clashes still get their parent directory."""
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "server.log").write_text("")
    app, _ = make_app(tmp_path, paths=(str(tmp_path / "*" / "server.log"),))
    app.loop._start()
    names = sorted(s.label_map["source"] for s in app.sources.followed())
    assert names == ["b/server", "server"]  # globs expand in sorted order: a/ is found first


class _Tailer:
    def __init__(self, budget: HandleBudget) -> None:
        self.budget = budget
        self.parked = 0

    def park(self) -> bool:
        self.parked += 1
        self.budget.released(self)  # as FileTailer.park does when it closes its file
        return True


@pytest.mark.parametrize("n", [1000, 4000])
def test_opens_under_the_bound_park_nothing_and_do_not_scan_the_table(n, monkeypatch):
    budget = HandleBudget(n)
    tailers = [_Tailer(budget) for _ in range(n)]
    copies = 0
    real_list = list

    def counting_list(x=()):
        nonlocal copies
        copies += 1
        return real_list(x)

    monkeypatch.setattr("builtins.list", counting_list)
    for t in tailers:
        assert budget.acquire(t)
        budget.opened(t)
    monkeypatch.undo()
    assert copies == 0
    assert budget.open_files == n
    assert budget.parks == 0
    extra = _Tailer(budget)
    assert budget.acquire(extra)  # at the bound: the least recently active one parks
    assert budget.parks == 1
    assert tailers[0].parked == 1
