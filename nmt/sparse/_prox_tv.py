"""Exact proximal operator of 1-d total variation (fused lasso), batched over rows.

For a row ``x`` of length ``m``::

    prox(x) = argmin_y  1/2 ||y - x||^2 + lam * sum_{i<m} |y_{i+1} - y_i|

It is the slope of the taut string through the tube ``|s_k - r_k| <= lam`` around the running
sums ``r`` of ``x`` (optimality: ``y = x + u_i - u_{i-1}``, ``|u| <= lam``, ``u_k = lam sign(y_{k+1}
- y_k)`` at jumps, so ``s = r + u``); computed exactly by :func:`taut_string`. Its Jacobian
(Niculae & Blondel 2017, Prop. 3) averages within fused groups.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ._common import fresh_output
from ._groups import group_average
from ._taut_string import taut_string


def prox_tv(x: Tensor, lengths: Tensor, lam: float, static: bool = False) -> tuple[Tensor, Tensor]:
    """Exact prox of ``lam`` (>= 0) times 1-d total variation on the prefix of each row.

    x: (B, n) float32/float64, positions ``>= lengths[b]`` ignored; lengths: (B,) long.
    static: no host sync (see :func:`taut_string`).
    Returns ``(y, groups)``, both (B, n): the prox (0 past the length) and the fused group of
    every position (the group's first position).
    """
    return taut_string(x, lengths, lam, lam, static=static)


class ProxTVFunction(torch.autograd.Function):
    """Autograd form of :func:`prox_tv`; backward averages the gradient within fused groups."""

    @staticmethod
    def forward(ctx, x: Tensor, lengths: Tensor, lam: float) -> Tensor:  # type: ignore[override]
        y, groups = prox_tv(x, lengths, lam)
        ctx.save_for_backward(groups, lengths)
        return fresh_output(y)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        groups, lengths = ctx.saved_tensors
        n = grad.shape[-1]
        member = torch.arange(n, device=grad.device) < lengths[:, None]
        return group_average(grad, groups, member, n + 1), None, None
