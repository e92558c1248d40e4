"""Deterministic generator of a synthetic SGLang 0.5.x scheduler log for the scan benchmark.

Usage::

    python bench/gen_scheduler_log.py OUT [--lines 2000000] [--oom-every 10000] [--seed 20260314]

Writes OUT (exactly ``--lines`` lines) and ``OUT.truth.json`` with the exact number of prefill and
decode OOM events and retraction lines written.

The log mimics a TP=1 0.5.x server with rank token ``TP0`` (docs/sglang-facts.md section 4): decode and prefill
usage lines, uvicorn access lines, occasional long request-log lines, occasional retraction warnings
(0.5.8+ text), and, about every ``--oom-every`` lines, alternating, a paged prefill or paged decode OOM
(logged block + blank line, then ``Scheduler hit an exception`` with the traceback whose exception line
repeats the block, two blank lines, then the main process's SIGQUIT line, §5). Each OOM is one event;
the SIGQUIT line is not an event. Timestamps advance monotonically, 1-second resolution, so no two
events or retraction lines share a second (no cross-event dedupe can apply).

Same seed + same arguments -> byte-identical output.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

SITE = "/usr/local/lib/python3.12/dist-packages"
MODEL = "/models/Qwen2.5-72B-Instruct"

# (path, line, function, source line) for the frames of each phase, outermost first (0.5.6-style layout).
_COMMON_OUTER = [
    ("sglang/srt/managers/scheduler.py", 2958, "run_scheduler_process", "scheduler.event_loop_overlap()"),
    ("torch/utils/_contextlib.py", 116, "decorate_context", "return func(*args, **kwargs)"),
    ("sglang/srt/managers/scheduler.py", 1012, "event_loop_overlap", "batch = self.get_next_batch_to_run()"),
]
PREFILL_FRAMES = [
    *_COMMON_OUTER,
    (
        "sglang/srt/managers/scheduler.py",
        1741,
        "get_next_batch_to_run",
        "new_batch = self.get_new_batch_prefill()",
    ),
    (
        "sglang/srt/managers/scheduler.py",
        1790,
        "get_new_batch_prefill",
        "return self._get_new_batch_prefill_raw(prefill_delayer_single_pass=prefill_delayer_single_pass)",
    ),
    (
        "sglang/srt/managers/scheduler.py",
        1948,
        "_get_new_batch_prefill_raw",
        "new_batch.prepare_for_extend()",
    ),
    (
        "sglang/srt/managers/schedule_batch.py",
        1265,
        "prepare_for_extend",
        "out_cache_loc = alloc_for_extend(self)",
    ),
    (
        "sglang/srt/mem_cache/common.py",
        372,
        "alloc_for_extend",
        "out_cache_loc = alloc_paged_token_slots_extend(",
    ),
    (
        "sglang/srt/mem_cache/common.py",
        235,
        "alloc_paged_token_slots_extend",
        "raise RuntimeError(error_msg)",
    ),
]
DECODE_FRAMES = [
    *_COMMON_OUTER,
    (
        "sglang/srt/managers/scheduler.py",
        1766,
        "get_next_batch_to_run",
        "self.running_batch = self.update_running_batch(self.running_batch)",
    ),
    ("sglang/srt/managers/scheduler.py", 2104, "update_running_batch", "batch.prepare_for_decode()"),
    (
        "sglang/srt/managers/schedule_batch.py",
        1617,
        "prepare_for_decode",
        "self.out_cache_loc = alloc_for_decode(self, token_per_req=1)",
    ),
    (
        "sglang/srt/mem_cache/common.py",
        441,
        "alloc_for_decode",
        "out_cache_loc = alloc_paged_token_slots_decode(",
    ),
    (
        "sglang/srt/mem_cache/common.py",
        289,
        "alloc_paged_token_slots_decode",
        "raise RuntimeError(error_msg)",
    ),
]

PROMPTS = [
    "You are a helpful assistant. Summarise the following quarterly report in three bullet points",
    "Translate the following paragraph into French, keeping the technical terms in English",
    "Write a Python function that parses an ISO-8601 timestamp and returns a timezone-aware datetime",
    "Explain the difference between paged attention and radix attention for a new team member",
    "Given the SQL schema below, write a query that returns the top ten customers by revenue",
    "Classify the sentiment of each review as positive, negative or neutral and give one reason",
]
ENDPOINTS = [
    ('"POST /v1/chat/completions HTTP/1.1" 200 OK', 70),
    ('"POST /v1/completions HTTP/1.1" 200 OK', 12),
    ('"POST /generate HTTP/1.1" 200 OK', 8),
    ('"GET /health HTTP/1.1" 200 OK', 6),
    ('"GET /metrics HTTP/1.1" 200 OK', 3),
    ('"POST /v1/chat/completions HTTP/1.1" 400 Bad Request', 1),
]


class _Clock:
    """Monotonic 1-second clock; the formatted prefix is cached per second."""

    def __init__(self, start: float) -> None:
        self.t = int(start)
        self._cached_t = -1
        self._ts = ""

    def ts(self) -> str:
        if self._cached_t != self.t:
            self._cached_t = self.t
            self._ts = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(self.t))
        return self._ts


def _oom_lines(kind: str, ts: str, rng: random.Random) -> list[str]:
    """The block, the traceback and the SIGQUIT line for one fatal OOM (one event)."""
    if kind == "prefill":
        need = rng.choice([2048, 4096, 8192, 8192, 16384])
        head = "Prefill out of memory. Try to lower your batch size."
        frames = PREFILL_FRAMES
    else:
        need = rng.randint(32, 256)
        head = "Decode out of memory. Try to lower your batch size."
        frames = DECODE_FRAMES
    evictable = rng.randint(0, need // 4)
    avail = rng.randint(0, max(0, need - evictable - 1))
    detail = [
        f"Try to allocate {need} tokens.",
        f"Available tokens: {avail + evictable} (available_size={avail} + evictable_size={evictable})",
    ]
    out = [f"[{ts} TP0] {head}", *detail, ""]
    out.append(f"[{ts} TP0] Scheduler hit an exception: Traceback (most recent call last):")
    for path, lineno, func, src in frames:
        out.append(f'  File "{SITE}/{path}", line {lineno}, in {func}')
        out.append(f"    {src}")
    out.append(f"RuntimeError: {head}")
    out.extend(detail)
    out.extend(["", ""])
    hexaddr = f"0x7f{rng.getrandbits(40):010x}"
    out.append(
        f"[{ts}] SIGQUIT received. signum=<Signals.SIGQUIT: 3>, frame=<frame at {hexaddr}, "
        "file '/usr/lib/python3.12/selectors.py', line 468, code select>. It usually means one child failed."
    )
    return out


def generate(out_path: Path, n_lines: int, oom_every: int, seed: int) -> dict[str, int | str]:
    rng = random.Random(seed)
    clock = _Clock(1773526053)  # 2026-03-14 22:07:33 UTC
    endpoints = [e for e, _ in ENDPOINTS]
    endpoint_w = [w for _, w in ENDPOINTS]

    prefill = decode = retract = 0
    running, queue, token = 37, 0, 81234
    capacity = 131072
    ratio = 0.4012
    last_retract_t = -1
    next_oom = oom_every
    written = 0
    written_bytes = 0
    buf: list[str] = []
    chunk = 20000

    with open(out_path, "w", encoding="utf-8", newline="\n") as fh:
        while written < n_lines:
            # The clock ticks roughly once per 15 lines.
            if rng.random() < 0.066:
                clock.t += 1
            if written >= next_oom and oom_every > 0:
                kind = "prefill" if (prefill + decode) % 2 == 0 else "decode"
                clock.t += 1
                block = _oom_lines(kind, clock.ts(), rng)
                clock.t += 1
                if written + len(block) <= n_lines:
                    buf.extend(block)
                    written += len(block)
                    if kind == "prefill":
                        prefill += 1
                    else:
                        decode += 1
                next_oom += oom_every
                continue
            ts = clock.ts()
            r = rng.random()
            running = min(256, max(1, running + rng.randint(-2, 2)))
            token = min(capacity, max(1000, token + rng.randint(-1000, 1000) + (92000 - token) // 64))
            usage = token / capacity
            if r < 0.50:
                thr = rng.uniform(200.0, 4200.0)
                extra = ""
                if rng.random() < 0.15:
                    extra = f"#retracted-req: 0, #transfer-req: 0, pre-allocated usage: {rng.random():.2f}, "
                line = (
                    f"[{ts} TP0] Decode batch, #running-req: {running}, #token: {token}, "
                    f"token usage: {usage:.2f}, cuda graph: True, "
                    f"gen throughput (token/s): {thr:.2f}, #queue-req: {queue}, {extra}"
                )
            elif r < 0.62:
                new_seq = rng.randint(1, 8)
                new_tok = rng.choice([512, 1024, 2048, 4096, 8192])
                cached = rng.choice([0, 0, 128, 1024, 3072])
                queue = max(0, queue + rng.randint(-2, 2) + (6 - queue) // 8)
                extra = ""
                if rng.random() < 0.3:
                    extra = f"input throughput (token/s): {rng.uniform(1000, 40000):.2f}, "
                line = (
                    f"[{ts} TP0] Prefill batch, #new-seq: {new_seq}, #new-token: {new_tok}, "
                    f"#cached-token: {cached}, token usage: {usage:.2f}, #running-req: {running}, "
                    f"#queue-req: {queue}, {extra}"
                )
            elif r < 0.985:
                ep = rng.choices(endpoints, endpoint_w)[0]
                ip = f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"
                line = f"[{ts}] INFO:     {ip}:{rng.randint(32768, 60999)} - {ep}"
            elif r < 0.9992 or clock.t == last_retract_t:
                rid = f"{rng.getrandbits(128):032x}"
                prompt = rng.choice(PROMPTS)
                line = (
                    f"[{ts}] Receive: obj=GenerateReqInput(rid='{rid}', text='<|im_start|>system\\n{prompt}"
                    f"<|im_end|>\\n<|im_start|>user\\n...', sampling_params={{'temperature': "
                    f"{rng.choice([0.0, 0.2, 0.7, 1.0])}, 'top_p': 0.95, 'max_new_tokens': "
                    f"{rng.choice([256, 512, 1024, 2048])}}}, stream={rng.choice(['True', 'False'])}, "
                    f"model='{MODEL}')"
                )
            else:
                last_retract_t = clock.t
                n = rng.randint(1, 8)
                new_ratio = min(1.0, ratio + rng.uniform(0.05, 0.3))
                line = (
                    f"[{ts} TP0] KV cache pool is full. Retract requests. #retracted_reqs: {n}, "
                    f"#new_tokens_gained: {n * rng.randint(128, 2048)}, "
                    f"#new_token_ratio: {ratio:.4f} -> {new_ratio:.4f}"
                )
                ratio = max(0.05, new_ratio - rng.uniform(0.2, 0.5))
                retract += 1
            buf.append(line)
            written += 1
            if len(buf) >= chunk:
                text = "\n".join(buf) + "\n"
                written_bytes += len(text.encode("utf-8"))
                fh.write(text)
                buf.clear()
        if buf:
            text = "\n".join(buf) + "\n"
            written_bytes += len(text.encode("utf-8"))
            fh.write(text)

    return {
        "lines": written,
        "bytes": written_bytes,
        "seed": seed,
        "oom_every": oom_every,
        "prefill": prefill,
        "decode": decode,
        "retract": retract,
        # Lines with the literal "out of memory": block head + RuntimeError line of each event.
        "lines_with_out_of_memory": 2 * (prefill + decode),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--lines", type=int, default=2_000_000)
    ap.add_argument("--oom-every", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=20260314)
    args = ap.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    truth = generate(args.out, args.lines, args.oom_every, args.seed)
    truth_path = Path(str(args.out) + ".truth.json")
    truth_path.write_text(json.dumps(truth, indent=2) + "\n", encoding="utf-8")
    dt = time.perf_counter() - t0
    print(
        f"wrote {args.out}: {truth['lines']} lines, {int(truth['bytes']) / 1e6:.1f} MB "
        f"({int(truth['bytes']) / int(truth['lines']):.1f} B/line), prefill={truth['prefill']} "
        f"decode={truth['decode']} retract={truth['retract']} in {dt:.1f}s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
