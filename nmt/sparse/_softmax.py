"""Softmax with a mask: exact zeros where masked, all zeros (and zero gradient) for empty rows.

A row holding NaN or ``+inf`` maps to all NaN, as in every other mapping (never to a row of
zeros, which would read as "nothing kept"). No host synchronisation on any device.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ._common import apply_last, fresh_output


def _softmax_last(x: Tensor) -> Tensor:
    """Softmax over the last dim; a row of only ``-inf`` maps to zeros instead of NaN (a row
    with NaN or ``+inf`` stays NaN). No autograd of its own."""
    empty = x.amax(dim=-1, keepdim=True) == float("-inf")
    return torch.softmax(x, dim=-1).masked_fill_(empty, 0.0)


class SoftmaxFunction(torch.autograd.Function):
    """:func:`_softmax_last` with the softmax's backward."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # type: ignore[override]
        p = fresh_output(_softmax_last(x))
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # type: ignore[override]
        (p,) = ctx.saved_tensors
        return torch._softmax_backward_data(grad.contiguous(), p, -1, p.dtype)


def softmax(scores: Tensor, dim: int = -1, mask: Optional[Tensor] = None) -> Tensor:
    """Softmax of ``scores`` along ``dim``; ``mask`` (bool, broadcastable, True = keep).

    Masked / ``-inf`` entries get exact zeros; rows with nothing kept are all zeros; rows
    holding NaN or ``+inf`` are all NaN.
    Half precisions are computed in float32 and returned in the input dtype.
    Where no gradient is recorded (decoding) the computation runs without the autograd Function:
    the same operations, about 30 us less per call on the CPU (a decoder step calls it once per
    attention module).
    """
    recording = torch.is_grad_enabled() and scores.requires_grad
    return apply_last(SoftmaxFunction.apply if recording else _softmax_last, scores, dim, mask)
