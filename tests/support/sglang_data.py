"""What a fake SGLang serves in the end-to-end tests: a v0.5.16 data-parallel /metrics page (METRICS) and the
/get_server_info answer of the same server (INFO), whose numbers the exporter joins to an OOM's event.

Not in fake_sglang.py: that file also runs alone inside a container (tests/test_chart_pods.py), without tests/data.
"""

from __future__ import annotations

from pathlib import Path

METRICS = (Path(__file__).resolve().parents[1] / "data" / "scrape" / "v0.5.16-dp2.prom").read_bytes()
INFO = {
    "chunked_prefill_size": 16384, "max_prefill_tokens": 16384, "max_running_requests": 256,
    "mem_fraction_static": 0.88, "page_size": 1, "context_length": 32768, "max_total_num_tokens": 61440,
    "version": "0.5.16", "internal_states": [{"last_gen_throughput": 1.0}],
}  # fmt: skip
