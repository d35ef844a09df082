"""alpha-entmax (Peters, Niculae & Martins 2019): ``p_i = [(alpha - 1) x_i - tau]_+^(1/(alpha-1))``.

* :func:`entmax15`: alpha = 1.5, exact. The threshold of ``z = x / 2`` is found on the sorted
  row (short rows) or by pruned Newton steps with a verified closed-form finish (long rows),
  see :mod:`nmt.sparse._threshold`.
* :func:`entmax_bisect`: any alpha >= 1 (float or per-row tensor, differentiable): the
  threshold is a root of a monotone function found by safeguarded Newton steps (with
  bisection fallback) to the dtype's precision, then ``p`` is renormalised. (The paper's
  name; a float alpha of 1.5 or 2 ends with the exact closed-form solve on the support.)

Backward (Peters et al. 2019, Prop. 1): with ``s = p^(2 - alpha)`` on the support,
``J^T g = s * g - s * <s, g> / sum(s)``; the alpha-gradient uses
``dp_i/dalpha = w_i - s_i * sum(w) / sum(s)``, ``w_i = p_i (1 - (alpha-1) log p_i) / (alpha-1)^2``.
"""
from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor, nn

from ._common import apply_last, apply_mask, check_scores, compute_dtype
from ._softmax import softmax
from ._threshold import SORT_MAX_N, root_threshold, sort_threshold


def entmax15_threshold(x: Tensor) -> Tensor:
    """Exact threshold ``tau: (..., 1)`` of 1.5-entmax, ``p = [x/2 - tau]_+^2``, for ``x: (..., n)``.

    ``+inf`` for rows without finite entries.
    """
    if x.shape[-1] <= SORT_MAX_N:
        return sort_threshold(x * 0.5, 2.0)
    return root_threshold(x, 2.0, scale=0.5)


def _entmax_backward(s: Tensor, grad: Tensor) -> Tensor:
    """``J^T grad`` given ``s = p^(2 - alpha)`` on the support (0 elsewhere): ``s * (grad - <s, grad> / sum(s))``."""
    ssum = s.sum(dim=-1, keepdim=True).clamp_(min=torch.finfo(s.dtype).tiny)
    coef = torch.linalg.vecdot(grad, s).unsqueeze(-1).div_(ssum)
    return (grad - coef).mul_(s)


def _support_power(p: Tensor, power: Union[float, Tensor]) -> Tensor:
    """``p ** power`` on the support of ``p``, 0 elsewhere (any real ``power``)."""
    if not isinstance(power, Tensor) and power > 0:
        return p.pow(power)
    supp = p > 0
    return torch.where(supp, torch.where(supp, p, 1).pow(power), 0)


class Entmax15Function(torch.autograd.Function):
    """1.5-entmax over the last dim of a float32/float64 tensor."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # type: ignore[override]
        r = torch.add(-entmax15_threshold(x), x, alpha=0.5).clamp_(min=0)  # [x/2 - tau]_+
        ctx.save_for_backward(r)  # r = sqrt(p) = p^(2 - alpha): no sqrt needed in backward
        return torch.square(r)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # type: ignore[override]
        (r,) = ctx.saved_tensors
        return _entmax_backward(r, grad)


def entmax15(scores: Tensor, dim: int = -1, mask: Optional[Tensor] = None) -> Tensor:
    """Exact 1.5-entmax of ``scores`` along ``dim``.

    scores: any shape, float (half precisions computed in float32, returned in the input
    dtype); mask: bool, broadcastable, True = keep. Masked / ``-inf`` entries get exact
    zeros; rows with nothing kept are all zeros. Returns probabilities shaped like ``scores``.
    """
    return apply_last(Entmax15Function.apply, scores, dim, mask)


class EntmaxBisectFunction(torch.autograd.Function):
    """alpha-entmax over the last dim; ``alpha: (..., 1)`` > 1 per row (same leading dims)."""

    @staticmethod
    def forward(ctx, x: Tensor, alpha: Tensor, n_iter: Optional[int],
                alpha_float: Optional[float]) -> Tensor:  # type: ignore[override]
        ctx.alpha = alpha_float
        eps = torch.finfo(x.dtype).eps
        if alpha_float is not None:  # one alpha for all rows: scalar arithmetic on the big tensor
            am1 = alpha_float - 1
            q = 1 / am1  # q in {1, 2}: Newton with the verified closed-form finish (exact)
            tol = None if q in (1.0, 2.0) else eps
            tau = root_threshold(x, q, tol=tol, max_iter=n_iter, scale=am1)
            r = torch.add(-tau, x, alpha=am1).clamp_(min=0)  # [(alpha - 1) x - tau]_+
            p = torch.square(r) if am1 == 0.5 else r.clone() if am1 == 1 else r.pow(1 / am1)
            # p^(2 - alpha) is proportional to r^((2 - alpha) / (alpha - 1)) per row and the
            # backward is invariant to a per-row scale of s: keep r, skip a pow in backward
            ctx.save_for_backward(r, alpha)
        else:
            am1 = alpha - 1
            z = x * am1
            tau = root_threshold(z, 1 / am1, tol=eps, max_iter=n_iter)
            p = (z - tau).clamp_(min=0).pow_(1 / am1)
        p = p.div_(p.sum(dim=-1, keepdim=True).clamp_(min=torch.finfo(p.dtype).tiny))
        if alpha_float is None:
            ctx.save_for_backward(p, alpha)
        return p

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        if ctx.alpha is not None:  # saved r = [(alpha - 1) x - tau]_+, alpha a float
            r, _ = ctx.saved_tensors
            e = (2 - ctx.alpha) / (ctx.alpha - 1)
            s = r if e == 1 else _support_power(r, e)
            return _entmax_backward(s, grad), None, None, None
        p, alpha = ctx.saved_tensors
        am1 = alpha - 1
        s = _support_power(p, 2 - alpha)
        gx = _entmax_backward(s, grad) if ctx.needs_input_grad[0] else None
        galpha = None
        if ctx.needs_input_grad[1]:
            supp = p > 0
            logp = torch.where(supp, p, 1).log()
            w = p * (1 - am1 * logp) / (am1 * am1)
            ssum = s.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(s.dtype).tiny)
            dp = w - s * (w.sum(dim=-1, keepdim=True) / ssum)
            galpha = (grad * dp).sum(dim=-1, keepdim=True)
        return gx, galpha, None, None


def _alpha_rows(alpha: Union[float, Tensor], scores: Tensor, dim: int) -> Tensor:
    """alpha as a tensor ``(..., 1)`` matching ``scores`` with ``dim`` moved last."""
    if not isinstance(alpha, Tensor):
        a = float(alpha)
        if not a >= 1:
            raise ValueError(f"entmax_bisect needs alpha >= 1, got alpha={alpha}")
        return scores.new_full((1,) * scores.dim(), a).movedim(dim, -1)
    a = alpha.to(scores.dtype)
    if a.dim() > scores.dim():
        raise ValueError(f"alpha of shape {tuple(alpha.shape)} has more dims than scores {tuple(scores.shape)}")
    a = a.reshape((1,) * (scores.dim() - a.dim()) + tuple(a.shape))
    if a.shape[dim] != 1:
        raise ValueError(f"alpha of shape {tuple(alpha.shape)} must have size 1 along dim={dim} "
                         f"of scores {tuple(scores.shape)} (one alpha per row)")
    try:
        torch.broadcast_shapes(a.shape, scores.shape)
    except RuntimeError:
        raise ValueError(f"alpha of shape {tuple(alpha.shape)} does not broadcast to scores "
                         f"{tuple(scores.shape)}") from None
    if bool((a.detach() < 1).any()):  # host sync on the small alpha tensor
        raise ValueError("entmax_bisect needs alpha >= 1 in every row")
    return a.movedim(dim, -1)


def entmax_bisect(scores: Tensor, alpha: Union[float, Tensor] = 1.5, dim: int = -1,
                  mask: Optional[Tensor] = None, n_iter: Optional[int] = None) -> Tensor:
    """alpha-entmax of ``scores`` along ``dim`` for any ``alpha >= 1``.

    alpha: float, or a tensor broadcastable to ``scores`` with size 1 along ``dim`` (one
    alpha per row; gradients flow to it). ``alpha = 1`` is softmax, ``2`` sparsemax.
    n_iter: cap on root-finding steps (None: until the dtype's precision, which takes
    few steps; the result is renormalised to sum to one). mask: bool, True = keep.
    Half precisions are computed in float32. Returns probabilities shaped like ``scores``.
    Rows with ``alpha == 1`` (tensor alpha) use softmax and get a zero alpha-gradient.
    """
    d = check_scores(scores, dim)
    if not isinstance(alpha, Tensor) and float(alpha) == 1.0:
        return softmax(scores, dim=d, mask=mask)
    if n_iter is not None and (not isinstance(n_iter, int) or n_iter < 1):
        raise ValueError(f"n_iter must be a positive int or None, got {n_iter!r}")
    dtype = scores.dtype
    cdt = compute_dtype(dtype)
    x = apply_mask(scores, mask).to(cdt).movedim(d, -1)
    a = _alpha_rows(alpha, scores.to(cdt), d)
    a = a.expand(*x.shape[:-1], 1)
    one = a == 1
    if isinstance(alpha, Tensor) and bool(one.any()):  # host sync on the small alpha tensor
        p_soft = softmax(x, dim=-1)
        p = EntmaxBisectFunction.apply(x, torch.where(one, 2.0, a), n_iter, None)
        p = torch.where(one, p_soft, p)
    else:
        alpha_float = None if isinstance(alpha, Tensor) else float(alpha)
        p = EntmaxBisectFunction.apply(x, a, n_iter, alpha_float)
    return p.movedim(-1, d).to(dtype)


class Entmax15(nn.Module):
    """Module form of :func:`entmax15` over a fixed ``dim``."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, scores: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return entmax15(scores, dim=self.dim, mask=mask)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class EntmaxBisect(nn.Module):
    """Module form of :func:`entmax_bisect`; ``alpha`` may be a float or a learnable tensor."""

    def __init__(self, alpha: Union[float, Tensor] = 1.5, dim: int = -1, n_iter: Optional[int] = None) -> None:
        super().__init__()
        self.alpha, self.dim, self.n_iter = alpha, dim, n_iter

    def forward(self, scores: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return entmax_bisect(scores, alpha=self.alpha, dim=self.dim, mask=mask, n_iter=self.n_iter)

    def extra_repr(self) -> str:
        a = self.alpha if not isinstance(self.alpha, Tensor) else f"tensor{tuple(self.alpha.shape)}"
        return f"alpha={a}, dim={self.dim}, n_iter={self.n_iter}"
