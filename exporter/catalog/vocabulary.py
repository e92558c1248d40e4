"""The catalog's vocabulary: the closed lists a catalog entry may use (event fields, severities, phases,
suggestion rules, the shape of a kind id). The loader checks against them; other code may import them.
"""

from __future__ import annotations

import re

# Named groups a pattern may capture: the numeric and textual fields of an event. Anything else is a typo.
EVENT_FIELDS = frozenset(
    {
        "requested_tokens",
        "available_tokens",
        "req_slots_available",
        "req_slots_requested",
        "retracted_requests",
        "aborted_retracted_requests",
        "new_tokens_gained",
        "mamba_num_gained",
        "new_token_ratio_from",
        "new_token_ratio_to",
        "rid",
        "mem_fraction_static",
        "tried_to_allocate",
        "leak_available",
        "leak_total",
        "leaked_full_pages",
        "leaked_mamba_pages",
    }
)
SEVERITIES = ("critical", "warning", "info")
PHASES = ("prefill", "decode", "frames", "none")
PHASE_GROUPS = ("spec_verify", "decode", "prefill")
# The phases a KV failure is resolved to; `phase_kinds` in the catalog names the kind each one counts as.
KV_PHASES = ("prefill", "decode")
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
