"""Waker: file events wake the loop (inotify or forced polling) and stop leaves no threads behind.

Nothing sleeps to synchronise: each test polls wait() against a deadline.
"""

from __future__ import annotations

import os
import time

import pytest

from sglang_oom_exporter.sources.watch import Waker

DEADLINE_SECONDS = 5.0


def woke_within(waker, deadline=DEADLINE_SECONDS):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if waker.wait(0.05):
            return True
    return False


def append(path, data=b"x\n"):
    with open(path, "ab") as handle:
        handle.write(data)


@pytest.fixture(params=[False, True], ids=["inotify", "polling"])
def waker(request):
    """A started Waker, inotify or forced polling, stopped after the test."""
    made = Waker(force_polling=request.param, polling_interval=0.05)
    made.start()
    yield made
    made.stop()


def test_write_wakes_the_loop(log_dir, waker):
    waker.watch_dirs({str(log_dir)})
    assert waker.watched == {str(log_dir)}
    append(log_dir / "server.log")
    assert woke_within(waker)
    assert str(log_dir) in (waker.take_changed() or set())


def test_rotation_wakes_the_loop(log_dir, waker):
    append(log_dir / "0.log")
    waker.watch_dirs({str(log_dir)})
    os.rename(log_dir / "0.log", log_dir / "0.log.20260314-220733")
    assert woke_within(waker)


def test_no_event_means_timeout(log_dir):
    waker = Waker()
    waker.start()
    try:
        waker.watch_dirs({str(log_dir)})
        assert waker.wait(0.01) is False
        waker.wake()
        assert waker.wait(0) is True
    finally:
        waker.stop()


def test_missing_dir_is_watched_once_it_exists(tmp_path):
    later = tmp_path / "later"
    waker = Waker()
    waker.start()
    try:
        waker.watch_dirs({str(later)})
        assert waker.watched == set()
        later.mkdir()
        waker.watch_dirs({str(later)})
        assert waker.watched == {str(later)}
        append(later / "1.log")
        assert woke_within(waker)
    finally:
        waker.stop()


def test_recreated_dir_is_watched_again(tmp_path):
    directory = tmp_path / "sglang"
    directory.mkdir()
    waker = Waker()
    waker.start()
    try:
        waker.watch_dirs({str(directory)})
        directory.rmdir()
        assert woke_within(waker)  # the deletion event marks the watch dead
        directory.mkdir()
        waker.watch_dirs({str(directory)})
        assert waker.watched == {str(directory)}
        append(directory / "0.log")
        assert woke_within(waker)
    finally:
        waker.stop()


# watchdog warns when a nested directory is created while it is adding the parent's watches; harmless.
@pytest.mark.filterwarnings("ignore:Callback with id:RuntimeWarning")
def test_recursive_watch_sees_new_pod_dirs(tmp_path):
    root = tmp_path / "pods"
    root.mkdir()
    waker = Waker(recursive=True)
    waker.start()
    try:
        waker.watch_dirs({str(root)})
        container = root / "llm_sglang-0_uid" / "sglang"
        container.mkdir(parents=True)
        assert woke_within(waker)
        append(container / "0.log")
        end = time.monotonic() + DEADLINE_SECONDS
        while str(container) not in (waker.take_changed() or set()) and time.monotonic() < end:
            waker.wait(0.05)
        assert time.monotonic() < end
    finally:
        waker.stop()


def test_unwatched_dir_stops_waking(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    waker = Waker()
    waker.start()
    try:
        waker.watch_dirs({str(a), str(b)})
        waker.watch_dirs({str(b)})
        assert waker.watched == {str(b)}
    finally:
        waker.stop()


def test_stop_is_idempotent_and_works_before_start(log_dir):
    never_started = Waker()
    never_started.stop()
    waker = Waker()
    waker.watch_dirs({str(log_dir)})
    waker.start()
    assert waker.watched == {str(log_dir)}
    waker.stop()
    waker.stop()
    # The autouse guard in conftest.py fails this test if any watchdog thread is still alive.


def test_an_append_in_a_quiet_directory_is_noted_without_waking_the_loop(tmp_path):
    quiet, loud = str(tmp_path / "foreign"), str(tmp_path / "sglang")
    waker = Waker()
    waker.quiet({quiet})
    waker.note(quiet, modified=True)
    assert waker.wait(0) is False  # read on the loop's next tick, not now
    waker.note(loud, modified=True)
    assert waker.wait(0) is True
    assert waker.take_changed() == {quiet, loud}
    waker.note(quiet, created=True)  # a new file (a rotation, a restart's next n.log) wakes the loop at once
    assert waker.wait(0) is True
    waker.note(quiet, gone=True)
    assert waker.wait(0) is True
    waker.quiet(set())
    waker.note(quiet, modified=True)
    assert waker.wait(0) is True


def test_inotify_appends_in_a_quiet_directory_wake_nobody_but_are_taken_with_the_next_wake(tmp_path):
    quiet, loud = tmp_path / "foreign", tmp_path / "sglang"
    quiet.mkdir()
    loud.mkdir()
    append(quiet / "0.log")
    append(loud / "0.log")
    waker = Waker()
    waker.start()
    try:
        waker.watch_dirs({str(quiet), str(loud)})
        waker.quiet({str(quiet)})
        append(quiet / "0.log")
        assert waker.wait(0.3) is False
        append(loud / "0.log")  # inotify hands events over in order: the quiet append was noted before this one
        assert woke_within(waker)
        changed: set[str] = set()
        end = time.monotonic() + DEADLINE_SECONDS
        while str(loud) not in changed and time.monotonic() < end:
            changed |= waker.take_changed() or set()
            waker.wait(0.05)
        assert changed == {str(quiet), str(loud)}
    finally:
        waker.stop()
