"""A beam search step's bookkeeping in one Triton launch (CUDA; CPU in Triton's interpreter).

The GPU counterpart of ``_step_update.c`` (:func:`nmt.translate.native_step.step_update`), with
the same definition and values, from the step's candidates: each row's kept candidates (scores,
parents, tokens, live prefixes), its certificate (a live slot with a NaN / ``+inf``
log-probability, then a finite candidate left out), its ``n_best`` best finished scores (the old
ones and this step's finished candidates divided by the length penalty, descending), whether a
step's best candidate finished, and whether the row may stop. One program per row; divisions are
IEEE-rounded float32 ones, as torch's. Where torch's operations launch about thirty kernels on
(R, K) tensors, this is one launch (GPU time unmeasured). Grid and sizes depend on shapes only:
no host synchronisation. float32 only (float64 keeps the torch code). ``NMT_TRITON_STEP=0`` turns
it off (the torch code serves: the A/B of a GPU benchmark).
"""
from __future__ import annotations

import os
from typing import Any, Optional

import torch
from torch import Tensor

from nmt.sparse import _triton
from nmt.translate.native_step import MAX_BEST, StepUpdate

tl: Any = None  # triton.language, bound by nmt.sparse._triton.jitted (the kernel resolves it here)


def _step_update_kernel(PREV, UNK, TV, TI, EX_IN, WHY_IN, BEST_IN, TOP_IN, SCORE, LIVE, PARENT, TOKEN, EX, WHY,
                        BEST, TOP, DONE, slots, width, vocab, eos, penalty, bound, code_nonfinite, code_pruned,
                        K: tl.constexpr, K_PAD: tl.constexpr, NB: tl.constexpr, NB_PAD: tl.constexpr,
                        S_PAD: tl.constexpr, CERTIFY: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    neg_inf = float("-inf")
    ex = tl.load(EX_IN + r) != 0
    why = tl.load(WHY_IN + r)
    if CERTIFY:
        ss = tl.arange(0, S_PAD)
        sm = ss < slots
        unknown = tl.load(UNK + r * slots + ss, mask=sm, other=0) != 0
        prev = tl.load(PREV + r * slots + ss, mask=sm, other=neg_inf)
        nonfinite = tl.max((unknown & (prev > neg_inf)).to(tl.int32), axis=0) > 0
        why = tl.where(nonfinite & ex, code_nonfinite, why)
        ex = ex & (~nonfinite)
        if width > K:
            pruned = tl.load(TV + r * width + K) > neg_inf
            why = tl.where(pruned & ex, code_pruned, why)
            ex = ex & (~pruned)
    js = tl.arange(0, K_PAD)
    jm = js < K
    v = tl.load(TV + r * width + js, mask=jm, other=neg_inf)
    ti = tl.load(TI + r * width + js, mask=jm, other=0)
    parent = ti // vocab
    token = ti - parent * vocab
    is_eos = token == eos
    finished = is_eos & (v > neg_inf) & jm
    kept = tl.where(is_eos, neg_inf, v)
    tl.store(SCORE + r * K + js, v, mask=jm)
    tl.store(LIVE + r * K + js, kept, mask=jm)
    tl.store(PARENT + r * K + js, parent, mask=jm)
    tl.store(TOKEN + r * K + js, token, mask=jm)
    any_live = tl.max(((kept > neg_inf) & jm).to(tl.int32), axis=0) > 0
    max_live = tl.max(tl.where(jm, kept, neg_inf), axis=0)
    first_finished = tl.max((finished & (js == 0)).to(tl.int32), axis=0) > 0
    # the NB best of the old finished scores and this step's, descending (values only)
    new = tl.where(finished, tl.math.div_rn(v, penalty), neg_inf)
    new_left = jm
    bs = tl.arange(0, NB_PAD)
    old_left = bs < NB
    old = tl.load(BEST_IN + r * NB + bs, mask=old_left, other=neg_inf)
    worst = neg_inf
    for i in tl.static_range(NB):
        m = tl.maximum(tl.max(tl.where(old_left, old, neg_inf), axis=0),
                       tl.max(tl.where(new_left, new, neg_inf), axis=0))
        at_old = tl.min(tl.where(old_left & (old == m), bs, NB_PAD), axis=0)
        from_old = at_old < NB_PAD
        old_left = old_left & ((bs != at_old) | (~from_old))
        at_new = tl.min(tl.where(new_left & (new == m), js, K_PAD), axis=0)
        new_left = new_left & ((js != at_new) | from_old)
        tl.store(BEST + r * NB + i, m)
        worst = m
    top = (tl.load(TOP_IN + r) != 0) | first_finished
    settled = (worst > neg_inf) & (top | (worst >= tl.math.div_rn(max_live, bound)))
    if CERTIFY:
        settled = settled & (~ex)
    tl.store(EX + r, ex.to(tl.int8))
    tl.store(WHY + r, why)
    tl.store(TOP + r, top.to(tl.int8))
    tl.store(DONE + r, ((~any_live) | settled).to(tl.int8))


def _kernel(x: Optional[Tensor] = None) -> Any:
    """The jitted kernel for launches on ``x`` (the compiled one on CUDA, the interpreter's on the CPU;
    without ``x``, for the current ``TRITON_INTERPRET`` setting: :func:`nmt.sparse._triton.jitted`)."""
    return _triton.jitted(_step_update_kernel, "nmt.translate.triton_step", x)


def step_update(top_scores: Tensor, top_index: Tensor, prev_scores: Tensor, unknown: Tensor, exact: Tensor,
                reason: Tensor, best_finished: Tensor, top_finished: Tensor, *, beam_size: int, vocab: int,
                eos: int, certify: bool, penalty: float, bound_penalty: float, nonfinite_code: int,
                pruned_code: int) -> Optional[StepUpdate]:
    """:func:`nmt.translate.native_step.step_update` (same arguments and outputs) in one Triton
    launch, for float32 tensors where the kernels run (CUDA; the CPU under ``TRITON_INTERPRET=1``);
    None elsewhere, for other sizes than the native call takes (W < K, W > K + 1, n_best + K >
    :data:`MAX_BEST`), with ``NMT_TRITON_STEP=0``, or where the kernel fails to build
    (:func:`nmt.sparse._triton.launched`: warned once, the torch code serves). New tensors; no host
    synchronisation."""
    rows, width = top_scores.shape
    slots = prev_scores.size(1)
    n_best = best_finished.size(1)
    if (os.environ.get("NMT_TRITON_STEP", "1") == "0" or top_scores.dtype != torch.float32
            or prev_scores.dtype != torch.float32 or best_finished.dtype != torch.float32
            or not beam_size <= width <= beam_size + 1 or n_best + beam_size > MAX_BEST
            or not unknown.dtype == exact.dtype == top_finished.dtype == torch.bool
            or not _triton._runs_here(top_scores)):
        return None
    device = top_scores.device
    score = torch.empty(rows, beam_size, dtype=torch.float32, device=device)
    live = torch.empty_like(score)
    parent = torch.empty(rows, beam_size, dtype=torch.long, device=device)
    token = torch.empty_like(parent)
    flags = torch.empty(3, rows, dtype=torch.int8, device=device)  # exact, top_finished, done
    new_reason = torch.empty(rows, dtype=torch.long, device=device)
    new_best = torch.empty(rows, n_best, dtype=torch.float32, device=device)
    if rows:
        inputs = [t.contiguous() for t in (prev_scores, unknown.view(torch.int8), top_scores, top_index,
                                           exact.view(torch.int8), reason, best_finished,
                                           top_finished.view(torch.int8))]
        if not _triton.launched("nmt.translate.triton_step", lambda: _kernel(top_scores)[(rows,)](
                *inputs, score, live, parent, token, flags[0], new_reason, new_best, flags[1], flags[2], slots,
                width, vocab, eos, float(penalty), float(bound_penalty), nonfinite_code, pruned_code, K=beam_size,
                K_PAD=_triton.pad_pow2(beam_size, 2), NB=n_best, NB_PAD=_triton.pad_pow2(n_best, 2),
                S_PAD=_triton.pad_pow2(slots, 2), CERTIFY=bool(certify), num_warps=1)):
            return None
    new_exact, new_top, done = flags.view(torch.bool).unbind(0)
    return StepUpdate(score, live, parent, token, new_exact, new_reason, new_best, new_top, done)


__all__ = ["step_update"]
