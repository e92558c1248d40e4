"""The recent events and each kind's last-event time survive a restart (the state file's "recent" key).

Unit tests drive App one Loop.step() at a time; the end-to-end test restarts the real daemon process and reads
its page, /events and /metrics over loopback.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.request

import pytest

from sglang_oom_exporter.events.sink import event_json
from sglang_oom_exporter.events.store import SAVED_EVENTS, EventStore
from tests.support.app import counted_app, make_app
from tests.support.daemon import settle
from tests.support.helpers import CATALOG
from tests.support.logs import oom_block

LAST_TS = "sglang_oom_last_event_timestamp_seconds"


def _state(tmp_path) -> dict:
    with open(tmp_path / "state" / "state.json", encoding="utf-8") as fh:
        return json.load(fh)


def _last(app) -> dict:
    """The last-event series of the metrics page (timestamp, requested and available tokens)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for m in app.counts.page.metrics()
        for s in m.samples
        if s.name.startswith("sglang_oom_last_event_")
    }


def test_a_restart_restores_the_events_marked_and_the_last_event_times(tmp_path):
    before = counted_app(tmp_path, 3)
    saved = _state(tmp_path)["data"]["recent"]
    assert len(saved["events"]) == 3
    assert [e["kind"] for e in saved["last"]] == ["decode"]
    app, _ = make_app(tmp_path)
    app.keeper.load()
    assert app.keeper.errors == 0
    assert app.counts.total("decode") == 3
    old, new = before.store.entries(), app.store.entries()
    assert [event_json(s.event, CATALOG) for s in new] == [event_json(s.event, CATALOG) for s in old]
    assert [(dict(s.labels), s.seen, s.restored) for s in new] == [(dict(s.labels), s.seen, True) for s in old]
    assert _last(app) == _last(before)
    # The blocks give requested tokens and no available ones: three series (the info one in words), all back.
    assert sorted(name for name, _ in _last(app)) == [
        "sglang_oom_last_event_info",
        "sglang_oom_last_event_requested_tokens",
        LAST_TS,
    ]


def test_an_old_state_file_without_recent_still_loads(tmp_path):
    counted_app(tmp_path, 2)
    doc = _state(tmp_path)
    del doc["data"]["recent"]
    (tmp_path / "state" / "state.json").write_text(json.dumps(doc))
    app, _ = make_app(tmp_path)
    app.keeper.load()
    assert (app.keeper.errors, app.counts.total("decode"), len(app.store)) == (0, 2, 0)


def test_a_bad_recent_key_costs_only_itself(tmp_path, caplog):
    counted_app(tmp_path, 2)
    doc = _state(tmp_path)
    doc["data"]["recent"]["events"][0]["pools"] = "full"
    (tmp_path / "state" / "state.json").write_text(json.dumps(doc))
    app, _ = make_app(tmp_path)
    app.keeper.load()
    assert (app.keeper.errors, app.counts.total("decode"), len(app.store)) == (1, 2, 1)  # the other event is kept
    assert os.path.exists(tmp_path / "state" / "state.json"), "the file is not moved aside"
    assert "one recent event set aside: pools is str, not an array" in caplog.text


def test_the_saved_events_are_bounded_and_newest(tmp_path):
    store = EventStore(capacity=200)
    for n in range(SAVED_EVENTS + 30):
        store.add(_event(n), seen=float(n))
    saved = store.export_state()
    assert len(saved) == SAVED_EVENTS
    assert [s["seen"] for s in saved] == [float(n) for n in range(30, SAVED_EVENTS + 30)]
    small = EventStore(capacity=10)
    small.add(_event(999), seen=999.0)
    assert small.restore_state(saved) == (10, 0)
    assert [s.seen for s in small.entries()] == [
        999.0,
        *(float(n) for n in range(SAVED_EVENTS + 29, SAVED_EVENTS + 20, -1)),
    ]


def _event(n: int):
    from sglang_oom_exporter.detect.model import OomEvent

    return OomEvent(kind="retract", fatal=False, source="s", location=f"s.log:{n}", time=None, ranks=(),
                    message="m", excerpt="m", numbers={"retracted_requests": 1})  # fmt: skip


def _get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return str(r.read().decode())


@pytest.mark.e2e
@pytest.mark.slow
def test_a_restarted_daemon_keeps_its_page_events_and_last_event_times(tmp_path, daemon_factory):
    log = tmp_path / "server.log"
    log.write_text(oom_block() + oom_block(kind="Decode"))
    d = daemon_factory("--from-beginning", str(log))
    settle(d, 1)
    settle(d, 1, "decode")
    before_page = _get(d.port, "/")
    before_events = json.loads(_get(d.port, "/events"))["events"]
    before_last = {k: v for k, v in d.metrics(LAST_TS).items() if k[0] == LAST_TS}
    assert len(before_last) == 2
    assert [e["restored"] for e in before_events] == [False, False]
    assert "restored from the state file" not in before_page
    assert d.stop(signal.SIGTERM) == 0

    d2 = daemon_factory(str(log))
    after_events = json.loads(_get(d2.port, "/events"))["events"]
    assert [e["restored"] for e in after_events] == [True, True]
    strip = ("restored",)
    assert [{k: v for k, v in e.items() if k not in strip} for e in after_events] == [
        {k: v for k, v in e.items() if k not in strip} for e in before_events
    ]
    assert {k: v for k, v in d2.metrics(LAST_TS).items() if k[0] == LAST_TS} == before_last
    page = _get(d2.port, "/")
    assert page.count('<tr class="event"') == 2
    assert page.count("restored from the state file</span>") == 2
    assert "None" not in page
    # A new event after the restart comes first, not marked, and moves its kind's last-event time on.
    with open(log, "a") as fh:
        fh.write(oom_block())
    settle(d2, 2)
    after = json.loads(_get(d2.port, "/events"))["events"]
    assert [e["restored"] for e in after] == [False, True, True]
    key = next(k for k in before_last if ("kind", "prefill") in k[1])
    assert d2.metrics(LAST_TS)[key] > before_last[key]
