"""End to end: the overview dashboard's own queries against a real Prometheus scraping a real `serve`.

The daemon follows a temporary log and scrapes a fake SGLang (server args: chunked_prefill_size 16384), and
Prometheus scrapes the daemon every second. After a prefill OOM (16384 tokens asked, 6100 available) is
appended, the OOM and suggestion panels' queries, taken from the committed dashboard JSON and interpolated as
Grafana does for "All" (allValue ".*", $__rate_interval for a 1s-scrape data source, $__range for the picked
range), must return exactly the expected series and values; the same queries before the event return zeros,
and a source that does not exist empties them.

It runs twice: with series without a cluster label (one Prometheus: the cluster variable's All, ".*", matches
the absent label), and with two clusters: the same daemon scraped as cluster="us-east" and, by a
second job, as cluster="eu-west", as a Thanos or Mimir sees two clusters with identical namespaces and pods.
There the checks run with us-east selected, and with All the tiles show each cluster apart, never the sum.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from sglang_oom_exporter.catalog import load_catalog
from sglang_oom_exporter.metrics.collector import TARGET_VALUES
from sglang_oom_exporter.metrics.groups import GROUP_INFO
from sglang_oom_exporter.render.dashboards import OVERVIEW_PATH
from tests.support.daemon import Daemon
from tests.support.dashboard_lint import interpolate, load_exclusions, panels
from tests.support.fake_sglang import FakeSGLang
from tests.support.helpers import wait_until
from tests.support.logs import PREFILL, append
from tests.support.promstack import Prometheus, require_binaries
from tests.support.sglang_data import INFO
from tests.support.sglang_data import METRICS as METRICS_0_5_16

# SGLang 0.5.4+ exports the PD pre-allocation gauge on every server (0 when not a PD decode server, as in the
# 0.5.6 fixture); the dashboard reads it, so the live exposition must carry it.
METRICS = METRICS_0_5_16 + (
    b"# TYPE sglang:pending_prealloc_token_usage gauge\n"
    b'sglang:pending_prealloc_token_usage{dp_rank="0",engine_type="unified",tp_rank="0"} 0.0\n'
    # SGLang main of 2026-08 (hierarchical cache on): the start-up memory split and the HiCache panel's series.
    # SGLang 0.5.23: the PD decode panels' series and the HiCache panel's host mamba pool, write-through and
    # storage capacity series (a reason label where SGLang's family has one).
    + b"".join(
        b"# TYPE sglang:%s %s\n" % (name, typ)
        + b'sglang:%s%s{engine_type="unified",tp_rank="0"%s} %s\n'
        % (name, b"_total" if typ == b"counter" else b"", extra, value)
        for name, typ, extra, value in (
            (b"startup_available_gpu_memory_gb", b"gauge", b"", b"6.5"),
            (b"weight_memory_usage_gb", b"gauge", b"", b"61.0"),
            (b"graph_memory_usage_gb", b"gauge", b"", b"1.5"),
            (b"kv_cache_memory_usage_gb", b"gauge", b"", b"9.0"),
            (b"hicache_host_used_tokens", b"gauge", b"", b"1000.0"),
            (b"hicache_host_total_tokens", b"gauge", b"", b"4000.0"),
            (b"evicted_tokens", b"counter", b"", b"10.0"),
            (b"hicache_prefetch_aux_alloc_failed_tokens", b"counter", b"", b"0.0"),
            (b"prealloc_full_token_usage", b"gauge", b"", b"0.25"),
            (b"prealloc_swa_token_usage", b"gauge", b"", b"0.125"),
            (b"num_decode_prealloc_queue_reqs", b"gauge", b"", b"0.0"),
            (b"num_decode_transfer_queue_reqs", b"gauge", b"", b"0.0"),
            (b"num_decode_host_receive_queue_reqs", b"gauge", b"", b"3.0"),
            (b"num_decode_deferred_kv_release_reqs", b"gauge", b"", b"0.0"),
            (b"hicache_host_mamba_used_states", b"gauge", b"", b"10.0"),
            (b"hicache_host_mamba_total_states", b"gauge", b"", b"100.0"),
        )
    )
    + b"# TYPE sglang:hicache_dropped_tokens counter\n"
    + b"".join(
        b'sglang:hicache_dropped_tokens_total{pool="kv",reason="%s",tp_rank="0"} 0.0\n' % reason
        for reason in (b"host_pressure", b"write_through_unbacked_eviction")
    )
    + b"# TYPE sglang:storage_prefetch_unfulfilled_tokens counter\n"
    + b"".join(
        b'sglang:storage_prefetch_unfulfilled_tokens_total{reason="%s",tp_rank="0"} 0.0\n' % reason
        for reason in (b"host_capacity", b"device_capacity", b"deadline")
    )
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = json.loads((ROOT / OVERVIEW_PATH).read_text(encoding="utf-8"))
LINT_FILE = ROOT / "dashboards" / ".lint"
FILTERS = ("cluster", "namespace", "pod", "source", "kind")
# The cluster the checks select: ".*" (All) without cluster labels; set per run by the stack fixture.
SELECTED: dict[str, str] = {"cluster": ".*"}
SECOND_CLUSTER = "eu-west"
# Grafana with the data source's scrape interval set to 1s: $__rate_interval = max(4 x scrape, step + scrape).
RATE_INTERVAL = "4s"


def _queries(title: str) -> list[str]:
    (panel,) = [p for p in panels(DASHBOARD) if p.get("title") == title]
    return [t["expr"] for t in panel["targets"]]


def _grafana(expr: str, *, range_s: int = 3600, **selected: str) -> str:
    """The expression as Grafana sends it: "All" is the allValue .*, one selected value is itself."""
    values = {name: selected.get(name, SELECTED.get(name, ".*")) for name in FILTERS}
    return interpolate(expr, {**values, "__rate_interval": RATE_INTERVAL, "__range": f"{range_s}s"})


def _series(prom: Prometheus, expr: str, *labels: str) -> dict[tuple[str, ...], float]:
    """An instant query's result keyed by the given label values."""
    return {tuple(r["metric"].get(k, "") for k in labels): float(r["value"][1]) for r in prom.query(expr)}


@pytest.fixture(params=[None, "us-east"], ids=["no-cluster-label", "two-clusters"])
def stack(tmp_path, request, monkeypatch):
    cluster = request.param
    monkeypatch.setitem(SELECTED, "cluster", cluster or ".*")
    require_binaries("prometheus")
    fake = FakeSGLang(metrics_body=METRICS, info_body=json.dumps(INFO).encode()).start()
    log = tmp_path / "server.log"
    log.write_text("")
    daemon = Daemon(["--sglang-url", fake.url, "--scrape-interval", "0.3s", "--scrape-timeout", "1s", str(log)],
                    str(tmp_path / "state"))  # fmt: skip
    try:
        daemon.start()
        target = f"127.0.0.1:{daemon.port}"
        second = [
            {
                "job_name": "sglang-oom-exporter-eu",
                "scrape_interval": "1s",
                "static_configs": [{"targets": [target], "labels": {"cluster": SECOND_CLUSTER}}],
            }
        ]
        with Prometheus(
            tmp_path / "prom",
            targets=[target],
            target_labels={"cluster": cluster} if cluster else None,
            extra_scrape_configs=second if cluster else (),
        ) as prom:
            yield prom, log, fake, daemon, cluster
    finally:
        if daemon.proc is not None and daemon.proc.poll() is None:
            daemon.stop()
        fake.stop()


def test_oom_and_suggestion_panels_return_the_event_and_the_flag_change(stack):
    prom, log, fake, daemon, cluster = stack
    started = time.monotonic()
    fatal_kinds = [k.id for k in load_catalog().kinds if k.fatal != "false"]
    (fatal_expr,) = _queries("Fatal OOMs in the picked range, by kind")
    current_expr, suggested_expr = _queries("What to change: suggested SGLang flag values")
    requested_expr, available_expr, ago_expr = _queries("Last event: requested vs available tokens")

    # The zero-initialised series are in Prometheus for a few scrapes before the event, so a range that starts
    # after their first sample exercises the increase() branch and a longer one the born-in-range branch.
    prefill = 'sglang_oom_fatal_events_total{job="sglang-oom-exporter",kind="prefill",source="server"}'
    prom.wait_for_targets_up()
    # Eight samples (seven seconds) before the event, so that since_first below is at least 6 however soon
    # the event is scraped after its append (with six, a quick scrape left it at 5 now and then).
    wait_until(lambda: (prom.query_value(f"count_over_time({prefill}[1m])") or 0) >= 8, timeout=20, what="samples")
    (raw,) = prom.api("query", query=f"{prefill}[1m]")["result"]
    first_sample = float(raw["values"][0][0])
    assert _series(prom, _grafana(fatal_expr), "kind") == {(k,): 0.0 for k in fatal_kinds}
    assert prom.query(_grafana(current_expr)) == []

    appended = time.time()
    append(log, PREFILL.format(s=1))
    wait_until(lambda: prom.query_value(prefill) == 1.0, timeout=15, what="the OOM in Prometheus")
    wait_until(lambda: prom.query(_grafana(suggested_expr)), timeout=10, what="the suggestion in Prometheus")

    expected = {(k,): (1.0 if k == "prefill" else 0.0) for k in fatal_kinds}
    assert _series(prom, _grafana(fatal_expr), "kind") == expected  # the whole hour: born in the range
    since_first = int(time.time() - first_sample) - 1
    assert since_first >= 6  # long enough that increase()'s extrapolation cannot round 1 event up to 2
    assert _series(prom, _grafana(fatal_expr, range_s=since_first), "kind") == expected  # increase() branch

    flag = ("prefill", "server", "chunked-prefill-size")
    assert _series(prom, _grafana(current_expr), "kind", "source", "flag") == {flag: 16384.0}
    assert _series(prom, _grafana(suggested_expr), "kind", "source", "flag") == {flag: 4096.0}
    assert _series(prom, _grafana(requested_expr), "kind", "source") == {("prefill", "server"): 16384.0}
    assert _series(prom, _grafana(available_expr), "kind", "source") == {("prefill", "server"): 6100.0}
    ((key, ago),) = _series(prom, _grafana(ago_expr), "kind", "source").items()
    assert key == ("prefill", "server")
    assert 0 <= ago <= time.time() - appended + 1

    (age_expr,) = _queries("Time since the last OOM")
    assert 0 <= _one(prom, _grafana(age_expr)) <= time.time() - appended + 1
    assert _one(prom, _grafana(_queries("Sources followed")[0])) == 1.0
    assert _one(prom, _grafana(_queries("SGLang targets up")[0])) == 1.0
    assert prom.query(_grafana(_queries("SGLang targets down")[0])) == []  # shown as the panel's noValue "0"
    usage_expr, promised_expr = _queries("KV cache token usage")
    assert _series(prom, _grafana(usage_expr), "target") == {(fake.url,): 0.99}
    # The near-full alert's gauge reading: 1 - (15000 + 6000) / 240000, summed over the two DP groups.
    assert _series(prom, _grafana(promised_expr), "target") == {(fake.url,): pytest.approx(0.9125)}
    # SGLang 0.5.23's series on their panels: the pre-allocated pool shares, the host-receive queue, and the host
    # mamba pool's occupancy (10 of 100 state slots).
    _, full_expr, swa_expr = _queries("PD decode: KV pool held for transfers")
    assert _series(prom, _grafana(full_expr), "target") == {(fake.url,): 0.25}
    assert _series(prom, _grafana(swa_expr), "target") == {(fake.url,): 0.125}
    assert _series(prom, _grafana(_queries("PD decode: transfer queues")[2]), "target") == {(fake.url,): 3.0}
    assert _series(prom, _grafana(_queries("HiCache host pool and eviction")[1]), "target") == {(fake.url,): 0.1}

    _events_over_time(prom, cluster)
    if cluster:
        _clusters_stay_apart(prom, cluster, fatal_kinds)
    _exclusions_match_the_real_labels(daemon)
    _a_selected_source_filters_every_panel(prom, fatal_kinds)
    _a_dead_server_leaves_the_mirrored_panels(prom, fake)
    print(f"\ndashboard e2e: {time.monotonic() - started:.1f}s from the scraped stack to the last panel check")


def _one(prom: Prometheus, expr: str) -> float:
    value = prom.query_value(expr)
    assert value is not None, expr
    return value


def _clusters_stay_apart(prom: Prometheus, cluster: str, fatal_kinds: list[str]) -> None:
    """With All clusters the tiles and tables show each cluster's OOM on its own (1 each, never 2), named."""
    (fatal_expr,) = _queries("Fatal OOMs in the picked range, by kind")
    current_expr, _ = _queries("What to change: suggested SGLang flag values")
    (up_expr,) = _queries("SGLang targets up")
    both = {(c, k): (1.0 if k == "prefill" else 0.0) for c in (cluster, SECOND_CLUSTER) for k in fatal_kinds}
    assert _series(prom, _grafana(fatal_expr, cluster=".*"), "cluster", "kind") == both
    current = _series(prom, _grafana(current_expr, cluster=".*"), "cluster", "source", "flag")
    assert current == {(c, "server", "chunked-prefill-size"): 16384.0 for c in (cluster, SECOND_CLUSTER)}
    assert _series(prom, _grafana(up_expr, cluster=".*"), "cluster") == {(cluster,): 1.0, (SECOND_CLUSTER,): 1.0}
    assert _series(prom, _grafana(up_expr, cluster=SECOND_CLUSTER), "cluster") == {(SECOND_CLUSTER,): 1.0}
    assert prom.query(_grafana(fatal_expr, cluster="nowhere")) == []


def _events_over_time(prom: Prometheus, cluster: str | None) -> None:
    """OOM events by kind and by source around the event: only prefill and only this source move."""
    (by_kind,) = _queries("OOM events by kind")
    (by_source,) = _queries("OOM events by source")
    annotation = DASHBOARD["annotations"]["list"][0]["expr"]
    events = 'sglang_oom_events_total{job="sglang-oom-exporter",kind="prefill",source="server"}'
    (raw,) = prom.api("query", query=f"{events}[1m]")["result"]
    first_one = min(float(t) for t, v in raw["values"] if v == "1")
    wait_until(lambda: (prom.query_value(f"timestamp({events})") or 0) >= first_one + 2, timeout=10,
               what="two scrapes after the event")  # fmt: skip
    window = {"start": str(first_one - 2), "end": str(first_one + 2), "step": "1"}
    kinds = {r["metric"]["kind"]: max(float(v) for _, v in r["values"])
             for r in prom.api("query_range", query=_grafana(by_kind), **window)["result"]}  # fmt: skip
    assert set(kinds) == set(load_catalog().ids)
    assert {k for k, v in kinds.items() if v > 0} == {"prefill"}
    assert kinds["prefill"] >= 1.0
    sources = prom.api("query_range", query=_grafana(by_source), **window)["result"]
    named = {"cluster": cluster} if cluster else {}
    assert [r["metric"] for r in sources] == [{**named, "source": "server"}]
    marks = prom.api("query_range", query=_grafana(annotation), **window)["result"]
    assert [r["metric"] for r in marks] == [{**named, "kind": "prefill", "source": "server"}]


def _exclusions_match_the_real_labels(daemon: Daemon) -> None:
    """dashboards/.lint excuses metrics for lacking kind or source labels: the live exposition agrees."""
    exclusions = load_exclusions(LINT_FILE)
    no_kind = exclusions["target-kind-rule"]["entries"][0]["metric"]
    no_source = exclusions["target-source-rule"]["entries"][0]["metric"]
    used = set(re.findall(r"sglang_oom_\w+", json.dumps(DASHBOARD)))
    labels: dict[str, set[str]] = {}
    for name, pairs in daemon.metrics():
        if name in used:
            labels.setdefault(name, set()).update(k for k, _ in pairs)
    # every metric the dashboard reads is exported; the serving-group map only for pods of a multi-node server
    # (tests/test_groups.py), and this daemon reads a plain file
    assert set(labels) == used - {GROUP_INFO}, sorted(used - set(labels))
    for name, keys in labels.items():
        assert (re.fullmatch(no_kind, name) is not None) == ("kind" not in keys), (name, keys)
        assert (re.fullmatch(no_source, name) is not None) == ("source" not in keys), (name, keys)


def _mirrored_queries() -> dict[str, list[str]]:
    """Panel title -> its queries that read a mirrored SGLang value (sglang_oom_target_<value>, not the health)."""
    names = {f"sglang_oom_target_{name}" for name, _, _ in TARGET_VALUES.values()}
    out: dict[str, list[str]] = {}
    for panel in panels(DASHBOARD):
        exprs = [t["expr"] for t in panel.get("targets", [])
                 if set(re.findall(r"sglang_oom_target_[a-z_]+?(?=_total\b|\b)", t["expr"])) & names]  # fmt: skip
        if exprs:
            out[panel["title"]] = exprs
    return out


def _a_dead_server_leaves_the_mirrored_panels(prom: Prometheus, fake: FakeSGLang) -> None:
    """The SGLang server dies: the top row counts it down, and every panel that shows its mirrored values empties
    (Prometheus marks the series the exporter stopped exposing stale), rather than drawing its last numbers on."""
    mirrored = _mirrored_queries()
    assert {"KV cache token usage", "KV tokens: used vs pool", "Running and queued requests"} <= set(mirrored)
    assert all(prom.query(_grafana(e)) for e in mirrored["KV cache token usage"])  # drawn while it is up
    fake.stop()
    (down_expr,) = _queries("SGLang targets down")
    wait_until(lambda: prom.query_value(_grafana(down_expr)) == 1.0, timeout=20, what="the target down in Prometheus")
    last: dict[str, list[str]] = {}

    def empty() -> bool:
        last.clear()
        for title, exprs in mirrored.items():
            shown = [r["value"][1] for e in exprs for r in prom.query(_grafana(e))]
            if shown:
                last[title] = shown
        return not last

    try:  # the counters' rates over their 4s window end a few seconds after the gauges
        wait_until(empty, timeout=20, what="every mirrored panel empty")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: still showing the dead server: {last}") from None
    assert _series(prom, _grafana(_queries("SGLang targets up")[0]), "target") == {("",): 0.0}


def _a_selected_source_filters_every_panel(prom: Prometheus, fatal_kinds: list[str]) -> None:
    """Picking this source keeps the results; picking another empties even the series without source labels."""
    (fatal_expr,) = _queries("Fatal OOMs in the picked range, by kind")
    (current_expr, _) = _queries("What to change: suggested SGLang flag values")
    (up_expr,) = _queries("SGLang targets up")
    assert _series(prom, _grafana(fatal_expr, source="server", kind="prefill"), "kind") == {("prefill",): 1.0}
    assert len(prom.query(_grafana(current_expr, source="server"))) == 1
    results: dict[str, Any] = {e: prom.query(_grafana(e, source="other")) for e in (fatal_expr, current_expr, up_expr)}
    assert all(r == [] for r in results.values()), results
    # Why "All" is ".*" and not the linter's ".+" (dashboards/.lint): plain-file series have no namespace label.
    assert prom.query(_grafana(current_expr, namespace=".+")) == []
