"""FileTailer scenarios, one test each; poll() is driven directly and nothing sleeps to synchronise."""

from __future__ import annotations

import gzip
import os
import shutil

import pytest

from sglang_oom_exporter.sources.fileid import FINGERPRINT_BYTES, TailChunk, TailPosition, TailReset
from sglang_oom_exporter.sources.tail import DELETED_LINGER_SECONDS, FileTailer

CRI = b"2026-03-14T22:07:33.118204551Z stderr F "


@pytest.fixture
def tailers():
    """Make tailers and close them after the test, so no file descriptor outlives it."""
    made: list[FileTailer] = []

    def make(path, **kwargs):
        tailer = FileTailer(str(path), **kwargs)
        made.append(tailer)
        return tailer

    yield make
    for tailer in made:
        tailer.close()


def poll(tailer):
    """One poll, with consecutive chunks joined and each reset shown as 'reset:<reason>'."""
    out: list[bytes | str] = []
    for item in tailer.poll():
        if isinstance(item, TailChunk):
            assert item.path == tailer.path
            if out and isinstance(out[-1], bytes):
                out[-1] += item.data
            else:
                out.append(item.data)
        else:
            assert isinstance(item, TailReset)
            out.append(f"reset:{item.reason}")
    return out


def append(path, data):
    with open(path, "ab") as handle:
        handle.write(data)


def test_append(log_dir, tailers):
    path = log_dir / "server.log"
    append(path, b"one\n")
    tailer = tailers(path)
    assert poll(tailer) == [b"one\n"]
    append(path, b"two\nthree\n")
    assert poll(tailer) == [b"two\nthree\n"]
    assert poll(tailer) == []
    assert tailer.stats.bytes_read == 14
    assert tailer.position is not None
    assert tailer.position.offset == 14


def test_line_written_in_two_pieces(log_dir, tailers):
    path = log_dir / "server.log"
    append(path, b"[TP0] Prefill out of")
    tailer = tailers(path)
    assert poll(tailer) == [b"[TP0] Prefill out of"]
    # The resume point stays at the line start until the newline arrives.
    assert tailer.position.offset == 0
    append(path, b" memory.\n")
    assert poll(tailer) == [b" memory.\n"]
    assert tailer.position.offset == 29


def test_rename_create_rotation_drains_unread_data_first(log_dir, tailers):
    path = log_dir / "app.log"
    append(path, b"a1\n")
    tailer = tailers(path)
    assert poll(tailer) == [b"a1\n"]
    append(path, b"a2\n")  # written before the rotation, not yet read
    os.rename(path, log_dir / "app.log.1")
    append(path, b"b1\n")
    assert poll(tailer) == [b"a2\n", "reset:rotated", b"b1\n"]
    append(path, b"b2\n")
    assert poll(tailer) == [b"b2\n"]


def test_kubelet_rotation_0_log_to_timestamped_name(tmp_path, tailers):
    container = tmp_path / "pods" / "llm_sglang-0_0f4c1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b" / "sglang"
    container.mkdir(parents=True)
    path = container / "0.log"
    append(path, CRI + b"token usage: 0.91\n")
    tailer = tailers(path)
    assert poll(tailer) == [CRI + b"token usage: 0.91\n"]
    append(path, CRI + b"Prefill out of memory. Try to lower your batch size.\n")
    rotated = container / "0.log.20260314-220733"
    os.rename(path, rotated)
    append(path, CRI + b"after rotation\n")
    assert poll(tailer) == [
        CRI + b"Prefill out of memory. Try to lower your batch size.\n",
        "reset:rotated",
        CRI + b"after rotation\n",
    ]
    # kubelet later compresses the rotated file: that must not disturb the live tail.
    with open(rotated, "rb") as src, gzip.open(f"{rotated}.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.remove(rotated)
    assert poll(tailer) == []


def test_path_missing_for_a_while_then_recreated(log_dir, tailers):
    path = log_dir / "server.log"
    append(path, b"first\n")
    now = [0.0]
    tailer = tailers(path, clock=lambda: now[0])
    assert poll(tailer) == [b"first\n"]
    os.remove(path)
    assert poll(tailer) == []  # kept while a writer may still hold it
    now[0] += DELETED_LINGER_SECONDS
    assert poll(tailer) == ["reset:deleted"]
    assert poll(tailer) == []
    # The ended generation is still what the state says (its epoch and dedupe memory go with it).
    ended = tailer.position
    assert ended is not None
    assert ended.offset == len(b"first\n")
    append(path, b"second life\n")
    assert poll(tailer) == [b"second life\n"]


def test_renamed_away_keeps_draining_until_recreated(log_dir, tailers):
    path = log_dir / "server.log"
    append(path, b"a\n")
    tailer = tailers(path)
    assert poll(tailer) == [b"a\n"]
    os.rename(path, log_dir / "server.log.1")
    assert poll(tailer) == []
    # The writer still holds the renamed file until it reopens the path.
    append(log_dir / "server.log.1", b"late\n")
    assert poll(tailer) == [b"late\n"]
    append(path, b"new\n")
    assert poll(tailer) == ["reset:rotated", b"new\n"]


def test_delete_and_recreate_between_two_looks(log_dir, tailers):
    path = log_dir / "server.log"
    append(path, b"old\n")
    tailer = tailers(path)
    assert poll(tailer) == [b"old\n"]
    os.remove(path)
    append(path, b"fresh\n")
    assert poll(tailer) == ["reset:recreated", b"fresh\n"]


def test_copytruncate_smaller(log_dir, tailers):
    path = log_dir / "app.log"
    append(path, b"0123456789\n" * 3)
    tailer = tailers(path)
    assert poll(tailer) == [b"0123456789\n" * 3]
    shutil.copy(path, log_dir / "app.log.1")
    os.truncate(path, 0)
    append(path, b"new\n")
    assert poll(tailer) == ["reset:truncated", b"new\n"]


def test_copytruncate_regrown_past_old_offset_before_next_look(log_dir, tailers):
    path = log_dir / "app.log"
    append(path, b"old line\n")
    tailer = tailers(path)
    assert poll(tailer) == [b"old line\n"]
    os.truncate(path, 0)
    regrown = b"a new generation, longer than the old offset\n"
    append(path, regrown)
    # Size alone says "grew by 37 bytes"; the fingerprint of the first bytes says "another file".
    assert poll(tailer) == ["reset:truncated", regrown]


def test_delete(log_dir, tailers):
    path = log_dir / "app.log"
    append(path, b"read\n")
    now = [0.0]
    tailer = tailers(path, clock=lambda: now[0])
    assert poll(tailer) == [b"read\n"]
    with open(path, "ab") as writer:
        writer.write(b"unread\n")
        writer.flush()
        os.remove(path)
        assert poll(tailer) == [b"unread\n"]
        assert tailer.lingering
        writer.write(b"after the rm\n")  # a writer that still holds the deleted file
        writer.flush()
        now[0] += DELETED_LINGER_SECONDS - 1
        assert poll(tailer) == [b"after the rm\n"]
    now[0] += DELETED_LINGER_SECONDS - 1
    assert poll(tailer) == []  # quiet for less than the linger since its last growth
    now[0] += 1
    assert poll(tailer) == ["reset:deleted"]
    assert not tailer.lingering
    ended = tailer.position  # the deleted generation, read to its end
    assert ended is not None
    assert ended.offset == len(b"read\nunread\nafter the rm\n")
    assert poll(tailer) == []


def test_new_file_burst_written_before_first_look(log_dir, tailers):
    path = log_dir / "1.log"
    tailer = tailers(path, start_at_end=True)
    assert poll(tailer) == []
    burst = b"".join(CRI + b"line %d\n" % i for i in range(50))
    append(path, burst)
    # Absent at start, so it is a new file: read from 0 despite start_at_end.
    assert poll(tailer) == [burst]


def test_start_at_end_skips_history_and_keeps_the_last_line_whole(log_dir, tailers):
    path = log_dir / "server.log"
    append(path, b"old 1\nold 2\npart")
    tailer = tailers(path, start_at_end=True)
    assert poll(tailer) == [b"part"]
    append(path, b"ial\nnew\n")
    assert poll(tailer) == [b"ial\nnew\n"]


def test_start_at_end_on_whole_lines(log_dir, tailers):
    path = log_dir / "server.log"
    append(path, b"old\n")
    tailer = tailers(path, start_at_end=True)
    assert poll(tailer) == []
    append(path, b"new\n")
    assert poll(tailer) == [b"new\n"]


def _saved_position(path, data):
    append(path, data)
    first = FileTailer(str(path))
    list(first.poll())
    pos = first.position
    first.close()
    assert pos is not None
    return TailPosition.from_dict(pos.to_dict())


def test_restore_from_position_same_file(log_dir, tailers):
    path = log_dir / "server.log"
    pos = _saved_position(path, b"a\nb\n")
    append(path, b"c\n")
    tailer = tailers(path, position=pos, start_at_end=True)
    assert poll(tailer) == [b"c\n"]


def test_restore_rereads_a_partial_last_line_whole(log_dir, tailers):
    path = log_dir / "server.log"
    pos = _saved_position(path, b"a\npart")
    append(path, b"ial\n")
    tailer = tailers(path, position=pos)
    assert poll(tailer) == [b"partial\n"]


def test_restore_when_the_file_was_rotated_while_down(log_dir, tailers):
    path = log_dir / "0.log"
    pos = _saved_position(path, b"a\n")
    append(path, b"b\n")
    os.rename(path, log_dir / "0.log.20260314-220733")
    append(path, b"c\n")
    tailer = tailers(path, position=pos, start_at_end=True)
    # The new 0.log may get the freed inode back: then its keys need a new epoch, which a truncation gives.
    reused = os.stat(path).st_ino == pos.ino
    assert poll(tailer) == [b"b\n", "reset:truncated" if reused else "reset:rotated", b"c\n"]


def test_restore_when_the_rotated_file_was_gzipped_while_down(log_dir, tailers):
    path = log_dir / "0.log"
    pos = _saved_position(path, b"a\n" * 600)  # past FINGERPRINT_BYTES, so the fingerprint is full length
    assert pos.fingerprint_len == FINGERPRINT_BYTES
    append(path, b"b\n")
    rotated = log_dir / "0.log.20260314-220733"
    os.rename(path, rotated)
    with open(rotated, "rb") as src, gzip.open(f"{rotated}.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.remove(rotated)
    append(path, b"c\n")
    tailer = tailers(path, position=pos, start_at_end=True)
    # The new 0.log may get the freed inode back: then its keys need a new epoch, which a truncation gives.
    reused = os.stat(path).st_ino == pos.ino
    assert poll(tailer) == [b"b\n", "reset:truncated" if reused else "reset:rotated", b"c\n"]


def test_restore_when_copytruncated_while_down_reads_the_copy(log_dir, tailers):
    path = log_dir / "app.log"
    pos = _saved_position(path, b"a\n")
    append(path, b"b\n")
    shutil.copy(path, log_dir / "app.log.1")
    os.truncate(path, 0)
    append(path, b"c\n")
    tailer = tailers(path, position=pos)
    assert poll(tailer) == [b"b\n", "reset:truncated", b"c\n"]  # same inode: a new epoch for what follows


def test_restore_when_truncated_while_down_without_a_copy(log_dir, tailers):
    path = log_dir / "app.log"
    pos = _saved_position(path, b"aaaa\n")
    os.truncate(path, 0)
    append(path, b"c\n")
    tailer = tailers(path, position=pos, start_at_end=True)
    assert poll(tailer) == [b"c\n"]


def test_restore_when_the_file_is_missing_and_no_rotated_copy_exists(log_dir, tailers):
    path = log_dir / "app.log"
    pos = _saved_position(path, b"a\n")
    os.remove(path)
    tailer = tailers(path, position=pos, start_at_end=True)
    assert poll(tailer) == []
    append(path, b"later\n")
    assert poll(tailer) == [b"later\n"]


def test_permission_denied_is_counted_and_retried(log_dir, tailers):
    path = log_dir / "server.log"
    append(path, b"secret\n")
    os.chmod(path, 0)
    try:
        with open(path, "rb"):
            pytest.skip("this user reads mode-000 files anyway (root); see the directory test")
    except PermissionError:
        pass
    tailer = tailers(path)
    assert poll(tailer) == []
    assert poll(tailer) == []
    assert tailer.stats.read_errors == 2
    os.chmod(path, 0o644)
    assert poll(tailer) == [b"secret\n"]


def test_unreadable_path_that_is_a_directory_is_counted_and_retried(log_dir, tailers):
    path = log_dir / "server.log"
    path.mkdir()
    tailer = tailers(path)
    assert poll(tailer) == []
    assert tailer.stats.read_errors == 1
    path.rmdir()
    append(path, b"now a file\n")
    assert poll(tailer) == [b"now a file\n"]


def test_fifo_at_the_path_does_not_block(log_dir, tailers):
    path = log_dir / "server.log"
    os.mkfifo(path)
    tailer = tailers(path)
    assert poll(tailer) == []
    assert tailer.stats.read_errors == 1


def test_large_catch_up_arrives_in_read_size_pieces(log_dir, tailers):
    path = log_dir / "server.log"
    data = b"".join(b"line %05d\n" % i for i in range(1000))
    append(path, data)
    tailer = tailers(path, read_size=1024)
    chunks = list(tailer.poll())
    assert all(isinstance(c, TailChunk) and len(c.data) <= 1024 for c in chunks)
    assert b"".join(c.data for c in chunks if isinstance(c, TailChunk)) == data


def test_consumer_that_stops_mid_poll_gets_no_bytes_twice(log_dir, tailers):
    path = log_dir / "server.log"
    append(path, b"aaaa\nbbbb\ncccc\n")
    tailer = tailers(path, read_size=5)
    items = tailer.poll()
    first = next(items)
    items.close()
    assert isinstance(first, TailChunk)
    assert first.data == b"aaaa\n"
    assert poll(tailer) == [b"bbbb\ncccc\n"]


def test_2000_files_polled(log_dir, tailers):
    paths = [log_dir / f"{i}.log" for i in range(2000)]
    for i, path in enumerate(paths):
        append(path, b"file %d\n" % i)
    group = [tailers(path) for path in paths]
    assert [poll(t) for t in group] == [[b"file %d\n" % i] for i in range(2000)]
    assert all(poll(t) == [] for t in group)
    for path in paths[::100]:
        append(path, b"more\n")
    got = {t.path: poll(t) for t in group}
    assert {p for p, items in got.items() if items} == {str(p) for p in paths[::100]}
    assert all(items == [b"more\n"] for items in got.values() if items)


def test_position_round_trips_through_a_dict():
    pos = TailPosition("/var/log/pods/a_b_c/sglang/0.log", 2049, 123456, 789, "ab" * 16, 1024)
    assert TailPosition.from_dict(pos.to_dict()) == pos


@pytest.mark.parametrize(
    "raw",
    [
        [],
        {},
        {"path": "", "dev": 1, "ino": 2, "offset": 3, "fingerprint": "ab", "fingerprint_len": 1},
        {"path": "x", "dev": -1, "ino": 2, "offset": 3, "fingerprint": "ab", "fingerprint_len": 1},
        {"path": "x", "dev": 1, "ino": True, "offset": 3, "fingerprint": "ab", "fingerprint_len": 1},
        {"path": "x", "dev": 1, "ino": 2, "offset": "3", "fingerprint": "ab", "fingerprint_len": 1},
        {"path": "x", "dev": 1, "ino": 2, "offset": 3, "fingerprint": "XYZ", "fingerprint_len": 1},
        {"path": "x", "dev": 1, "ino": 2, "offset": 3, "fingerprint": "ab", "fingerprint_len": 4096},
    ],
)
def test_position_from_dict_rejects_bad_input(raw):
    with pytest.raises(ValueError, match="position"):
        TailPosition.from_dict(raw)
