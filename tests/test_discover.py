"""Discovery: globs re-evaluated on each call, and Kubernetes pod log paths with their filters."""

from __future__ import annotations

import os

import pytest

from sglang_oom_exporter.sources.discover import (
    KubernetesFilter,
    PodLogRef,
    dirs_to_watch,
    discover_pods,
    expand,
    glob_root,
)
from sglang_oom_exporter.sources.fileid import TailChunk
from sglang_oom_exporter.sources.tail import FileTailer

UID = "0f4c1a2b-3c4d-4e5f-8a9b-0c1d2e3f4a5b"


def touch(path, data=b""):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as handle:
        handle.write(data)
    return path


def read_all(tailer):
    return b"".join(item.data for item in tailer.poll() if isinstance(item, TailChunk))


def test_expand_keeps_plain_paths_even_when_missing(tmp_path):
    missing = str(tmp_path / "not-yet.log")
    assert expand([missing]) == [missing]


def test_expand_globs_with_double_star_and_sees_new_files(tmp_path):
    touch(tmp_path / "a" / "server.log")
    touch(tmp_path / "a" / "b" / "worker.log")
    (tmp_path / "a" / "dir.log").mkdir()
    pattern = str(tmp_path / "**" / "*.log")
    assert expand([pattern]) == [str(tmp_path / "a" / "b" / "worker.log"), str(tmp_path / "a" / "server.log")]
    touch(tmp_path / "c" / "new.log")
    assert str(tmp_path / "c" / "new.log") in expand([pattern])


def test_expand_deduplicates_and_skips_rotated_generations(tmp_path):
    for name in [
        "app.log",
        "app.log.1",
        "app.log.2.gz",
        "app.log-20260314",
        "0.log",
        "0.log.20260314-220733",
    ]:
        touch(tmp_path / name)
    pattern = str(tmp_path / "*")
    explicit = str(tmp_path / "app.log.1")
    assert expand([pattern, str(tmp_path / "app.log"), explicit]) == [
        str(tmp_path / "0.log"),
        str(tmp_path / "app.log"),
        explicit,
    ]


def test_dirs_to_watch_holds_file_dirs_and_existing_glob_roots(tmp_path):
    touch(tmp_path / "a" / "x.log")
    (tmp_path / "b").mkdir()
    patterns = [str(tmp_path / "b" / "**" / "*.log"), str(tmp_path / "gone" / "*.log")]
    assert dirs_to_watch(patterns, [str(tmp_path / "a" / "x.log")]) == {
        str(tmp_path / "a"),
        str(tmp_path / "b"),
    }
    assert glob_root("/var/log/pods/*/sglang/*.log") == "/var/log/pods"
    assert glob_root("*.log") == "."


def test_discover_pods_takes_labels_from_the_path_and_skips_other_files(tmp_path):
    root = tmp_path / "pods"
    good = touch(root / f"llm-prod_sglang-0_{UID}" / "sglang" / "3.log")
    for rel in (
        f"ns_pod_{UID}/sglang/0.log.20260314-220733",
        f"ns_pod_{UID}/sglang/0.log.20260314-220733.gz",
        f"ns_pod_{UID}/sglang/current.log",
        f"ns_pod_{UID}/0.log",
        "nounderscore/sglang/0.log",
    ):
        touch(root / rel)
    assert discover_pods(str(root)) == [PodLogRef("llm-prod", "sglang-0", UID, "sglang", 3, str(good))]


@pytest.mark.parametrize(
    ("namespace", "container", "picked"),
    [
        ("llm", "sglang", True),
        ("llm", "sglang-leader", True),
        ("llm", "sglang-worker", True),
        ("llm", "server", True),
        ("llm", "prefill", True),
        ("llm", "Inference-Engine", True),
        ("llm", "istio-proxy", True),  # followed: it never shows SGLang, so it costs no series
        ("kserve-test", "kserve-container", True),
        ("team-a", "main", True),
        ("team-a", "model", True),
        ("training", "ray-worker", True),
        ("llm", "sglang-oom-exporter", False),
        ("kube-system", "kube-apiserver", False),
        ("kube-system", "sglang", False),
    ],
)
def test_default_filter_follows_every_container_but_the_exporters_and_the_system_namespaces(
    namespace, container, picked
):
    flt = KubernetesFilter()
    assert (flt.matches_pod(namespace, "pod-0") and flt.matches_container(container)) is picked


def test_filter_rejects_an_invalid_regex():
    with pytest.raises(ValueError, match="container"):
        KubernetesFilter(container="(unclosed")


def test_discover_pods_applies_the_filters(tmp_path):
    root = tmp_path / "pods"
    want = touch(root / f"llm_sglang-0_{UID}" / "sglang" / "0.log")
    touch(root / f"llm_sglang-0_{UID}" / "sglang" / "0.log.20260314-220733")
    touch(root / f"llm_sglang-0_{UID}" / "istio-proxy" / "0.log")
    touch(root / f"kube-system_kube-apiserver-n1_{UID}" / "kube-apiserver" / "0.log")
    touch(root / f"web_shop-0_{UID}" / "server" / "0.log")
    refs = discover_pods(str(root), KubernetesFilter(namespace="llm", container="sglang"))
    assert refs == [PodLogRef("llm", "sglang-0", UID, "sglang", 0, str(want))]
    assert [r.container for r in discover_pods(str(root), KubernetesFilter(namespace="llm"))] == [
        "istio-proxy",
        "sglang",
    ]
    # By default every container but the system namespaces' (SGLang is recognised by what it writes).
    assert [(r.namespace, r.container) for r in discover_pods(str(root))] == [
        ("llm", "istio-proxy"),
        ("llm", "sglang"),
        ("web", "server"),
    ]
    assert discover_pods(str(root), KubernetesFilter(container="sglang")) == refs
    assert discover_pods(str(tmp_path / "missing")) == []


def test_restart_n_plus_1_log_is_discovered_and_read_from_zero(tmp_path):
    root = tmp_path / "pods"
    container = root / f"llm_sglang-0_{UID}" / "sglang"
    touch(container / "0.log", b"history\n")
    # First start without state: what exists now is read from its end.
    tailers = {r.path: FileTailer(r.path, start_at_end=True) for r in discover_pods(str(root))}
    try:
        assert [read_all(t) for t in tailers.values()] == [b""]
        touch(container / "0.log", b"Decode out of memory. Try to lower your batch size.\n")
        touch(container / "1.log", b"restarted\n")
        refs = discover_pods(str(root))
        assert [r.restart for r in refs] == [0, 1]
        for ref in refs:
            # A file that appears later may hold the first second of a crash loop: read it from 0.
            tailers.setdefault(ref.path, FileTailer(ref.path))
        assert {os.path.basename(p): read_all(t) for p, t in tailers.items()} == {
            "0.log": b"Decode out of memory. Try to lower your batch size.\n",
            "1.log": b"restarted\n",
        }
    finally:
        for tailer in tailers.values():
            tailer.close()
