"""StateStore: atomic saves, and a bad state file is a warning and a first run, never a crash."""

from __future__ import annotations

import json
import logging
import os

import pytest

from sglang_oom_exporter.daemon import state as state_module
from sglang_oom_exporter.daemon.state import STATE_VERSION, StateStore
from sglang_oom_exporter.sources.fileid import TailChunk, TailPosition
from sglang_oom_exporter.sources.tail import FileTailer

NOW = 1_773_526_053.0


def store_in(directory):
    return StateStore(directory, clock=lambda: NOW)


def test_load_without_a_state_file_is_a_first_run(tmp_path):
    assert store_in(tmp_path / "missing-dir").load() is None


def test_save_then_load_round_trips_atomically(tmp_path):
    store = store_in(tmp_path / "state")  # the directory is created on the first save
    data = {"positions": [], "counters": {"prefill": 3}}
    store.save(data)
    store.save({**data, "counters": {"prefill": 4}})
    assert store.load() == {"positions": [], "counters": {"prefill": 4}}
    assert os.listdir(tmp_path / "state") == ["state.json"]
    with open(store.path, encoding="utf-8") as handle:
        assert json.load(handle)["version"] == STATE_VERSION


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"version": 1, "data": {', "not valid JSON"),
        (b"\xff\xfe\x00", "not valid JSON"),
        (b"[1, 2]", "top level is list"),
        (b'{"version": 2, "data": {}}', "version is 2"),
        (b'{"version": "1", "data": {}}', "version is '1'"),
        (b'{"version": true, "data": {}}', "version is True"),
        (b'{"data": {}}', "version is None"),
        (b'{"version": 1, "data": []}', "'data' is missing"),
    ],
)
def test_corrupt_state_warns_moves_it_aside_and_starts_fresh(tmp_path, caplog, body, reason):
    store = store_in(tmp_path)
    with open(store.path, "wb") as handle:
        handle.write(body)
    with caplog.at_level(logging.WARNING, logger="sglang_oom_exporter.daemon.state"):
        assert store.load() is None
    assert reason in caplog.text
    assert "read from their end" in caplog.text
    aside = tmp_path / f"state.json.corrupt-{int(NOW)}"
    assert aside.read_bytes() == body
    assert not os.path.exists(store.path)
    assert store.load() is None  # the next start is an ordinary first run


def test_unreadable_state_file_is_a_warning(tmp_path, caplog):
    store = store_in(tmp_path)
    os.mkdir(store.path)  # a directory where the file should be: unreadable even for root
    with caplog.at_level(logging.WARNING, logger="sglang_oom_exporter.daemon.state"):
        assert store.load() is None
    assert "unreadable" in caplog.text
    assert os.path.isdir(tmp_path / f"state.json.corrupt-{int(NOW)}")


def test_failed_save_keeps_the_old_state_and_no_temp_file(tmp_path, monkeypatch):
    store = store_in(tmp_path)
    store.save({"generation": 1})

    def broken_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(state_module.os, "replace", broken_replace)
    with pytest.raises(OSError, match="No space"):
        store.save({"generation": 2})
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["state.json"]
    assert store.load() == {"generation": 1}


def test_temp_files_left_by_a_crash_are_removed_on_load(tmp_path):
    store = store_in(tmp_path)
    store.save({"ok": True})
    (tmp_path / ".state.json.abc123.tmp").write_bytes(b'{"half')
    assert store.load() == {"ok": True}
    assert os.listdir(tmp_path) == ["state.json"]


def test_restart_resumes_from_saved_positions(tmp_path, log_dir):
    path = str(log_dir / "0.log")
    with open(path, "ab") as handle:
        handle.write(b"before the restart\n")
    first = FileTailer(path, start_at_end=True)
    list(first.poll())
    store_in(tmp_path / "state").save({"files": {path: {"position": first.position.to_dict()}}})
    first.close()
    with open(path, "ab") as handle:
        handle.write(b"while we were down\n")

    saved = TailPosition.from_dict(store_in(tmp_path / "state").load()["files"][path]["position"])
    second = FileTailer(path, start_at_end=True, position=saved)
    try:
        got = b"".join(i.data for i in second.poll() if isinstance(i, TailChunk))
    finally:
        second.close()
    assert got == b"while we were down\n"
