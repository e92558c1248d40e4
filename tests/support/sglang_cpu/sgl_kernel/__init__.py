"""A CPU stand-in for the CUDA-only `sgl_kernel` package (test support for tests/support/live_sglang.py only).

SGLang 0.5.23's CPU engine, on a CPU without AMX, calls one op of it on the path the live tests drive:
`assign_req_to_token_pool_cpu`, which writes each request's new token indices into its row of the req-to-token
table. That op is implemented here in plain torch; every other name is a stub that raises NotImplementedError, so a
path that would need a real kernel fails loudly instead of computing something wrong.
"""

from __future__ import annotations

from typing import Any

import torch


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """req_to_token[row i, start[i]:end[i]] = the next end[i] - start[i] entries of out_cache_loc, request by
    request in batch order (what SGLang's Triton kernel `assign_req_to_token_pool` does on a GPU)."""
    del pool_len  # the row length; req_to_token's own shape says it
    taken = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True):
        length = end - start
        req_to_token[row, start:end] = out_cache_loc[taken : taken + length].to(req_to_token.dtype)
        taken += length


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)

    def stub(*args: object, **kwargs: object) -> None:
        raise NotImplementedError(f"sgl_kernel.{name}: not in the live test's CPU stand-in")

    return stub
