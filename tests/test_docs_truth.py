"""The docs' names and counts, tied to the code they describe, so that a doc cannot drift from it unnoticed:
every metric family a real `serve` exposes is in docs/metrics.md (or docs/sglang-endpoints.md for the mirrored
`sglang_oom_target_*`), every chart value is in the chart README's Values table, the count of inhibit rules and
their `equal` lists quoted in the docs are the example's, the ClusterRole docs/kubernetes.md names is the one the
chart renders, docs/configuration.md quotes the default Kubernetes filters, and every install into a namespace
labels it for Pod Security first.
"""

from __future__ import annotations

import json
import re
import shlex
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from sglang_oom_exporter.sources.discover import (
    DEFAULT_CONTAINER_FILTER,
    DEFAULT_NAMESPACE_FILTER,
    DEFAULT_POD_FILTER,
)
from tests.support.daemon import Daemon
from tests.support.fake_sglang import FakeSGLang
from tests.support.helm import CHART, ROOT, helm, one, run_tool
from tests.support.helpers import wait_until
from tests.support.sglang_data import INFO, METRICS

DOCS = ROOT / "docs"
PREFIXES = ("sglang_oom_exporter_", "sglang_oom_target_", "sglang_oom_")
NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}


def documented_metrics(text: str) -> set[str]:
    """The metric names a doc spells: `sglang_oom_…` in backquotes, and each `…_name` after one, which is short
    for the same prefix (`sglang_oom_exporter_read_bytes_total`, `…_lines_read_total`)."""
    names: set[str] = set()
    prefix = ""
    for token in re.findall(r"`((?:sglang_oom_|…_)[a-z0-9_]+)", text):
        if token.startswith("…_"):
            if prefix:
                names.add(prefix + token[2:])
            continue
        names.add(token)
        prefix = next(p for p in PREFIXES if token.startswith(p))
    return names


def _exposed_families(tmp_path: Path) -> set[str]:
    """Every metric family a real `serve` lists on /metrics (# TYPE lines: families with no sample yet too),
    following a file and scraping a stand-in SGLang, so the mirrored target families are there."""
    fake = FakeSGLang(metrics_body=METRICS, info_body=json.dumps(INFO).encode()).start()
    log = tmp_path / "server.log"
    log.write_text("")
    try:
        args = ["--sglang-url", fake.url, "--scrape-interval", "0.3s", "--scrape-timeout", "1s", str(log)]
        with Daemon(args, str(tmp_path / "state")) as daemon:

            def page() -> str | None:
                """The page once the target's first scrape is on it."""
                with urllib.request.urlopen(f"http://127.0.0.1:{daemon.port}/metrics", timeout=5) as r:
                    text = r.read().decode()
                up = [s.value for f in text_string_to_metric_families(text) if f.name == "sglang_oom_target_up"
                      for s in f.samples]  # fmt: skip
                return text if up == [1.0] else None

            text = wait_until(page, timeout=15, what="a page with the target scraped")
    finally:
        fake.stop()
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


@pytest.mark.e2e
def test_every_exposed_metric_family_is_documented(tmp_path):
    families = _exposed_families(tmp_path)
    assert len(families) > 40
    # docs/metrics.md lists "every series serve exports" but the mirrored target ones, which are in
    # docs/sglang-endpoints.md.
    documented = documented_metrics((DOCS / "metrics.md").read_text())
    documented |= {
        n for n in documented_metrics((DOCS / "sglang-endpoints.md").read_text()) if n.startswith(PREFIXES[1])
    }
    # Counters are documented with their _total sample name.
    missing = sorted(f for f in families if f not in documented and f + "_total" not in documented)
    assert missing == []


def test_the_flag_value_series_are_in_the_metrics_table():
    table = (DOCS / "metrics.md").read_text()
    for name in ("sglang_oom_suggested_flag_value", "sglang_oom_current_flag_value"):
        assert f"| `{name}` | gauge | kind, source labels, flag |" in table


def test_the_abbreviation_reader():
    text = "`sglang_oom_exporter_read_bytes_total`, `…_lines_read_total` and `sglang_oom_target_token_usage`, `…_used_tokens`"
    assert documented_metrics(text) == {
        "sglang_oom_exporter_read_bytes_total", "sglang_oom_exporter_lines_read_total",
        "sglang_oom_target_token_usage", "sglang_oom_target_used_tokens",
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------- chart values


def _value_paths(tree: dict, prefix: str = "") -> list[str]:
    """The chart's values: every key path down to the first level that holds user data (labels, volumes,
    terms, resources, a strategy), as the chart README's Values table lists them."""
    whole = {"image", "nodeLabels", "nodeSelectorTerms", "podSelector", "resources", "stateVolume", "volume",
             "updateStrategy", "tests"}  # fmt: skip
    out = []
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in whole:
            out += _value_paths(value, f"{path}.")
        else:
            out.append(path.replace("tests", "tests.image") if path == "tests" else path)
    return out


def test_every_chart_value_is_in_the_readme_values_table():
    readme = (CHART / "README.md").read_text()
    section = readme.split("\n## Values\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    listed = {name for row in rows for name in re.findall(r"`([A-Za-z.]+)`", row.split(" | ")[0])}
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    paths = _value_paths(values)
    assert len(paths) > 80
    assert sorted(p for p in paths if p not in listed) == []
    assert sorted(p for p in listed if p not in paths) == []
    # Every top-level key, in the file's order.
    tops = [p.split(".")[0] for p in paths]
    assert list(dict.fromkeys(tops)) == list(values)


# ---------------------------------------------------------------------------------------------- Alertmanager


def test_inhibit_rule_count_and_equal_lists_in_the_docs_are_the_examples():
    example = yaml.safe_load((ROOT / "alerts" / "alertmanager.example.yml").read_text())
    rules = example["inhibit_rules"]
    routing = (DOCS / "alertmanager-routing.md").read_text()
    (word,) = re.findall(r"Append the (\w+) `inhibit_rules`", routing)
    assert NUMBERS[word] == len(rules) == 4
    equals = {tuple(r["equal"]) for r in rules}
    for doc in sorted(DOCS.glob("*.md")):
        for quoted in re.findall(r"`equal: \[([^\]]*)\]`", doc.read_text()):
            labels = tuple(x.strip() for x in quoted.split(","))
            if labels[-1] == "…":  # `equal: [cluster, …]`: the start of every list
                assert all(e[: len(labels) - 1] == labels[:-1] for e in equals), (doc.name, quoted)
            else:
                assert labels in equals, (doc.name, quoted)
    assert all(e[0] == "cluster" for e in equals)


def test_the_routing_snippet_is_the_examples_subtree():
    example = yaml.safe_load((ROOT / "alerts" / "alertmanager.example.yml").read_text())
    routing = (DOCS / "alertmanager-routing.md").read_text()
    snippet = yaml.safe_load(re.search(r"```yaml\n(route:.*?)```", routing, re.S).group(1))
    (ours,) = example["route"]["routes"]
    (shown,) = snippet["route"]["routes"]
    # The doc elides the long alert-name regex; everything else is the example's, `cluster` included.
    assert shown["matchers"][0].startswith('alertname=~"SGLangPrefillOOM|SGLangDecodeOOM|…|')
    assert {k: v for k, v in shown.items() if k != "matchers"} == {k: v for k, v in ours.items() if k != "matchers"}
    assert "cluster" in shown["group_by"]


# ---------------------------------------------------------------------------------------------- Kubernetes


@pytest.mark.e2e
def test_kubernetes_md_names_the_cluster_role_the_chart_renders():
    proc = run_tool(helm(), "template", "sglang-oom-exporter", str(CHART), "-n", "sglang-oom-exporter",
                    "--set", "discovery.enabled=true,events.enabled=true")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    role = one(docs, "ClusterRole")["metadata"]["name"]
    account = one(docs, "ServiceAccount")["metadata"]["name"]
    assert (role, account) == ("sglang-oom-exporter-sglang-oom-exporter", "sglang-oom-exporter")
    rbac = (DOCS / "kubernetes.md").read_text().split("\n## RBAC\n", 1)[1]
    assert f"ClusterRole and ClusterRoleBinding `{role}`" in rbac
    assert f"ServiceAccount `{account}`" in rbac
    verbs = {tuple(r["verbs"]) for r in one(docs, "ClusterRole")["rules"]}
    assert verbs == {("list", "get"), ("create", "patch")}
    assert "`create` and `patch` on `events`" in rbac


def test_configuration_md_quotes_the_default_kubernetes_filters():
    text = (DOCS / "configuration.md").read_text()
    for regex in (DEFAULT_NAMESPACE_FILTER, DEFAULT_POD_FILTER, DEFAULT_CONTAINER_FILTER):
        assert f"`{regex}`" in text
    assert "every container but the exporter's own" in text


def test_every_helm_install_into_a_namespace_labels_it_for_pod_security_first():
    for path in (ROOT / "README.md", CHART / "README.md", DOCS / "kubernetes.md"):
        for block in re.findall(r"```sh\n(.*?)```", path.read_text(), re.S):
            lines = block.replace("\\\n", " ").splitlines()
            for i, line in enumerate(lines):
                argv = shlex.split(line, comments=True)
                if argv[:2] != ["helm", "install"] or "-n" not in argv:
                    continue
                namespace = argv[argv.index("-n") + 1]
                assert "--create-namespace" not in argv, (path.name, line)
                label = f"kubectl label namespace {namespace} pod-security.kubernetes.io/enforce=privileged"
                assert label in path.read_text().split(line, 1)[0] or label in lines[:i], (path.name, line)
