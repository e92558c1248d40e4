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


def changed_until(waker, directory, deadline=DEADLINE_SECONDS):
    """Every directory take_changed() names until `directory` is among them (or the deadline passes)."""
    seen: set[str] = set()
    end = time.monotonic() + deadline
    while directory not in seen and time.monotonic() < end:
        waker.wait(0.05)
        taken = waker.take_changed()
        seen |= {"*"} if taken is None else taken
    return seen


@pytest.fixture
def pod_root(tmp_path):
    """A pod log root, and a started recursive Waker (inotify) watching it, stopped after the test."""
    root = tmp_path / "pods"
    root.mkdir()
    made = Waker(recursive=True)
    made.start()
    yield root, made
    made.stop()


def test_a_recursive_root_watches_the_pod_directories_that_were_there_before(pod_root):
    root, waker = pod_root
    container = root / "llm_sglang-0_uid" / "sglang"
    container.mkdir(parents=True)
    waker.watch_dirs({str(root)})
    assert waker.watched == {str(root)}
    append(container / "0.log")
    assert str(container) in changed_until(waker, str(container))


def test_files_made_in_a_new_directory_before_its_watch_are_noted_as_created(pod_root):
    # mkdir -p and the first write can both land before the reader adds the new directory's watch: the
    # directories found then are noted as created, so the loop discovers and reads them without an event.
    root, waker = pod_root
    waker.watch_dirs({str(root)})
    container = root / "llm_sglang-1_uid" / "sglang"
    container.mkdir(parents=True)
    append(container / "0.log")
    assert str(container) in changed_until(waker, str(container))
    assert waker.take_created() is True


def test_an_overflowed_event_queue_means_look_everywhere():
    waker = Waker()
    waker.take_changed()
    waker.overflowed()
    assert waker.wait(0) is True
    assert waker.take_changed() is None
    assert waker.take_created() is True  # a glob's new match may be among the lost events: discover too
    assert waker.take_changed() == set()


def test_a_burst_of_writes_to_one_file_is_read_as_a_few_events(tmp_path, monkeypatch):
    # The reader lets a batch gather, and the kernel merges a file's repeated writes meanwhile: a thousand
    # appends cost a few events, not a thousand (watchdog made an object for each and passed it across threads).
    from sglang_oom_exporter.sources import inotify

    seen: list[int] = []
    dispatch = inotify.Watches._dispatch
    monkeypatch.setattr(
        inotify.Watches, "_dispatch", lambda self, events: (seen.append(len(events)), dispatch(self, events))
    )
    (tmp_path / "0.log").write_bytes(b"")
    waker = Waker()
    waker.start()
    try:
        waker.watch_dirs({str(tmp_path)})
        with open(tmp_path / "0.log", "ab", buffering=0) as fh:
            for _ in range(1000):
                fh.write(b"x\n")
        assert str(tmp_path) in changed_until(waker, str(tmp_path))
    finally:
        waker.stop()
    assert 1 <= sum(seen) < 1000


def test_watches_the_kernel_refuses_are_warned_about_once(tmp_path, monkeypatch, caplog):
    # A node past fs.inotify.max_user_watches refuses every new directory: one warning, not one per directory.
    import errno

    from sglang_oom_exporter.sources import inotify

    def refuse(self, path, mask):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(inotify.INotify, "add_watch", refuse)
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    waker = Waker()
    waker.start()
    try:
        with caplog.at_level("DEBUG", logger="sglang_oom_exporter.sources.inotify"):
            waker.watch_dirs({str(tmp_path / n) for n in ("a", "b", "c")})
        assert waker.watched == set()
        refusals = [r for r in caplog.records if "cannot watch" in r.getMessage()]
        assert [r.levelname for r in refusals] == ["WARNING", "DEBUG", "DEBUG"]
    finally:
        waker.stop()
