"""The soak's own accounting (bench/soak.py): what a fault may take by design, so that its exact check is fair.

A post-mortem of `python bench/soak.py --seconds 60 --seed 1 --keep` found f107 counted 15 of 16 with nothing
at risk: its OOM (requested=7368) was written at soak time 46.315, counted by one daemon and SIGKILLed with it
at 46.68 before a save; the restarted daemon re-read and counted it again at about 48.8 (its log line), the file
was deleted while up at 49.66 and the daemon SIGKILLed at 49.70, 0.04 s later, before its save. The state saved
at that kill still had the count without it and the file was gone: the documented limit "a delete while up, then
a SIGKILL before a save". But the soak only counted apart the events *written* within 3 s of the delete, and this
one was written 3.35 s before it: its count was 0.9 s old, since the restart had to read it again.
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from soak import DELETE_KILL_WINDOW, counted_soon_before  # noqa: E402


def test_an_event_reread_after_a_restart_is_as_young_as_the_restarted_daemons_first_pass() -> None:
    # f107 in the post-mortem (soak times): written 46.315, first pass of the restarted daemon about 48.7,
    # delete 49.66. Counted 0.96 s before the delete by the daemon that was then killed: at risk.
    assert counted_soon_before([46.315], up_since=48.7, deleted_at=49.66) == 1


def test_an_old_event_counted_by_a_daemon_that_was_up_before_it_is_not_at_risk() -> None:
    # The same bytes with the daemon up since long before: counted right after they were written, 3.35 s
    # before the delete, and saved since (a save follows a count within about 1.5 s).
    assert counted_soon_before([46.315], up_since=10.0, deleted_at=49.66) == 0


def test_the_window_counts_each_event_by_the_later_of_its_write_and_the_first_pass() -> None:
    writes = [40.0, 47.0, 49.0, 49.5]
    # Up since 30: only the writes within the window before the delete at 50 (47.0 is exactly on its edge).
    assert counted_soon_before(writes, up_since=30.0, deleted_at=50.0) == 3
    assert DELETE_KILL_WINDOW == 50.0 - 47.0
    # Up since 48: every event of the generation was counted at 48 or later.
    assert counted_soon_before(writes, up_since=48.0, deleted_at=50.0) == 4
    assert counted_soon_before([], up_since=48.0, deleted_at=50.0) == 0
