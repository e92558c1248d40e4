"""An in-place truncation while the daemon is down is told even when the new content begins
with the old one's first bytes (a start-up banner longer than the head fingerprint).

The daemon's parts with the fake clock (tests/test_app.py); "SIGKILL" is closing the files without a save.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from sglang_oom_exporter.sources.fileid import FINGERPRINT_BYTES, TailPosition
from tests.support.app import first_life, restarted_app, state_path
from tests.support.logs import BLOCK, append

# SGLang prints its server args at start: longer than the head fingerprint, the same at every start.
BANNER = "".join(f"[2026-03-14 22:00:00] server_args: option_{i}=value_{i}\n" for i in range(60))
assert len(BANNER) > 2 * FINGERPRINT_BYTES


def _first_life(tmp_path) -> tuple[str, int]:
    """A start on a log with history, one OOM counted and saved, then SIGKILL; returns the path and the saved offset."""
    log = first_life(tmp_path, BANNER + "[2026-03-14 22:00:01] history\n")
    with open(state_path(tmp_path), encoding="utf-8") as fh:
        position = json.load(fh)["data"]["files"][log]["position"]
    return log, position["offset"]


def _rewrite_with_the_same_banner(log: str, offset: int, blocks: list[int]) -> None:
    """Truncate in place and write the banner and new OOMs, past the saved offset (the size check cannot tell)."""
    os.truncate(log, 0)
    append(log, BANNER + "".join(BLOCK.format(s=s) for s in blocks))
    assert os.path.getsize(log) >= offset


def test_truncated_in_place_while_down_with_the_same_banner_is_read_from_0(tmp_path):
    log, offset = _first_life(tmp_path)
    _rewrite_with_the_same_banner(log, offset, [11, 12, 13])
    app = restarted_app(tmp_path)
    assert app.counts.total("decode") == 4  # was 2: resumed at the old offset, inside the new content
    assert app.sources.get(log).epoch == 1  # a new epoch: the new events' keys differ from the old ones'


def test_copytruncated_while_down_with_the_same_banner_drains_the_copy_first(tmp_path):
    log, offset = _first_life(tmp_path)
    append(log, BLOCK.format(s=2))  # written while down, before the copy
    shutil.copyfile(log, log + ".1")
    _rewrite_with_the_same_banner(log, offset, [11, 12, 13])
    app = restarted_app(tmp_path)
    assert app.counts.total("decode") == 5  # 1 before, 1 drained from the copy, 3 in the new file


def test_an_older_copy_with_the_same_banner_is_not_taken_for_the_saved_generation(tmp_path):
    """Two rotated siblings begin alike: only the one with the saved bytes before the offset is drained."""
    log, offset = _first_life(tmp_path)
    append(log, BLOCK.format(s=2))
    older = log + ".2"
    with open(older, "w") as fh:  # an older generation: same banner, other content, newer mtime
        fh.write(BANNER + "".join(BLOCK.format(s=s) for s in (31, 32, 33, 34)))
    shutil.copyfile(log, log + ".1")
    os.utime(older)
    _rewrite_with_the_same_banner(log, offset, [11, 12])
    app = restarted_app(tmp_path)
    assert app.counts.total("decode") == 4  # 1 + 1 from a.log.1 + 2 new; none of a.log.2's four


def test_a_file_that_only_grew_resumes_in_place(tmp_path):
    log, _ = _first_life(tmp_path)
    append(log, BLOCK.format(s=2))
    app = restarted_app(tmp_path)
    assert app.counts.total("decode") == 2
    assert app.sources.get(log).epoch == 0


def test_a_state_file_saved_without_the_mark_still_resumes(tmp_path):
    """Backward compatible: a position with no mark (an older build's) is checked by its head alone, as before."""
    log, _ = _first_life(tmp_path)
    path = tmp_path / "state" / "state.json"
    doc = json.loads(path.read_text())
    position = doc["data"]["files"][log]["position"]
    assert position["mark_len"] == FINGERPRINT_BYTES
    del position["mark"], position["mark_len"]
    path.write_text(json.dumps(doc))
    append(log, BLOCK.format(s=2))
    app = restarted_app(tmp_path)
    assert app.counts.total("decode") == 2
    assert app.keeper.errors == 0


@pytest.mark.parametrize(
    "mark",
    [{"mark": "XYZ", "mark_len": 1}, {"mark": "ab", "mark_len": -1}, {"mark": "ab", "mark_len": True},
     {"mark": "ab", "mark_len": FINGERPRINT_BYTES + 1}, {"mark": "ab", "mark_len": 4}],
)  # fmt: skip
def test_a_malformed_mark_is_a_rejected_position(mark):
    raw = {"path": "x", "dev": 1, "ino": 2, "offset": 3, "fingerprint": "ab", "fingerprint_len": 1, **mark}
    with pytest.raises(ValueError, match=r"position\.mark"):
        TailPosition.from_dict(raw)
