"""Count the host synchronisations a piece of work makes, on the device it runs on.

On CUDA ``torch.cuda.set_sync_debug_mode("warn")`` makes every synchronising CUDA call (a
device-to-host copy, ``.item()``, ``nonzero``, a blocking stream wait) emit a warning; they
are counted. On the CPU nothing really synchronises, so ``SyncAudit`` counts the calls that
would (``.item()``, ``.tolist()``, ``bool(t)``, ``nonzero``, boolean-mask indexing, ...). The
benchmarks report both as "host syncs"; the CPU count is an upper bound of the CUDA one.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

from nmt.utils.sync_audit import count_host_syncs


def count_host_syncs_on(device: torch.device | str, fn: Callable[[], Any]) -> tuple[Any, int]:
    """Run ``fn()``; return ``(its result, host syncs counted)`` (see the module docstring)."""
    if torch.device(device).type != "cuda":
        result, audit = count_host_syncs(fn)
        return result, audit.total
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = fn()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return result, sum("synchronizing" in str(w.message) for w in caught)


__all__ = ["count_host_syncs_on"]
