"""The catalog's vocabulary: the closed lists a catalog entry may use (event fields, severities, phases,
suggestion rules, the shape of a kind id). The loader checks against them; other code may import them.

It is also the one home of the names detection shares with the catalog: the phases, the phase-frame groups
and the KV pools an event names. detect/ and advise/ import them and never spell them again.
"""

from __future__ import annotations

import re

# Named groups a pattern may capture: the numeric and textual fields of an event, each with its type. Anything
# else is a typo. Types: int (a count of tokens, slots, pages or requests), float (a ratio or fraction), text
# (kept as logged: a request id, "2.00 GiB"), count (a logged set such as "{3, 7}", counted: 2; "None" is 0).
FIELD_TYPES: dict[str, str] = {
    "requested_tokens": "int",
    "available_tokens": "int",
    "req_slots_available": "int",
    "req_slots_requested": "int",
    "retracted_requests": "int",
    "aborted_retracted_requests": "int",
    "new_tokens_gained": "int",
    "mamba_num_gained": "int",
    "new_token_ratio_from": "float",
    "new_token_ratio_to": "float",
    "rid": "text",
    "mem_fraction_static": "float",
    # SGLang's own start-up arithmetic (2026 wording): raise --mem-fraction-static above this, and its
    # "minimum viable" value (facts 11.10).
    "mem_fraction_floor": "float",
    "mem_fraction_viable": "float",
    "tried_to_allocate": "text",
    "leak_available": "int",
    "leak_total": "int",
    "leaked_full_pages": "count",
    "leaked_mamba_pages": "count",
    # KV page invariants (facts 11.2): the sub-pool and its duplicate pages; owner page refs found free.
    "sub_pool": "int",
    "double_free_pages": "int",
    "use_after_free_refs": "int",
    # PD decode pre-allocation (facts 11.4) and DP-attention aborts (facts 11.6).
    "page_size": "int",
    "dp_rank": "int",
    # Host-pool retraction backup smaller than the device pool (facts 11.5).
    "host_slots": "int",
    "device_slots": "int",
    # 2026-08 main (facts 12): the sidecar host pool's index source, in slots (12.5); the Ascend DSv4
    # compressed-KV pool's compression ratio (12.10); HiSparse's compressed length and device-buffer size,
    # in tokens (12.18); host (HiCache) memory asked for and free, in GB of 1e9 bytes (12.14); the int8 mamba
    # checkpoint pool's need and the free HBM, in GiB, and its slots (12.15).
    "source_slots": "int",
    "compress_ratio": "int",
    "compressed_len": "int",
    "alloc_size": "int",
    "host_requested_gb": "float",
    "host_free_gb": "float",
    "ckpt_needed_gib": "float",
    "hbm_free_gib": "float",
    "ckpt_slots": "int",
    # 0.5.23: HiSparse host-pool pages asked for; session-held request slots beside a request-slot leak (held, not
    # leaked); a sharded pool's free pages per class and its counts that are no multiple of the page, as logged; the
    # SWA pool's ask and free tokens in a PD pre-allocation failure.
    "host_pages": "int",
    "leak_session_held": "int",
    "class_free_pages": "text",
    "unaligned_counts": "text",
    "swa_requested_tokens": "int",
    "swa_available_tokens": "int",
    # The exception line a process died of, where no kind's text named it (its frames decided: detect/match.py).
    "exception": "text",
}
FIELD_KINDS = ("int", "float", "text", "count")
EVENT_FIELDS = frozenset(FIELD_TYPES)
SEVERITIES = ("critical", "warning", "info")
# The phases a kind's `phase:` may name. Two are also kind ids of the shipped catalog: this module is the only
# Python that may spell them (tests/test_catalog.py), and the detection modules import these names.
PHASE_PREFILL = "prefill"
PHASE_DECODE = "decode"
PHASE_FRAMES = "frames"  # the traceback frames decide the phase (and an allocator frame may point here too)
PHASE_NONE = "none"  # not a KV allocation
PHASES = (PHASE_PREFILL, PHASE_DECODE, PHASE_FRAMES, PHASE_NONE)
# The groups of `phase_frames`, in the order they are checked. Speculative verify says "Prefill" but is a
# step of decode: SUBPHASES maps such a group to the phase it counts as.
PHASE_SPEC_VERIFY = "spec_verify"
# A PD decode server's pre-allocation (an allocator's `alloc_extend_swa_tail` frame, facts 12.10): no KV phase of
# its own; `phase_kinds` may name the kind a failure under it counts as, and its events have no phase.
PHASE_PD_PREALLOC = "pd_decode_prealloc"
PHASE_GROUPS = (PHASE_PD_PREALLOC, PHASE_SPEC_VERIFY, PHASE_DECODE, PHASE_PREFILL)
SUBPHASES = {PHASE_SPEC_VERIFY: PHASE_DECODE}
# The phases a KV failure is resolved to; `phase_kinds` in the catalog names the kind each one counts as.
KV_PHASES = (PHASE_PREFILL, PHASE_DECODE)
# The frame groups that are no KV phase and may still name a kind in `phase_kinds` (optional there).
KIND_GROUPS = (PHASE_PD_PREALLOC,)
# The groups of the catalog's `crash_frames`: frames of memory-pool or allocator code, and of the scheduler's start-up.
CRASH_MEMORY = "memory"
CRASH_INIT = "init"
CRASH_LAUNCH = "launch"  # the main process launching the server: its uncaught traceback is a start-up failure
CRASH_FRAME_GROUPS = (CRASH_MEMORY, CRASH_INIT, CRASH_LAUNCH)
# The phases of a KV allocation failure: one of KV_PHASES, or one the frames decide.
KV_FAILURE_PHASES = (*KV_PHASES, PHASE_FRAMES)
# KV pools as an event names them (`pools`, `limiting_pool`): SGLang's older texts say "Available tokens" or
# "full tokens" for the full pool and "swa tokens" for the sliding-window one; any other pool keeps the name
# the message gives it (Available mamba: N, [mamba-active] total=N).
POOL_FULL = "full"
POOL_SWA = "swa"
POOL_MAMBA = "mamba"  # the hybrid model's per-request state pool: its count is state slots, not KV tokens
# Suggestion rules a kind (or one of its patterns) may name in `suggest:`; advise/rules.py implements each.
SUGGEST_RULES = (
    "none",
    "chunked_prefill",
    "running_requests",
    "prefill_or_decode",
    "request_slots",
    "conservativeness",
    "mem_fraction_up",
    "mem_fraction_down",
    "cuda_graph_bs",
    "mamba_cache",
)
ID_RE = re.compile(r"^[a-z][a-z0-9_]*$")
