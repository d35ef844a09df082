"""Sparsemax (Martins & Astudillo 2016): the Euclidean projection of the scores onto the simplex.

``sparsemax(z)_i = max(z_i - tau, 0)`` with the threshold ``tau`` chosen so the output sums
to one. The threshold is exact: found on the sorted scores (small rows), or by Newton
(Michelot) steps on ``f(tau) = sum_i max(z_i - tau, 0) - 1`` followed by the closed-form
solve ``tau = (sum_S z - 1) / |S|`` on the found support ``S`` (long rows). The backward
is the support-restricted Jacobian-vector product ``J^T g = s * (g - mean_S(g))``.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from ._common import apply_last
from ._threshold import SORT_MAX_N, root_threshold, sort_threshold


def sparsemax_threshold(z: Tensor) -> Tensor:
    """Exact sparsemax threshold ``(..., 1)`` of ``z: (..., n)`` (``-inf`` allowed; ``+inf``
    for a row without finite entries): sort-based on short rows, pruned Newton on long ones."""
    if z.shape[-1] <= SORT_MAX_N:
        return sort_threshold(z, 1.0)
    return root_threshold(z, 1.0)


def sparsemax_backward(p: Tensor, grad: Tensor) -> Tensor:
    """``J^T grad`` of sparsemax at output ``p``, both ``(..., n)``: ``s * (grad - mean_S(grad))``
    with ``s`` the support indicator; zero off the support and for empty rows."""
    s = p.sign()
    k = s.sum(dim=-1, keepdim=True).clamp_(min=1)
    mean = torch.linalg.vecdot(grad, s).unsqueeze(-1).div_(k)
    return (grad - mean).mul_(s)


class SparsemaxFunction(torch.autograd.Function):
    """Sparsemax over the last dim of a float32/float64 tensor (``-inf`` entries -> 0)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # type: ignore[override]
        p = (x - sparsemax_threshold(x)).clamp_(min=0)
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # type: ignore[override]
        (p,) = ctx.saved_tensors
        return sparsemax_backward(p, grad)


def sparsemax(scores: Tensor, dim: int = -1, mask: Optional[Tensor] = None) -> Tensor:
    """Exact sparsemax of ``scores`` along ``dim``.

    scores: any shape, float (half precisions are computed in float32 and returned in the
    input dtype); mask: bool, broadcastable to ``scores``, True = keep. Masked and ``-inf``
    entries get exact zeros; a row without any kept finite entry is all zeros (zero gradient).
    Returns probabilities of the shape and dtype of ``scores``, summing to one along ``dim``.
    """
    return apply_last(SparsemaxFunction.apply, scores, dim, mask)


class Sparsemax(nn.Module):
    """Module form of :func:`sparsemax` over a fixed ``dim``."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, scores: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return sparsemax(scores, dim=self.dim, mask=mask)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"
