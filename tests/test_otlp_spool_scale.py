"""The spool's work grows with what it holds, never with its square: thousands of sources named by `service.name`
share one directory (files/), which no request and no start lists once per source. Counted as directory entries
listed (os.listdir, os.scandir), never timed."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from sglang_oom_exporter.sources.otlpspool import Line
from tests.support.app import run_app, started_app

REQUESTS, NAMES = 4, 500  # 2,000 services (the attack was 11 requests of 1,000)


@contextlib.contextmanager
def listings(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Count the directory entries os.listdir and os.scandir hand out while inside."""
    seen = [0]
    listdir, scandir = os.listdir, os.scandir

    def counted_listdir(path: str = ".") -> list[str]:
        names = listdir(path)
        seen[0] += len(names)
        return names

    class CountedScandir:
        def __init__(self, path: str = ".") -> None:
            self._it = scandir(path)

        def __enter__(self) -> CountedScandir:
            return self

        def __exit__(self, *exc: object) -> None:
            self._it.close()

        def __iter__(self) -> CountedScandir:
            return self

        def __next__(self) -> os.DirEntry[str]:
            entry = next(self._it)
            seen[0] += 1
            return entry

        def close(self) -> None:
            self._it.close()

    with monkeypatch.context() as m:
        m.setattr(os, "listdir", counted_listdir)
        m.setattr(os, "scandir", CountedScandir)
        yield seen


def _request(r: int) -> dict[str, list[Line]]:
    return {f"files/svc-{r}-{i}.log": [Line(b"a line of service %d\n" % i, (r * NAMES + i).to_bytes(16, "big"))]
            for i in range(NAMES)}  # fmt: skip


def test_thousands_of_services_list_the_shared_directory_once_per_pass_not_once_per_source(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # durability is not the subject: 10,000 fsyncs are slow
    app, clock = started_app(tmp_path, otlp_listen="127.0.0.1:0", paths=())
    assert app.receiver is not None
    per_request = []
    for r in range(REQUESTS):
        with listings(monkeypatch) as seen:
            assert app.receiver.accept(_request(r)).written == NAMES
            app.loop.step()
        per_request.append(seen[0])
    total = REQUESTS * NAMES
    # A request lists what it adds a few times over at most (a discovery pass lists the whole spool once).
    assert max(per_request) <= 4 * (total + 10), per_request
    run_app(app, clock, 6.0)  # a discovery pass and a save
    app.keeper.save()
    assert app.receiver.spool.use().sources == total
    app.sources.close()
    # A restart: the spool's recovery and the first discovery list each directory once, whatever it holds.
    with listings(monkeypatch) as seen:
        again, _ = started_app(tmp_path, otlp_listen="127.0.0.1:0", paths=())
    assert again.receiver is not None
    assert again.receiver.spool.use().sources == total
    assert seen[0] <= 4 * (2 * total + 10), seen[0]  # a log and an .ids file per source, a few passes


class _CountedValues(dict):
    """A dict that counts the items its values() hands out (the source set's sources by path)."""

    handed = 0

    def values(self):  # type: ignore[override]
        for value in super().values():
            _CountedValues.handed += 1
            yield value


def test_thousands_of_sources_retired_at_once_cost_a_pass_not_one_per_source(tmp_path):
    # The spool removes every idle source at one save; the source set then retires them in one discovery pass.
    logs = tmp_path / "logs"
    logs.mkdir()
    for i in range(2000):
        (logs / f"svc-{i}.log").write_bytes(b"a line\n")
    app, clock = started_app(tmp_path, paths=(str(logs / "*.log"),))
    run_app(app, clock, 1.0)
    assert len(app.sources.paths()) == 2000
    for i in range(2000):
        (logs / f"svc-{i}.log").unlink()
    app.sources.discover()  # gone from now on
    clock.now += app.config.source_retention
    app.sources._by_path = _CountedValues(app.sources._by_path)
    app.sources.discover()
    assert app.sources.paths() == []
    assert _CountedValues.handed <= 4 * 2000, _CountedValues.handed
