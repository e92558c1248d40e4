"""A path that flips between a directory and a regular file lost short-lived generations.

The cause was not the directory itself (it is opened, found not to be a regular file, counted as a read error and
looked at again on the next event): it was the inode. Seeing the directory at the path, the tailer lets go of the
deleted file it held; ext4 then gives that freed inode to the next file written there, whose events carried the
old file's keys (dev:ino:epoch@offset), so the deduper took the event at offset 0 for the one it had already
counted. The real daemon on real files, scraped over loopback; every step waits for what the daemon reports.
"""

from __future__ import annotations

import os

import pytest

from sglang_oom_exporter.daemon.logsource import LogSource
from sglang_oom_exporter.detect.pipeline import Pipeline
from sglang_oom_exporter.sources.fileid import RECREATED, TailChunk, TailItem, TailReset
from sglang_oom_exporter.sources.tail import FileTailer
from tests.support.app import make_app
from tests.support.daemon import Daemon, settle
from tests.support.helpers import CATALOG, MATCHER, wait_until
from tests.support.logs import oom_block

FLIPS = 10


def _errors(d: Daemon) -> float:
    m = d.metrics("sglang_oom_exporter_read_errors_total")
    return sum(v for (name, _), v in m.items() if name == "sglang_oom_exporter_read_errors_total")


@pytest.mark.e2e
@pytest.mark.slow
def test_a_path_flipping_between_file_and_directory_counts_every_generation(tmp_path, daemon_factory):
    path = tmp_path / "flip.log"
    d = daemon_factory(str(path))
    inodes = []
    for i in range(FLIPS):
        path.write_text(oom_block())
        inodes.append(path.stat().st_ino)
        wait_until(lambda n=i + 1: d.total() >= n, what=f"generation {i + 1} counted", timeout=15.0)
        errors = _errors(d)
        path.unlink()
        path.mkdir()
        # The daemon looks at the directory (one read error per look, never a crash), and lets the file go.
        wait_until(lambda e=errors: _errors(d) > e, what=f"the directory at the path, flip {i + 1}", timeout=15.0)
        path.rmdir()
    # was 1 to 5 of 10 on ext4: each reused inode's event was taken for a repeat. And settle would time out: the
    # directory's size (4096) less the file's offset stood as file_lag_bytes, a backlog that was never there.
    settle(d, FLIPS)
    m = d.metrics("sglang_oom_exporter_file_resets_total")
    assert m[("sglang_oom_exporter_file_resets_total", (("reason", "recreated"),))] == FLIPS
    assert d.proc is not None
    assert d.proc.poll() is None  # never crashed
    # What made it fail: on ext4 the files reuse few inodes (the tmpfs inode counter never reuses one; the
    # in-process test below pins the key logic on any filesystem).
    print(f"distinct inodes: {len(set(inodes))} of {FLIPS}")


class _Tailer:
    """Stands in for a FileTailer: hands out what a file recreated on the inode it freed yields."""

    def __init__(self) -> None:
        self.items: list[TailItem] = []
        self.lingering = False

    def poll(self) -> list[TailItem]:
        items, self.items = self.items, []
        return items


@pytest.mark.parametrize("traceback", [True, False])
def test_a_file_recreated_on_the_freed_inode_gets_new_event_keys(traceback):
    events = []
    # The daemon's traceback wait: an event is still waiting when its file ends and the next one starts.
    pipeline = Pipeline(CATALOG, MATCHER, source="s", location="/x/s.log", sink=events.append, wait_seconds=1.0)
    tailer = _Tailer()
    source = LogSource("/x/s.log", ("s",), {"source": "s"}, pipeline, tailer)  # type: ignore[arg-type]
    for i in range(5):
        # Each generation, 0.1 s apart: its block at offset 0 of inode 7, then the directory at the path ends it.
        block = oom_block(traceback=traceback).encode()
        tailer.items = [TailChunk("/x/s.log", block, 0, 1, 7), TailReset("/x/s.log", RECREATED)]
        source.poll(0.1 * i)
    for i in range(10):
        source.poll(1.0 + i)
    assert len(events) == 5  # was 1: the other four took the first one's key, dedupe suppressed them
    assert pipeline.stats().events == 5
    assert source.epoch == 4  # one new epoch per reuse of the inode: keys 1:7:0@0 ... 1:7:4@0


def test_a_directory_at_the_path_is_a_read_error_not_a_crash(tmp_path):
    os.mkdir(tmp_path / "d.log")
    events = []
    pipeline = Pipeline(CATALOG, MATCHER, source="s", location=str(tmp_path), sink=events.append, wait_seconds=0.0)
    tailer = FileTailer(str(tmp_path / "d.log"))
    source = LogSource(str(tmp_path / "d.log"), ("s",), {"source": "s"}, pipeline, tailer)
    for now in (0.0, 1.0, 2.0):
        source.poll(now)
    assert tailer.stats.read_errors == 3  # one per look, counted (read_errors_total), never raised
    assert tailer.position is None
    assert events == []
    os.rmdir(tmp_path / "d.log")
    (tmp_path / "d.log").write_text(oom_block(traceback=False))
    source.poll(3.0)
    source.poll(20.0)
    assert len(events) == 1


class _Events:
    """File events handed to the loop as sources/watch.Waker hands them: the directory changed, a file was created."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.changed: set[str] = set()
        self.created = False

    def note(self) -> None:
        self.changed.add(self.directory)
        self.created = True

    def wait(self, timeout: float | None) -> bool:
        return bool(self.changed)

    def take_changed(self) -> set[str] | None:
        changed, self.changed = self.changed, set()
        return changed

    def take_created(self) -> bool:
        created, self.created = self.created, False
        return created

    def watch_dirs(self, dirs: set[str]) -> None:
        pass

    def quiet(self, dirs: set[str]) -> None:
        pass


def test_a_glob_match_flipping_with_a_directory_once_a_second_counts_every_generation(tmp_path):
    # A glob's new match is followed only once a discovery finds it. A requested discovery ran at most once a
    # second (DISCOVER_MIN_GAP), and a writer with that period fell in step with it: every discovery came while
    # the path was a directory. A created file now asks for one within DISCOVER_CREATED_GAP (0.1 s). The loop
    # runs in this process on a settable clock, so the writer's rhythm is exact however loaded the machine is.
    path = tmp_path / "flip.log"
    app, clock = make_app(tmp_path, discover_interval=5.0)  # the default: the periodic discovery is no help
    app.loop._start()
    events = _Events(str(tmp_path))
    for tick in range(FLIPS * 20 + 100):  # 50 ms ticks: a flip a second, then 5 s for the last traceback wait
        writing = tick < FLIPS * 20
        if writing and tick % 20 == 10:  # half a second into each second: the file
            if path.is_dir():
                path.rmdir()
            path.write_text(oom_block())
            events.note()
        elif writing and tick % 20 == 0 and tick:  # on the second: a directory in its place
            path.unlink()
            path.mkdir()
            events.note()
        app.loop._wait(events, lambda: None)  # as Loop.run: take the events, then step
        app.loop.step()
        clock.now += 0.05
    assert app.counts.total("prefill") == FLIPS  # was 1 with a 1 s gap after a created file


@pytest.mark.e2e
@pytest.mark.slow
def test_the_real_daemon_follows_a_glob_match_through_its_directory_flips(tmp_path, daemon_factory):
    # The same flips on the real daemon and its file watcher, each step waiting for what the daemon reports
    # (bench/flip_dir.py --glob --rate 1 measures the fixed-rhythm writer's count).
    path = tmp_path / "flip.log"
    d = daemon_factory(str(tmp_path / "*.log"))
    for i in range(FLIPS):
        path.write_text(oom_block())
        wait_until(lambda n=i + 1: d.total() >= n, what=f"generation {i + 1} counted", timeout=15.0)
        errors = _errors(d)
        path.unlink()
        path.mkdir()
        wait_until(lambda e=errors: _errors(d) > e, what=f"the directory at the path, flip {i + 1}", timeout=15.0)
        path.rmdir()
    settle(d, FLIPS)
    assert d.proc is not None
    assert d.proc.poll() is None
