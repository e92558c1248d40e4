"""The server's description from its own log (detect/serverlog.py): both banner forms, the capacity line, the KV
pool lines, per run; the last usage line before a failure; the same whatever the chunking or the cuts."""

from __future__ import annotations

import json
import os

import pytest

from sglang_oom_exporter.detect.model import ServerLog
from sglang_oom_exporter.detect.pipeline import Pipeline
from sglang_oom_exporter.detect.serverlog import ARG_KEYS, ServerScanner, parse_line, state_of
from sglang_oom_exporter.scan.run import scan_paths
from sglang_oom_exporter.sources.sglang_metrics import INFO_KEYS
from tests.support.helpers import CATALOG, MATCHER, scan_bytes

HERE = os.path.dirname(__file__)
LIVE = os.path.join(HERE, "data", "logs", "live_0_5_23_{}.log")

OLD_BANNER = (
    "[2025-06-01 10:00:00] server_args=ServerArgs(model_path='m', chunked_prefill_size=8192, max_prefill_tokens=16384, "
    "mem_fraction_static=0.88, max_running_requests=None, max_total_tokens=None, context_length=None, page_size=1, "
    "schedule_conservativeness=1.0, speculative_algorithm=None)"
)
DICT_BANNER = (
    "[2026-12-07 23:51:25] server_args={'model_path': '/m', 'context_length': None, 'mem_fraction_static': 0.719, "
    "'max_running_requests': 8, 'max_total_tokens': 256, 'chunked_prefill_size': 4096, 'page_size': 16, "
    "'cuda_graph_config': {'decode': {'backend': 'disabled', 'max_bs': 32}}, 'speculative_algorithm': None}"
)
CAPACITY_CPU = (
    "[2026-12-07 23:52:18] max_total_num_tokens=256, chunked_prefill_size=4096, max_prefill_tokens=16384, "
    "max_running_requests=8, context_len=4096, available_cpu_mem=20.83 GB"
)
CAPACITY_GPU = (
    "[2026-03-14 22:00:10 TP0] max_total_num_tokens=401408, chunked_prefill_size=8192, max_prefill_tokens=16384, "
    "max_running_requests=2048, context_len=32768, available_gpu_mem=9.71 GB"
)
KV_POOL = (
    "[2026-12-07 23:52:18] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 256, K size: 0.00 GB, V size: 0.00 GB"
)
SMALL_POOL = (
    "[2026-12-07 23:52:18] KV pool holds 256 tokens, fewer than --context-length 4096. One full-length request cannot "
    "fit, so long requests will be refused or truncated at serving time."
)
PREFILL = (
    "[2026-12-07 23:52:19] Prefill batch, #new-seq: 3, #new-token: 60, #cached-token: 0, token usage: 0.31, "
    "#running-req: 2, #queue-req: 4, #pending-token: 0, cpu graph: False, input throughput (token/s): 47.19"
)
DECODE = (
    "[2026-12-07 23:52:20] Decode batch, #running-req: 4, #token: 88, token usage: 0.34, cpu graph: False, "
    "gen throughput (token/s): 46.39, #queue-req: 1"
)
OOM = (
    "[2026-12-07 23:52:21] Prefill out of memory. Try to lower your batch size.\nTry to allocate 120 tokens.\n"
    "Available full tokens: 64 (full_available_size=64 + full_evictable_size_=0)\n\n"
)


@pytest.mark.parametrize(
    ("line", "args", "reset"),
    [
        (OLD_BANNER, {"model_path": "m", "chunked_prefill_size": 8192, "max_prefill_tokens": 16384,
                      "mem_fraction_static": 0.88, "page_size": 1, "schedule_conservativeness": 1.0}, True),
        (DICT_BANNER, {"model_path": "/m", "mem_fraction_static": 0.719, "max_running_requests": 8,
                       "max_total_tokens": 256, "chunked_prefill_size": 4096, "page_size": 16}, True),
        (CAPACITY_CPU, {"max_total_num_tokens": 256, "chunked_prefill_size": 4096, "max_prefill_tokens": 16384,
                        "max_running_requests": 8, "context_length": 4096}, False),
        (CAPACITY_GPU, {"max_total_num_tokens": 401408, "chunked_prefill_size": 8192, "max_prefill_tokens": 16384,
                        "max_running_requests": 2048, "context_length": 32768}, False),
        (KV_POOL, {"max_total_num_tokens": 256}, False),
        (SMALL_POOL, {"max_total_num_tokens": 256, "context_length": 4096}, False),
    ],
)  # fmt: skip
def test_each_start_up_line_as_server_args(line, args, reset):
    found = parse_line(line)
    assert found is not None
    assert found.server_args() == args
    assert found.reset is reset
    assert found.batch is None


def test_the_log_reads_every_key_server_info_does():
    assert set(INFO_KEYS) <= ARG_KEYS


def test_other_lines_say_nothing():
    assert parse_line(PREFILL) is None
    assert parse_line("[2026-12-07 23:52:18] Load weight end. avail mem=20.84 GB") is None


def test_the_usage_line_is_parsed_only_when_asked_and_says_its_time():
    assert state_of(ServerLog(batch=PREFILL)) == {"running_requests": 2, "token_usage": 0.31, "queued_requests": 4,
                                                "new_tokens": 60, "batch": "prefill", "at": "2026-12-07 23:52:19"}  # fmt: skip
    assert state_of(ServerLog(batch=DECODE)) == {"running_requests": 4, "num_used_tokens": 88, "token_usage": 0.34,
                                               "queued_requests": 1, "batch": "decode", "at": "2026-12-07 23:52:20"}  # fmt: skip
    assert state_of(ServerLog()) is None


def _log(*lines: str) -> bytes:
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines).encode()


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
def test_a_failure_gets_its_run_and_its_last_usage_line_before_it_whatever_the_chunking(chunk):
    data = _log(
        OLD_BANNER, CAPACITY_GPU, DECODE, OOM,  # run 1
        DICT_BANNER, PREFILL.replace("#running-req: 2", "#running-req: 0"), KV_POOL,  # run 2: a restart's banner
        CAPACITY_CPU, DECODE.replace("#running-req: 4", "#running-req: 5"), OOM, PREFILL,  # a usage line after it
        DICT_BANNER, OOM,  # run 3: no usage line yet
    )  # fmt: skip
    events = scan_bytes(data, chunk=chunk)
    assert [e.location for e in events] == ["t.log:4", "t.log:13", "t.log:19"]
    first, second, third = (e.server for e in events)
    assert first.server_args() == {
        "model_path": "m", "chunked_prefill_size": 8192, "max_prefill_tokens": 16384, "mem_fraction_static": 0.88,
        "page_size": 1, "schedule_conservativeness": 1.0, "max_total_num_tokens": 401408,
        "max_running_requests": 2048, "context_length": 32768,
    }  # fmt: skip
    assert state_of(first)["running_requests"] == 4
    assert second.server_args() == {
        "model_path": "/m", "mem_fraction_static": 0.719, "max_running_requests": 8, "max_total_tokens": 256,
        "chunked_prefill_size": 4096, "page_size": 16, "max_total_num_tokens": 256, "max_prefill_tokens": 16384,
        "context_length": 4096,
    }  # fmt: skip
    assert state_of(second)["running_requests"] == 5  # the last before it, not the one after
    assert "max_total_num_tokens" not in third.server_args()  # nothing of run 2 carries into run 3
    assert state_of(third) is None


def test_a_scanner_lets_go_of_what_no_report_can_need_and_still_answers_the_same():
    data = _log(DICT_BANNER, CAPACITY_CPU, *(PREFILL for _ in range(200)), DECODE)
    scanner = ServerScanner()
    scanner.feed(data, 0)
    whole = scanner.at(len(data))
    scanner.keep_from(len(data) - 10)
    assert scanner.at(len(data)) == whole
    assert state_of(whole)["batch"] == "decode"
    assert len(whole.server_args()) == 9


def _scan_json(path: str) -> list[dict]:
    return json.loads(json.dumps(scan_paths(CATALOG, [path]).to_json()))["events"]


@pytest.mark.parametrize(
    ("scenario", "kv"),
    [
        ("prefill", {"running_requests": 0, "token_usage": 0.0, "queued_requests": 0}),
        ("decode", {"running_requests": 0, "token_usage": 0.12, "queued_requests": 0}),
        ("req_slots", {"running_requests": 0, "token_usage": 0.0, "queued_requests": 0}),
        ("generic", {"running_requests": 0, "token_usage": 0.0, "queued_requests": 0}),
    ],
)
def test_scan_of_a_real_0_5_23_log_knows_the_server_from_the_log_alone(scenario, kv):
    (event,) = _scan_json(LIVE.format(scenario))
    args = event["context"]["server_args"]
    assert {k: args[k] for k in ("chunked_prefill_size", "max_running_requests", "max_total_num_tokens",
                                 "max_total_tokens", "context_length", "max_prefill_tokens")} == {
        "chunked_prefill_size": 4096, "max_running_requests": 8, "max_total_num_tokens": 256,
        "max_total_tokens": 256, "context_length": 4096, "max_prefill_tokens": 16384,
    }  # fmt: skip
    assert args["page_size"] == (16 if scenario in ("prefill", "decode") else 1)
    assert event["context"]["server_args_source"] == "log"
    assert event["context"]["kv"] == kv
    assert event["context"]["kv_source"].startswith("log line at 2026-12-0")


def _pipeline(**kw):
    events: list = []
    pipe = Pipeline(CATALOG, MATCHER, source="s", location="s", sink=events.append, **kw)
    return pipe, events


def test_a_restart_resuming_mid_file_still_knows_the_server_from_the_state_file():
    head = _log(DICT_BANNER, CAPACITY_CPU, DECODE)
    tail = _log(OOM)
    pipe, _ = _pipeline()
    pipe.start_generation("g", 0, 1)
    pipe.feed(head)
    state = json.loads(json.dumps(pipe.export_state()))  # through the state file's JSON
    assert state["server_log"]["reset"] is True
    offset, lineno = pipe.resume_point()
    assert offset == len(head)
    restarted, events = _pipeline()
    restarted.restore_state(state)
    restarted.start_generation("g", offset, lineno)
    restarted.feed(tail)
    restarted.finish()
    (event,) = events
    assert event.server.server_args()["max_total_tokens"] == 256
    assert event.server.server_args()["context_length"] == 4096
    assert state_of(event.server)["running_requests"] == 4
    fresh, alone = _pipeline()
    fresh.start_generation("g", offset, lineno)
    fresh.feed(tail)
    fresh.finish()
    assert alone[0].server.args == ()  # without the state, nothing: the lines are before the resume point


@pytest.mark.parametrize(
    "bad",
    [{"args": [["max_total_tokens", [1]]]}, {"args": [["nope", 1]]}, {"args": "x"}, {"batch": 3}, {"reset": "yes"}],
)
def test_a_malformed_saved_server_log_is_refused(bad):
    pipe, _ = _pipeline()
    with pytest.raises(ValueError, match="server_log"):
        pipe.restore_state({"emitted_keys": [], "groups": [], "server_log": bad})
