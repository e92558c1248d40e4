"""Kubernetes Events end to end: the real daemon in node mode, pod logs on disk, a fake TLS API server.

Exactly one Event per counted OOM, and none for an OOM counted again after a restart (graceful or a crash
before the state was saved), none for history read on a first start, none for a foreign container.
"""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest

from tests.support.daemon import Daemon, settle
from tests.support.fake_kubeapi import FakeKubeApi, pod
from tests.support.helpers import openssl_cert, wait_until
from tests.support.logs import append, cri, oom_block

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NODE = "gpu-node-1"
UID = "6f1c1a52-3b8e-4a0e-9d7e-1f2a3b4c5d6e"
TRAINER_UID = "0b9d7c7e-1111-4c2a-9f00-5a5a5a5a5a5a"
TP2 = Path(__file__).parent / "data" / "logs" / "whole_crash_0_5_16_cri_tp2.log"
# A training job's torch CUDA OOM: no SGLang frame, no SGLang log line, in a container the default filter follows.
FOREIGN_OOM = cri(
    "Traceback (most recent call last):\n"
    '  File "/workspace/train.py", line 88, in <module>\n'
    "    loss = model(batch).loss\n"
    '  File "/usr/local/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1736, in _wrapped_call_impl\n'
    "    return self._call_impl(*args, **kwargs)\n"
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB"
    " of which 1.06 GiB is free. Process 12345 has 78.08 GiB memory in use. Of the allocated memory 75.50 GiB is"
    " allocated by PyTorch, and 1.20 GiB is reserved by PyTorch but unallocated.\n"
)


@pytest.fixture
def cluster(tmp_path):
    """(api, pod log of llm/llama-0, env, config path); the API server knows the pod by its uid."""
    cert, key = openssl_cert(tmp_path, "apiserver")
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text("tok-1\n")
    (sa / "ca.crt").write_bytes(cert.read_bytes())
    api = FakeKubeApi(cert, key, pods=[pod("llm", "llama-0", "10.0.0.5", uid=UID)]).start()
    log = tmp_path / "pods" / f"llm_llama-0_{UID}" / "sglang" / "0.log"
    log.parent.mkdir(parents=True)
    log.write_text("")
    config = tmp_path / "config.yaml"
    config.write_text(
        f"kubernetes:\n  logs_root: {tmp_path / 'pods'}\n  events: {{enabled: true, service_account_dir: {sa}}}\n"
    )
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api.port), "NODE_NAME": NODE}
    yield api, log, env, config
    api.stop()


def start(daemon_factory, config: Path, state: Path, env: dict[str, str], *extra: str) -> Daemon:
    return daemon_factory("--config", str(config), *extra, env=env, state_dir=str(state))


def results(d: Daemon) -> dict[str, float]:
    m = d.metrics("sglang_oom_exporter_k8s_events")
    return {dict(labels)["result"]: v for (name, labels), v in m.items() if v and name.endswith("_total")}


def fatal_total(d: Daemon) -> float:
    m = d.metrics("sglang_oom_fatal_events_total")
    return sum(v for (name, _), v in m.items() if name == "sglang_oom_fatal_events_total")


def writes(api: FakeKubeApi) -> list[tuple[str, str, dict]]:
    with api.lock:
        return [(m, p, b) for m, p, _, b in api.calls if m != "GET"]


def test_a_tp2_crash_gives_one_event_and_no_restart_gives_another(tmp_path, cluster, daemon_factory):
    api, log, env, config = cluster
    state = tmp_path / "state"
    d = start(daemon_factory, config, state, env)
    before_oom = tmp_path / "state-before-the-oom.json"
    shutil.copy(state / "state.json", before_oom)  # the positions before the crash was written
    append(log, TP2.read_text())
    settle(d, 1)  # the one fatal prefill OOM (ranks TP0 and TP1, block and traceback each)
    wait_until(lambda: results(d) == {"created": 1}, what="one Event created", timeout=15.0)
    ((method, path, body),) = writes(api)
    assert (method, path) == ("POST", "/api/v1/namespaces/llm/events")
    assert body["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "llm", "name": "llama-0",
                                      "uid": UID, "fieldPath": "spec.containers{sglang}"}  # fmt: skip
    assert (body["type"], body["reason"], body["count"]) == ("Warning", "SGLangPrefillOOM", 1)
    assert (body["reportingComponent"], body["reportingInstance"], body["source"]["host"]) == (
        "sglang-oom-exporter", NODE, NODE,
    )  # fmt: skip
    assert (
        "asked for 16384 KV tokens while 9000 were available; state from the log line at 2026-03-17 06:04:40: "
        "402 running requests, token usage 0.97 (ranks TP0, TP1)."
    ) in body["message"]
    assert body["message"].endswith("/sglangprefilloom.md")
    assert len(body["message"].encode()) < 1024
    assert d.total("retract") == 1  # counted, and no Event: non-fatal kinds are off by default
    # A graceful restart: the state holds the count, nothing is counted or posted again.
    assert d.stop() == 0
    d = start(daemon_factory, config, state, env)
    settle(d, 1)
    assert results(d) == {}
    # A crash before the state was saved: the restart counts the OOM again, and the ledger says it was posted.
    assert d.stop(signal.SIGKILL) == -signal.SIGKILL
    shutil.copy(before_oom, state / "state.json")
    d = start(daemon_factory, config, state, env)
    settle(d, 1)
    wait_until(lambda: results(d) == {"replayed": 1}, what="the recounted OOM recognised", timeout=15.0)
    assert len(writes(api)) == 1
    # A new OOM on the same pod after all that: the restarted recorder starts a new Event (as client-go does).
    append(log, cri(oom_block(rank="TP0")))
    settle(d, 2)
    wait_until(lambda: results(d) == {"replayed": 1, "created": 1}, what="the new OOM's Event", timeout=15.0)
    assert [m for m, _, _ in writes(api)] == ["POST", "POST"]


def test_history_read_on_a_first_start_gives_no_event(tmp_path, cluster, daemon_factory):
    api, log, env, config = cluster
    log.write_text(cri(oom_block(rank="TP0")))  # an OOM from before the exporter ever ran
    d = start(daemon_factory, config, tmp_path / "state", env, "--from-beginning")
    settle(d, 1)
    append(log, cri(oom_block(rank="TP0")))  # a live one, as a barrier: its Event proves the poster ran
    settle(d, 2)
    wait_until(lambda: results(d) == {"created": 1}, what="one Event, for the live OOM", timeout=15.0)
    assert len(writes(api)) == 1


def test_a_foreign_containers_oom_gives_no_event(tmp_path, cluster, daemon_factory):
    api, log, env, config = cluster
    api.pods.append(pod("ml", "trainer-0", "10.0.0.7", uid=TRAINER_UID))
    trainer = tmp_path / "pods" / f"ml_trainer-0_{TRAINER_UID}" / "worker" / "0.log"
    trainer.parent.mkdir(parents=True)
    trainer.write_text("")
    d = start(daemon_factory, config, tmp_path / "state", env)
    append(trainer, FOREIGN_OOM)
    append(log, cri(oom_block(rank="TP0")))  # an SGLang OOM as a barrier: its Event proves the poster ran
    settle(d, 1)
    # Every fatal OOM counted was offered to the poster: wait until each has its result, whatever it is.
    wait_until(
        lambda: sum(results(d).values()) == fatal_total(d) >= 1, what="a result for every counted OOM", timeout=15.0
    )
    assert [b["involvedObject"]["name"] for _, _, b in writes(api)] == ["llama-0"]
