"""Exact proximal operator of OSCAR, batched over rows of different lengths.

For a row ``x`` of length ``m``::

    prox(x) = argmin_y  1/2 ||y - x||^2 + lam * sum_{i<j} max(|y_i|, |y_j|)

The penalty is the ordered (sorted-L1) norm ``sum_k w_k |y|_(k)`` with ``|y|_(1) >= |y|_(2) >= ..``
and weights ``w_k = lam (m - k)``. Its prox (Bogdan et al. 2015; Zeng & Figueiredo 2014) is
``sign(x) * P^T max(iso(|x|_sorted - w), 0)``, where ``P`` sorts ``|x|`` decreasingly and
``iso`` is the least-squares non-increasing fit, computed exactly as a taut string
(:mod:`._taut_string`). Blocks of the fit that stay positive are the OSCAR groups.

Without the absolute values, ``sum_{i<j} max(z_i, z_j)`` has the prox ``P^T iso(x_sorted - w)``
with ``P`` sorting ``x`` itself (:func:`ordered_fit`): on the simplex, where ``|p| = p``, this is
the penalty of the exact OSCAR-regularised attention map.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ._common import fresh_output
from ._groups import group_average
from ._native import ordered_fit as native_ordered_fit
from ._taut_string import taut_string


def isotonic_nonincreasing(v: Tensor, lengths: Tensor, static: bool = False) -> tuple[Tensor, Tensor]:
    """Exact least-squares non-increasing fit of each row prefix.

    v: (B, n), only the first ``lengths[b]`` entries are used; lengths: (B,) long. The fit is
    the slope of the least concave majorant of the running sums of ``v`` (a taut string with
    the lower wall only). ``static``: no host sync (see :func:`taut_string`). Returns
    ``(fit, blocks)``, both (B, n): the fit (0 past the length) and the first position of every
    position's block of tied values.
    """
    return taut_string(v, lengths, 0.0, math.inf, static=static)


def ordered_fit(keys: Tensor, lengths: Tensor, lam: float, static: bool = False,
                native: bool = True) -> tuple[Tensor, Tensor]:
    """Exact prox of ``lam * sum_{i<j} max(z_i, z_j) = sum_k w_k z_(k)`` (``w_k = lam (m - k)``).

    The minimiser is ordered like ``keys``, so it is ``P^T iso(keys_sorted - w)`` with ``P``
    sorting ``keys`` decreasingly. keys: (B, n), positions ``>= lengths[b]`` ignored.
    static: no host sync (see :func:`taut_string`). ``native`` (CPU, eager, not ``static``): the
    whole fit in one native call (:func:`nmt.sparse._native.ordered_fit`: sort, weights, pool
    adjacent violators, scatter) where the library is built; False: the torch operations around
    the taut string. Returns ``(fit, groups)``, both (B, n) in the original order: the prox (undefined past the
    length) and each position's group of tied values.
    """
    if native and not static and keys.device.type == "cpu" and not torch.compiler.is_compiling():
        found = native_ordered_fit(keys, lengths, lam)
        if found is not None:  # (None: no native library, or another dtype)
            return found
    B, n = keys.shape
    pos = torch.arange(n, device=keys.device)
    valid = pos < lengths[:, None]
    keys = keys.masked_fill(~valid, float("-inf"))                           # padding sorts last
    keys_sorted, order = keys.sort(dim=-1, descending=True, stable=True)
    # w_k = lam (m - k) for k = 1..m (0-based: lam (m - 1 - k)); padding gets -inf - w = -inf
    weights = torch.sub(lengths[:, None] - 1, pos).to(keys.dtype).mul_(lam)
    fit, blocks = isotonic_nonincreasing(keys_sorted.sub_(weights), lengths, static)
    return (torch.empty_like(keys).scatter_(1, order, fit),
            torch.empty_like(order).scatter_(1, order, blocks))


def prox_oscar(x: Tensor, lengths: Tensor, lam: float, static: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """Exact prox of the OSCAR penalty with weight ``lam`` (>= 0) on the prefix of each row.

    x: (B, n) float32/float64, positions ``>= lengths[b]`` ignored; lengths: (B,) long.
    static: no host sync (see :func:`taut_string`).
    Returns ``(y, groups, coef)``, all (B, n): the prox (0 past the length), the group of every
    position (entries of equal ``|y|``) and ``sign(y)`` (0 where ``y`` is 0), for the backward.
    """
    fit, groups = ordered_fit(x.abs(), lengths, lam, static)  # 0 past the length (taut_string)
    coef = torch.sign(x).masked_fill_(fit <= 0, 0.0)
    return coef * fit, groups, coef


class ProxOscarFunction(torch.autograd.Function):
    """Autograd form of :func:`prox_oscar`; backward is the signed average within groups."""

    @staticmethod
    def forward(ctx, x: Tensor, lengths: Tensor, lam: float) -> Tensor:  # type: ignore[override]
        y, groups, coef = prox_oscar(x, lengths, lam)
        ctx.save_for_backward(groups, coef)
        return fresh_output(y)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        groups, coef = ctx.saved_tensors
        avg = group_average(coef * grad, groups, coef != 0, grad.shape[-1] + 1)
        return coef * avg, None, None


class OrderedFitFunction(torch.autograd.Function):
    """Autograd form of :func:`ordered_fit`; backward averages the gradient within tied groups."""

    @staticmethod
    def forward(ctx, x: Tensor, lengths: Tensor, lam: float) -> Tensor:  # type: ignore[override]
        fit, groups = ordered_fit(x, lengths, lam)
        valid = torch.arange(x.shape[-1], device=x.device) < lengths[:, None]
        ctx.save_for_backward(groups, valid)
        return torch.where(valid, fit, torch.zeros_like(fit))

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        groups, valid = ctx.saved_tensors
        return group_average(grad, groups, valid, grad.shape[-1] + 1), None, None
