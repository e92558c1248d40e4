"""The alert pack: static checks over the rendered rules, promtool (lint and unit tests), amtool on the example.

The rules file is rendered from the catalog (render/alerts.py) and committed; test_render.py proves it is
fresh, so these tests read the committed file. promtool's unit tests live in tests/rules/<alert>.test.yaml;
this module runs them, proves they can fail, and checks that every alert has one.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from sglang_oom_exporter.catalog import CatalogError, load_catalog
from sglang_oom_exporter.config.values import parse_duration
from sglang_oom_exporter.render.alerts import (
    ALERTMANAGER_PATH,
    PAGE_GROUP_WAIT,
    RECEIVERS,
    RULES_PATH,
    alert_pack,
    recording_rules,
    retraction_kind,
    rules_file,
)
from sglang_oom_exporter.render.alertspec import NAME_RE, OOM_GROUP, alert_name
from sglang_oom_exporter.render.options import DEFAULT_RUNBOOK_BASE_URL, RenderOptions, runbook_page_url
from sglang_oom_exporter.render.promql import SOURCE_LABELS
from tests.support.helpers import dump_yaml, load_yaml
from tests.support.promtool_rules import isolate as _isolate

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / RULES_PATH
EXAMPLE = ROOT / ALERTMANAGER_PATH
RULE_TESTS = sorted((ROOT / "tests" / "rules").glob("*.test.yaml"))
CATALOG = load_catalog()
SPECS = alert_pack(CATALOG)
JOB = CATALOG.alert_pack["job"]
CONTRACT = {"SGLangPrefillOOM", "SGLangDecodeOOM", "SGLangReqSlotsOOM", "SGLangDecodeRequestsAborted",
            "SGLangOOMCrashLoop", "SGLangKVCacheRetractionsHigh", "SGLangKVCacheNearFull", "SGLangOOMExporterDown",
            "SGLangOOMExporterNoLogs", "SGLangOOMTargetDown", "SGLangOOMExporterStateErrors"}  # fmt: skip

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian package prometheus) "
                                    "is not installed; .ci/run installs it")  # fmt: skip
needs_amtool = pytest.mark.skipif(shutil.which("amtool") is None, reason="amtool (Debian package "
                                  "prometheus-alertmanager) is not installed; .ci/run installs it")  # fmt: skip


def _rules() -> list[dict]:
    """The alerting rules of the committed pack."""
    data = load_yaml(RULES)
    return [r for g in data["groups"] for r in g["rules"] if "alert" in r]


def _records() -> list[dict]:
    """The recording rules of the committed pack."""
    data = load_yaml(RULES)
    return [r for g in data["groups"] for r in g["rules"] if "record" in r]


def _run(*argv: str, cwd: Path = ROOT, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """timeout is a hang guard: promtool runs every test file of the pack in about 12 s on a quiet 2-core machine,
    and over 60 s beside a loaded suite."""
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


# --- what the pack contains ------------------------------------------------------------------------------


def test_the_contract_names_and_one_fatal_alert_per_fatal_kind_are_all_there():
    names = [r["alert"] for r in _rules()]
    assert len(names) == len(set(names)) == len(SPECS)
    assert set(names) >= CONTRACT, CONTRACT - set(names)
    fatal_kinds = [k.id for k in CATALOG.kinds if k.fatal in ("true", "raised")]
    fatal_alerts = [s.name for s in SPECS if s.role == "fatal"]
    assert fatal_alerts == [alert_name(k) for k in fatal_kinds]
    assert {"SGLangCUDAOOM", "SGLangPDPreallocOOM", "SGLangMemoryLeakOOM"} <= set(fatal_alerts)  # acronyms kept
    retract = retraction_kind(CATALOG)
    assert retract is not None
    assert [s.kind.id for s in SPECS if s.role == "retraction" and s.kind] == [retract.id]
    # 19 today: 9 fatal kinds, decode's aborts, the retraction rate, a non-memory crash and its loop, the OOM crash
    # loop, near full and four guards.
    assert len(SPECS) == len(fatal_kinds) + 10
    records = [r["record"] for r in _records()]
    assert len(records) == len(set(records)) == len(recording_rules(CATALOG))


def test_recording_rules_follow_the_naming_convention_and_come_before_what_reads_them():
    """level:metric:operations (the Prometheus docs), and each group's records first, each reading only records
    recorded before it: a group's rules run in order, so an alert reads the value of the same evaluation."""
    data = load_yaml(RULES)
    for group in data["groups"]:
        seen: list[str] = []
        kinds = ["record" if "record" in r else "alert" for r in group["rules"]]
        assert kinds == sorted(kinds, key=lambda k: k != "record"), group["name"]  # records first
        for rule in group["rules"]:
            read = set(re.findall(r"\b([a-z_]+:[a-z0-9_]+:[a-z0-9_]+)\b", rule["expr"]))
            assert read <= set(seen), (rule.get("record") or rule["alert"], read - set(seen))
            if "record" in rule:
                assert re.fullmatch(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", rule["record"]), rule["record"]
                assert set(rule) == {"record", "expr"}, rule["record"]
                seen.append(rule["record"])


def test_alerts_read_in_one_breath_and_descriptions_hold_at_most_one_lookup():
    """The joins live in recording rules: every OOM and pack alert expression is short, and each description
    is plain text around at most one query."""
    for spec in SPECS:
        if spec.role != "exporter_no_logs":  # the guard over kube-state-metrics: its own test
            assert len(spec.expr) <= 300, (spec.name, len(spec.expr))
        assert spec.description.count("query ") <= 1, spec.name
    fatal = [s for s in SPECS if s.role == "fatal"]
    assert all(s.expr.count("\n") == 1 for s in fatal)  # one line


def test_names_severities_and_annotations_follow_the_conventions():
    for rule in _rules():
        name = rule["alert"]
        assert NAME_RE.match(name), name
        assert set(rule["labels"]) == {"severity"}, name
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        ann = rule["annotations"]
        assert set(ann) == {"summary", "description", "runbook_url"}, name  # dashboard_url only with --grafana-url
        summary = ann["summary"]
        assert "{{" not in summary, name
        assert summary[0].isupper(), name
        assert summary.endswith("."), name
        assert "{{" in ann["description"], name
        assert ann["runbook_url"] == f"{DEFAULT_RUNBOOK_BASE_URL}/{name.lower()}.md"


def test_critical_is_for_fatal_ooms_and_crash_loops_only():
    critical = {s.name for s in SPECS if s.severity == "critical"}
    assert critical == {s.name for s in SPECS if s.role in ("fatal", "crash_loop", "crash_loop_any")}
    rules = {r["alert"]: r for r in _rules()}
    for spec in SPECS:
        if spec.role == "fatal" and spec.kind is not None:
            assert rules[spec.name]["labels"]["severity"] == spec.kind.severity, spec.name


def test_for_is_below_the_window_and_event_alerts_keep_firing():
    rules = {r["alert"]: r for r in _rules()}
    windowed = [s for s in SPECS if s.window]
    assert len(windowed) >= 14
    for spec in windowed:
        rule = rules[spec.name]
        # One isolated event keeps an increase()/rate() true for about one window: `for` must fit inside it.
        assert parse_duration(rule["for"]) < parse_duration(spec.window), spec.name
        assert any(f"[{spec.window}]" in e for e in _read_by(rule["expr"])), spec.name
    for spec in SPECS:
        if spec.role in ("fatal", "crash_loop", "crash", "crash_loop_any"):
            source = spec.kind.alert if spec.kind else CATALOG.alert_pack[spec.role]
            source = source["loop"] if spec.role == "crash_loop_any" else source
            assert rules[spec.name]["keep_firing_for"] == source["keep_firing_for"], spec.name
            assert parse_duration(rules[spec.name]["keep_firing_for"]) >= 600, spec.name
        else:
            assert "keep_firing_for" not in rules[spec.name], spec.name


def _read_by(expr: str) -> list[str]:
    """expr and the expressions of every recording rule it reads, directly or through another."""
    records = {r.name: r.expr for r in recording_rules(CATALOG)}
    found, todo = [expr], [expr]
    while todo:
        for name in re.findall(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", todo.pop()):
            if records[name] not in found:
                found.append(records[name])
                todo.append(records[name])
    return found


def test_every_expression_matches_the_catalog_job_and_oom_alerts_aggregate_exporters_away():
    # Every raw series a rule reads is of the pack's job; recorded series are job-free (they aggregate it away).
    for rule in _records() + _rules():
        name = rule.get("record") or rule["alert"]
        for metric, matchers in re.findall(r"\b((?:sglang_oom_|up\b)[a-z_]*)\{([^}]*)\}", rule["expr"]):
            assert f'job="{JOB}"' in matchers, (name, metric)
    by = f"max by (cluster, {', '.join(SOURCE_LABELS)}"
    records = {r.name: r.expr for r in recording_rules(CATALOG)}
    for spec in SPECS:
        if spec.role == "non_fatal":
            assert spec.expr.startswith(by), spec.name  # no instance: two exporters give one alert
        if spec.role == "retraction":
            (logged,) = re.findall(r"\bsource:[a-z_]+:[a-z0-9_]+", spec.expr)
            assert records[logged].startswith(f"{by})"), spec.name
        if spec.role in ("fatal", "crash_loop"):
            (read,) = set(re.findall(r"\b(unit_kind:[a-z_]+:[a-z0-9_]+)", spec.expr))
            source = read.replace("unit_kind:", "source_kind:", 1)
            assert records[source].startswith(f"{by}, host, kind)"), spec.name  # two exporters of a pod count once
            assert records[read].startswith(f"{by}, group, host, kind)"), spec.name  # one page per serving group
    absent = next(s for s in SPECS if s.role == "exporter_down")
    assert f'absent(up{{job="{JOB}"}})' in absent.expr  # bare selector: the alert keeps its job label


def test_descriptions_quote_the_exporters_text_and_fall_back_to_the_catalog_fix():
    for spec in SPECS:
        if spec.kind is None:
            continue
        d = spec.description
        assert "sglang_oom_last_event_info:max{" in d, spec.name  # the exporter's numbers and advice
        assert "{{ .Labels.advice }}" in d or " .Labels.advice }}" in d, spec.name
        assert f"{{{{ else }}}}Fix: {spec.kind.summary}{{{{ end }}}}" in d, spec.name
        # Every page quotes the last event's numbers (its detail); a fatal page shortens them to one clause.
        assert "{{ .Labels.detail }}" in d or "{{ with .Labels.detail }}" in d, spec.name


def test_a_new_kind_in_the_catalog_gets_its_alert_without_code_changes():
    base = CATALOG.kind("mamba")
    new = replace(base, id="swa_pool", title="The sliding-window pool is exhausted")
    catalog = replace(CATALOG, kinds=(*CATALOG.kinds, new))
    text = rules_file(catalog, RenderOptions())
    rule = next(r for g in yaml.safe_load(text)["groups"] for r in g["rules"] if r.get("alert") == "SGLangSWAPoolOOM")
    assert 'kind="swa_pool"' in rule["expr"]
    assert rule["annotations"]["summary"] == "SGLang fatal OOM: the sliding-window pool is exhausted."
    assert re.search(r"SGLang\(?[^']*SGLangSWAPoolOOM", _example_for(catalog))


def _example_for(catalog) -> str:
    from sglang_oom_exporter.render.alerts import alertmanager_example

    return alertmanager_example(catalog)


# --- promtool ---------------------------------------------------------------------------------------------
# The timeouts below are hang guards, not speed limits: a promtool unit test of NoLogs costs about 6 s of CPU
# alone (a day of 1m evaluation steps), and beside a loaded machine's other work it took over 30 s.


@pytest.mark.e2e
@pytest.mark.needs_promtool
@needs_promtool
def test_promtool_lints_the_rules_clean():
    proc = _run("promtool", "check", "rules", "--lint=all", "--lint-fatal", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(SPECS) + len(recording_rules(CATALOG))} rules found" in proc.stdout


@pytest.mark.e2e
@pytest.mark.needs_promtool
@needs_promtool
@pytest.mark.timeout(360)
def test_promtool_unit_tests_pass(tmp_path):
    names = [_isolate(tmp_path, p)[0] for p in RULE_TESTS]
    proc = _run("promtool", "test", "rules", *names, cwd=tmp_path, timeout=330)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUCCESS") == len(RULE_TESTS) == len(SPECS)


# The longest names a page realistically shows: Kubernetes object names of 63 characters (a generated pod name
# is cut there), a long cluster name, a plain file's source on a fully qualified host, and two-digit counts.
LONGEST = {
    "cluster": "prod-us-east-1-gpu-a100-01",
    "namespace": "llm-inference-production-east",
    "pod": "sglang-llama-3-1-405b-instruct-fp8-decode-7f9c8d6b5d-x2k4p-abcd",
    "group": "sglang-deepseek-v3-671b-instruct-fp8-prefill-leaderworkerset-01",
    "source": "llama-3-1-405b-instruct-fp8-decode-node",
    "host": "gpu-node-017.prod.example.internal:9877",
}
# The exporter's longest advice (INFO_LABEL_LIMIT, 299 characters): a rule's own words where no value is given,
# and suggested values with their reasons in parentheses.
LONG_FIX = ("Fix: A 2048-token chunk would not change the failing prefill, which asked for only 15 tokens (at most "
            "the floor 512); lower --max-running-requests instead, since the running requests hold the KV pool and "
            "each new one takes its share of it before the prefill asks for its chunk of tokens, so fewer...")  # fmt: skip
LONG_SUGGESTED = ("Suggested: --max-running-requests from 1024 to 256, --chunked-prefill-size from 16384 to 4096 (not "
                  "--mem-fraction-static: a larger static fraction leaves less room for CUDA graphs and activations, "
                  "and the pool that ran out is the one the running requests hold; not --page-size: pages round up "
                  "to the next page).")  # fmt: skip
LAST_SEEN = 1796693025  # 2026-12-08 01:23:45 UTC
# The longest numbers the exporter writes (advise/explain.py): a pool other than the full one, a note, the state.
LONG_DETAIL = ("The last one asked for 16384 tokens; the SWA (sliding-window) KV pool was the limit with 6100 available "
               "(the full KV pool had 120000): the numbers show no shortfall at page size 1, where nothing is rounded; "
               "state from the log line at 2026-12-08 01:23:44: 1024 running requests, token usage 0.98.")  # fmt: skip
LONG_NUMBERS = ": asked for 16384 tokens (swa pool had 6100)"  # what the page says of it


def _lever(advice: str) -> str:
    """What a page quotes of the exporter's advice: the suggested values without their reasons, cut at 120."""
    if advice.startswith("Suggested: ") and " (" in advice:
        advice = advice.split(" (", 1)[0] + "."
    return advice if len(advice) <= 120 else advice[:119] + "…"


def _longest_pages_test(kind) -> dict:
    """A promtool test case of one fatal kind on four units with the longest names, each with 12 new OOMs: a PD
    decode pod with the longest advice, a multi-node server's group, a plain file's source on its host (with the
    suggested values and their reasons), and a pod whose last event the rules do not know (the catalog's fix)."""
    n = LONGEST
    job = f'job="{JOB}",cluster="{n["cluster"]}"'
    pod, bare = f'namespace="{n["namespace"]}",pod="{n["pod"]}"', f'namespace="{n["namespace"]}",pod="{n["pod"]}-x"'
    member = f'namespace="{n["namespace"]}",pod="{n["group"]}-0"'
    source = f'source="{n["source"]}"'
    units = [(f'instance="10.0.0.7:9877",{pod},container="sglang"', LONG_FIX),
             (f'instance="10.0.0.7:9877",{member},container="sglang"', LONG_SUGGESTED),
             (f'instance="{n["host"]}",{source}', LONG_SUGGESTED),
             (f'instance="10.0.0.7:9877",{bare},container="sglang"', None)]  # fmt: skip
    series = []
    for labels, advice in units:
        at = f'{job},{labels},kind="{kind.id}"'
        series.append({"series": f"sglang_oom_fatal_events_total{{{at}}}", "values": "0x2 12x10"})
        if advice is not None:
            info = f'{at},limiting_pool="swa",detail="{LONG_DETAIL}",advice="{advice}"'
            series += [{"series": f"sglang_oom_last_event_info{{{info}}}", "values": "_x2 1x10"},
                       {"series": f"sglang_oom_last_event_timestamp_seconds{{{at}}}", "values": f"_x2 {LAST_SEEN}x10"}]  # fmt: skip
    series += [
        {"series": f'sglang_oom_target_token_usage{{{job},instance="10.0.0.7:9877",{pod},engine_type="decode"}}',
         "values": "0.5x12"},
        {"series": f'sglang_oom_serving_group_info{{{job},instance="10.0.0.7:9877",{member},group="{n["group"]}",'
                   'worker_index="0"}', "values": "1x12"},
    ]  # fmt: skip
    events = f"12 fatal {kind.id} OOMs"
    at = ", the last at 2026-12-08 01:23:45 +0000 UTC"
    cluster = f" in cluster {n['cluster']}"
    pages = [
        ({"namespace": n["namespace"], "pod": n["pod"], "container": "sglang"},
         f"{events} on pod {n['namespace']}/{n['pod']}{cluster} (PD decode server){at}{LONG_NUMBERS}. {_lever(LONG_FIX)}"),
        ({"namespace": n["namespace"], "group": n["group"]},
         f"{events} on group {n['namespace']}/{n['group']}{cluster}{at}{LONG_NUMBERS}. {_lever(LONG_SUGGESTED)}"),
        ({"source": n["source"], "host": n["host"]},
         f"{events} on source {n['source']} on host {n['host']}{cluster}{at}{LONG_NUMBERS}. {_lever(LONG_SUGGESTED)}"),
        ({"namespace": n["namespace"], "pod": f"{n['pod']}-x", "container": "sglang"},
         f"{events} on pod {n['namespace']}/{n['pod']}-x{cluster} within {kind.alert['window']}. Fix: {kind.summary}"),
    ]  # fmt: skip
    name = alert_name(kind.id)
    spec = next(s for s in SPECS if s.name == name)
    exp = [{"exp_labels": {"severity": "critical", "kind": kind.id, "cluster": n["cluster"], **labels},
            "exp_annotations": {"summary": spec.summary, "description": text,
                                "runbook_url": runbook_page_url(RenderOptions(), name)}}
           for labels, text in pages]  # fmt: skip
    return {"name": f"{name} on the longest names", "interval": "1m", "input_series": series,
            "alert_rule_test": [{"eval_time": "3m", "alertname": name, "exp_alerts": exp}]}  # fmt: skip


@pytest.mark.e2e
@pytest.mark.needs_promtool
@needs_promtool
def test_every_fatal_page_is_one_sentence_of_at_most_400_characters_for_the_longest_names(tmp_path):
    """Rendered by promtool (the same Go templates as Prometheus): every fatal alert's description on the longest
    names, with the exporter's longest numbers and advice and with none, is the expected sentence (the numbers of
    the pool that failed included), and none is over 400 characters; the reasons stay on /events and the runbook."""
    fatal = [k for k in CATALOG.kinds if k.fatal in ("true", "raised")]
    cases = [_longest_pages_test(k) for k in fatal]
    texts = [a["exp_annotations"]["description"] for c in cases for t in c["alert_rule_test"] for a in t["exp_alerts"]]
    assert len(texts) == 4 * len(fatal) == 36
    longest = max(texts, key=len)
    assert len(longest) <= 400, (len(longest), longest)
    assert longest.count(". ") == 1  # one sentence, then the lever
    assert longest.endswith("…")  # the advice cut: its whole text is on /events
    test = {"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": cases}
    (tmp_path / "longest.test.yaml").write_text(dump_yaml(test))
    proc = _run("promtool", "test", "rules", "longest.test.yaml", cwd=tmp_path, timeout=110)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    print(f"\nthe longest fatal page ({len(longest)} characters): {longest}")


def _unit_test_mutated(
    tmp_path: Path, alert: str, mutate: Callable[[str], str], rule: str | None = None
) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run the alert's promtool tests against the rules with one expression mutated (the alert's, or the
    recording rule `rule`'s); the result and test names."""
    name = rule or alert

    def change(data: dict) -> None:
        rule = next(r for g in data["groups"] for r in g["rules"] if r.get("alert", r.get("record")) == name)
        mutated = mutate(rule["expr"])
        assert mutated != rule["expr"]
        rule["expr"] = mutated

    name, test = _isolate(tmp_path, ROOT / "tests" / "rules" / f"{alert.lower()}.test.yaml", change)
    proc = _run("promtool", "test", "rules", name, cwd=tmp_path)
    return proc, {t["name"] for t in test["tests"]}


@pytest.mark.e2e
@pytest.mark.needs_promtool
@needs_promtool
def test_the_unit_tests_catch_a_rule_without_its_born_at_one_branch(tmp_path):
    # The convention's warning: a plain increase() misses a series born at 1, and it extrapolates. Prove the
    # tests notice both, while the ordinary case still pages (rounded, as the old pack printed it).
    plain = f'max by (cluster, namespace, pod, container, source, kind) (round(increase(sglang_oom_fatal_events_total{{job="{JOB}"}}[5m])))'
    proc, _ = _unit_test_mutated(
        tmp_path, "SGLangPrefillOOM", lambda _expr: plain, "source_kind:sglang_oom_fatal_events:exact_increase5m"
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1
    assert "name: a series born at 1 pages," in out
    assert "name: one event on a source just seen pages as exactly one," in out  # 1.57 read as 2
    assert "name: one event pages" not in out  # the plain increase still sees the ordinary case


_NO_LOGS = "SGLangOOMExporterNoLogs"
_EXCLUDED = ', image!~"(?i).*sglang[-_]?(oom[-_]?exporter|router|(model[-_]?)?gateway).*"'
_OWN_CONTAINER = re.compile(r"\n    unless on \(cluster, namespace, pod, container\)\n.*\n", re.M)
_BUSY = 'and on (cluster, job, instance)\nmax by (cluster, job, instance) (max_over_time(sglang_oom_target_running_requests{job="sglang-oom-exporter"}[1h])) > 0\n'
_INFO = "and on (cluster, job, instance)\nmax by (cluster, job, instance) (changes(instance:sglang_oom_exporter_last_read_timestamp_seconds:max[1d])) >= 60\n"


def _without_line(expr: str, marker: str) -> str:
    """The alert's expression without its `or` line that contains marker (one branch per line)."""
    lines = expr.rstrip("\n").split("\n")
    drop = next(i for i, line in enumerate(lines) if marker in line)
    kept = [line for i, line in enumerate(lines) if i != drop]
    kept[0] = kept[0].removeprefix("or on (cluster, job, instance) ")
    return "\n".join(kept) + "\n"


@pytest.mark.needs_promtool
@needs_promtool
@pytest.mark.parametrize(
    ("rule", "mutate", "failing"),
    [
        # Without `offset 1h`, a file missing for 15m (SGLang still loading) would already warn, and a file
        # missing for good would warn 45 minutes early.
        ("instance:sglang_oom_exporter_sources_waiting:min_over_time1h",
         lambda e: e.replace('sources_waiting{job="sglang-oom-exporter"} offset 1h', 'sources_waiting{job="sglang-oom-exporter"}'),
         {"a file that appears half an hour after start never warns",
          "a configured file missing for an hour warns although the other files are read",
          "an exporter restart does not restart the hour of waiting"}),
        # Without the waiting branch, a missing file goes unseen while another file is read.
        (_NO_LOGS, lambda e: _without_line(e, "sources_waiting"),
         {"a configured file missing for an hour warns although the other files are read",
          "an exporter restart does not restart the hour of waiting",
          "a file missing from 11m on warns an hour and 15 minutes later"}),
        # The old "follows no file" branch: every node without pods would warn.
        (_NO_LOGS, lambda e: 'max by (cluster, job, instance) (sglang_oom_exporter_files_watched{job="sglang-oom-exporter"}) == 0\nor ' + e,
         {"a CPU node with no SGLang stays silent, with or without other containers"}),
        # Every image that says sglang a server (the old pattern): routers and gateways would warn, and so
        # would the exporter's released image where its scrape identity is not known (a fresh cluster,
        # another cluster's exporter without `up` in the test).
        ("node:sglang_oom_sglang_server_containers:count", lambda e: e.replace(_EXCLUDED, ""),
         {"a router or gateway pod is never an SGLang server", "a fresh cluster without an SGLang server is silent",
          "a wrong hostPath on a node with an SGLang server warns, naming the node and the exporter pod",
          "SGLang servers in one cluster never make another cluster's idle exporter warn"}),
        # Without the exporter's own container left out by its scrape identity, a mirrored exporter image
        # whose name no pattern excludes would be an SGLang server.
        ("node:sglang_oom_sglang_server_containers:count", lambda e: _OWN_CONTAINER.sub("\n", e),
         {"the exporter's own pods are never an SGLang server"}),
        # Silence not scoped to a busy SGLang (the old line branch): an idle server warns overnight.
        ("instance:sglang_oom_busy_sglang_silence:seconds", lambda e: e.replace(_BUSY, ""),
         {"an SGLang server idle overnight after 90 busy minutes is silent"}),
        # Without the info-level evidence, a busy server run at --log-level warning warns.
        ("instance:sglang_oom_busy_sglang_silence:seconds", lambda e: e.replace(_INFO, ""),
         {"a busy SGLang server at log level warning is silent", "a busy server silent for over a day no longer warns"}),
        # Without the silence branch, a busy server whose lines stop goes unseen.
        (_NO_LOGS, lambda e: _without_line(e, "busy_sglang_silence"),
         {"a busy SGLang server whose lines stop warns 76 minutes after its last line"}),
        # Without the kube-state-metrics node part, a wrong hostPath on the SGLang node is unseen.
        ("instance:sglang_oom_unread_sglang:count",
         lambda e: e[e.index("or on (cluster, job, instance)\n") + len("or on (cluster, job, instance)\n"):],
         {"a wrong hostPath on a node with an SGLang server warns, naming the node and the exporter pod"}),
        # Without the target part, an answering SGLang whose log is not read is unseen.
        ("instance:sglang_oom_unread_sglang:count", lambda e: e[: e.index("or on (cluster, job, instance)\n")],
         {"an SGLang endpoint that answers while its logs are not read warns; one that does not answer is quiet"}),
        # Without the job branch, SGLang servers no exporter runs beside go unseen.
        (_NO_LOGS, lambda e: _without_line(e, "job:sglang_oom_unread_sglang"),
         {"SGLang servers while no exporter of the job follows any SGLang log warn once for the job",
          "SGLang servers in one cluster never make another cluster's idle exporter warn"}),
    ],
    ids=["no-whole-window-guard", "no-waiting-branch", "files-watched-zero", "any-sglang-image",
         "own-container-kept", "idle-silence", "warning-level-silence", "no-silence-branch", "no-node-branch",
         "no-target-branch", "no-job-branch"],
)  # fmt: skip
@pytest.mark.e2e
def test_the_unit_tests_catch_a_no_logs_rule_that_ignores_waiting_sources_or_pages_too_soon(
    tmp_path, rule, mutate, failing
):
    """Each branch and record of NoLogs, and its scoping to where an SGLang server runs and logs, has a
    promtool test that fails without it."""
    proc, names = _unit_test_mutated(tmp_path, _NO_LOGS, mutate, rule=rule)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1
    assert {n for n in names if f"name: {n}," in out} == failing, out


@pytest.mark.e2e
@pytest.mark.slow
def test_the_guard_alerts_read_series_a_live_daemon_exports_with_the_values_their_tests_assume(tmp_path):
    """A corrupt state file and a configured log that does not exist: the series the guards read, on real serve."""
    from tests.support.daemon import Daemon

    state = tmp_path / "state"
    state.mkdir()
    (state / "state.json").write_text("{not json")
    present = tmp_path / "server.log"
    present.write_text("")
    daemon = Daemon([str(present), str(tmp_path / "not-started.log")], str(state)).start()
    try:
        everything = daemon.metrics()
    finally:
        daemon.stop()
    metrics = {name: v for (name, labels), v in everything.items() if not labels}
    guards = [s.expr for s in SPECS if s.group == "sglang-oom-exporter"]
    guards += [r.expr for r in recording_rules(CATALOG) if r.group == "sglang-oom-exporter"]
    read = {m for expr in guards for m in re.findall(r"\b(sglang_oom_exporter_\w+)\{", expr)}
    assert read == {"sglang_oom_exporter_sglang_sources", "sglang_oom_exporter_last_read_timestamp_seconds",
                    "sglang_oom_exporter_sources_waiting", "sglang_oom_exporter_state_errors_total"}  # fmt: skip
    # The missing file is followed (files_watched counts it) and waiting: NoLogs needs its waiting branch.
    assert metrics["sglang_oom_exporter_files_watched"] == 2.0
    assert metrics["sglang_oom_exporter_sources_waiting"] == 1.0
    # Nothing read yet: no last-read time, so NoLogs' silence record has no value (it needs a line first).
    assert not [k for k in everything if k[0] == "sglang_oom_exporter_last_read_timestamp_seconds"]
    # Both files are SGLang by the user's word (named paths), the missing one too: NoLogs' scoping sees them.
    assert metrics["sglang_oom_exporter_sglang_sources"] == 2.0
    # The corrupt state was counted at start, before any scrape: StateErrors' series is born at 1.
    assert metrics["sglang_oom_exporter_state_errors_total"] == 1.0


def test_every_alert_has_a_promtool_test_that_fires_it_and_one_that_keeps_it_quiet():
    fired: dict[str, set[str]] = {}
    quiet: dict[str, set[str]] = {}
    for path in RULE_TESTS:
        data = load_yaml(path)
        assert data["rule_files"] == ["../../alerts/sglang-oom.rules.yaml"], path
        assert data["evaluation_interval"] == "1m", path
        for test in data["tests"]:
            for case in test["alert_rule_test"]:
                into = fired if case["exp_alerts"] else quiet
                into.setdefault(case["alertname"], set()).add(path.name)
                for alert in case["exp_alerts"]:
                    # promtool compares annotations as a whole map: every firing case checks all of them.
                    assert set(alert["exp_annotations"]) == {"summary", "description", "runbook_url"}, path
    names = {s.name for s in SPECS}
    assert set(fired) == names, names ^ set(fired)
    assert set(quiet) == names, names ^ set(quiet)
    assert {p.name for p in RULE_TESTS} == {f"{n.lower()}.test.yaml" for n in names}


@pytest.mark.e2e
@pytest.mark.needs_promtool
@needs_promtool
def test_dashboard_url_is_templated_from_the_alert_labels(tmp_path):
    options = RenderOptions(
        runbook_base_url="https://runbooks.example.com/sglang", grafana_url="https://grafana.example.com"
    )
    (tmp_path / "rules.yaml").write_text(rules_file(CATALOG, options))
    lint = _run("promtool", "check", "rules", "--lint=all", "--lint-fatal", "rules.yaml", cwd=tmp_path)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    k8s = 'job="sglang-oom-exporter",instance="10.0.0.7:9877",kind="cuda_oom",namespace="llm",pod="sglang-0",container="sglang"'
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [{"series": f"sglang_oom_fatal_events_total{{{k8s}}}", "values": "0 1x5"},
                             {"series": 'up{job="other"}', "values": "1x12"}],
            "alert_rule_test": [
                {"eval_time": "1m", "alertname": "SGLangCUDAOOM", "exp_alerts": [{
                    "exp_labels": {"severity": "critical", "kind": "cuda_oom", "namespace": "llm", "pod": "sglang-0",
                                   "container": "sglang"},
                    "exp_annotations": {
                        "summary": "SGLang fatal OOM: the CUDA allocator ran out of GPU memory (outside the KV pool).",
                        "description": "1 fatal cuda_oom OOM on pod llm/sglang-0 within 5m. Fix: Activations or CUDA graphs "
                        "outgrew what the KV pool left free; lower --mem-fraction-static (e.g. to 0.8).",
                        "runbook_url": "https://runbooks.example.com/sglang/sglangcudaoom.md",
                        "dashboard_url": "https://grafana.example.com/d/sglang-oom-overview?from=now-3h&to=now"
                        "&var-kind=cuda_oom&var-namespace=llm&var-pod=sglang-0",
                    }}]},
                {"eval_time": "10m", "alertname": "SGLangOOMExporterDown", "exp_alerts": [{
                    "exp_labels": {"severity": "warning", "job": "sglang-oom-exporter"},
                    "exp_annotations": {
                        "summary": "The SGLang OOM exporter is down or not scraped, so no OOM alert can fire.",
                        "description": 'Prometheus has no target with job="sglang-oom-exporter" at all (for 10m). '
                        "OOMs on the servers it watches go uncounted until it is back: check the exporter pod or "
                        'process, its logs, and that the scrape job matches job="sglang-oom-exporter".',
                        "runbook_url": "https://runbooks.example.com/sglang/sglangoomexporterdown.md",
                        "dashboard_url": "https://grafana.example.com/d/sglang-oom-overview?from=now-3h&to=now",
                    }}]},
            ],
        }],
    }  # fmt: skip
    (tmp_path / "t.test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    proc = _run("promtool", "test", "rules", "t.test.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert runbook_page_url(options, "SGLangCUDAOOM") == "https://runbooks.example.com/sglang/sglangcudaoom.md"


# --- the example Alertmanager config ----------------------------------------------------------------------


def test_the_pager_waits_seconds_for_an_incidents_alerts_and_the_rules_let_one_evaluation_find_them():
    """The example's page route holds a new incident PAGE_GROUP_WAIT (not Alertmanager's default 30s, which paged
    31 s after a live crash). Its reason is the rules': every page is `for: 0m` in one rule group, so a crash's alerts
    come from one evaluation; a page with a `for:` or in another group would arrive after the wait, as a second
    notification."""
    example = load_yaml(EXAMPLE)
    (ours,) = example["route"]["routes"]
    pager = [r for r in ours["routes"] if r["receiver"] == RECEIVERS["critical"]]
    assert [r.get("group_wait") for r in pager] == ["10s"] == [PAGE_GROUP_WAIT]
    assert all("group_wait" not in r for r in (example["route"], ours, *ours["routes"]) if r not in pager)
    assert f"group_wait: {PAGE_GROUP_WAIT}\n" in EXAMPLE.read_text()
    groups = load_yaml(RULES)["groups"]
    pages = {
        (g["name"], r["for"]) for g in groups for r in g["rules"] if r.get("labels", {}).get("severity") == "critical"
    }
    assert pages == {(OOM_GROUP, "0m")}


@pytest.mark.e2e
@needs_amtool
def test_amtool_accepts_the_example():
    proc = _run("amtool", "check-config", str(EXAMPLE))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout
    assert " - 4 inhibit rules" in proc.stdout
    assert " - 4 receivers" in proc.stdout


@pytest.mark.e2e
@needs_amtool
def test_amtool_routes_critical_to_the_pager_and_warnings_to_tickets():
    for spec in SPECS:
        receiver = RECEIVERS[spec.severity]
        labels = [f"alertname={spec.name}", f"severity={spec.severity}", "namespace=llm", "pod=sglang-0"]
        proc = _run("amtool", "config", "routes", "test", f"--config.file={EXAMPLE}",
                    f"--verify.receivers={receiver}", *labels)  # fmt: skip
        assert proc.returncode == 0, (spec.name, proc.stdout + proc.stderr)
        assert proc.stdout.strip() == receiver
    # The check can fail: a page is not a ticket, and info is never routed.
    proc = _run("amtool", "config", "routes", "test", f"--config.file={EXAMPLE}", "--verify.receivers=ticket",
                "alertname=SGLangPrefillOOM", "severity=critical")  # fmt: skip
    assert proc.returncode == 1
    # Only the pack's own alerts are routed by it: anyone else's info alert is not silenced.
    proc = _run("amtool", "config", "routes", "test", f"--config.file={EXAMPLE}", "alertname=X", "severity=info")
    assert proc.stdout.strip() == "default"


# What an existing setup looks like: a catch-all root, team routes, and a critical route that would take any
# page, ours included, if it came first.
EXISTING = {
    "route": {
        "receiver": "team-default",
        "group_by": ["alertname"],
        "routes": [
            {"receiver": "db-team", "matchers": ['team="db"']},
            {"receiver": "oncall", "matchers": ['severity="critical"']},
            {"receiver": "blackhole", "matchers": ['severity="info"']},
        ],
    },
    "receivers": [{"name": n} for n in ("team-default", "db-team", "oncall", "blackhole")],
    "inhibit_rules": [{"source_matchers": ['alertname="NodeDown"'], "target_matchers": ['severity="warning"'],
                       "equal": ["instance"]}],
}  # fmt: skip
# (labels, the receiver the existing config routes them to): none of them is one of ours.
OTHERS = [
    (["alertname=NodeDown", "severity=critical"], "oncall"),
    (["alertname=SlowQueries", "severity=warning", "team=db"], "db-team"),
    (["alertname=Watchdog", "severity=info"], "blackhole"),
    (["alertname=DiskFilling", "severity=warning"], "team-default"),
    (["alertname=SGLangSomethingElse", "severity=critical"], "oncall"),  # a name like ours is not ours
    (["alertname=SGLangPrefillOOMx", "severity=critical"], "oncall"),
    (["alertname=KubePodCrashLooping", "severity=warning", "namespace=llm", "pod=sglang-0"], "team-default"),
]


def _merged() -> dict:
    """The example merged into EXISTING as its header says: subtree first, receivers and inhibitions added."""
    example = yaml.safe_load(EXAMPLE.read_text())
    subtree = example["route"]["routes"]
    assert len(subtree) == 1, "the example's root has one child: the pack's subtree"
    merged = copy.deepcopy(EXISTING)
    merged["route"]["routes"] = subtree + merged["route"]["routes"]
    merged["receivers"] += [r for r in example["receivers"] if r["name"] != "default"]
    merged["inhibit_rules"] += example["inhibit_rules"]
    return merged


def _route(config: Path, labels: list[str]) -> str:
    proc = _run("amtool", "config", "routes", "test", f"--config.file={config}", *labels)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip()


@pytest.mark.e2e
@needs_amtool
def test_the_example_merged_under_a_catch_all_routes_ours_and_leaves_the_others_alone(tmp_path):
    before, after = tmp_path / "existing.yml", tmp_path / "merged.yml"
    before.write_text(dump_yaml(EXISTING))
    after.write_text(dump_yaml(_merged()))
    proc = _run("amtool", "check-config", str(after))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for labels, receiver in OTHERS:
        assert (_route(before, labels), _route(after, labels)) == (receiver, receiver), labels
    for spec in SPECS:
        labels = [f"alertname={spec.name}", f"severity={spec.severity}", "namespace=llm", "pod=sglang-0"]
        assert _route(before, labels) == ("oncall" if spec.severity == "critical" else "team-default")
        assert _route(after, labels) == RECEIVERS[spec.severity], spec.name


def test_the_example_inhibits_a_sources_warnings_while_its_oom_pages():
    config = yaml.safe_load(EXAMPLE.read_text())
    pages = {s.name for s in SPECS if s.severity == "critical"}
    rules = config["inhibit_rules"]
    assert len(rules) == 4

    def names(matcher: str) -> set[str]:
        m = re.fullmatch(r'alertname(=~|=)"(.*)"', matcher)
        assert m is not None, matcher
        pattern = m.group(2) if m.group(1) == "=~" else re.escape(m.group(2))
        return {s.name for s in SPECS if re.fullmatch(pattern, s.name)}

    warnings, near_full, near_full_source, no_logs = rules
    assert names(warnings["source_matchers"][0]) == pages
    assert names(warnings["target_matchers"][0]) == {
        "SGLangDecodeRequestsAborted", "SGLangKVCacheRetractionsHigh", "SGLangCrashed"
    }  # fmt: skip
    assert warnings["equal"] == ["cluster", *SOURCE_LABELS]
    assert names(near_full["source_matchers"][0]) == pages
    assert names(near_full["target_matchers"][0]) == {"SGLangKVCacheNearFull"}
    assert near_full["target_matchers"][1:] == ['pod=~".+"']
    assert near_full["equal"] == ["cluster", "namespace", "pod"]
    # A near-full warning by source (config targets) is quieted by its own source's page only.
    assert names(near_full_source["source_matchers"][0]) == pages
    assert names(near_full_source["target_matchers"][0]) == {"SGLangKVCacheNearFull"}
    assert near_full_source["target_matchers"][1:] == ['pod=""', 'source=~".+"']
    assert near_full_source["equal"] == ["cluster", "source"]
    assert names(no_logs["source_matchers"][0]) == {"SGLangOOMExporterDown"}
    assert names(no_logs["target_matchers"][0]) == {"SGLangOOMExporterNoLogs"}
    assert no_logs["equal"] == ["cluster", "instance"]


def test_the_alerts_page_names_every_alert_and_the_job():
    page = (ROOT / "docs" / "alerts.md").read_text()
    section = page.split("\n## Get paged\n", 1)[1].split("\n## ", 1)[0]
    for spec in SPECS:
        assert f"`{spec.name}`" in section, spec.name
    assert f"job_name: {JOB}" in section
    assert f"amtool check-config {ALERTMANAGER_PATH}" in section


BAD_ALERT_FIELDS = [
    (lambda d: d["alert_pack"].pop("kv_near_full"), "alert_pack.kv_near_full: missing: needs severity, threshold, for"),
    (lambda d: d["alert_pack"].update(pager="x"), "alert_pack.pager: unknown key"),
    (lambda d: d["alert_pack"]["crash_loop"].update(severity="page"), "alert_pack.crash_loop.severity: 'page' is not one of critical, warning, info"),
    (lambda d: d["alert_pack"]["kv_near_full"].update(threshold=98), "alert_pack.kv_near_full.threshold: is a ratio: at most 1"),
    (lambda d: d["alert_pack"]["state_errors"].update(window="30 minutes"), "alert_pack.state_errors.window: '30 minutes' is not a Prometheus duration (5m, 1h)"),
    (lambda d: d["kinds"][0]["alert"].pop("keep_firing_for"), "kinds[prefill].alert.keep_firing_for: missing"),
    (lambda d: d["kinds"][0]["alert"].update(non_fatal={"name": "Aborts", "severity": "warning", "for": "10m", "window": "15m", "threshold_per_minute": 0.1}), "kinds[prefill].alert.non_fatal: only for a kind with a `fatal: false` pattern"),
    (lambda d: d["kinds"][1]["alert"]["non_fatal"].update(name="requests aborted"), "kinds[decode].alert.non_fatal.name: must be CamelCase (the alert name's ending)"),
    (lambda d: d["kinds"][4]["alert"].update(threshold_per_minute=0), "kinds[retract].alert.threshold_per_minute: must be a positive number"),
    (lambda d: d["kinds"][4]["alert"].update(window="5m"), "kinds[retract].alert.for: must be shorter than the window (5m)"),
]  # fmt: skip


@pytest.mark.parametrize(("mutate", "problem"), BAD_ALERT_FIELDS)
def test_the_loader_names_each_bad_alert_field(tmp_path, mutate, problem):
    data = load_yaml(Path(CATALOG.path))
    assert [k["id"] for k in data["kinds"][:5]] == ["prefill", "decode", "req_slots", "unknown", "retract"]
    mutate(data)
    path = tmp_path / "catalog.yaml"
    path.write_text(dump_yaml(data))
    with pytest.raises(CatalogError) as err:
        load_catalog(str(path))
    assert [p.split(": ", 1)[1] for p in err.value.problems] == [problem]
