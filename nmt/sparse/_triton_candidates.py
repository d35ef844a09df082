"""A beam search step's best candidates in one Triton pass (CUDA; CPU in Triton's interpreter).

The GPU counterpart of ``_step_candidates.c`` (:func:`nmt.sparse._native.step_candidates`), with
the same values: for groups of ``slots`` rows of log-probabilities ``(G * slots, V)`` and the
scores of their prefixes ``offsets (G * slots,)``, per row the number of finite entries and
whether it holds a NaN or ``+inf``; per group, over its ``slots * V`` concatenated entries, the
``width`` largest candidates ``c = offset + log_prob`` (every non-finite ``c`` as ``-inf``) in
descending order, ties in index order (the lower first), with their indices ``s * V + v``.

Where torch needs about a dozen launches and as many passes over the ``(G, slots, V)``
candidates (``amax`` for the unknown rows, ``add`` and ``nan_to_num`` for the candidates, three
operations for the support sizes, ``topk``), one program per group reads each entry once:

* per block of ``BLOCK`` entries: the flags and counts, then the block's candidates, best first,
  each replacing the worst of the ``width`` kept so far while it beats it (a larger value, or an
  equal one at a lower index); a block whose best does not reach the worst kept is skipped after
  one reduction (after the first blocks, most are);
* at the end the kept candidates are written in descending order.

Every group has at least ``width`` entries (the wrapper refuses other widths), so the sentinels the
kept set starts with are all replaced, by ``-inf`` candidates if need be. Grid and block sizes
depend on shapes only: no host synchronisation. float32 only (the search's scores; float64 keeps
the torch path). ``NMT_TRITON_CANDIDATES=0`` turns it off (the torch passes serve: the A/B of a
GPU benchmark).
"""
from __future__ import annotations

import os
from typing import Any, Optional

import torch
from torch import Tensor

from . import _triton

MAX_WIDTH = 64
"""Widest candidate list the kernel keeps (beam size + 1 with a certificate)."""

BLOCK = 1024
"""Entries of a row read at once (rows shorter than that: the next power of two)."""

_SENTINEL = 1 << 62
"""Indices of the kept set's starting entries (``_SENTINEL + j``): above any real index."""

tl: Any = None  # triton.language, bound by nmt.sparse._triton.jitted (the kernel resolves it here)


def _candidates_kernel(LP, OFF, SUP, UNK, TV, TI, slots, V, W: tl.constexpr, W_PAD: tl.constexpr,
                       BLOCK: tl.constexpr):
    g = tl.program_id(0).to(tl.int64)
    neg_inf = float("-inf")
    pos_inf = float("inf")
    ks = tl.arange(0, W_PAD)
    kept = ks < W
    best_v = tl.full([W_PAD], neg_inf, tl.float32)
    best_i = ks.to(tl.int64) + 4611686018427387904  # _SENTINEL + j: distinct, above any index
    none = 9223372036854775807  # no candidate left
    lanes = tl.arange(0, BLOCK)
    for s in range(0, slots):
        row = g * slots + s
        off = tl.load(OFF + row).to(tl.float32)
        unknown = tl.zeros([BLOCK], tl.int32)
        support = tl.zeros([BLOCK], tl.int32)
        for start in range(0, V, BLOCK):
            cols = start + lanes
            inb = cols < V
            x = tl.load(LP + row * V + cols, mask=inb, other=neg_inf).to(tl.float32)
            unknown = unknown | ((x != x) | (x == pos_inf)).to(tl.int32)
            support += ((x > neg_inf) & (x < pos_inf)).to(tl.int32)
            c = off + x
            c = tl.where(c < pos_inf, c, neg_inf)  # NaN and +inf: -inf
            idx = s * V + cols.to(tl.int64)
            avail = inb
            worst_v = tl.min(tl.where(kept, best_v, pos_inf), axis=0)
            if tl.max(tl.where(avail, c, neg_inf), axis=0) >= worst_v:
                for _ in tl.static_range(W):
                    m = tl.max(tl.where(avail, c, neg_inf), axis=0)
                    mi = tl.min(tl.where(avail & (c == m), idx, none), axis=0)
                    wv = tl.min(tl.where(kept, best_v, pos_inf), axis=0)
                    wi = tl.max(tl.where(kept & (best_v == wv), best_i, -1), axis=0)
                    better = (mi < none) & ((m > wv) | ((m == wv) & (mi < wi)))
                    put = kept & (best_v == wv) & (best_i == wi) & better
                    best_v = tl.where(put, m, best_v)
                    best_i = tl.where(put, mi, best_i)
                    avail = avail & (idx != mi)
        tl.store(UNK + row, (tl.max(unknown, axis=0) > 0).to(tl.int8))
        tl.store(SUP + row, tl.sum(support, axis=0))
    taken = ks >= W
    for j in tl.static_range(W):
        m = tl.max(tl.where(taken, neg_inf, best_v), axis=0)
        mi = tl.min(tl.where((~taken) & (best_v == m), best_i, none), axis=0)
        tl.store(TV + g * W + j, m)
        tl.store(TI + g * W + j, mi)
        taken = taken | (best_i == mi)


def _kernel(x: Optional[Tensor] = None) -> Any:
    """The jitted kernel for launches on ``x`` (the compiled one on CUDA, the interpreter's on the CPU;
    without ``x``, for the current ``TRITON_INTERPRET`` setting: :func:`nmt.sparse._triton.jitted`)."""
    return _triton.jitted(_candidates_kernel, "nmt.sparse._triton_candidates", x)


def available(log_probs: Tensor, slots: int, width: int) -> bool:
    """Whether :func:`step_candidates` takes ``log_probs: (G * slots, V)`` with this ``width``:
    float32 where the kernels run (CUDA; the CPU under ``TRITON_INTERPRET=1``), ``width`` in
    ``[1, min(slots * V, MAX_WIDTH)]``, ``NMT_TRITON_CANDIDATES`` not ``0``. Shapes, dtype and device
    only: no host sync."""
    return (os.environ.get("NMT_TRITON_CANDIDATES", "1") != "0"
            and log_probs.dim() == 2 and log_probs.dtype == torch.float32 and slots >= 1
            and log_probs.size(0) % slots == 0 and 1 <= width <= min(slots * log_probs.size(1), MAX_WIDTH)
            and _triton._runs_here(log_probs))


def step_candidates(log_probs: Tensor, offsets: Tensor, slots: int,
                    width: int) -> Optional[tuple[Tensor, Tensor, Tensor, Tensor]]:
    """``(support (G * slots,) int32, unknown (G * slots,) bool, values (G, width), index (G, width)
    long)`` of the rows ``log_probs: (G * slots, V)`` and ``offsets: (G * slots,)`` (see the module
    docstring), on their device; None where :func:`available` says no, or where the kernel fails to
    build (:func:`nmt.sparse._triton.launched`: warned once, torch's passes serve). No host
    synchronisation."""
    if not available(log_probs, slots, width):
        return None
    n, v = log_probs.shape
    groups = n // slots
    log_probs = log_probs.detach().contiguous()
    offsets = offsets.detach().reshape(-1).to(torch.float32).contiguous()
    device = log_probs.device
    support = torch.empty(n, dtype=torch.int32, device=device)
    unknown = torch.empty(n, dtype=torch.int8, device=device)
    values = torch.empty(groups, width, dtype=torch.float32, device=device)
    index = torch.empty(groups, width, dtype=torch.long, device=device)
    if groups:
        block = min(BLOCK, _triton.pad_pow2(v, 16))
        if not _triton.launched("nmt.sparse._triton_candidates", lambda: _kernel(log_probs)[(groups,)](
                log_probs, offsets, support, unknown, values, index, slots, v, W=width,
                W_PAD=_triton.pad_pow2(width, 2), BLOCK=block, num_warps=4 if block >= 512 else 1)):
            return None
    return support, unknown.view(torch.bool), values, index


__all__ = ["BLOCK", "MAX_WIDTH", "available", "step_candidates"]
