"""Classification through the real pipeline: phases from frames, R1-R8, look-alikes, numbers."""

from __future__ import annotations

import io

import pytest

from sglang_oom_exporter.detect.assemble import Assembler
from sglang_oom_exporter.detect.model import LogLine
from sglang_oom_exporter.detect.prefix import PrefixParser
from sglang_oom_exporter.scan.serial import scan_stream
from tests.support.helpers import CATALOG, MATCHER, frames, scan_text
from tests.support.logs import cri

GENERIC = "Out of memory. Try to lower your batch size.\nTry to allocate 96 tokens.\nAvailable tokens: 40 (available_size=40 + evictable_size=0)\n"


def _crash(rank: str, funcs: tuple[str, ...], text: str = GENERIC, ts: str = "2026-03-14 22:07:33") -> str:
    return (
        f"[{ts} {rank}] {text}\n"
        f"[{ts} {rank}] Scheduler hit an exception: Traceback (most recent call last):\n"
        + frames(*funcs)
        + f"RuntimeError: {text}\n\n"
    )


@pytest.mark.parametrize(
    ("funcs", "kind", "subphase"),
    [
        (("update_running_batch", "prepare_for_decode", "alloc_for_decode", "alloc_token_slots"), "decode", None),
        (("get_new_batch_prefill", "prepare_for_extend", "alloc_for_extend", "alloc_token_slots"), "prefill", None),
        (("forward", "prepare_for_verify", "alloc_token_slots"), "decode", "spec_verify"),
        (("run_scheduler_process", "event_loop", "alloc_token_slots"), "unknown", None),
    ],
)
def test_generic_text_takes_its_phase_from_the_frames(funcs, kind, subphase):
    events = scan_text(_crash("TP0", funcs))
    assert [(e.kind, e.subphase, e.fatal) for e in events] == [(kind, subphase, True)]
    assert events[0].numbers["requested_tokens"] == 96
    assert events[0].numbers["available_tokens"] == 40


def test_speculative_verify_frames_override_a_prefill_word():
    text = "Prefill out of memory. Try to lower your batch size.\nTry to allocate 64 tokens.\n"
    events = scan_text(_crash("TP0", ("verify", "prepare_for_verify", "alloc_paged_token_slots_extend"), text))
    assert [(e.kind, e.phase, e.subphase) for e in events] == [("decode", "decode", "spec_verify")]


def test_block_and_its_traceback_on_two_ranks_are_one_event():
    log = _crash("TP1", ("prepare_for_decode", "alloc_token_slots")) + _crash("TP0", ("prepare_for_decode",))
    events = scan_text(log)
    assert [(e.kind, e.ranks, e.location) for e in events] == [("decode", ("TP0", "TP1"), "t.log:1")]


def test_ranks_straddling_a_second_are_one_event_but_two_seconds_later_is_another():
    a = _crash("TP0", ("prepare_for_decode",), ts="2026-03-14 22:07:33")
    b = _crash("TP1", ("prepare_for_decode",), ts="2026-03-14 22:07:34")
    c = _crash("TP0", ("prepare_for_decode",), ts="2026-03-14 22:07:40")
    events = scan_text(a + b + c)
    assert [e.ranks for e in events] == [("TP0", "TP1"), ("TP0",)]


def test_data_parallel_ranks_with_other_numbers_are_separate_failures():
    other = GENERIC.replace("96", "128")
    log = _crash("DP0 TP0", ("prepare_for_decode",)) + _crash("DP1 TP0", ("prepare_for_decode",), other)
    events = scan_text(log)
    assert [(e.ranks, e.numbers["requested_tokens"]) for e in events] == [(("DP0 TP0",), 96), (("DP1 TP0",), 128)]


def test_same_rank_twice_is_two_events_even_within_a_second():
    # With no rank token (TP=1 on 0.4.6+) two identical bodies are still two failures.
    block = "[2026-03-14 22:07:33] Decode out of memory. Try to lower your batch size.\nTry to allocate 8 tokens.\n\n"
    assert len(scan_text(block + block)) == 2


def _pd_swa(rid_warned: str, rid_asserted: str) -> str:
    ts = "[2026-11-06 21:47:12 TP0]"
    return (
        f"{ts} SWA eviction insufficient: needed=3072, available=1024, req={rid_warned}\n"
        f"{ts} Scheduler hit an exception: Traceback (most recent call last):\n"
        + frames("process_decode_queue", "pop_preallocated", "_pre_alloc")
        + "AssertionError: KV cache is full! Bug in memory estimation. available=9216, evictable=0, protected=0, "
        f"required_alloc=4096, swa_available=1024, swa_evictable=0, required_swa=3072, page_size=64, req={rid_asserted}\n\n"
    )


def test_a_swa_warning_and_the_kv_full_assertion_for_its_request_are_one_fatal_event():
    events = scan_text(_pd_swa("c3d2", "c3d2"))
    assert [(e.kind, e.fatal, e.numbers["rid"], e.numbers["swa_requested_tokens"]) for e in events] == [
        ("pd_prealloc", True, "c3d2", 3072)
    ]


def test_a_swa_warning_and_an_assertion_for_another_request_stay_two_events():
    events = scan_text(_pd_swa("aaaa", "bbbb"))
    assert [(e.kind, e.fatal, e.numbers["rid"]) for e in events] == [
        ("pd_prealloc", False, "aaaa"),
        ("pd_prealloc", True, "bbbb"),
    ]


def test_a_kv_full_assertion_whose_swa_pool_is_not_charged_states_no_swa_numbers():
    # 0.5.23 prints -1 and 0 for the SWA fields when the request charges no SWA pages.
    line = ("AssertionError: KV cache is full! Bug in memory estimation. available=100, evictable=0, protected=0, "
            "required_alloc=4096, delta=3996, fill=4032, prefix=64, total_prefix=64, swa_available=-1, "
            "swa_evictable=-1, required_swa=0, swa_tail_len=0, page_size=64, req=9a1c\n")  # fmt: skip
    (event,) = scan_text(line)
    assert event.numbers == {"available_tokens": 100, "requested_tokens": 4096, "page_size": 64, "rid": "9a1c"}


def test_exception_line_alone_counts_once():
    events = scan_text("RuntimeError: Out of memory. Try to lower your batch size.\n")
    assert [(e.kind, e.ranks, e.time) for e in events] == [("unknown", (), None)]


@pytest.mark.parametrize(
    ("last_frame", "kind"),
    [
        ("alloc_paged_token_slots_extend", "prefill"),
        ("alloc_paged_token_slots_decode", "decode"),
        ("alloc_req_slots", "req_slots"),
    ],
)
def test_truncated_traceback_is_inferred_from_its_last_allocator_frame(last_frame, kind):
    log = (
        "[2026-03-14 22:07:33 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        + frames("event_loop_overlap", last_frame)
        + '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/mem_'
    )
    events = scan_text(log)
    assert [(e.kind, e.inferred) for e in events] == [(kind, True)]


def test_truncated_traceback_after_its_block_confirms_the_block():
    log = (
        "[2026-03-14 22:07:33 TP0] Out of memory. Try to lower your batch size.\nTry to allocate 9 tokens.\n\n"
        "[2026-03-14 22:07:33 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        + frames("update_running_batch", "prepare_for_decode", "alloc_token_slots")
    )
    events = scan_text(log)
    assert [(e.kind, e.inferred, e.numbers["requested_tokens"]) for e in events] == [("decode", False, 9)]


@pytest.mark.parametrize(
    "line",
    [
        "[2026-03-14 22:07:33] Receive: obj=GenerateReqInput(rid='a', text='Prefill out of memory. Try to lower your batch size.')",
        '[2026-03-14 22:07:33] Finish: obj=GenerateReqInput(text="Out of memory. Try to lower your batch size.")',
        "[2026-03-14 22:07:33 TP0] Decode batch, #running-req: 37, #token: 81234, token usage: 1.00, #queue-req: 9",
        "[2026-03-14 22:07:33] SIGQUIT received. signum=<Signals.SIGQUIT: 3>, frame=<frame at 0x7f>. It usually means one child failed.",
        "[2026-03-14 22:07:33] Received sigquit from a child process. It usually means the child failed.",
        "[2026-03-14 22:07:33] kill_process_tree called: parent_pid=1, include_parent=True, pid=1",
    ],
)
def test_lines_that_only_mention_oom_are_not_events(line):
    assert scan_text(line + "\n") == []


def test_old_decode_retraction_is_a_retraction_not_a_decode_oom():
    events = scan_text(
        "[22:14:05 TP0] Decode out of memory happened. #retracted_reqs: 4, #new_token_ratio: 0.3 -> 0.4\n"
    )
    assert [(e.kind, e.fatal, e.numbers["retracted_requests"]) for e in events] == [("retract", False, 4)]


def test_retraction_on_eight_ranks_is_one_event_counting_its_requests_once():
    line = "KV cache pool is full. Retract requests. #retracted_reqs: 3, #new_tokens_gained: 2048, #new_token_ratio: 0.4012 -> 0.5000\n"
    log = "".join(f"[2026-03-14 22:01:05 TP{r}] {line}" for r in range(8))
    events = scan_text(log)
    assert len(events) == 1
    assert events[0].numbers["retracted_requests"] == 3
    assert len(events[0].ranks) == 8


def test_collapsed_block_still_gives_its_numbers():
    line = (
        "[2024-11-02 10:00:00 TP0] Prefill out of memory. Try to lower your batch size.Try to allocate 5000 tokens."
        "Avaliable tokens:3000self.token to kv pool allocator.available size()=2900\n"
    )
    events = scan_text(line)
    assert [(e.kind, e.numbers["requested_tokens"], e.numbers["available_tokens"]) for e in events] == [
        ("prefill", 5000, 3000)
    ]


def test_swa_hybrid_keeps_every_pool_and_names_the_limiting_one():
    log = (
        "[2026-03-14 22:07:33 TP0] Decode out of memory. Try to lower your batch size.\n"
        "Try to allocate 512 tokens.\n"
        "Available full tokens: 2000000 (full_available_size=1999000 + full_evictable_size=1000)\n"
        "Available swa tokens: 300 (swa_available_size=200 + swa_evictable_size=100)\n"
        "Full LRU list evictable size: 1000\nSWA LRU list evictable size: 100\n\n"
    )
    (event,) = scan_text(log)
    assert event.numbers["available_tokens"] == 300
    assert event.numbers["limiting_pool"] == "swa"
    # available is what the line calls available (free + evictable); the pool's capacity is not logged.
    assert [(p.name, p.total, p.available, p.free, p.evictable) for p in event.pools] == [
        ("full", None, 2000000, 1999000, 1000),
        ("swa", None, 300, 200, 100),
    ]
    assert event.numbers["shortfall_tokens"] == 212


def test_paged_0_4_5_detail_lines_fill_the_pool_split():
    log = (
        "[2025-04-01 10:00:00 TP0] Prefill out of memory. Try to lower your batch size.\n"
        "Try to allocate 4096 tokens.\nAvaliable tokens: 1000\n"
        "self.token_to_kv_pool_allocator.available_size()=900\nself.tree_cache.evictable_size()=100\n\n"
    )
    (event,) = scan_text(log)
    pool = event.pools[0]
    assert (pool.total, pool.available, pool.free, pool.evictable) == (None, 1000, 900, 100)


def test_available_tokens_alone_is_what_was_available_and_the_total_stays_unknown():
    log = "[2025-04-01 10:00:00] Decode out of memory. Try to lower your batch size.\nTry to allocate 6400 tokens.\n"
    (event,) = scan_text(log + "Available tokens: 6100\n\n")
    assert [p.as_dict() for p in event.pools] == [
        {"pool": "full", "total": None, "available": 6100, "evictable": None, "free": None}
    ]
    assert (event.numbers["available_tokens"], event.numbers["shortfall_tokens"]) == (6100, 300)


@pytest.mark.parametrize(("requested", "available"), [(6100, 8000), (7701, 7701), (1, 7702)])
def test_a_request_not_above_what_was_available_has_no_shortfall_and_says_why(requested, available):
    log = (
        "[2026-03-14 22:07:33 TP0] Prefill out of memory. Try to lower your batch size.\n"
        f"Try to allocate {requested} tokens.\nAvailable tokens: {available} (available_size={available} + evictable_size=0)\n\n"
    )
    (event,) = scan_text(log)
    assert event.numbers["requested_tokens"] == requested
    assert event.numbers["available_tokens"] == available
    assert event.numbers["shortfall_tokens"] is None
    assert event.numbers["shortfall_note"].startswith(f"asked for {requested}, {available} available: paged allocators")


def test_leak_check_pools_keep_each_term_under_its_own_name():
    log = (
        "ValueError: pool memory leak detected! [full] total=100, available=60, evictable=30, protected=4, "
        "session_held=2, uncached=1\n[swa] total=50, available=49, evictable=0, protected=0, session_held=0, uncached=0\n"
    )
    (event,) = scan_text(log)
    assert event.kind == "memory_leak"
    assert [p.as_dict() for p in event.pools] == [
        {"pool": "full", "total": 100, "available": None, "evictable": 30, "free": 60, "protected": 4,
         "session_held": 2, "uncached": 1},
        {"pool": "swa", "total": 50, "available": None, "evictable": 0, "free": 49, "protected": 0,
         "session_held": 0, "uncached": 0},
    ]  # fmt: skip


@pytest.mark.parametrize("header", ["Exception in ControllerSingle:", "Exception in ModelRpcClient:"])
def test_old_crash_headers_open_a_traceback_that_confirms_the_logged_block(header):
    block = (
        "[2026-03-14 22:07:33 TP0] Decode out of memory. Try to lower your batch size.\nTry to allocate 8 tokens.\n\n"
    )
    trace = (
        f"[2026-03-14 22:07:33 TP0] {header}\nTraceback (most recent call last):\n"
        + frames("update_running_batch", "prepare_for_decode", "alloc_token_slots")
        + "RuntimeError: Decode out of memory. Try to lower your batch size.\nTry to allocate 8 tokens.\n\n"
    )
    events = scan_text(block + trace)
    assert [(e.kind, e.ranks, e.location, e.inferred) for e in events] == [("decode", ("TP0",), "t.log:1", False)]
    # The header, not the bare "Traceback" line after it, opens the record: the traceback is TP0's (R2).
    assembler = Assembler(CATALOG.anchors())
    records = [r for i, text in enumerate((block + trace).splitlines(), 1) for r in assembler.feed(LogLine(i, text))]
    records += list(assembler.close_all())
    assert [(r.kind, r.ranks, r.lineno) for r in records] == [("block", "TP0", 1), ("traceback", "TP0", 4)]


def test_custom_logging_format_with_every_line_prefixed_and_crlf():
    p = "2026-04-02 09:15:07 ERROR 2210 [ TP1 PP0 scheduler.py:2604] "
    log = (
        f"{p}Scheduler hit an exception: Traceback (most recent call last):\r\n"
        + "".join(
            p + line + "\r\n"
            for line in frames("prepare_for_extend", "alloc_for_extend", "alloc_token_slots").splitlines()
        )
        + f"{p}RuntimeError: Out of memory. Try to lower your batch size.\r\n"
        + f"{p}Try to allocate 300 tokens.\r\n{p}Available tokens: 10 (available_size=10 + evictable_size=0)\r\n"
    )
    events = scan_text(log)
    assert [(e.kind, e.ranks, e.time, e.numbers["requested_tokens"]) for e in events] == [
        ("prefill", ("TP1 PP0",), "2026-04-02T09:15:07", 300)
    ]


def test_cri_partial_records_are_joined_and_dump_noise_on_stdout_is_ignored():
    first = "[2026-03-14 22:07:33 TP0] Prefill out of memory. Try to lower your batch size."
    log = (
        f"2026-03-14T22:07:33.1Z stderr P {first[:20]}\n"
        f"2026-03-14T22:07:33.1Z stdout F  0 [] r=1\n"
        f"2026-03-14T22:07:33.2Z stderr P {first[20:50]}\n"
        f"2026-03-14T22:07:33.3Z stderr F {first[50:]}\n"
        "2026-03-14T22:07:33.3Z stdout F    12 [1, 2, 3] r=0\n"
        "2026-03-14T22:07:33.4Z stderr F Try to allocate 70 tokens.\n"
        "2026-03-14T22:07:33.4Z stderr F \n"
    )
    events = scan_text(log)
    assert [(e.kind, e.location, e.numbers["requested_tokens"]) for e in events] == [("prefill", "t.log:1", 70)]


def test_docker_json_and_compose_wrappers():
    docker = (
        '{"log":"[2026-03-14 22:07:33 TP0] Decode out of memory. Try to lower your batch size.\\n","stream":"stderr","time":"2026-03-14T22:07:33.1Z"}\n'
        '{"log":"Try to allocate 12 tokens.\\n","stream":"stderr","time":"2026-03-14T22:07:33.1Z"}\n'
        '{"log":"\\n","stream":"stderr","time":"2026-03-14T22:07:33.1Z"}\n'
    )
    compose = "sglang-1  | [2026-03-14 22:08:00 TP0] Decode out of memory. Try to lower your batch size.\nsglang-1  | Try to allocate 13 tokens.\n"
    events = scan_text(docker + compose)
    assert [(e.kind, e.numbers["requested_tokens"]) for e in events] == [("decode", 12), ("decode", 13)]


def test_capture_cuda_graph_failure_with_hints_is_one_startup_event():
    log = (
        "[2026-03-14 22:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        + frames("init_cuda_graphs", "capture")
        + "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
        "Possible solutions:\n1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
        "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n3. disable torch compile by not using --enable-torch-compile\n"
        "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)\n"
        "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose \n\n"
    )
    events = scan_text(log)
    assert [(e.kind, e.fatal) for e in events] == [("startup", True)]


def test_memory_leak_warning_is_not_fatal_but_raised_leak_is():
    warn = "/sgl/srt/managers/router/radix_cache.py:123: UserWarning: KV cache pool leak detected!available_size=10, self.max_total_num_tokens=20\n"
    raised = "ValueError: req_to_token_pool memory leak detected!available_size=3, total_size=4\n"
    events = scan_text(warn + raised)
    assert [(e.kind, e.fatal) for e in events] == [("memory_leak", False), ("memory_leak", True)]


def test_cuda_oom_on_every_rank_naming_its_own_gpu_is_one_event():
    log = "".join(
        f"[2026-03-14 22:24:09 TP{r}] Scheduler hit an exception: Traceback (most recent call last):\n"
        + frames("forward_extend")
        + f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {r} has a total capacity of 79.14 GiB\n\n"
        for r in range(4)
    )
    events = scan_text(log)
    assert [(e.kind, len(e.ranks), e.numbers["tried_to_allocate"]) for e in events] == [("cuda_oom", 4, "2.00 GiB")]


@pytest.mark.parametrize(
    "log",
    [
        "2026-03-14 22:07:33 TP0] Decode out of memory. Try to lower your batch size.\nTry to allocate 9 tokens.\n\n",
        "2026-03-14T22:07:33.1234567Z [2026-03-14 22:07:33 TP0] Decode out of memory. Try to lower your batch size.\n"
        "2026-03-14T22:07:33.1234567Z Try to allocate 9 tokens.\n",
        "(SchedulerActor pid=4242, ip=10.0.0.7) [2026-03-14 22:07:33 TP0] Decode out of memory. Try to lower your "
        "batch size.\n(SchedulerActor pid=4242, ip=10.0.0.7) Try to allocate 9 tokens.\n",
    ],
    ids=["lost-leading-bracket", "github-actions-timestamps", "ray-actor-prefix-every-line"],
)
def test_trimmed_and_wrapped_prefixes_keep_rank_time_and_numbers(log):
    events = scan_text(log)
    assert [(e.kind, e.ranks, e.time, e.numbers.get("requested_tokens")) for e in events] == [
        ("decode", ("TP0",), "2026-03-14T22:07:33", 9)
    ]


def test_a_file_cut_mid_traceback_with_its_exception_line_counts_once_with_the_phase_from_its_frames():
    path = "/usr/lib/python3/dist-packages/sglang/srt/managers/scheduler.py"
    log = (
        "    scheduler.event_loop_overlap()\n"
        + frames("update_running_batch", "prepare_for_decode", "alloc_token_slots", path=path)
        + "RuntimeError: " + GENERIC + "\n"
    )  # fmt: skip
    for prefilter in (True, False):
        events = scan_text(log, prefilter=prefilter)
        assert [(e.kind, e.phase, e.inferred, e.location) for e in events] == [("decode", "decode", False, "t.log:2")]
        assert (events[0].numbers["requested_tokens"], events[0].numbers["available_tokens"]) == (96, 40)


def test_frames_of_other_code_with_nothing_open_start_no_record():
    log = frames("forward", "alloc_token_slots", path="/opt/venv/lib/python3.12/site-packages/vllm/worker.py") + "\n"
    assert scan_text(log) == []


@pytest.mark.parametrize(
    ("line", "time", "ranks", "message"),
    [
        (
            "[gpu_id=0] new fill batch. #seq: 4. #new_token: 7310.",
            None,
            "gpu_id=0",
            "new fill batch. #seq: 4. #new_token: 7310.",
        ),
        ("[09:41:07 TP1] [gpu_id=1] Prefill out of memory.", "09:41:07", "TP1 gpu_id=1", "Prefill out of memory."),
        ("[gpu_id=x] text", None, None, "[gpu_id=x] text"),
    ],
)
def test_gpu_id_prefix_names_the_rank(line, time, ranks, message):
    prefix, rest = PrefixParser().parse(line)
    assert rest == message
    if ranks is None:
        assert prefix is None
    else:
        assert (prefix.time, prefix.ranks) == (time, ranks)


def test_emitted_groups_keep_no_records_so_the_dedupe_window_stays_small():
    # The window keeps the last groups so that late ranks and tracebacks join them; it used to keep every
    # line of every rank's block and traceback too (about 25 KB per TP8 event, 256 events per file).
    from sglang_oom_exporter.detect.match import Matcher
    from sglang_oom_exporter.detect.pipeline import Pipeline

    events: list = []
    pipeline = Pipeline(CATALOG, Matcher(CATALOG), source="t", location="t.log", sink=events.append)
    for minute in range(30):
        ts = f"2026-03-14 22:{minute:02d}:33"
        log = _crash("TP1", ("prepare_for_decode", "alloc_token_slots"), ts=ts) + _crash(
            "TP0", ("prepare_for_decode",), ts=ts
        )
        pipeline.feed(log.encode(), now=float(minute))
    # The last failure: TP0's block alone, counted when the traceback wait runs out.
    pipeline.feed(f"[2026-03-14 22:40:33 TP0] {GENERIC}".encode(), now=100.0)
    pipeline.close_open(150.0)  # the file went quiet: its open record closes
    pipeline.tick(200.0)
    assert [(e.kind, e.ranks) for e in events] == [("decode", ("TP0", "TP1"))] * 30 + [("unknown", ("TP0",))]
    groups = list(pipeline._deduper._groups)
    assert len(groups) == 31
    assert all(g.emitted for g in groups)
    assert sum(len(m.reports) for g in groups for m in g.members.values()) == 0
    # Its traceback, arriving after the event was counted, still joins the emitted group: no second event.
    late = "[2026-03-14 22:40:33 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    pipeline.feed((late + frames("prepare_for_decode") + "RuntimeError: " + GENERIC + "\n").encode(), now=201.0)
    pipeline.finish()
    assert len(events) == 31
    assert sum(len(m.reports) for g in pipeline._deduper._groups for m in g.members.values()) == 0


@pytest.mark.parametrize(
    ("line", "message"),
    [
        # The exception's whole sentence, not from the matched words on (0.4.8-0.5.6 retraction failure).
        (
            "ValueError: Failed to retract any request. No space left for only one request.",
            "Failed to retract any request. No space left for only one request.",
        ),
        # The pool's name is part of what SGLang said (0.4.6+ idle self-check).
        (
            "ValueError: token_to_kv_pool_allocator memory leak detected! available_size=10, evictable_size=0, "
            "protected_size=0, max_total_num_tokens=20",
            "token_to_kv_pool_allocator memory leak detected! available_size=10, evictable_size=0, protected_size=0, "
            "max_total_num_tokens=20",
        ),
        # A log prefix and a logging module's " - " fields are not the message.
        (
            "[2026-03-14 22:07:33 TP0] Prefill out of memory. Try to lower your batch size.",
            "Prefill out of memory. Try to lower your batch size.",
        ),
        (
            "2026-03-14 22:07:33,120 - sglang - ERROR - Prefill out of memory. Try to lower your batch size.",
            "Prefill out of memory. Try to lower your batch size.",
        ),
    ],
)
def test_the_message_starts_where_sglang_s_message_starts(line, message):
    assert [e.message for e in scan_text(line + "\n")] == [message]


def test_a_message_far_behind_its_separator_starts_at_the_matched_words():
    # Past 120 characters of lead-in the text before the match is not taken as the message's start.
    lead = "x" * 130
    events = scan_text(f"[2026-03-14 22:07:33 TP0] {lead} Prefill out of memory. Try to lower your batch size.\n")
    assert [e.message for e in events] == ["Prefill out of memory. Try to lower your batch size."]


def test_the_pattern_s_own_suggestion_rule_still_applies_to_the_wider_message():
    # suggest_rule finds the matched pattern inside the message, as the matcher found it inside the line.
    startup = CATALOG.kind("startup")
    capture = "Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert startup.suggest_rule(capture) == "cuda_graph_bs"
    assert startup.suggest_rule("Scheduler failed. " + capture) == "cuda_graph_bs"
    assert startup.suggest_rule("Not enough memory. Please try to increase --mem-fraction-static.") == "mem_fraction_up"


PREFILL_TEXT = "Prefill out of memory. Try to lower your batch size."
# SGLang's text inside another program's record: a log forwarder echoing SGLang's line (OpenTelemetry Collector's
# debug exporter, Fluent Bit's stdout, Vector's console JSON, a JSON log wrapper, a text forwarder's own fields).
ECHOES = [
    f"Body: Str([2026-12-03 10:00:00 TP0] {PREFILL_TEXT})",
    f"     -> body: Str([2026-12-03 10:00:00 TP0] {PREFILL_TEXT})",
    f"2026-12-03T10:00:01.123Z\tinfo\tResourceLog #0 Body: Str(RuntimeError: {PREFILL_TEXT})",
    f'[0] kube.var.log.containers.sglang-0_llm_sglang-1.log: [1733220000.1, {{"log"=>"[2026-12-03 10:00:00 TP0] '
    f'{PREFILL_TEXT}", "stream"=>"stderr"}}]',
    f'{{"date":1733220000.1,"log":"[2026-12-03 10:00:00 TP0] {PREFILL_TEXT}"}}',
    f'{{"kubernetes":{{"pod_name":"sglang-0"}},"message":"RuntimeError: {PREFILL_TEXT}"}}',
    f'{{"level":"info","msg":"forwarded","line":"[2026-12-03 10:00:00 TP0] {PREFILL_TEXT}"}}',
    f"sglang-0 stderr [2026-12-03 10:00:00 TP0] {PREFILL_TEXT}",
    f"forwarder: RuntimeError: {PREFILL_TEXT}",
]
# What SGLang (or Python for it) writes at the start of a line without a log prefix: each is its event.
OWN_STARTS = [
    PREFILL_TEXT,
    f"RuntimeError: {PREFILL_TEXT}",
    "ValueError: Failed to retract any request. No space left for only one request.",
    "ValueError: token_to_kv_pool_allocator memory leak detected! available_size=10, max_total_num_tokens=20",
    "/usr/local/lib/python3.10/dist-packages/sglang/srt/mem_cache/radix_cache.py:123: UserWarning: KV cache pool "
    "leak detected!available_size=1, self.max_total_num_tokens=9",
    f"(SchedulerActor pid=48213, ip=10.0.3.17) {PREFILL_TEXT}",
]


def _scan(text: str) -> tuple[list[str], int]:
    events, stats = scan_stream(CATALOG, MATCHER, "t.log", io.BytesIO(text.encode()))
    return [e.kind for e in events], stats.foreign_events


@pytest.mark.parametrize("line", ECHOES)
def test_sglang_s_text_inside_another_program_s_line_is_a_foreign_event_never_an_event(line):
    assert _scan(line + "\n") == ([], 1)
    # The same in a CRI record of the forwarder's container, and after SGLang's own banner: still not SGLang's line.
    banner = "[2026-12-03 09:58:00] server_args=ServerArgs(model_path='m')\n"
    assert _scan(banner + cri(line + "\n")) == ([], 1)


@pytest.mark.parametrize("line", OWN_STARTS)
def test_sglang_s_words_starting_an_unprefixed_line_are_its_event(line):
    kinds, foreign = _scan(line + "\n\n")
    assert (len(kinds), foreign) == (1, 0)


def test_a_forwarded_traceback_printed_raw_is_one_foreign_event_not_an_event():
    # A recombined record printed as it is: the header after the forwarder's words, then frames and exception text
    # at the start of their lines, as SGLang wrote them. The header decides: the lines that follow are its record.
    text = (
        "Body: Str([2026-12-03 10:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        + frames("prepare_for_extend", "alloc_paged_token_slots_extend")
        + f"RuntimeError: {PREFILL_TEXT}\nTry to allocate 8192 tokens.)\n\n"
    )
    assert _scan(text) == ([], 1)
    assert _scan(text.replace("Body: Str([2026-12-03 10:00:00 TP0] ", "")) == (["prefill"], 0)


def test_sglang_s_own_prefixed_line_quoting_a_request_stays_no_event_and_no_foreign_event():
    line = f"[2026-03-23 10:11:02] Receive: obj=GenerateReqInput(text='My server logs \"{PREFILL_TEXT}\"')\n"
    assert _scan(line) == ([], 0)
