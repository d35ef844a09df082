"""The static search loop's masking of stopped sentences in one Triton launch (CUDA; the CPU in
Triton's interpreter).

After a static step (:func:`nmt.translate.static_search.static_step`) the sentences that had
stopped before it keep their certificate and record the history's fill values, the sentences
stopping now lose their live prefixes, and the model state is gathered by flat parent rows. In
torch that is about eleven launches on ``(B,)`` and ``(B, K)`` tensors (a ``masked_fill`` per
record, two ``where``, an ``or``, the flat parents' ``arange``, ``mul`` and ``add``); here it is
one (GPU time unmeasured), with the same values: :func:`nmt.translate.static_search.mask_stopped`
is the torch reference and serves every other case. Grid and sizes depend on shapes only: no
host synchronisation. ``NMT_TRITON_MASK=0`` turns it off (the torch code serves).
"""
from __future__ import annotations

import os
from typing import Any, NamedTuple, Optional

import torch
from torch import Tensor

from nmt.sparse import _triton

tl: Any = None  # triton.language, bound by nmt.sparse._triton.jitted (the kernel resolves it here)

BLOCK_ROWS = 32
"""Sentences per program."""


class StoppedMask(NamedTuple):
    """A static step's outputs with its stopped sentences masked (B sentences, K slots)."""

    token: Tensor  # (B, K) long the step's tokens, ``pad`` where the sentence had stopped
    parent: Tensor  # (B, K) long the step's parents, 0 where it had stopped
    score: Tensor  # (B, K) the step's scores, -inf where it had stopped
    support: Optional[Tensor]  # (B, K) int32 support sizes, 0 where it had stopped (None: not recorded)
    live: Tensor  # (B, K) live prefixes, -inf where the sentence has stopped (before or at this step)
    exact: Tensor  # (B,) bool the certificate: the one before the step where it had stopped
    reason: Tensor  # (B,) long likewise
    stopped: Tensor  # (B,) bool stopped before or at this step
    flat_parent: Tensor  # (B * K,) long row of the previous step's B * S rows each slot extends


def _static_mask_kernel(STOPPED, DONE, TOKEN, PARENT, SCORE, SUPPORT, LIVE, EX_NEW, WHY_NEW, EX_OLD, WHY_OLD,
                        TOKEN_O, PARENT_O, SCORE_O, SUPPORT_O, LIVE_O, EX_O, WHY_O, STOPPED_O, FLAT_O,
                        rows, slots, pad, K: tl.constexpr, K_PAD: tl.constexpr, BLOCK_R: tl.constexpr,
                        HAS_SUPPORT: tl.constexpr):
    neg_inf = float("-inf")
    rs = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)  # (BLOCK_R,) sentences
    rm = rs < rows
    before = tl.load(STOPPED + rs, mask=rm, other=0) != 0
    now = before | (tl.load(DONE + rs, mask=rm, other=0) != 0)
    ex = tl.where(before, tl.load(EX_OLD + rs, mask=rm, other=0), tl.load(EX_NEW + rs, mask=rm, other=0))
    why = tl.where(before, tl.load(WHY_OLD + rs, mask=rm, other=0), tl.load(WHY_NEW + rs, mask=rm, other=0))
    tl.store(EX_O + rs, ex, mask=rm)
    tl.store(WHY_O + rs, why, mask=rm)
    tl.store(STOPPED_O + rs, now.to(tl.int8), mask=rm)
    js = tl.arange(0, K_PAD)
    at = rs[:, None] * K + js[None, :]  # (BLOCK_R, K_PAD)
    m = rm[:, None] & (js[None, :] < K)
    was = before[:, None]
    parent = tl.load(PARENT + at, mask=m, other=0)
    tl.store(FLAT_O + at, rs[:, None] * slots + parent, mask=m)
    tl.store(PARENT_O + at, tl.where(was, 0, parent), mask=m)
    tl.store(TOKEN_O + at, tl.where(was, pad, tl.load(TOKEN + at, mask=m, other=0)), mask=m)
    tl.store(SCORE_O + at, tl.where(was, neg_inf, tl.load(SCORE + at, mask=m, other=0.0)), mask=m)
    if HAS_SUPPORT:
        tl.store(SUPPORT_O + at, tl.where(was, 0, tl.load(SUPPORT + at, mask=m, other=0)), mask=m)
    tl.store(LIVE_O + at, tl.where(now[:, None], neg_inf, tl.load(LIVE + at, mask=m, other=0.0)), mask=m)


def _kernel(x: Optional[Tensor] = None) -> Any:
    """The jitted kernel for launches on ``x`` (the compiled one on CUDA, the interpreter's on the CPU;
    without ``x``, for the current ``TRITON_INTERPRET`` setting: :func:`nmt.sparse._triton.jitted`)."""
    return _triton.jitted(_static_mask_kernel, "nmt.translate.triton_static_mask", x)


def mask_stopped(stopped: Tensor, done: Tensor, token: Tensor, parent: Tensor, score: Tensor,
                 support: Optional[Tensor], live: Tensor, exact: Tensor, reason: Tensor, old_exact: Tensor,
                 old_reason: Tensor, *, slots: int, pad: int) -> Optional[StoppedMask]:
    """:func:`nmt.translate.static_search.mask_stopped`'s values in one launch: ``stopped`` (B,)
    bool the sentences stopped before the step, ``done`` (B,) bool those that may stop now;
    ``token``, ``parent`` (B, K) long, ``score``, ``live`` (B, K) float32 and ``support`` (B, K) int32
    (or None) the step's records and live prefixes; ``exact``, ``reason`` (B,) the certificate after
    the step, ``old_exact``, ``old_reason`` before it; ``slots``: the previous step's slots per
    sentence (for the flat parents). New tensors. None where the kernel does not run here (not
    CUDA, nor the CPU under ``TRITON_INTERPRET=1``), for other dtypes or non-contiguous (B, K)
    records, with ``NMT_TRITON_MASK=0``, or where the kernel fails to build (warned once). No host
    synchronisation."""
    pairs = [token, parent, score, live] + ([] if support is None else [support])
    if (os.environ.get("NMT_TRITON_MASK", "1") == "0" or score.dtype != torch.float32 or live.dtype != torch.float32
            or token.dtype != torch.long or parent.dtype != torch.long
            or (support is not None and support.dtype != torch.int32)
            or any(t.dim() != 2 or t.shape != score.shape or not t.is_contiguous() for t in pairs)
            or not stopped.dtype == done.dtype == exact.dtype == old_exact.dtype == torch.bool
            or not _triton._runs_here(score)):
        return None
    rows, k = score.shape
    device = score.device
    out_token, out_parent, flat = (torch.empty(rows, k, dtype=torch.long, device=device) for _ in range(3))
    out_score, out_live = torch.empty_like(score), torch.empty_like(live)
    out_support = None if support is None else torch.empty_like(support)
    flags = torch.empty(2, rows, dtype=torch.int8, device=device)  # exact, stopped
    out_reason = torch.empty_like(reason)
    if rows:
        as_bytes = [t.contiguous().view(torch.int8) for t in (stopped, done)]
        grid = ((rows + BLOCK_ROWS - 1) // BLOCK_ROWS,)
        if not _triton.launched("nmt.translate.triton_static_mask", lambda: _kernel(score)[grid](
                *as_bytes, token, parent, score, score if support is None else support, live,
                exact.contiguous().view(torch.int8), reason.contiguous(), old_exact.contiguous().view(torch.int8),
                old_reason.contiguous(), out_token, out_parent, out_score,
                out_score if out_support is None else out_support, out_live, flags[0], out_reason, flags[1], flat,
                rows, slots, pad, K=k, K_PAD=_triton.pad_pow2(k, 2), BLOCK_R=BLOCK_ROWS,
                HAS_SUPPORT=support is not None, num_warps=1)):
            return None
    new_exact, new_stopped = flags.view(torch.bool).unbind(0)
    return StoppedMask(out_token, out_parent, out_score, out_support, out_live, new_exact, out_reason, new_stopped,
                       flat.view(-1))


__all__ = ["BLOCK_ROWS", "StoppedMask", "mask_stopped"]
