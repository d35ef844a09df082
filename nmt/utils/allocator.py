"""Keep freed memory in the process: glibc malloc tuning for the CPU training/decoding loops
(and :func:`freeze_live_objects`, which keeps the garbage collector off the loaded objects).

Every training step allocates and frees the same large temporaries (logits, probabilities and
their gradients: batch tokens x vocabulary floats, tens of MB). glibc serves blocks above its
mmap threshold with fresh ``mmap`` pages and unmaps them on ``free``, so each step pays page
faults on every such tensor again; measured here that costs 5-30% of a CPU training step and
swings timings by up to 2x. :func:`keep_freed_memory` makes glibc serve large blocks from the
heap and never trim it, so the memory of one step is reused by the next. It is a no-op off
glibc (macOS, Windows, musl) and when ``NMT_MALLOC_TUNING=0`` is set.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import sys

M_TRIM_THRESHOLD = -1  # glibc malloc.h
M_MMAP_MAX = -4
_done = False


def _glibc(name: str, argtypes: list) -> ctypes._CFuncPtr | None:
    """The C library's function ``name`` taking ``argtypes`` and returning an int, or None where
    the C library has none (not glibc) or cannot be loaded."""
    try:
        function = getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):  # not glibc
        return None
    function.argtypes, function.restype = argtypes, ctypes.c_int
    return function


def keep_freed_memory() -> bool:
    """Tune glibc's malloc once per process (no mmap for large blocks, no heap trimming).

    Returns True when the tuning is in effect (now or from an earlier call).
    """
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux") or os.environ.get("NMT_MALLOC_TUNING", "1") == "0":
        return False
    mallopt = _glibc("mallopt", [ctypes.c_int, ctypes.c_int])
    if mallopt is None:
        return False
    _done = bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
    return _done


def release_freed_memory() -> bool:
    """Return the heap's free memory to the system now (glibc ``malloc_trim(0)``).

    For after a one-off peak (building a token-id cache) in a process that
    :func:`keep_freed_memory` told never to trim. Returns True when glibc released something.
    """
    if not sys.platform.startswith("linux"):
        return False
    trim = _glibc("malloc_trim", [ctypes.c_size_t])
    if trim is None:
        return False
    return bool(trim(0))


def freeze_live_objects() -> None:
    """Exempt every Python object alive now from the cyclic garbage collector (``gc.freeze``).

    After torch is imported and a model loaded, a process holds some 170,000 objects, and each
    full collection scans them all (85 ms measured); the allocation churn of a decoding or
    training loop triggers such collections now and then (one fell inside the first batches of
    every ``nmt-translate`` run). Frozen objects are never freed by the collector (reference
    counting still frees them): a program's entry point calls it after loading and
    :func:`thaw_live_objects` when it ends (the CLIs also run inside test processes).
    """
    gc.freeze()


def thaw_live_objects() -> None:
    """Undo :func:`freeze_live_objects` (``gc.unfreeze``): frozen objects are collectable again."""
    gc.unfreeze()


__all__ = ["freeze_live_objects", "keep_freed_memory", "release_freed_memory", "thaw_live_objects"]
