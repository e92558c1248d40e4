"""The sglang_oom_target_* series name the SGLang workload an endpoint serves: the pod found by node
discovery, or the source a config target names; never a label the exporter cannot know."""

from __future__ import annotations

from prometheus_client.core import Metric

from sglang_oom_exporter.daemon.targets import TargetSet
from sglang_oom_exporter.metrics.collector import target_families
from tests.support.app import config_from_text


class _View:
    """A scraped endpoint as the collector reads it (metrics.TargetView)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.up = True
        self.duration = 0.25
        self.last_success = 1_780_000_000.0
        self.errors_total = {"timeout": 2}
        self.info_errors_total: dict[str, int] = {}

    def snapshot_values(self) -> dict[str, float]:
        return {"token_usage": 0.5}

    def snapshot_labels(self) -> dict[str, str]:
        return {"engine_type": "decode"} if "a" in self.url else {}

    def server_args(self) -> dict[str, object]:
        return {"chunked_prefill_size": 8192}


def _samples(families: list[Metric], name: str) -> list[dict[str, str]]:
    return [dict(s.labels) for f in families for s in f.samples if s.name == name]


def test_a_config_target_names_its_source_in_file_mode(tmp_path):
    config = config_from_text(tmp_path, "targets:\n  - {url: http://10.0.0.5:30000, source: llama-70b}\n"
                               "  - {url: http://10.0.0.6:30000}\nsources:\n  - {name: llama-70b, path: /x.log}\n")  # fmt: skip
    targets = TargetSet(config)
    assert targets.labels_for("http://10.0.0.5:30000") == {"source": "llama-70b"}
    assert targets.labels_for("http://10.0.0.6:30000") == {}


def test_a_config_target_in_kubernetes_mode_adds_no_label_it_cannot_know(tmp_path):
    config = config_from_text(tmp_path, f"kubernetes: {{logs_root: {tmp_path}}}\n"
                               "targets:\n  - {url: http://10.0.0.5:30000, source: llama-0}\n")  # fmt: skip
    assert TargetSet(config).labels_for("http://10.0.0.5:30000") == {}


def test_every_target_family_carries_the_workload_labels_beside_target():
    families = list(target_families([_View("http://a:30000"), _View("http://b:30000")],
                                    lambda url: {"namespace": "llm", "pod": "llama-0"} if "a" in url else {}))  # fmt: skip
    assert _samples(families, "sglang_oom_target_up") == [
        {"target": "http://a:30000", "namespace": "llm", "pod": "llama-0"},
        {"target": "http://b:30000"},
    ]
    assert _samples(families, "sglang_oom_target_last_success_timestamp_seconds") == [
        {"target": "http://a:30000", "namespace": "llm", "pod": "llama-0"},
        {"target": "http://b:30000"},
    ]
    errors = _samples(families, "sglang_oom_target_scrape_errors_total")
    assert {"target": "http://a:30000", "namespace": "llm", "pod": "llama-0", "reason": "timeout"} in errors
    assert _samples(families, "sglang_oom_target_server_arg") == [
        {"target": "http://a:30000", "namespace": "llm", "pod": "llama-0", "arg": "chunked_prefill_size"},
        {"target": "http://b:30000", "arg": "chunked_prefill_size"},
    ]
    # The mirrored values also keep SGLang's engine_type where it gives one, beside the workload labels.
    assert _samples(families, "sglang_oom_target_token_usage") == [
        {"target": "http://a:30000", "namespace": "llm", "pod": "llama-0", "engine_type": "decode"},
        {"target": "http://b:30000"},
    ]
