"""SGLang's /metrics and /server_info bodies -> KvSnapshot and ServerInfo: pure parsing for the scraper.

Aggregation when one SGLang name has several series (ranks, DP groups, processes):
  1. Sum over the `pid` label first. Multiprocess gauges without a mode (num_retracted_reqs) carry one
     series per process, and the pid changes with every restart.
  2. Usage and ratio gauges (token_usage, new_token_ratio): the max over the remaining series, i.e. the
     worst rank, because the worst rank is the one that runs out. Per-GPU memory set at start-up likewise:
     the largest weights, graph (its `phase` series summed first) and KV share, the smallest headroom.
     Counters by pool (hicache_dropped_tokens_total: `pool`) sum that label first, then as in 3.
  3. Token and request counts (and counters): group by `dp_rank` (absent = one group), take the max
     within a group, then sum the groups. Each DP group owns its own KV pool and requests, while the TP
     (and PP, MoE-EP) ranks of one group mirror the same pool; any other label (engine_type, model_name,
     extra labels) is treated like tp_rank.
A field read from a counter with a `reason` label reads only its own reason (_REASON): SGLang 0.5.23's
hicache_dropped_tokens_total counts `host_pressure` (host memory short) and `write_through_unbacked_eviction`
(evicted before its write-through finished) in one family, and only the first is a lack of host memory.
Counters are read from their `_total` samples; sglang:total_retracted_reqs (0.4.10, cumulative although
typed gauge) feeds retracted_requests_total like the 0.5.8+ counter. Nothing here exports: metrics/ reads
the scrapers and yields the values under sglang_oom_target_* names, never SGLang's `sglang:` ones.

Both spellings of SGLang's names are read (facts 11.7): `sglang:token_usage` as SGLang writes it, and
`sglang_token_usage` after name escaping (OpenMetrics `escaping=underscores`, the router's /engine_metrics).
When a body has both spellings of one name, the `sglang:` one is used, so nothing is counted twice. An
OpenMetrics body (it ends with `# EOF`) is parsed as OpenMetrics. engine_type (unified, prefill, decode;
0.4.3+) is SGLang's label for the server's role; the snapshot keeps it for the mirrored series' label.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any

from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from .http import HttpError, Reason

INFO_KEYS = (
    "chunked_prefill_size", "max_prefill_tokens", "max_running_requests", "mem_fraction_static", "page_size",
    "context_length", "speculative_algorithm", "speculative_num_draft_tokens", "speculative_num_steps",
    "speculative_eagle_topk", "schedule_conservativeness", "max_mamba_cache_size", "max_total_num_tokens",
    "version", "model_path", "served_model_name",
)  # fmt: skip
INFO_PATHS = ("/server_info", "/get_server_info")  # newest first; the old path is a deprecated alias


@dataclass(frozen=True, slots=True)
class KvSnapshot:
    """KV-related values of one target at one scrape, aggregated over ranks; None when not exposed."""

    target: str
    time: float  # wall seconds when the body arrived
    token_usage: float | None = None
    num_used_tokens: float | None = None
    max_total_num_tokens: float | None = None
    kv_available_tokens: float | None = None
    kv_evictable_tokens: float | None = None
    kv_used_tokens: float | None = None
    running_requests: float | None = None
    queued_requests: float | None = None
    retracted_requests_total: float | None = None
    retracted_reqs: float | None = None
    aborted_requests_total: float | None = None
    new_token_ratio: float | None = None
    pending_prealloc_token_usage: float | None = None
    decode_prealloc_queue_requests: float | None = None
    # main of 2026-08 (facts 12.23-12.27): how start-up divided a GPU (GB as SGLang reports them, per GPU),
    # the HiCache host pool, eviction, host-cache allocation failures and the PD queues.
    startup_available_gpu_memory_gb: float | None = None
    weight_memory_gb: float | None = None
    graph_memory_gb: float | None = None
    kv_cache_memory_gb: float | None = None
    hicache_host_used_tokens: float | None = None
    hicache_host_total_tokens: float | None = None
    evicted_tokens_total: float | None = None
    hicache_dropped_tokens_total: float | None = None
    hicache_prefetch_alloc_failed_tokens_total: float | None = None
    prefill_bootstrap_queue_requests: float | None = None
    prefill_inflight_queue_requests: float | None = None
    decode_transfer_queue_requests: float | None = None
    # 0.5.23: the PD decode pool share pre-allocated to pending transfers (full and SWA pool), the decode requests
    # receiving into host memory and the failed ones whose KV waits for a deferred release; the host mamba pool's
    # occupancy; device KV lost because eviction overtook its write-through, and storage prefetches that found no
    # room in host or device memory.
    prealloc_full_token_usage: float | None = None
    prealloc_swa_token_usage: float | None = None
    decode_host_receive_queue_requests: float | None = None
    decode_deferred_kv_release_requests: float | None = None
    hicache_host_mamba_used_states: float | None = None
    hicache_host_mamba_total_states: float | None = None
    hicache_unbacked_evicted_tokens_total: float | None = None
    storage_prefetch_host_capacity_tokens_total: float | None = None
    storage_prefetch_device_capacity_tokens_total: float | None = None
    # The served context (sglang:context_len, set at start-up): /server_info's context_length is the flag, null unless
    # set; the advice's --context-length rule compares the pool with this.
    context_len: float | None = None
    engine_type: str | None = None  # SGLang's label: unified | prefill | decode (| dynamic); several joined by "+"

    def as_dict(self) -> dict[str, Any]:
        """Target, time and the values that are present."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}


_MAX, _COUNT, _MIN, _PER_GPU, _POOLS = "max", "count", "min", "per_gpu", "pools"
# Snapshot field -> (aggregation, SGLang sample names, first present wins).
_SOURCES: dict[str, tuple[str, tuple[str, ...]]] = {
    "token_usage": (_MAX, ("sglang:token_usage",)),
    "num_used_tokens": (_COUNT, ("sglang:num_used_tokens",)),
    "max_total_num_tokens": (_COUNT, ("sglang:max_total_num_tokens",)),
    "context_len": (_MAX, ("sglang:context_len",)),
    "kv_available_tokens": (_COUNT, ("sglang:kv_available_tokens",)),
    "kv_evictable_tokens": (_COUNT, ("sglang:kv_evictable_tokens",)),
    "kv_used_tokens": (_COUNT, ("sglang:kv_used_tokens",)),
    "running_requests": (_COUNT, ("sglang:num_running_reqs",)),
    "queued_requests": (_COUNT, ("sglang:num_queue_reqs",)),
    "retracted_requests_total": (_COUNT, ("sglang:num_retracted_requests_total", "sglang:total_retracted_reqs")),
    "retracted_reqs": (_COUNT, ("sglang:num_retracted_reqs",)),
    "aborted_requests_total": (_COUNT, ("sglang:num_aborted_requests_total",)),
    "new_token_ratio": (_MAX, ("sglang:new_token_ratio",)),
    # PD decode servers (0.5.4+ / facts 11.8): tokens promised to transfers not yet pre-allocated, over capacity,
    # and the requests waiting for a pre-allocation.
    "pending_prealloc_token_usage": (_MAX, ("sglang:pending_prealloc_token_usage",)),
    "decode_prealloc_queue_requests": (_COUNT, ("sglang:num_decode_prealloc_queue_reqs",)),
    # Set once at start-up, one GPU each: the headroom left on the tightest GPU (the capacity line's
    # available_gpu_mem), the largest weights, CUDA graph and KV pool share of one GPU (graph memory has one
    # series per captured graph set, label `phase`: their sum is the GPU's).
    "startup_available_gpu_memory_gb": (_MIN, ("sglang:startup_available_gpu_memory_gb",)),
    "weight_memory_gb": (_MAX, ("sglang:weight_memory_usage_gb",)),
    "graph_memory_gb": (_PER_GPU, ("sglang:graph_memory_usage_gb",)),
    "kv_cache_memory_gb": (_MAX, ("sglang:kv_cache_memory_usage_gb",)),
    # Hierarchical cache: the host pool's occupancy (the pool host-pool retraction backs up into), and tokens
    # given up for host memory: device KV dropped without a backup, prefetches an aux host pool could not hold.
    "hicache_host_used_tokens": (_COUNT, ("sglang:hicache_host_used_tokens",)),
    "hicache_host_total_tokens": (_COUNT, ("sglang:hicache_host_total_tokens",)),
    "evicted_tokens_total": (_COUNT, ("sglang:evicted_tokens_total",)),
    "hicache_dropped_tokens_total": (_POOLS, ("sglang:hicache_dropped_tokens_total",)),
    "hicache_prefetch_alloc_failed_tokens_total": (_COUNT, ("sglang:hicache_prefetch_aux_alloc_failed_tokens_total",)),
    # PD queues: requests waiting for bootstrap or in flight on a prefill server, in transfer on a decode server.
    "prefill_bootstrap_queue_requests": (_COUNT, ("sglang:num_prefill_bootstrap_queue_reqs",)),
    "prefill_inflight_queue_requests": (_COUNT, ("sglang:num_prefill_inflight_queue_reqs",)),
    "decode_transfer_queue_requests": (_COUNT, ("sglang:num_decode_transfer_queue_reqs",)),
    # 0.5.23, PD decode: the share of the full (SWA) pool held by pre-allocated requests whose transfer is pending
    # (same basis as full_token_usage); the transfers landing in host memory first (host-receive threshold below
    # 1); failed requests whose KV stays allocated until the transfer drains or times out.
    "prealloc_full_token_usage": (_MAX, ("sglang:prealloc_full_token_usage",)),
    "prealloc_swa_token_usage": (_MAX, ("sglang:prealloc_swa_token_usage",)),
    "decode_host_receive_queue_requests": (_COUNT, ("sglang:num_decode_host_receive_queue_reqs",)),
    "decode_deferred_kv_release_requests": (_COUNT, ("sglang:num_decode_deferred_kv_release_reqs",)),
    # 0.5.23, HiCache: the host mamba state pool (hybrid-SSM models; absent without one), device KV evicted before
    # its eager write-through reached host memory, and storage-hit tokens not prefetched for want of room.
    "hicache_host_mamba_used_states": (_COUNT, ("sglang:hicache_host_mamba_used_states",)),
    "hicache_host_mamba_total_states": (_COUNT, ("sglang:hicache_host_mamba_total_states",)),
    "hicache_unbacked_evicted_tokens_total": (_POOLS, ("sglang:hicache_dropped_tokens_total",)),
    "storage_prefetch_host_capacity_tokens_total": (_COUNT, ("sglang:storage_prefetch_unfulfilled_tokens_total",)),
    "storage_prefetch_device_capacity_tokens_total": (_COUNT, ("sglang:storage_prefetch_unfulfilled_tokens_total",)),
}
# Snapshot field -> the one `reason` its series must carry; the family's other reasons are other fields or none.
_REASON = {
    "hicache_dropped_tokens_total": "host_pressure",
    "hicache_unbacked_evicted_tokens_total": "write_through_unbacked_eviction",
    "storage_prefetch_host_capacity_tokens_total": "host_capacity",
    "storage_prefetch_device_capacity_tokens_total": "device_capacity",
}
PREFIX, ESCAPED_PREFIX = "sglang:", "sglang_"
# Our own names share the escaped prefix: an exporter page is never read as SGLang's.
_NOT_SGLANG = "sglang_oom_"
_Series = list[tuple[dict[str, str], float]]


def parse_metrics(body: bytes, target: str, now: float) -> KvSnapshot:
    """Parse one SGLang /metrics body into a KvSnapshot; HttpError(BAD_BODY) when it is none."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HttpError(Reason.BAD_BODY, f"body is not UTF-8 text: {exc}") from None
    head = text.lstrip()[:512].lower()
    if head.startswith("<") or "<html" in head:
        raise HttpError(Reason.BAD_BODY, "body is HTML")
    # SGLang's name (colon spelling) -> its series; the escaped spelling's series apart, used only when the
    # colon spelling of that name is absent.
    series: defaultdict[str, _Series] = defaultdict(list)
    escaped: defaultdict[str, _Series] = defaultdict(list)
    families = 0
    engine_types: set[str] = set()
    parse = openmetrics_families if text.rstrip().endswith("# EOF") else text_string_to_metric_families
    try:
        for family in parse(text):
            families += _sglang_name(family.name) is not None
            for sample in family.samples:
                name = _sglang_name(sample.name)
                if name is None or math.isnan(sample.value):
                    continue
                (series if sample.name.startswith(PREFIX) else escaped)[name].append((sample.labels, sample.value))
                if sample.labels.get("engine_type"):
                    engine_types.add(sample.labels["engine_type"])
    except Exception as exc:  # the parser raises several types; any of them means "not metrics"
        raise HttpError(Reason.BAD_BODY, f"unparsable: {str(exc)[:120]}") from exc
    if not families and not series and not escaped:
        raise HttpError(Reason.BAD_BODY, "no sglang: (or sglang_) metric family")
    values: dict[str, Any] = {}
    for field, (rule, names) in _SOURCES.items():
        found = next((s[n] for n in names for s in (series, escaped) if s.get(n)), None)
        if found and field in _REASON:
            found = [(labels, v) for labels, v in found if labels.get("reason") == _REASON[field]]
        if found:
            values[field] = _aggregate(found, rule)
    if engine_types:
        values["engine_type"] = "+".join(sorted(engine_types))
    return KvSnapshot(target, now, **values)


def _sglang_name(name: str) -> str | None:
    """SGLang's name in its colon spelling ("sglang:token_usage"), from either spelling; None for other names."""
    if name.startswith(PREFIX):
        return name
    if name.startswith(ESCAPED_PREFIX) and not name.startswith(_NOT_SGLANG):
        return PREFIX + name[len(ESCAPED_PREFIX) :]
    return None


def _aggregate(series: _Series, rule: str) -> float:
    merged: dict[frozenset[tuple[str, str]], float] = defaultdict(float)
    # per_gpu: a GPU's parts (one series per `phase`) add up first, then the largest GPU, like max; pools: the
    # pools' (and reasons') series add up first, then as a count.
    summed = {_PER_GPU: ("pid", "phase"), _POOLS: ("pid", "pool", "reason")}.get(rule, ("pid",))
    for labels, value in series:
        merged[frozenset((k, v) for k, v in labels.items() if k not in summed)] += value
    if rule in (_MAX, _PER_GPU):
        return max(merged.values())
    if rule == _MIN:
        return min(merged.values())
    groups: dict[str, float] = {}
    for key, value in merged.items():
        dp = dict(key).get("dp_rank", "")
        groups[dp] = max(groups.get(dp, value), value)
    return sum(groups.values())


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """The server-info settings the runbooks use (only keys the server sent) and its top-level key count."""

    args: Mapping[str, Any]
    raw_keys: int


def parse_server_info(body: bytes) -> ServerInfo:
    """Parse a /server_info or /get_server_info body; HttpError(BAD_BODY) unless a JSON object."""
    try:
        raw = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise HttpError(Reason.BAD_BODY, f"not JSON: {str(exc)[:120]}") from None
    if not isinstance(raw, dict):
        raise HttpError(Reason.BAD_BODY, f"JSON {type(raw).__name__}, not an object")
    args = {k: raw[k] for k in INFO_KEYS if k in raw and isinstance(raw[k], str | int | float | bool | type(None))}
    if args.get("max_total_num_tokens") is None:
        # Releases that keep scheduler info per DP rank put it in internal_states only; rank 0 first,
        # the same per-rank meaning as the top-level value.
        states = raw.get("internal_states")
        for state in states if isinstance(states, list) else [states]:
            value = state.get("max_total_num_tokens") if isinstance(state, dict) else None
            if isinstance(value, int | float) and not isinstance(value, bool):
                args["max_total_num_tokens"] = value
                break
    return ServerInfo(MappingProxyType(args), len(raw))
