"""Configuration: defaults, precedence, durations, and every problem reported at once."""

from __future__ import annotations

import pytest

from sglang_oom_exporter.config.load import ConfigError, load_config
from sglang_oom_exporter.config.model import KubernetesConfig
from sglang_oom_exporter.config.settings import DEFAULT_LISTEN
from sglang_oom_exporter.config.values import parse_duration
from sglang_oom_exporter.sources.discover import DEFAULT_CONTAINER_FILTER, KubernetesFilter


def test_defaults_work_without_any_file():
    config = load_config(env={}, flags={})
    assert config.listen == DEFAULT_LISTEN == ":9877"
    assert config.paths == ()
    assert config.kubernetes is None
    assert (config.poll_interval, config.traceback_wait, config.source_retention) == (1.0, 2.5, 3600.0)


@pytest.mark.parametrize(
    ("text", "seconds"), [("15s", 15), ("2m", 120), ("1h30m", 5400), ("250ms", 0.25), ("1d", 86400)]
)
def test_durations_need_a_unit(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["15", "", "2 m", "1x", "-1s"])
def test_durations_without_a_unit_are_errors(text):
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def test_flags_beat_environment_beat_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("listen: ':1111'\npoll_interval: 3s\nstate_dir: /file\npaths: [/from/file.log]\n")
    env = {"SGLANG_OOM_EXPORTER_LISTEN": ":2222", "SGLANG_OOM_EXPORTER_STATE_DIR": "/env"}
    config = load_config(env=env, flags={"config": str(path), "listen": ":3333", "paths": []})
    assert (config.listen, config.state_dir, config.poll_interval) == (":3333", "/env", 3.0)
    assert config.paths == ("/from/file.log",)
    config = load_config(env={**env, "SGLANG_OOM_EXPORTER_PATHS": "/a.log,/b/*.log"}, flags={"config": str(path)})
    assert (config.listen, config.paths) == (":2222", ("/a.log", "/b/*.log"))


def test_named_sources_and_kubernetes_from_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "sources:\n  - {name: llama, path: /var/log/llama.log}\n"
        "kubernetes:\n  logs_root: /var/log/pods\n  namespace: 'llm-.*'\n"
    )
    config = load_config(env={}, flags={"config": str(path)})
    assert config.paths == ("/var/log/llama.log",)
    assert config.names == {"/var/log/llama.log": "llama"}
    assert config.kubernetes is not None
    assert (config.kubernetes.logs_root, config.kubernetes.namespace) == ("/var/log/pods", "llm-.*")
    assert config.kubernetes.container == DEFAULT_CONTAINER_FILTER


def test_every_problem_is_reported_at_once(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "colour: red\npoll_interval: 2\nlisten: nowhere\nlog_level: loud\n"
        "kubernetes: {logs_root: /p, pod: '('}\nsources: [{path: /x, extra: 1}]\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(env={"SGLANG_OOM_EXPORTER_FROM_BEGINNING": "maybe"}, flags={"config": str(path)})
    text = str(err.value)
    assert len(err.value.problems) == 7, err.value.problems
    for needle in ("colour: unknown key", "poll_interval: '2' is not a duration", "'nowhere' is not HOST:PORT",
                   "log_level: must be one of", "kubernetes.pod: bad regex", "sources[0]: needs 'path'",
                   "SGLANG_OOM_EXPORTER_FROM_BEGINNING: 'maybe' is not a boolean"):  # fmt: skip
        assert needle in text


def test_bad_yaml_names_its_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("paths:\n  - /a\n  bad: [\n")
    with pytest.raises(ConfigError, match=rf"{path}:\d+: not valid YAML"):
        load_config(env={}, flags={"config": str(path)})


def test_missing_config_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(env={}, flags={"config": str(tmp_path / "absent.yaml")})


def test_kubernetes_filter_defaults_are_one_set():
    """config.py and discover.py once drifted (LWS `leader` missing from one); now both use one set, which is
    the one written here: every namespace but Kubernetes' own, any pod, any container but an exporter's."""
    expected = (r"(?!kube-system$|kube-public$|kube-node-lease$).+", r".+", r"(?i)(?!.*oom-exporter).+")
    k = KubernetesConfig("/var/log/pods")
    assert (k.namespace, k.pod, k.container) == expected
    assert (KubernetesFilter().namespace, KubernetesFilter().pod, KubernetesFilter().container) == expected
    assert KubernetesFilter().matches_container("lws-leader")
    assert not KubernetesFilter().matches_container("sglang-oom-exporter")
    assert not KubernetesFilter().matches_pod("kube-system", "kube-apiserver-node1")
