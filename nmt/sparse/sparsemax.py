"""Sparsemax (Martins & Astudillo 2016): the Euclidean projection of the scores onto the simplex.

``sparsemax(z)_i = max(z_i - tau, 0)`` with the threshold ``tau`` chosen so the output sums
to one. The threshold is exact: found on the sorted scores (small rows), or by Newton
(Michelot) steps on ``f(tau) = sum_i max(z_i - tau, 0) - 1`` followed by the closed-form
solve ``tau = (sum_S z - 1) / |S|`` on the found support ``S`` (long rows), verified; on
accelerators (``impl="static"``) a fixed number of verified Newton steps without host
synchronisation (see :mod:`nmt.sparse._dispatch`). Scores are taken relative to the row
maximum. The backward is the support-restricted Jacobian-vector product
``J^T g = s * (g - mean_S(g))``.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from . import _dispatch
from ._common import apply_last, fresh_output, rows, shaped
from ._dispatch import check_impl, resolve_impl, shifted_threshold, takes_half
from ._native import support_backward, support_backward_serves
from ._threshold import native_long_sparsemax, native_sorted_probs


def sparsemax_threshold(z: Tensor, impl: str = "auto") -> Tensor:
    """Exact sparsemax threshold ``(..., 1)`` of ``z: (..., n)`` (``-inf`` allowed; ``+inf``
    for a row without finite entries; NaN for a row holding NaN or ``+inf``).

    ``impl``: ``"auto"`` (CPU: sort-based on short rows, pruned Newton on long ones; other
    devices and ``torch.compile``: static), ``"pruned"``, ``"static"`` (no host sync),
    ``"triton"`` (= static here). See :mod:`nmt.sparse._dispatch`.
    """
    tau, zmax = shifted_threshold(z, 1.0, impl=impl)
    return tau + zmax


def sparsemax_probs(z: Tensor, impl: str = "auto") -> Tensor:
    """``sparsemax(z)`` over the last dim of a float32/64 tensor, without autograd: ``[z - tau]_+``
    computed relative to the row maximum (``-inf`` -> 0; empty rows 0; NaN / ``+inf`` rows NaN).
    ``impl``: ``"auto" | "pruned" | "static"`` (``"triton"`` = static here)."""
    tau, zmax = shifted_threshold(z, 1.0, impl=impl)
    return torch.sub(z, zmax).sub_(tau).clamp_(min=0)


def sparsemax_backward(p: Tensor, grad: Tensor) -> Tensor:
    """``J^T grad`` of sparsemax at output ``p``, both ``(..., n)``: ``s * (grad - mean_S(grad))``
    with ``s`` the support indicator; zero off the support and for empty rows. No host sync."""
    s = p.sign()
    k = s.sum(dim=-1, keepdim=True).clamp_(min=1)
    mean = torch.linalg.vecdot(grad, s).unsqueeze(-1).div_(k)
    return (grad - mean).mul_(s)


class SparsemaxFunction(torch.autograd.Function):
    """Sparsemax over the last dim of a float32/float64 tensor (``-inf`` entries -> 0);
    ``impl`` as in :func:`sparsemax_threshold` (``"triton"``: the fused kernels)."""

    @staticmethod
    def forward(ctx, x: Tensor, impl: str = "auto") -> Tensor:  # type: ignore[override]
        kind = resolve_impl(impl, x)
        fused = None
        long = None
        if kind == "pruned" and not torch.compiler.is_compiling():  # one native call where it serves
            fused = native_sorted_probs(x, 1.0, root=False)
            if fused is None:  # long rows: threshold and p in one native pass a row
                long = native_long_sparsemax(x, squares=False)
        ctx.triton, ctx.native, ctx.pruned = kind == "triton", fused is not None, kind == "pruned"
        if ctx.triton:  # the kernels take (..., n) rows as they are: no view, nor its node
            p = _dispatch.kernels().sparsemax_forward(x)
            ctx.save_for_backward(p)
            return p
        if fused is not None:
            p = fused[0]
        elif long is not None:
            p = long[0]
        else:
            p = fresh_output(sparsemax_probs(x, impl=kind))
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        (p,) = ctx.saved_tensors
        if ctx.triton:
            return _dispatch.kernels().sparsemax_backward(p, grad), None
        if ctx.native or (ctx.pruned and support_backward_serves(p)):  # one native pass (the static path: torch's)
            return shaped(support_backward(rows(p), rows(grad), indicator=True), p.shape), None
        return sparsemax_backward(p, grad), None


def sparsemax(scores: Tensor, dim: int = -1, mask: Optional[Tensor] = None, impl: str = "auto") -> Tensor:
    """Exact sparsemax of ``scores`` along ``dim``.

    scores: any shape, float (half precisions are computed in float32 and returned in the
    input dtype); mask: bool, broadcastable to ``scores``, True = keep. Masked and ``-inf``
    entries get exact zeros; a row without any kept finite entry is all zeros (zero gradient);
    a row holding NaN or ``+inf`` is all NaN. ``impl``: ``"auto" | "pruned" | "static" |
    "triton"`` (see :mod:`nmt.sparse._dispatch`; ``"static"`` never synchronises with the host).
    Returns probabilities of the shape and dtype of ``scores``, summing to one along ``dim``.
    """
    check_impl(impl)
    return apply_last(lambda x: SparsemaxFunction.apply(x, impl), scores, dim, mask, takes_half(impl))


class Sparsemax(nn.Module):
    """Module form of :func:`sparsemax` over a fixed ``dim``."""

    def __init__(self, dim: int = -1, impl: str = "auto") -> None:
        super().__init__()
        self.dim, self.impl = dim, check_impl(impl)

    def forward(self, scores: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return sparsemax(scores, dim=self.dim, mask=mask, impl=self.impl)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, impl={self.impl!r}"
