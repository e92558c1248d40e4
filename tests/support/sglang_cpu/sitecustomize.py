"""One-call fault injection for the live SGLang tests (tests/support/live_sglang.py), inactive unless asked.

SGLang's admission control (the input length check, max_new_tokens clipped to the pool, the prefill budgets,
decode retraction) stops every natural attempt to exhaust its KV pool. So, when LIVE_SGLANG_FAULT names a row of
FAULTS, one allocator method is wrapped, once its module is imported, to report "no room" exactly as it does when
its free list is too short (it returns None) for a call at least as large as the row's threshold. SGLang's own
code does the rest: its message, its logger.error, the raise and the teardown are all real.

This file is on PYTHONPATH only for the server the harness starts, so every Python process of that server (the
scheduler is a spawned child) reads it; it does nothing for any other process.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

ENV = "LIVE_SGLANG_FAULT"


def _extend_tokens(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """alloc_extend(prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens, ...)."""
    return int(kwargs["extend_num_tokens"] if "extend_num_tokens" in kwargs else args[5])


def _max_seq_len(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """alloc_decode(seq_lens, seq_lens_cpu, last_loc): the longest sequence of the batch."""
    seq_lens_cpu = kwargs["seq_lens_cpu"] if "seq_lens_cpu" in kwargs else args[1]
    return int(seq_lens_cpu.max().item())


# name: (module, class, method, the call's size, threshold): the method returns None for a size >= threshold.
FAULTS: dict[str, tuple[str, str, str, Callable[[tuple[Any, ...], dict[str, Any]], int], int]] = {
    # the generic "Out of memory. Try to lower your batch size." (page size 1): ask for >= 100 tokens
    "generic": ("sglang.srt.mem_cache.allocator.token", "TokenToKVPoolAllocator", "alloc",
                lambda a, k: int(k.get("need_size", a[0] if a else 0)), 100),
    # "Prefill out of memory. ..." (--page-size 16): extend >= 100 tokens
    "prefill": ("sglang.srt.mem_cache.allocator.paged", "PagedTokenToKVPoolAllocator", "alloc_extend",
                _extend_tokens, 100),
    # "Decode out of memory. ..." (--page-size 16): a sequence reaches 30 tokens
    "decode": ("sglang.srt.mem_cache.allocator.paged", "PagedTokenToKVPoolAllocator", "alloc_decode",
               _max_seq_len, 30),
    # "alloc_req_slots runs out of memory. ...": a batch of >= 3 requests asks for slots
    "req_slots": ("sglang.srt.mem_cache.memory_pool", "ReqToTokenPool", "alloc",
                  lambda a, k: len(k.get("reqs", a[0] if a else [])), 3),
}  # fmt: skip


def _wrap(module: ModuleType, fault: str) -> None:
    _, cls_name, method, size, threshold = FAULTS[fault]
    cls = getattr(module, cls_name)
    original = getattr(cls, method)

    def no_room(self: object, *args: Any, **kwargs: Any) -> Any:
        if size(args, kwargs) >= threshold:
            return None
        return original(self, *args, **kwargs)

    setattr(cls, method, no_room)


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when the fault's module is found, its loader wraps the method after running it."""

    def __init__(self, fault: str) -> None:
        self.fault = fault
        self.module = FAULTS[fault][0]

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname != self.module:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader, fault = spec.loader, self.fault

        class Loader(importlib.abc.Loader):
            def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
                return loader.create_module(spec)

            def exec_module(self, module: ModuleType) -> None:
                loader.exec_module(module)
                _wrap(module, fault)

        spec.loader = Loader()
        return spec


_fault = os.environ.get(ENV, "")
if _fault:
    if _fault not in FAULTS:
        raise SystemExit(f"{ENV}={_fault!r}: not one of {sorted(FAULTS)}")
    sys.meta_path.insert(0, _WrapOnImport(_fault))
