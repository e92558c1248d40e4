"""Log text for the tests: OOM blocks as SGLang writes them, the same lines as a CRI log, the fragments the
property tests glue together, and `append`, which writes them as a logger does.

The templates take their second (`{s}`) so that a test can write blocks the deduper keeps apart.
"""

from __future__ import annotations

import json
import os
import time

# A decode OOM block without a traceback (the App tests count it as "decode").
BLOCK = "[2026-03-14 22:07:{s:02d} TP0] Decode out of memory. Try to lower your batch size.\nTry to allocate {s} tokens.\n\n"
# A prefill OOM block with the numbers the sglang context joins (the targets and alerts end-to-end tests).
PREFILL = (
    "[2026-03-14 22:10:{s:02d} TP0] Prefill out of memory. Try to lower your batch size.\n"
    "Try to allocate 16384 tokens.\nAvailable tokens: 6100 (available_size=5980 + evictable_size=120)\n\n"
)
# A log's history before any OOM (the rotation and reload tests).
HISTORY = "[2026-03-14 22:00:00 TP0] Load weight end.\n"
# A prefill block and its traceback: settled at once, emitted after the deduper's short settle (0.3 s), not before.
_ROTATION_TEXT = "Prefill out of memory. Try to lower your batch size.\nTry to allocate {s} tokens.\n"
EVENT = (
    "[2026-03-14 22:07:{s:02d} TP0] " + _ROTATION_TEXT + "\n[2026-03-14 22:07:{s:02d} TP0] Scheduler hit an exception: "
    'Traceback (most recent call last):\n  File "/usr/lib/python3/dist-packages/sglang/srt/managers/scheduler.py", '
    "line 9, in prepare_for_extend\n    x()\nRuntimeError: " + _ROTATION_TEXT + "\n\n"
)

# Fragments that exercise every state of the assembler, glued in random order by the property tests' strategies.
FRAGMENTS = [
    b"[2026-03-14 22:07:33 TP0] Out of memory. Try to lower your batch size.\n",
    b"Try to allocate 96 tokens.\n",
    b"Available tokens: 40 (available_size=40 + evictable_size=0)\n",
    b"\n",
    b"[2026-03-14 22:07:33 TP1] Scheduler hit an exception: Traceback (most recent call last):\n",
    b'  File "/x/sglang/srt/managers/scheduler.py", line 1, in prepare_for_decode\n',
    b"    batch.prepare_for_decode()\n",
    b'  File "/x/sglang/srt/mem_cache/allocation.py", line 9, in alloc_token_slots\n',
    b"RuntimeError: Out of memory. Try to lower your batch size.\n",
    b" 0 [] r=1\n",
    b"#tokens: 61420\n",
    b"[2026-03-14 22:07:34 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 2, #new_token_ratio: 0.1 -> 0.2\n",
    b"2026-03-14T22:07:33.1Z stderr P [2026-03-14 22:07:33 TP0] Decode out of\n",
    b"2026-03-14T22:07:33.1Z stderr F  memory. Try to lower your batch size.\n",
    b"[2026-03-14 22:07:33] SIGQUIT received. It usually means one child failed.\n",
    b"\r\n",
    b"\xff\xfe\x00garbage\n",
    b"[2026-03-14 22:07:35 TP0] Decode batch, #running-req: 3, token usage: 1.00\n",
    # Section 10 variants
    b"[gpu_id=1] Prefill out of memory. Try to lower your batch size.\n",
    b"RuntimeError: CUDA Error: out of memory (2) /x/flashinfer/handler.cuh: line 1 at function cudaMallocAsync(b)\n",
    b"ValueError: pool memory leak detected! [full] total=9, available=1, evictable=2, protected=0, session_held=0, "
    b"uncached=0\n",
    b"[swa] total=5, available=5, evictable=0, protected=0, session_held=0, uncached=0\n",
    b"/x/sglang/srt/managers/router/model_rpc.py:1: UserWarning: Warning: available_size=1, max_total_num_token=2\n",
    b"KV cache pool leak detected!\n",
    b"Exception in ControllerSingle:\n",
    b"Traceback (most recent call last):\n",
    b'  File "/x/sglang/srt/speculative/eagle_info.py", line 3, in prepare_for_verify\n',
    b"AssertionError: No space left for only one request, self.token_to_kv_pool_allocator.available_size()=6\n",
    b"[2026-03-14 22:07:33] SIGQUIT received. signum=None, frame=None. It usually means one child failed.\n",
    b"Available tokens: 6100\n",
    # A scheduler that dies of what no kind names: non-memory frames and lines, and the launch-phase SIGQUIT line
    b'  File "/x/sglang/srt/managers/scheduler.py", line 4, in event_loop_overlap\n',
    b'  File "/x/sglang/srt/mem_cache/kv_cache_configurator.py", line 5, in _init_pools\n',
    b"ValueError: Insufficient destination DCP pages: required=64, provided=48\n",
    b"[2026-03-14 22:07:36 TP1] Scheduler hit an exception: Traceback (most recent call last):\n",
    b"[2026-03-14 22:07:36] Received sigquit from a child process. It usually means the child failed.\n",
]
# The same records as docker-compose prints them, with another service's lines to mix in anywhere.
COMPOSE_FRAGMENTS = [b"sglang-1  | " + f for f in FRAGMENTS if not f.startswith((b"2026-03-14T", b"\xff"))] + [
    b'webui-1   | INFO:     172.19.0.1:40112 - "GET /health HTTP/1.1" 200 OK\n',
    b"webui-1   | Traceback (most recent call last):\n",
    b"webui-1   | [2026-03-14 22:07:33] WARNING: chat task failed, retrying\n",
    b"sglang-1 exited with code 137\n",
]

# The same records as a CRI log on either stream, with partial records and another program's lines on stdout: a
# node's container beside its own web server. Drawn so that one stream's record is open while the other's lines
# pass, the reader's window armed by either.
_CRI_T = b"2026-03-14T22:07:33.1Z"
CRI_FRAGMENTS = [
    _CRI_T + b" " + stream + b" F " + f
    for f in FRAGMENTS
    if not f.startswith((b"2026-03-14T", b"\r"))
    for stream in (b"stdout", b"stderr")
] + [
    _CRI_T + b" stdout P [2026-03-14 22:07:33 TP0] Prefill out\n",
    _CRI_T + b" stdout F  of memory. Try to lower your batch size.\n",
    _CRI_T + b" stderr P Try to alloc\n",
    _CRI_T + b" stderr F ate 7 tokens.\n",
    _CRI_T + b" stdout P\n",  # an empty partial record: no literal in it
    _CRI_T + b" stdout F\n",
    _CRI_T + b' stdout F 10.0.0.1 - - [14/Mar/2026:22:07:33 +0000] "GET /v1/models HTTP/1.1" 200 91\n',
    _CRI_T + b' stdout F {"level": "info", "msg": "request served", "ms": 12}\n',
    _CRI_T + b" stdout F 2026-03-14 22:07:33,101 INFO trainer: step 9 loss=0.1\n",
    _CRI_T + b" stderr F torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n",
    _CRI_T + b'2 stdout F   File "/workspace/train.py", line 88, in <module>\n',
    b"2026-03-14 stdout F not a CRI record\n",
]


def _docker(stream: str, line: bytes, *, html: bool) -> bytes:
    """One docker json-file line: json-file escapes quotes and backslashes, docker's encoder also <, > and &."""
    obj = {"log": line.decode("utf-8", "replace"), "stream": stream, "time": "2026-03-14T22:07:33.1Z"}
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    if html:
        text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return text.encode() + b"\n"


# The same records as docker's json-file log on either stream (stderr with docker's HTML escapes, stdout without),
# with another program's lines, lines that only look like docker's, and a traceback cut at its first frame.
DOCKER_FRAGMENTS = [
    _docker(stream, f, html=stream == "stderr")
    for f in FRAGMENTS
    if not f.startswith(b"2026-03-14T")
    for stream in ("stdout", "stderr")
] + [
    _docker("stdout", b'10.0.0.1 - - [14/Mar/2026:22:07:33 +0000] "GET /v1/models HTTP/1.1" 200 91\n', html=False),
    _docker("stderr", b'  File "/x/sglang/srt/managers/scheduler.py", line 2, in <module>\n', html=True),
    _docker("stderr", b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n", html=True),
    b'{"log":"Try to allocate 5 tokens.\\n","stream":"stderr"}\n',  # no time: irregular, the reader cannot vouch
    b'{"log":"Available tokens: 3\\x\\n","stream":"stderr","time":"t"}\n',  # an invalid escape: a json error
    b"plain line between json ones\n",
]


_SECOND = [0]


def oom_block(*, traceback: bool = True, rank: str = "TP0", kind: str = "Prefill") -> str:
    """A fatal OOM (logged block, then its traceback) with a timestamp no other block in the test has."""
    _SECOND[0] += 3
    ts = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(1_780_000_000 + _SECOND[0]))
    text = f"{kind} out of memory. Try to lower your batch size.\nTry to allocate {_SECOND[0]} tokens.\n"
    out = f"[{ts} {rank}] {text}\n"
    if traceback:
        out += (
            f"[{ts} {rank}] Scheduler hit an exception: Traceback (most recent call last):\n"
            '  File "/usr/lib/python3/dist-packages/sglang/srt/managers/scheduler.py", line 9, in prepare_for_extend\n'
            "    x()\n"
            f"RuntimeError: {text}\n\n"
        )
    return out


# Frames a dying scheduler's traceback may end in (0.5.23's files and functions), by what the structure says of them.
CRASH_FRAMES = {
    "other": [("managers/scheduler.py", "event_loop_overlap"), ("managers/scheduler.py", "run_batch"),
              ("disaggregation/decode.py", "process_decode_queue"), ("model_executor/model_runner.py", "forward")],
    "memory": [("mem_cache/allocation.py", "alloc_token_slots"), ("mem_cache/allocation.py", "alloc_for_extend"),
               ("mem_cache/kv_cache_configurator.py", "_init_pools"), ("managers/scheduler.py", "init_memory_pools"),
               ("mem_cache/allocator/paged.py", "alloc_decode"), ("mem_cache/radix_cache.py", "evict")],
    "phase": [("managers/schedule_batch.py", "prepare_for_decode"), ("managers/schedule_batch.py", "prepare_for_extend"),
              ("managers/scheduler.py", "__init__")],
}  # fmt: skip


def scheduler_crash(exception: str, frames: list[tuple[str, str]], ranks: tuple[str, ...] = ("TP0",)) -> str:
    """What SGLang logs when a scheduler dies (managers/scheduler.py, run_scheduler_process): per rank the header,
    the frames and the exception text, then the parent's SIGQUIT line."""
    tb = "".join(
        f'  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/{path}", line {10 + i}, in {func}\n    x()\n'
        for i, (path, func) in enumerate([("managers/scheduler.py", "run_scheduler_process"), *frames])
    )
    out = "".join(
        f"[2026-10-30 09:41:18 {rank}] Scheduler hit an exception: Traceback (most recent call last):\n{tb}{exception}\n\n"
        for rank in ranks
    )
    return out + "[2026-10-30 09:41:18] SIGQUIT received. signum=None, frame=None. It usually means one child failed.\n"


def cri(text: str) -> str:
    """The same lines as a containerd CRI log."""
    return "".join(f"2026-03-14T22:07:33.{i:09d}Z stderr F {line}\n" for i, line in enumerate(text.splitlines()))


def append(path: str | os.PathLike[str], text: str) -> None:
    """Append text to a log file, as a writer does."""
    with open(path, "a") as fh:
        fh.write(text)
