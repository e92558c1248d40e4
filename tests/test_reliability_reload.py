"""A path a reload drops and a later reload names again keeps what it counted.

The daemon's parts driven with the fake clock (tests/test_app.py's helpers); a reload is App.reload with a
config that names the file or does not. The counter is read from the exported page, as a scrape reads it.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from sglang_oom_exporter.config.model import Config
from tests.support.app import config_fields, run_app, started_app
from tests.support.logs import BLOCK, EVENT, HISTORY, append


def _scrape(app, kind: str = "decode", source: str = "a") -> float | None:
    """One scrape of the app's page: the value of events_total{kind, source} (None: no such series)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(app.collector())
    return registry.get_sample_value("sglang_oom_events_total", {"kind": kind, "source": source})


def _with_and_without(tmp_path, app):
    named = app.config
    other = Config(**{**config_fields(named), "paths": (str(tmp_path / "other-*.log"),)})
    return named, other


def test_a_path_flipping_in_and_out_of_the_config_counts_every_event(tmp_path):
    """A non-atomic config writer: the path is named, then not, then named again, ten times (issue: 12 of 165)."""
    log = tmp_path / "a.log"
    log.write_text(HISTORY)
    app, clock = started_app(tmp_path, source_retention=600.0)
    named, other = _with_and_without(tmp_path, app)
    written = 0
    for i in range(10):
        append(log, BLOCK.format(s=2 * i))  # written while named
        written += 1
        app.loop.mark_changed({str(tmp_path)})
        run_app(app, clock, 3.0)
        assert app.reload(other, app.catalog) == "applied"
        assert _scrape(app) == written  # let go, still exported
        append(log, BLOCK.format(s=2 * i + 1))  # written while not named: read from the kept position later
        written += 1
        run_app(app, clock, 1.0)
        assert app.reload(named, app.catalog) == "applied"
        run_app(app, clock, 6.0)  # the next discovery follows it again
    assert _scrape(app) == written == 20
    assert app.counts.total("decode") == 20


def test_what_a_dropped_path_had_pending_is_shown_to_a_scrape(tmp_path):
    """An event waiting for its traceback when the reload lets the file go is counted then, and exported."""
    log = tmp_path / "a.log"
    log.write_text(HISTORY)
    app, clock = started_app(tmp_path, source_retention=1.0)
    _, other = _with_and_without(tmp_path, app)
    append(log, EVENT.format(s=5))
    app.loop.mark_changed({str(tmp_path)})
    app.loop.step()
    assert app.loop.pending == 1  # read, not yet counted
    app.reload(other, app.catalog)
    run_app(app, clock, 10.0)  # the retention (1 s) is long over, but no scrape has been served yet
    assert app.counts.total("prefill") == 1
    assert _scrape(app, "prefill") == 1.0  # the first scrape after the drop still sees it
    run_app(app, clock, 6.0)  # the next discovery, after that scrape, drops the series
    assert _scrape(app, "prefill") is None
    assert ("a",) not in app.counts.known()


def test_a_dropped_path_back_after_the_retention_starts_again(tmp_path):
    """Past the retention (and a scrape), the series goes, as a deleted file's does: a new series from 0."""
    log = tmp_path / "a.log"
    log.write_text(HISTORY)
    app, clock = started_app(tmp_path, source_retention=30.0)
    named, other = _with_and_without(tmp_path, app)
    append(log, BLOCK.format(s=1))
    app.loop.mark_changed({str(tmp_path)})
    run_app(app, clock, 3.0)
    app.reload(other, app.catalog)
    run_app(app, clock, 20.0)
    assert _scrape(app) == 1.0  # within the retention
    run_app(app, clock, 20.0)
    assert _scrape(app) is None  # dropped at the first discovery past it (a scrape had been served)
    app.reload(named, app.catalog)
    append(log, BLOCK.format(s=2))
    run_app(app, clock, 8.0)
    assert _scrape(app) == 1.0  # its position was kept: only the new OOM, on a new series
