"""Fenchel-Young losses where several classes are correct (partial labels).

When any class of a set ``A`` is a correct answer (a token that can be generated from the
vocabulary or copied from one of several source positions), the loss takes the target
distribution on ``A`` that the model finds cheapest:

    L_A(z) = min_{q in simplex(A)} L(z; q) = Omega*(z) - Omega*_A(z_A)

(``Omega*_A`` the conjugate over the face of the simplex on ``A``). The minimiser is the
mapping of the scores restricted to ``A``, ``q* = mapping(z with -inf outside A)``: so
``L_A(z) = L(z; q*)``, the ordinary Fenchel-Young loss at the distribution target ``q*``, and by
Danskin's theorem its gradient is ``p - q*`` with ``q*`` held fixed (a detached target gives
exactly that). For softmax ``L_A(z) = -log sum_{i in A} softmax(z)_i``, the marginal likelihood
of the set (CopyNet's loss, Gu et al. 2016); for the sparse mappings it stays finite where the
marginal likelihood would be infinite (the model put no mass on ``A``) and is 0 exactly where
``p``'s support lies inside ``A`` with ``p = q*``.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from ._common import compute_dtype


def set_target(mapping: Callable[..., Tensor], scores: Tensor, allowed: Tensor) -> Tensor:
    """The cheapest target distribution on the allowed classes: ``mapping(scores)`` over
    ``allowed`` alone (zero elsewhere), detached; the Fenchel-Young loss of ``mapping`` at it is
    the set loss ``L_A`` of the module docstring.

    mapping: ``f(scores, dim=-1, mask=None) -> probs`` (e.g. ``nmt.sparse.get_mapping(name)``);
    scores: (..., C) float; allowed: (..., C) bool, at least one True per row where the result
    is used (a row with none gives the mapping's answer for an all-masked row). Half precision
    scores are mapped in float32. Returns (..., C) in the computing dtype. No host
    synchronisation beyond the mapping's own.
    """
    with torch.no_grad():
        z = scores.to(compute_dtype(scores.dtype))
        return mapping(z.masked_fill(~allowed, float("-inf")), dim=-1, mask=allowed)


__all__ = ["set_target"]
