"""The daemon's parts wired together (App) in this process, driven one Loop.step() at a time by a settable clock:
no threads and no sleeps. `make_app` builds one on a test directory, `run_app` moves its clock, and the state
file helpers write what a previous run would have left.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sglang_oom_exporter.config.load import load_config
from sglang_oom_exporter.config.model import Config
from sglang_oom_exporter.daemon.app import App
from tests.support.helpers import CATALOG, Clock
from tests.support.logs import BLOCK, append

# Every App make_app built during the running test: close_apps_after_each_test closes their files, so a test
# that follows 500 files does not leave 500 descriptors to the next one (a worker past 1,024 open descriptors
# broke select() in test_scan_progress).
_MADE: list[App] = []


def make_app(tmp_path: Path, catalog: Any = CATALOG, **overrides: Any) -> tuple[App, Clock]:
    """An App following tmp_path/*.log with its state in tmp_path/state, short test intervals, and its clock."""
    clock = Clock()
    fields = {"paths": (str(tmp_path / "*.log"),), "state_dir": str(tmp_path / "state"), "traceback_wait": 1.0,
              "discover_interval": 5.0, "state_interval": 5.0, "sweep_interval": 1.0, **overrides}  # fmt: skip
    app = App(Config(**fields), catalog, clock=clock, wall=clock)
    _MADE.append(app)
    return app, clock


@pytest.fixture(autouse=True)
def close_apps_after_each_test() -> Iterator[None]:
    """Close the files of every App the test made (a plugin of conftest's: every test module has it)."""
    yield
    while _MADE:
        _MADE.pop().sources.close()


def run_app(app: App, clock: Clock, seconds: float = 3.0) -> None:
    """Step the loop for `seconds` of the clock, a quarter second a step."""
    end = clock.now + seconds
    while clock.now < end:
        app.loop.step()
        clock.now += 0.25


def config_fields(config: Config) -> dict[str, Any]:
    """A Config's fields by name, to build a changed copy (Config(**{**config_fields(c), ...}))."""
    return {name: getattr(config, name) for name in config.__dataclass_fields__}


def state_path(tmp_path: Path) -> str:
    """Where make_app's daemon keeps its state file."""
    return str(tmp_path / "state" / "state.json")


def write_state(tmp_path: Path, doc: object, *, raw: str | None = None) -> None:
    """Leave a state file for make_app's daemon: `doc` as JSON, or the `raw` text."""
    os.makedirs(tmp_path / "state", exist_ok=True)
    with open(state_path(tmp_path), "w", encoding="utf-8") as fh:
        fh.write(raw if raw is not None else json.dumps(doc))


def started_app(tmp_path: Path, **overrides: Any) -> tuple[App, Clock]:
    """An App started the way serve starts it (state loaded, positions saved before the first read), with no
    periodic save inside a test (a test saves, or leaves it unsaved to stand for a SIGKILL)."""
    app, clock = make_app(tmp_path, **{"state_interval": 60.0, **overrides})
    app.loop._start()
    return app, clock


def first_life(tmp_path: Path, history: str) -> str:
    """A started App on tmp_path/a.log (`history` written before it starts, so read from the end) that counted
    one decode OOM and saved its state, then stopped as a SIGKILL leaves it; the log's path."""
    log = tmp_path / "a.log"
    log.write_text(history)
    app, clock = started_app(tmp_path)
    append(str(log), BLOCK.format(s=1))
    app.loop.mark_changed({str(tmp_path)})
    run_app(app, clock, 3.0)
    assert app.counts.total("decode") == 1
    app.keeper.save()
    app.sources.close()
    return str(log)


def restarted_app(tmp_path: Path, seconds: float = 8.0, **overrides: Any) -> App:
    """A started App on the same directory (and state) as an earlier one, run for `seconds` of its clock."""
    app, clock = started_app(tmp_path, **overrides)
    run_app(app, clock, seconds)
    return app


def counted_app(tmp_path: Path, events: int) -> App:
    """An App that has counted `events` decode OOMs in tmp_path/a.log and saved its state."""
    app, clock = make_app(tmp_path)
    run_app(app, clock, 1.0)
    (tmp_path / "a.log").write_text("".join(BLOCK.format(s=i) for i in range(events)))
    app.loop.request_discover()
    run_app(app, clock, 8.0)
    assert app.counts.total("decode") == events
    app.keeper.save()
    return app


def config_from_text(tmp_path: Path, text: str) -> Config:
    """The Config a config.yaml of this text gives, with no environment."""
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return load_config(str(path), env={})
