"""The alpha-entmax Fenchel-Young loss at a tensor alpha, one per row, differentiable in alpha.

For the Tsallis regulariser ``Omega_a(y) = (sum y^a - 1) / (a (a - 1))`` and ``p = a-entmax(z)``::

    L_a(z; y) = Omega_a*(z) - <z, y> + Omega_a(y) = <z, p - y> - Omega_a(p) + Omega_a(y)

    dL/dz = p - y
    dL/da = dOmega_a(y)/da - dOmega_a(p)/da,   dOmega_a(y)/da = sum y^a log y / (a (a - 1))
                                                               - (sum y^a - 1) (2a - 1) / (a (a - 1))^2

Both derivatives hold with ``p`` held fixed: ``p`` maximises ``<z, p> - Omega_a(p)`` over the
simplex, so by Danskin's theorem ``Omega_a*`` varies with ``z`` and ``a`` as that objective does
at its maximiser. The loss is therefore written with ``p`` computed outside autograd's recording
(:func:`nmt.sparse.entmax.entmax_bisect_above_one`, no backward pass of the mapping) and autograd
differentiates the closed form above: the gradients are those of the exact loss wherever ``p`` is
the exact mapping (float32 precision of root finding: ``p`` to a few ulps). This is what the heads
of an adaptively sparse Transformer (Correia, Niculae & Martins 2019: one learned alpha per head)
need when a loss other than the output's supervises them (guided alignment): the loss reaches the
heads' alphas as well as their scores. The fixed-alpha losses of :mod:`nmt.sparse.losses` take one
float alpha, carry no alpha-gradient, and use the threshold's exact conjugate formula.

Products run only over the support (``p > 0``, ``y > 0``): scores of ``-inf`` (masked keys) add
nothing, and ``y > 0`` on a ``-inf`` score is an infinite loss. Scores are taken relative to their
row maximum. Rows are clamped at 0 (rounding of a few ulps below it), as the other losses are.

Host synchronisation: none on the static path (``impl="static"``; ``"auto"`` off the CPU), on
accelerators and in compiled graphs; the CPU's eager path reads the target checks and the alpha
check on the host.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ._common import compute_dtype, own_precision
from .entmax import entmax_bisect_above_one
from .losses import _REDUCTIONS, _check, _out_of_range, _reduce, check_index_shape, checked_distribution


def _tsallis_omega(y: Tensor, alpha: Tensor) -> Tensor:
    """``(sum_i y_i^a - 1) / (a (a - 1))`` per row, differentiable in ``a`` (and ``y``): zero
    entries add nothing (their ``0^a log 0`` alpha-derivative is 0, not NaN)."""
    on = y > 0
    powers = torch.where(on, y, torch.ones_like(y)).pow(alpha) * on
    a = alpha.squeeze(-1)
    return (powers.sum(-1) - 1) / (a * (a - 1))


def tensor_alpha_entmax_loss(scores: Tensor, target: Tensor, alpha: Tensor, ignore_index: int = -100,
                             reduction: str = "mean", n_iter: Optional[int] = None,
                             impl: str = "auto") -> Tensor:
    """alpha-entmax Fenchel-Young loss with a tensor ``alpha`` per row; gradients to the scores
    (``entmax_bisect(scores, alpha) - y``) and to ``alpha`` (see the module docstring).

    scores: ``(..., V)``; target: a float distribution ``(..., V)`` (rows on the simplex) or long
    class indices ``(...)`` (``ignore_index`` rows add nothing); alpha: a tensor broadcastable to
    ``scores`` with size 1 along the last dim, every value above 1 (a learned head's alpha, clamped
    at 1.01; 2 is sparsemax). reduction: ``"mean"`` (over non-ignored rows), ``"sum"`` or
    ``"none"`` (shape ``(...)``). n_iter / impl: as :func:`nmt.sparse.entmax_bisect`. Half
    precisions are computed in float32; the loss is returned in the scores' dtype.
    """
    if not isinstance(scores, Tensor) or not scores.is_floating_point() or scores.dim() == 0:
        raise ValueError("scores must be a floating point tensor of shape (..., V)")
    if not isinstance(alpha, Tensor) or not alpha.is_floating_point():
        raise ValueError("alpha must be a floating point tensor (for a float alpha: entmax_bisect_loss)")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; valid: {', '.join(_REDUCTIONS)}")
    dtype, n_classes = scores.dtype, scores.shape[-1]
    if alpha.dim() > scores.dim() or (alpha.dim() > 0 and alpha.shape[-1] != 1):
        raise ValueError(f"alpha of shape {tuple(alpha.shape)} must broadcast to the scores "
                         f"{tuple(scores.shape)} with size 1 along the last dim")
    cdt = compute_dtype(dtype)
    z = scores.reshape(-1, n_classes).to(cdt)
    a = alpha.to(cdt).expand(*scores.shape[:-1], 1).reshape(-1, 1)
    if target.is_floating_point():
        y = checked_distribution(target, scores, cdt)
        valid = torch.ones(z.shape[0], dtype=torch.bool, device=z.device)
    else:
        check_index_shape(target, scores)
        t = target.reshape(-1).to(z.device)
        valid = t != ignore_index
        index = torch.where(valid, t, 0).long()
        _check(((index >= 0) & (index < n_classes)).all(),
               _out_of_range(n_classes, ignore_index))
        y = torch.zeros_like(z).scatter_(-1, index.unsqueeze(-1), valid.unsqueeze(-1).to(cdt))
    with own_precision(z):
        with torch.no_grad():
            p = entmax_bisect_above_one(z.detach(), a.detach(), dim=-1, n_iter=n_iter, impl=impl)
        top = z.detach().amax(-1, keepdim=True)
        shifted = z - torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        inner = (torch.where(p > 0, shifted, 0.0) * p).sum(-1) - (torch.where(y > 0, shifted, 0.0) * y).sum(-1)
        loss = inner - _tsallis_omega(p, a) + _tsallis_omega(y, a)
        loss = torch.where(valid, loss.clamp(min=0), 0.0)
    return _reduce(loss, reduction, valid, scores.shape[:-1], dtype)


__all__ = ["tensor_alpha_entmax_loss"]
