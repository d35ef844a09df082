"""Fenchel-Young losses (Blondel, Martins & Niculae 2020) matched to the output mappings.

For a regulariser ``Omega`` with mapping ``p = argmax_{p in simplex} <theta, p> - Omega(p)``:

    L(theta; y) = Omega*(theta) - <theta, y> + Omega(y),   grad_theta L = p - y.

Shannon ``Omega(p) = sum p log p`` gives softmax / cross-entropy; Tsallis
``Omega(p) = (sum p^alpha - 1) / (alpha (alpha - 1))`` gives alpha-entmax (alpha = 2:
sparsemax, 1.5: 1.5-entmax). For the exact mappings the conjugate comes from the threshold:
``Omega*(theta) = (tau + (1 - 1/alpha) sum p^alpha + 1/alpha) / (alpha - 1)``, so no product
with ``-inf`` scores is ever formed. All scores are taken relative to the row maximum.

``target`` is class indices ``(...)`` (``ignore_index`` rows contribute 0, any value works,
negative included) or a distribution ``(..., V)``. ``label_smoothing = e`` mixes the target
with the uniform distribution over the classes whose score is finite. A target on a class
with score ``-inf`` has an infinite loss (never NaN); its gradient stays ``p - y``.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from ._common import compute_dtype
from ._threshold import root_threshold
from .entmax import entmax15_threshold
from .sparsemax import sparsemax_threshold

_REDUCTIONS = ("mean", "sum", "none")


class Regularizer:
    """``Omega(p) = sum_i phi(p_i) + const`` and its mapping / conjugate (subclasses)."""

    def phi(self, v: Tensor) -> Tensor:
        """Elementwise term of ``Omega`` (``phi(0) = 0``)."""
        raise NotImplementedError

    const: float = 0.0
    uses_argmax: bool = False
    """Whether ``probs_conj`` reads ``argmax`` (otherwise it gets ``None``, saving an index pass)."""

    def omega(self, p: Tensor) -> Tensor:
        """``Omega(p)`` per row: ``p (N, V) -> (N,)``."""
        return self.phi(p).sum(dim=-1) + self.const

    def probs_conj(self, z: Tensor, c: Tensor, argmax: Optional[Tensor]) -> tuple[Tensor, Tensor]:
        """``z: (N, V)`` scores, ``c: (N, 1)`` row maxima at ``argmax: (N, 1)`` (if ``uses_argmax``)
        -> ``(p (N, V), Omega*(z) - c (N,))``."""
        raise NotImplementedError


class Shannon(Regularizer):
    """Negative Shannon entropy: softmax, cross-entropy."""

    uses_argmax = True

    def phi(self, v: Tensor) -> Tensor:
        return torch.where(v > 0, v * torch.where(v > 0, v, 1).log(), 0)

    def probs_conj(self, z: Tensor, c: Tensor, argmax: Tensor) -> tuple[Tensor, Tensor]:
        p = torch.softmax(z, dim=-1).nan_to_num_(0.0)
        # logsumexp(z) - c = -log p(argmax), with p(argmax) >= 1/V: no second pass of exp
        return p, -p.gather(-1, argmax)[:, 0].log()


class Tsallis(Regularizer):
    """Tsallis alpha-negentropy (alpha > 1): alpha-entmax by root finding (``n_iter`` cap)."""

    def __init__(self, alpha: float, n_iter: Optional[int] = None) -> None:
        alpha = float(alpha)
        if not alpha > 1:
            raise ValueError(f"Tsallis loss needs alpha > 1 (alpha = 1 is cross-entropy), got {alpha}")
        self.alpha, self.n_iter = alpha, n_iter
        self.const = -1.0 / (alpha * (alpha - 1))

    def phi(self, v: Tensor) -> Tensor:
        return v.clamp(min=0).pow(self.alpha) / (self.alpha * (self.alpha - 1))

    def probs_conj(self, z: Tensor, c: Tensor, argmax: Tensor) -> tuple[Tensor, Tensor]:
        am1 = self.alpha - 1
        q = 1 / am1  # q in {1, 2}: exact closed-form finish, else to the dtype's precision
        tol = None if q in (1.0, 2.0) else torch.finfo(z.dtype).eps
        tau = root_threshold(z, q, tol=tol, max_iter=self.n_iter, scale=am1)
        r = torch.add(-tau, z, alpha=am1).clamp_(min=0)  # p = r^(1/(alpha-1)) up to normalisation
        p = torch.square(r) if am1 == 0.5 else r.clone() if am1 == 1 else r.pow(1 / am1)
        total = p.sum(dim=-1, keepdim=True).clamp_(min=torch.finfo(p.dtype).tiny)
        p = p.div_(total)
        sum_pa = torch.linalg.vecdot(p, r) / total[:, 0].pow(am1)  # sum p^alpha = sum p * r
        conj = (tau[:, 0] - am1 * c[:, 0] + (1 - 1 / self.alpha) * sum_pa + 1 / self.alpha) / am1
        return p, conj


class TsallisSparsemax(Tsallis):
    """alpha = 2, exact: ``p = [z - tau]_+``, ``Omega* = tau + |p|^2 / 2 + 1/2``."""

    def __init__(self) -> None:
        super().__init__(2.0)

    def probs_conj(self, z: Tensor, c: Tensor, argmax: Tensor) -> tuple[Tensor, Tensor]:
        tau = sparsemax_threshold(z)
        p = (z - tau).clamp_(min=0)
        return p, (tau - c)[:, 0] + 0.5 * torch.linalg.vecdot(p, p) + 0.5


class TsallisEntmax15(Tsallis):
    """alpha = 1.5, exact: ``p = [z/2 - tau]_+^2``, ``Omega* = 2 tau + (2/3) sum p^1.5 + 4/3``."""

    def __init__(self) -> None:
        super().__init__(1.5)

    def probs_conj(self, z: Tensor, c: Tensor, argmax: Tensor) -> tuple[Tensor, Tensor]:
        tau = entmax15_threshold(z)
        r = torch.add(-tau, z, alpha=0.5).clamp_(min=0)  # sqrt(p)
        p = torch.square(r)
        sum15 = torch.linalg.vecdot(r, p)  # sum p^1.5
        return p, (2 * tau - c)[:, 0] + (2.0 / 3.0) * sum15 + 4.0 / 3.0


class _FenchelYoungFunction(torch.autograd.Function):
    """Per-row loss of ``z: (N, V)``; backward ``(p - y) * grad``."""

    @staticmethod
    def forward(ctx, z: Tensor, reg: Regularizer, index: Optional[Tensor], dist: Optional[Tensor],
                valid: Tensor, eps: float) -> Tensor:  # type: ignore[override]
        if reg.uses_argmax:
            c, argmax = z.max(dim=-1, keepdim=True)
        else:
            c, argmax = z.amax(dim=-1, keepdim=True), None
        c = torch.where(c == float("-inf"), 0, c)  # rows without a finite score
        p, conj = reg.probs_conj(z, c, argmax)
        if eps > 0 or index is None:
            finite = z > float("-inf")
        if eps > 0:
            m = finite.sum(dim=-1, keepdim=True).clamp(min=1).to(z.dtype)
            smooth = torch.where(finite, eps / m, 0)
        if index is not None:
            idx = index[:, None]
            zt = z.gather(-1, idx)[:, 0] - c[:, 0]
            impossible = zt == float("-inf")
            if eps > 0:
                zf = torch.where(finite, z - c, 0).sum(dim=-1) / m[:, 0]
                zy = (1 - eps) * zt + eps * zf
                a, b = eps / m[:, 0], 1 - eps + eps / m[:, 0]
                omega_y = (m[:, 0] - 1) * reg.phi(a) + reg.phi(b) + reg.const
                grad = (p - smooth).scatter_add_(-1, idx, torch.full_like(zt, eps - 1)[:, None])
            else:
                zy = zt
                omega_y = torch.zeros_like(zt) + (reg.phi(torch.ones_like(zt)) + reg.const)
                grad = p.scatter_add_(-1, idx, torch.full_like(zt, -1.0)[:, None])
        else:
            y = dist if eps == 0 else (1 - eps) * dist + smooth
            on = y > 0
            impossible = (on & ~finite).any(dim=-1)
            zy = torch.where(on & finite, (z - c) * y, 0).sum(dim=-1)
            omega_y = reg.omega(y)
            grad = p - y
        loss = conj - zy + omega_y
        loss = torch.where(impossible, float("inf"), loss)
        loss = torch.where(valid, loss, 0)
        ctx.save_for_backward(grad, valid)  # ignored rows: zeroed in backward (no extra pass here)
        return loss

    @staticmethod
    def backward(ctx, g: Tensor):  # type: ignore[override]
        grad, valid = ctx.saved_tensors
        return grad * torch.where(valid, g, 0)[:, None], None, None, None, None, None


class _CrossEntropyFunction(torch.autograd.Function):
    """Cross-entropy of ``z: (N, V)`` at class indices, the Shannon case of
    :class:`_FenchelYoungFunction` in fewer passes: ``-log_softmax(z)[y]``, gradient
    ``softmax(z) - e_y`` from the same ``log_softmax`` (no row maximum or argmax pass).
    A target with score ``-inf`` (rows of only ``-inf`` included) has loss ``inf``; such rows
    get gradient ``-e_y``, as in the generic function."""

    @staticmethod
    def forward(ctx, z: Tensor, index: Tensor, valid: Tensor) -> Tensor:  # type: ignore[override]
        p = torch.log_softmax(z, dim=-1)
        idx = index[:, None]
        logp_t = p.gather(-1, idx)[:, 0]
        loss = torch.where(z.gather(-1, idx)[:, 0] == float("-inf"), float("inf"), -logp_t)
        loss = torch.where(valid, loss, 0)
        p = p.exp_().nan_to_num_(0.0)  # rows of only -inf: NaN -> 0
        p.scatter_add_(-1, idx, torch.where(valid, -1.0, 0.0).to(p.dtype)[:, None])
        ctx.save_for_backward(p, valid)
        return loss

    @staticmethod
    def backward(ctx, g: Tensor):  # type: ignore[override]
        grad, valid = ctx.saved_tensors
        return grad * torch.where(valid, g, 0)[:, None], None, None


def fenchel_young_loss(reg: Regularizer, scores: Tensor, target: Tensor, ignore_index: int = -100,
                       reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """Fenchel-Young loss of ``reg`` over the last dim of ``scores: (..., V)``.

    target: long ``(...)`` class indices, or a float distribution ``(..., V)``.
    reduction: "mean" (over non-ignored targets; 0 if none), "sum", or "none" (shape ``(...)``).
    Half precisions are computed in float32; the loss is returned in the scores' dtype.
    """
    if not isinstance(scores, Tensor) or not scores.is_floating_point() or scores.dim() == 0:
        raise ValueError("scores must be a floating point tensor of shape (..., V)")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; valid: {', '.join(_REDUCTIONS)}")
    eps = float(label_smoothing)
    if not 0.0 <= eps <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    dtype, n_classes = scores.dtype, scores.shape[-1]
    z = scores.to(compute_dtype(dtype)).reshape(-1, n_classes)
    index = dist = None
    if not isinstance(target, Tensor):
        raise ValueError(f"target must be a tensor, got {type(target).__name__}")
    if target.is_floating_point():
        if target.shape != scores.shape:
            raise ValueError(f"distribution target of shape {tuple(target.shape)} must match scores "
                             f"{tuple(scores.shape)}")
        dist = target.to(z.dtype).reshape(-1, n_classes)
        valid = torch.ones(z.shape[0], dtype=torch.bool, device=z.device)
    else:
        if target.shape != scores.shape[:-1]:
            raise ValueError(f"index target of shape {tuple(target.shape)} must match scores without "
                             f"the class dim {tuple(scores.shape[:-1])}")
        t = target.reshape(-1)
        valid = t != ignore_index
        index = torch.where(valid, t, 0).long()
        if bool(((index < 0) | (index >= n_classes)).any()):  # one host sync: a clear error
            raise ValueError(f"target class index out of range [0, {n_classes}) "
                             f"(and not ignore_index={ignore_index})")
    if isinstance(reg, Shannon) and index is not None and eps == 0:
        loss = _CrossEntropyFunction.apply(z, index, valid)
    else:
        loss = _FenchelYoungFunction.apply(z, reg, index, dist, valid, eps)
    if reduction == "none":
        return loss.reshape(scores.shape[:-1]).to(dtype)
    total = loss.sum()
    if reduction == "mean":
        total = total / valid.sum().clamp(min=1)
    return total.to(dtype)


def cross_entropy_loss(scores: Tensor, target: Tensor, ignore_index: int = -100,
                       reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """Cross-entropy (softmax Fenchel-Young loss); gradient ``softmax(scores) - y``."""
    return fenchel_young_loss(Shannon(), scores, target, ignore_index, reduction, label_smoothing)


def sparsemax_loss(scores: Tensor, target: Tensor, ignore_index: int = -100,
                   reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """Sparsemax loss (exact); gradient ``sparsemax(scores) - y``."""
    return fenchel_young_loss(TsallisSparsemax(), scores, target, ignore_index, reduction, label_smoothing)


def entmax15_loss(scores: Tensor, target: Tensor, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """1.5-entmax loss (exact); gradient ``entmax15(scores) - y``."""
    return fenchel_young_loss(TsallisEntmax15(), scores, target, ignore_index, reduction, label_smoothing)


def entmax_bisect_loss(scores: Tensor, target: Tensor, alpha: float = 1.5, ignore_index: int = -100,
                       reduction: str = "mean", label_smoothing: float = 0.0,
                       n_iter: Optional[int] = None) -> Tensor:
    """alpha-entmax loss for a float ``alpha >= 1`` (1: cross-entropy); gradient ``entmax_bisect - y``."""
    reg: Regularizer = Shannon() if float(alpha) == 1.0 else Tsallis(alpha, n_iter)
    return fenchel_young_loss(reg, scores, target, ignore_index, reduction, label_smoothing)


class FenchelYoungLoss(nn.Module):
    """Module form: ``FenchelYoungLoss(reg, ignore_index, reduction, label_smoothing)(scores, target)``."""

    def __init__(self, reg: Regularizer, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0) -> None:
        super().__init__()
        if reduction not in _REDUCTIONS:
            raise ValueError(f"unknown reduction {reduction!r}; valid: {', '.join(_REDUCTIONS)}")
        self.reg, self.ignore_index = reg, ignore_index
        self.reduction, self.label_smoothing = reduction, label_smoothing

    def forward(self, scores: Tensor, target: Tensor) -> Tensor:
        return fenchel_young_loss(self.reg, scores, target, self.ignore_index, self.reduction,
                                  self.label_smoothing)


class CrossEntropyLoss(FenchelYoungLoss):
    def __init__(self, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0) -> None:
        super().__init__(Shannon(), ignore_index, reduction, label_smoothing)


class SparsemaxLoss(FenchelYoungLoss):
    def __init__(self, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0) -> None:
        super().__init__(TsallisSparsemax(), ignore_index, reduction, label_smoothing)


class Entmax15Loss(FenchelYoungLoss):
    def __init__(self, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0) -> None:
        super().__init__(TsallisEntmax15(), ignore_index, reduction, label_smoothing)


class EntmaxBisectLoss(FenchelYoungLoss):
    def __init__(self, alpha: float = 1.5, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0, n_iter: Optional[int] = None) -> None:
        reg: Regularizer = Shannon() if float(alpha) == 1.0 else Tsallis(alpha, n_iter)
        super().__init__(reg, ignore_index, reduction, label_smoothing)
