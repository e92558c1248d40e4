"""A hostile state.json, one field at a time: every field is checked by type and range before it is used. A bad
one is set aside (the rest of the file is used; a copy of the file is kept beside it for a human), counted in
sglang_oom_exporter_state_errors_total, and never an exit, a NaN or Infinity on the page, or a 500 from / or
/events. Each test is one mutation of a real state file that a run left."""

from __future__ import annotations

import glob
import json
import math
from email.message import Message

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from sglang_oom_exporter.events.store import EventStore, Health
from sglang_oom_exporter.web.routes import Routes
from tests.support.app import counted_app, make_app, run_app, state_path, write_state
from tests.support.helpers import CATALOG
from tests.support.logs import BLOCK


def _saved(tmp_path) -> dict:
    counted_app(tmp_path, 2)
    with open(state_path(tmp_path), encoding="utf-8") as fh:
        return json.load(fh)


def _restart(tmp_path, doc: dict):
    write_state(tmp_path, doc)
    app, clock = make_app(tmp_path)
    app.keeper.load()
    run_app(app, clock, 8.0)
    return app, clock


def _stat(app) -> float:
    """sglang_oom_exporter_state_errors_total."""
    return app.extra_metrics()["state_errors_total"]


def _answers(app) -> tuple[int, int]:
    """The statuses of / and /events."""
    routes = Routes(registry=CollectorRegistry(), catalog=CATALOG, events=app.store, health=lambda: Health(True))
    return routes.respond("/", Message()).status, routes.respond("/events", Message()).status


def _samples(app) -> list:
    return [s for m in app.counts.page.metrics() for s in m.samples]


def _page_values(app) -> list[float]:
    return [s.value for s in _samples(app)]


def _a_copy_kept(tmp_path) -> bool:
    return len(glob.glob(state_path(tmp_path) + ".corrupt-*")) == 1


@pytest.mark.parametrize("text", ["NaN", "nan", "Infinity", "1e400", "-1", "2"])
def test_a_counter_that_is_a_string_is_set_aside(tmp_path, text):
    doc = _saved(tmp_path)
    doc["data"]["counters"]["sources"][0]["events"]["decode"] = text
    app, _ = _restart(tmp_path, doc)
    assert all(math.isfinite(v) for v in _page_values(app))
    assert app.counts.total("decode") == 0  # this source's counters are set aside (a reset), not NaN for good
    assert _stat(app) == 1
    assert _a_copy_kept(tmp_path)


@pytest.mark.parametrize("value", [-1.0, "NaN", "-Infinity", 2.0**60])
def test_a_bad_retracted_count_is_set_aside(tmp_path, value):
    doc = _saved(tmp_path)
    doc["data"]["counters"]["sources"][0]["retracted"] = value
    app, _ = _restart(tmp_path, doc)
    assert all(math.isfinite(v) and v >= 0 for v in _page_values(app))
    retracted = [s.value for s in _samples(app) if s.name == "sglang_oom_retracted_requests_total"]
    assert retracted == [0.0]
    assert _stat(app) == 1


@pytest.mark.parametrize("dedupe", ["x", 5, [1, 2], {"groups": "x"}, {"groups": [{"members": 1}]}])
def test_a_dedupe_of_the_wrong_type_is_set_aside(tmp_path, dedupe):
    doc = _saved(tmp_path)
    (entry,) = doc["data"]["files"].values()
    entry["dedupe"] = dedupe
    app, clock = _restart(tmp_path, doc)
    assert app.counts.total("decode") == 2  # not re-read from 0 on top of the counters that hold its events
    assert _stat(app) == 1
    with open(tmp_path / "a.log", "a") as fh:
        fh.write(BLOCK.format(s=30))
    run_app(app, clock, 8.0)
    assert app.counts.total("decode") == 3  # and what comes next is counted


def test_a_restored_event_of_an_unknown_kind_is_set_aside(tmp_path):
    """A downgrade after a release added a kind: the newer build's events of that kind are not this one's."""
    doc = _saved(tmp_path)
    doc["data"]["recent"]["events"][0]["kind"] = "kind_of_a_later_release"
    doc["data"]["recent"]["last"][0]["kind"] = "kind_of_a_later_release"
    app, _ = _restart(tmp_path, doc)
    assert _answers(app) == (200, 200)
    assert [s.event.kind for s in app.store.entries()] == ["decode"]  # the other event is kept
    assert app.counts.total("decode") == 2
    assert _stat(app) == 1  # the event: a last-event time of that kind is a number like any other, kept


@pytest.mark.parametrize("seen", ["nan", 1e20, -5.0, "1001"])
def test_a_bad_seen_time_is_set_aside(tmp_path, seen):
    doc = _saved(tmp_path)
    doc["data"]["recent"]["events"][0]["seen"] = seen
    app, _ = _restart(tmp_path, doc)
    assert _answers(app) == (200, 200)
    assert [s.seen for s in app.store.entries()] == [1001.25]  # the event with the bad field is set aside
    assert _stat(app) == 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("numbers", {"requested_tokens": "NaN"}),
        ("pools", [{"pool": "full", "total": "1e400"}]),
        ("ranks", "TP0"),
        ("suggestions", [{"flag": "--x", "current": "inf", "suggested": None, "rule": "r"}]),
        ("context", ["a"]),
        ("time", 5),
    ],
)
def test_a_bad_field_of_a_restored_event_is_set_aside(tmp_path, field, value):
    doc = _saved(tmp_path)
    doc["data"]["recent"]["events"][0][field] = value
    app, _ = _restart(tmp_path, doc)
    assert _answers(app) == (200, 200)
    assert len(app.store.entries()) == 1
    assert app.counts.total("decode") == 2
    assert _stat(app) == 1


@pytest.mark.parametrize("timestamp", ["NaN", "1e400", -1.0, None, 1e20])
def test_a_bad_last_event_time_is_set_aside(tmp_path, timestamp):
    doc = _saved(tmp_path)
    doc["data"]["recent"]["last"][0]["timestamp"] = timestamp
    app, _ = _restart(tmp_path, doc)
    assert all(math.isfinite(v) and v >= 0 for v in _page_values(app))
    assert len(app.store.entries()) == 2  # the events are kept
    assert _stat(app) == 1


@pytest.mark.parametrize("entry", [5, "x", [1], None, {"position": "x"}, {"lineno": "7"}, {"epoch": 1e20}])
def test_a_file_entry_of_the_wrong_type_is_set_aside_not_read_again(tmp_path, entry):
    doc = _saved(tmp_path)
    (path,) = doc["data"]["files"]
    doc["data"]["files"][path] = entry if not isinstance(entry, dict) else {**doc["data"]["files"][path], **entry}
    app, clock = _restart(tmp_path, doc)
    assert app.counts.total("decode") == 2  # not 4: the file is not read again from 0 under counters that hold it
    assert _stat(app) == 1
    with open(tmp_path / "a.log", "a") as fh:
        fh.write(BLOCK.format(s=30))
    run_app(app, clock, 8.0)
    assert app.counts.total("decode") == 3


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20) | st.sampled_from(["NaN", "1e400", "-Infinity", "nan", "decode", "", "TP0"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip
# What a hand edit or another build leaves most often: drawn as often as all the rest.
_HOSTILE = st.sampled_from(["NaN", "1e400", "nan", "-Infinity", "2", 1e20, -1, -0.5, 2**60, None, "x", [], {}, True])
_VALUE = st.one_of(_HOSTILE, _JSON)


@pytest.fixture(scope="module")
def saved_event(tmp_path_factory) -> dict:
    """One recent event as a real run saves it, with pools, a suggestion and a context."""
    doc = _saved(tmp_path_factory.mktemp("saved"))
    event = doc["data"]["recent"]["events"][0]
    event["pools"] = [{"pool": "full", "total": 100, "available": 5, "evictable": 0, "free": 5}]
    event["context"] = {"kv": {"token_usage": 0.97}, "server_args": {"chunked_prefill_size": 8192}, "target": "x"}
    return event


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_value_in_any_field_of_a_restored_event_never_fails_a_page(saved_event, data):
    item = json.loads(json.dumps(saved_event))
    path = data.draw(st.sampled_from(_paths(item)))
    _set(item, path, data.draw(_VALUE))
    store = EventStore(10)
    restored, bad = store.restore_state([item], CATALOG.ids)
    assert restored + bad == 1
    routes = Routes(registry=CollectorRegistry(), catalog=CATALOG, events=store, health=lambda: Health(True))
    for where in ("/", "/events"):
        answer = routes.respond(where, Message())
        assert answer.status == 200
        if where == "/events":
            json.loads(answer.body, parse_constant=_no_constant)  # strict JSON: no NaN or Infinity in it


def _no_constant(name: str) -> None:
    raise AssertionError(f"/events holds {name}")


def _paths(value, prefix=()) -> list[tuple]:
    """Every key path in a JSON value (the whole of each container too)."""
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


def _set(root, path: tuple, value) -> None:
    for key in path[:-1]:
        root = root[key]
    root[path[-1]] = value


@pytest.fixture(scope="module")
def saved_doc(tmp_path_factory) -> dict:
    return _saved(tmp_path_factory.mktemp("doc"))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_value_anywhere_in_the_state_file_never_stops_a_start(tmp_path_factory, saved_doc, data):
    tmp_path = tmp_path_factory.mktemp("start")
    (tmp_path / "a.log").write_text("".join(BLOCK.format(s=i) for i in range(2)))
    text = json.dumps(saved_doc).replace(json.dumps(str(_log_of(saved_doc)))[1:-1], str(tmp_path / "a.log"))
    doc = json.loads(text)  # the same state, of this example's a.log
    path = data.draw(st.sampled_from(_paths(doc)))
    _set(doc, path, data.draw(_VALUE))
    app, _ = _restart(tmp_path, doc)  # loads, then runs the loop over a.log: never raises
    assert all(math.isfinite(v) for v in _page_values(app))
    assert all(math.isfinite(v) for v in app.extra_metrics().values())
    assert _answers(app) == (200, 200)


def _log_of(doc: dict) -> str:
    (path,) = doc["data"]["files"]
    return path
