"""What a source's log says about its server: the start-up lines and the last batch line before a failure. Pure.

    bytes --ServerScanner (its own literal search, complete lines only; beside the reader)--> ServerLog per Report

SGLang describes itself in its log (0.5.23's code, /server_info needs none of it):
- the banner, once per run: `server_args=ServerArgs(model_path='...', chunked_prefill_size=8192, ...)` (up to
  0.5.x) or `server_args={'model_path': '...', 'chunked_prefill_size': 4096, ...}` (0.5.23, a dict). A banner
  starts a run: what the log said before it belongs to the run before (a restart writing into the same file);
- the capacity line, the scheduler's resolved values: `max_total_num_tokens=256, chunked_prefill_size=4096,
  max_prefill_tokens=16384, max_running_requests=8, context_len=4096, available_gpu_mem=...` (`available_cpu_mem`
  on a CPU); context_len is the served context, where the banner's context_length is the flag (None by default);
- the KV pool line `KV Cache is allocated. dtype: ..., #tokens: 256, ...` and the warning `KV pool holds 256
  tokens, fewer than --context-length 4096. ...` (tp_worker.py);
- the scheduler's usage lines `Prefill batch, ..., token usage: 0.31, #running-req: 3, #queue-req: 4, ...` and
  `Decode batch, #running-req: 4, #token: 88, token usage: 0.34, ..., #queue-req: 0`, logged before each
  prefill and every decode_log_interval decode steps: the last one before a failure is the state it failed in.

The start-up lines are rare and parsed when found. Usage lines are frequent: they are never searched for as the
bytes go by; the bytes a report may still need are kept (from the oldest line the pipeline holds in flight) and
the last usage line before a report is found by one reverse search when the report is made, kept raw, and parsed
only when its event is enriched (`state_of()`). A report's ServerLog depends only on the lines before it,
so a file read in one piece, byte by byte or cut into ranges (`then()` joins a range onto the ones before it)
gives the same one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..sources import saved
from .decode import unwrap
from .finder import LineTail, make_finder
from .model import ServerLog
from .prefix import PrefixParser

BANNER_LITERALS = ("server_args=ServerArgs(", "server_args={")
# The start-up lines' literals: the scanner's own search (the reader's prefilter never sees them).
SERVER_LITERALS = (*BANNER_LITERALS, "max_total_num_tokens=", "KV Cache is allocated", "KV pool holds ")
BATCH_LITERAL = b"#running-req: "
# The server args the advice reads, as /server_info names them: sources/sglang_metrics.py INFO_KEYS (a test keeps
# them in) and the flags /server_info has no rule for; max_total_tokens is the pool's cap (the flag).
ARG_KEYS = frozenset((
    "chunked_prefill_size", "max_prefill_tokens", "max_running_requests", "mem_fraction_static", "page_size",
    "context_length", "speculative_algorithm", "speculative_num_draft_tokens", "speculative_num_steps",
    "speculative_eagle_topk", "schedule_conservativeness", "max_mamba_cache_size", "max_total_num_tokens",
    "version", "model_path", "served_model_name", "max_total_tokens", "cuda_graph_max_bs", "mamba_full_memory_ratio",
))  # fmt: skip
MAX_LINE = 256 * 1024  # a longer line is judged on its first MAX_LINE bytes (the reader's bound)

# One `name=value` (ServerArgs repr) or `'name': value` (the dict): a scalar value only.
_ARG = re.compile(r"""'?(\w+)'?(?:=|: )('[^']*'|"[^"]*"|-?\d+(?:\.\d+)?(?:e-?\d+)?|None|True|False)(?=[,)}])""")
_CAPACITY = re.compile(r"(?<![\w(])max_total_num_tokens=\d+(?:, \w+=[-\d.]+(?: GB)?)*")
_PAIR = re.compile(r"(\w+)=(-?\d+(?:\.\d+)?)")
_KV_POOL = re.compile(r"KV Cache is allocated\..*?#tokens: (\d+)")
_SMALL_POOL = re.compile(r"KV pool holds (\d+) tokens, fewer than --context-length (\d+)")
_BATCH = re.compile(r"(Prefill|Decode) batch(?: \[\d+\])?, ")
# Usage line field -> the KV snapshot's name for it (sources/sglang_metrics.py KvSnapshot).
_STATE = (
    ("running_requests", re.compile(r"#running-req: (\d+)")),
    ("num_used_tokens", re.compile(r"#token: (\d+)")),
    ("token_usage", re.compile(r"(?<![\w-])token usage: ([\d.]+)")),
    ("queued_requests", re.compile(r"#queue-req: (\d+)")),
    ("new_tokens", re.compile(r"#new-token: (\d+)")),
)
_CAPACITY_KEYS = {"context_len": "context_length"}  # the capacity line's name -> /server_info's
_PREFIXES = PrefixParser()


def state_of(log: ServerLog) -> dict[str, Any] | None:
    """The last usage line parsed into KV snapshot fields, with its time as logged (`at`); None without one."""
    if log.batch is None:
        return None
    out: dict[str, Any] = {}
    for key, regex in _STATE:
        m = regex.search(log.batch)
        if m is not None:
            out[key] = float(m.group(1)) if "." in m.group(1) else int(m.group(1))
    m = _BATCH.search(log.batch)
    if m is not None:
        out["batch"] = m.group(1).lower()
    prefix, _ = _PREFIXES.parse(log.batch)
    if prefix is not None and prefix.time:
        out["at"] = prefix.time
    return out or None


EMPTY = ServerLog()


def export_log(log: ServerLog) -> dict[str, Any]:
    """A ServerLog as plain data for the state file (a restart resuming mid-file still knows its server)."""
    return {"args": [list(pair) for pair in log.args], "batch": log.batch, "reset": log.reset}


def import_log(raw: object) -> ServerLog:
    """Inverse of export_log(); ValueError when malformed (a value other than a scalar, a key not a name)."""
    memory = saved.obj(raw, "server_log")
    pairs = []
    for pair in saved.array(memory.get("args", []), "server_log.args"):
        key, value = saved.array(pair, "server_log.args[]")
        if saved.text(key, "server_log.args[].key") not in ARG_KEYS:
            raise ValueError(f"server_log: unknown key {key!r}")
        if value is None or not isinstance(value, str | int | float | bool):
            raise ValueError(f"server_log: {key} is no scalar")
        pairs.append((key, value))
    batch = saved.optional(saved.text, memory.get("batch"), "server_log.batch")
    return ServerLog(tuple(sorted(pairs)), batch, saved.flag(memory.get("reset", False), "server_log.reset"))


def parse_line(text: str) -> ServerLog | None:
    """One start-up line (banner, capacity, KV pool, small-pool warning) as a ServerLog; None for any other."""
    for literal in BANNER_LITERALS:
        i = text.find(literal)
        if i >= 0:
            return ServerLog(_pairs(_banner_args(text[i + len("server_args=") :])), reset=True)
    m = _CAPACITY.search(text)
    if m is not None:
        found = {_CAPACITY_KEYS.get(k, k): _number(v) for k, v in _PAIR.findall(m.group(0))}
        return ServerLog(_pairs({k: v for k, v in found.items() if k in ARG_KEYS or k == "max_total_num_tokens"}))
    m = _KV_POOL.search(text)
    if m is not None:
        return ServerLog(_pairs({"max_total_num_tokens": int(m.group(1))}))
    m = _SMALL_POOL.search(text)
    if m is not None:
        return ServerLog(_pairs({"max_total_num_tokens": int(m.group(1)), "context_length": int(m.group(2))}))
    return None


def _banner_args(body: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in _ARG.finditer(body):
        key = m.group(1)
        if key in ARG_KEYS and key not in out:  # a nested dict's key never shadows the top level's earlier one
            out[key] = _value(m.group(2))
    return out


def _value(raw: str) -> Any:
    if raw[:1] in "'\"":
        return raw[1:-1]
    if raw in ("None", "True", "False"):
        return {"None": None, "True": True, "False": False}[raw]
    return _number(raw)


def _number(raw: str) -> int | float:
    return float(raw) if any(c in raw for c in ".e") else int(raw)


def _pairs(values: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, v) for k, v in values.items() if v is not None))


class ServerScanner:
    """One source's start-up lines and the bytes a usage-line lookup may still need, per file generation.

    feed() takes every byte the pipeline is fed, before the reader; at(offset) is the ServerLog of the lines
    before `offset` (a report's first line); keep_from(offset) lets go of what no later report can need.
    """

    def __init__(self, finder: str = "auto") -> None:
        self._finder = make_finder(tuple(s.encode() for s in SERVER_LITERALS), prefer=finder)
        self._base = EMPTY  # everything before `_floor`, and before this generation
        self._floor = 0
        self._lines: list[tuple[int, ServerLog]] = []  # start-up lines at or after the floor: (offset, ServerLog)
        # Complete lines at or after the floor, the bytes as fed: (offset of buf[0], buf, lo, hi), lines in buf[lo:hi].
        self._regions: list[tuple[int, bytes, int, int]] = []
        self._tail = LineTail(MAX_LINE)

    def inherit(self, log: ServerLog) -> None:
        """Lines read before this scanner's first byte said this (a restart's saved state, an earlier range)."""
        self._base = log.then(self._base)

    def feed(self, data: bytes, offset: int) -> None:
        """The next bytes of the current generation, the first at `offset` (kept as they are: no copy)."""
        if not data:
            return
        cut = data.rfind(b"\n")
        tail = self._tail
        if cut < 0:
            tail.extend(data, offset)
            return
        begin = 0
        if tail:
            begin = data.find(b"\n") + 1
            truncated, at, line = tail.truncated, tail.at, tail.take()
            if not truncated:  # an over-long line is no line this scanner reads
                self._take(line + data[:begin], at, 0, len(line) + begin)
        self._take(data, offset, begin, cut + 1)
        tail.extend(data[cut + 1 :], offset + cut + 1)

    def finish(self) -> None:
        """The generation ended: its last line (without a newline) is a line."""
        truncated, at, line = self._tail.truncated, self._tail.at, self._tail.take()
        if line and not truncated:
            self._take(line, at, 0, len(line))

    def start(self, offset: int = 0) -> None:
        """A new file generation follows from `offset`: the old one's lines fold into the base."""
        self.finish()
        self._base = self._fold(1 << 62)
        self._lines, self._regions = [], []
        self._floor = offset

    def at(self, offset: int) -> ServerLog:
        """What the lines before this offset of the current generation said, in this run."""
        return self._fold(offset)

    def keep_from(self, offset: int) -> None:
        """No later lookup asks for an offset before this one: fold what lies before it into the base."""
        if offset <= self._floor:
            return
        self._base = self._fold(offset)
        self._floor = offset
        self._lines = [(at, log) for at, log in self._lines if at >= offset]
        self._regions = [region for region in self._regions if region[0] + region[3] > offset]

    def _fold(self, offset: int) -> ServerLog:
        log, reset_at = self._base, -1
        for at, line in self._lines:
            if at >= offset:
                break
            log = log.then(line)
            if line.reset:
                reset_at = at
        batch = self._last_batch(max(reset_at, self._floor), offset)
        return log if batch is None else replace(log, batch=batch)

    def _last_batch(self, low: int, high: int) -> str | None:
        """The last usage line that starts in [low, high), from the kept bytes."""
        for base, buf, first, last in reversed(self._regions):
            if base + first >= high:
                continue
            if base + last <= low:
                return None
            lo, hi = max(low - base, first), min(high - base, last)
            while True:
                i = buf.rfind(BATCH_LITERAL, lo, hi)
                if i < 0:
                    break
                start = buf.rfind(b"\n", first, i) + 1 or first
                if start < lo:
                    break
                end = buf.find(b"\n", i, last)
                text = unwrap(buf[start : min(last if end < 0 else end, start + MAX_LINE)])
                if _BATCH.search(text) is not None:
                    return text
                hi = start
        return None

    def _take(self, buf: bytes, base: int, lo: int, hi: int) -> None:
        """The complete lines buf[lo:hi], buf[0] at file offset `base`: kept, and their start-up lines read."""
        if lo >= hi:
            return
        self._regions.append((base, buf, lo, hi))
        last_end = -1
        for hit in self._finder.offsets(buf, lo, hi):
            if hit < last_end:
                continue  # another literal of a line already taken
            start = buf.rfind(b"\n", lo, hit) + 1 or lo
            end = buf.find(b"\n", hit, hi)
            last_end = hi if end < 0 else end
            found = parse_line(unwrap(buf[start : min(last_end, start + MAX_LINE)]))
            if found is not None:
                self._lines.append((base + start, found))
