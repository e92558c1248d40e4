"""Shared fixtures: a per-test log directory and an autouse guard that fails tests leaking threads."""

from __future__ import annotations

import threading
import time

import pytest

# Threads get this long to finish after a test: a stopped observer's threads exit asynchronously.
_THREAD_GRACE_SECONDS = 2.0


@pytest.fixture
def log_dir(tmp_path):
    """A fresh directory for the log files of one test."""
    directory = tmp_path / "logs"
    directory.mkdir()
    return directory


@pytest.fixture(autouse=True)
def _no_leaked_threads():
    """Fail the test if it leaves threads running (watchdog's conftest does the same)."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + _THREAD_GRACE_SECONDS
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    while leaked and time.monotonic() < deadline:
        leaked[0].join(deadline - time.monotonic())
        leaked = [t for t in leaked if t.is_alive()]
    assert not leaked, f"test leaked threads: {leaked}"
