"""Count the host synchronisations a piece of work makes, on the device it runs on.

On CUDA ``torch.cuda.set_sync_debug_mode("warn")`` makes every synchronising CUDA call (a
device-to-host copy, ``.item()``, ``nonzero``, a blocking stream wait) emit a warning; they
are counted. On the CPU nothing really synchronises, so ``SyncAudit`` counts the calls that
would (``.item()``, ``.tolist()``, ``bool(t)``, ``nonzero``, boolean-mask indexing, ...). The
benchmarks report both as "host syncs"; the CPU count is an upper bound of the CUDA one.
"""
from __future__ import annotations

import warnings
from collections import Counter
from typing import Any, Callable

import torch

from nmt.utils.sync_audit import count_host_syncs


SYNC_WARNING = "called a synchronizing CUDA operation"
"""The text of the sync debug mode's warning for each synchronising call (its first use in a
process also warns that the mode is a prototype that does not catch every sync: not a sync, and
counted as one until 2026-11-26, which put one extra sync in the first measurement of a process)."""


def count_host_syncs_on(device: torch.device | str, fn: Callable[[], Any]) -> tuple[Any, int]:
    """Run ``fn()``; return ``(its result, host syncs counted)`` (see the module docstring)."""
    result, sites = host_sync_sites_on(device, fn)
    return result, sum(sites.values())


def host_sync_sites_on(device: torch.device | str, fn: Callable[[], Any]) -> tuple[Any, Counter[str]]:
    """Run ``fn()``; return ``(its result, {call site: host syncs there})``. A site is the Python
    line that made the call (``file:line``; on CUDA the line the sync debug mode's warning names,
    on the CPU the first frame outside the audit of each kind of call, with the call's name); the
    counts sum to :func:`count_host_syncs_on`'s."""
    if torch.device(device).type != "cuda":
        result, audit = count_host_syncs(fn)
        return result, Counter({f"{audit.sites[name]} ({name})": n for name, n in audit.counts.items()})
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = fn()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return result, Counter(f"{w.filename}:{w.lineno}" for w in caught if SYNC_WARNING in str(w.message))


__all__ = ["count_host_syncs_on", "host_sync_sites_on"]
