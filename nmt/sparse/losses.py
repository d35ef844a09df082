"""Fenchel-Young losses (Blondel, Martins & Niculae 2020) matched to the output mappings.

For a regulariser ``Omega`` with mapping ``p = argmax_{p in simplex} <theta, p> - Omega(p)``:

    L(theta; y) = Omega*(theta) - <theta, y> + Omega(y),   grad_theta L = p - y.

Shannon ``Omega(p) = sum p log p`` gives softmax / cross-entropy (``L = KL(y || p)``); Tsallis
``Omega(p) = (sum p^alpha - 1) / (alpha (alpha - 1))`` gives alpha-entmax (alpha = 2:
sparsemax, 1.5: 1.5-entmax). Scores are taken relative to the row maximum (``z' = z - max``),
so large offsets cost no precision. For the exact mappings the conjugate comes from the
threshold ``tau'`` of ``z'``, written so that its exact cases cancel exactly::

    Omega*(z') = [(tau' + 1) + (1 - 1/alpha) (sum p^alpha - 1)] / (alpha - 1)

(a prediction that is exactly one-hot on the target has ``tau' = -1``, ``sum p^alpha = 1``,
``z'_target = 0``: loss exactly 0, in every dtype). For alpha-entmax by root finding
(renormalised ``p``) it is ``<z', p> - Omega(p)`` with ``<z', p> = (tau' sum p + <p, r>) / (alpha -
1)``, ``r = [(alpha - 1) z' - tau']_+`` (no product with ``-inf`` scores), 0 in the same case. A
Fenchel-Young loss is never negative (Blondel et al., Prop. 2); every loss is clamped at 0,
which only removes rounding of a few ulps below 0 (``inf`` and NaN pass through).

``target`` is class indices ``(...)`` (``ignore_index`` rows contribute 0, any value works,
negative included) or a distribution ``(..., V)`` on the simplex. ``label_smoothing = e`` mixes
the target with the uniform distribution over the classes whose score is finite. A target on
a class with score ``-inf`` has an infinite loss (never NaN); its gradient stays ``p - y``.

Host synchronisation: none, forward or backward, for cross-entropy and for the sparse losses
with ``impl="static"`` or ``"triton"`` (``"auto"`` picks the Triton kernels on CUDA where they
are installed, else the static path, on accelerators). With the kernels:

* index targets take two launches per loss forward: the sparse losses' mapping kernel finds
  ``p`` (exact support and closed form for sparsemax / 1.5-entmax, float32 precision for other
  alphas) and, with the row still on chip, the conjugate ``Omega*(z')``, the loss and the
  gradient ``p - y`` (label smoothing and ``ignore_index`` included); cross-entropy's forward
  kernel reads the scores once and writes only per-row values, its backward kernel recomputes
  ``softmax - y`` from them (nothing ``(N, V)`` saved); then one program reduces the rows
  ("sum", "mean": the count of targets) and checks the indices' range. With the range check's
  ``torch._assert_async``, a forward is three launches (seven with the reduction and check in
  torch ops) and a backward one (cross-entropy) or at most two (``grad * g`` and, for "mean",
  its factor); a forward allocates twice (the loss, and one ``work`` buffer for the rest: the
  factor of "mean", the check's flag, the rows' statistics) and dispatches four or five torch
  operators in all (``tools/host_ops.py`` counts them; ``tests/sparse/test_host_ops.py`` pins them);
* distribution targets take ``p`` and ``Omega*(z') = <z', p> - Omega(p)`` from the mapping kernel
  (:meth:`Tsallis.kernel_probs_conj`) into the generic function.

They compute in float32 (float64 scores keep the torch paths under ``"auto"``); the static
path remains the reference and the fallback. The torch cross-entropy (CPU, float64, compiled
graphs) is one ``log_softmax`` forward, ``softmax - y`` in backward from it: exact as
``log_softmax`` is, equal to ``F.cross_entropy`` (up to ``H(y)`` with smoothing).
Rows to ignore are handled by masks, the token count of ``"mean"`` stays on the device. Target
checks (class index in range; a distribution non-negative and summing to 1) run through
``torch._assert_async``: a ``ValueError`` on the CPU (eager), a device-side assertion on an
accelerator or under ``torch.compile`` (no sync; the error surfaces at the next sync point).
"""
from __future__ import annotations

import math
from typing import Any, Optional, Union

import torch
from torch import Tensor, nn

from . import _dispatch
from ._common import own_precision
from ._native import power_probs, xent_backward, xent_smoothing
from ._dispatch import check_impl, resolve_impl, shifted_threshold
from ._threshold import (ROOT_MAX_ITER, Candidates, count_true, native_long_entmax15, native_long_sparsemax,
                         pruned_shifted_threshold)
from .entmax import entmax_at_candidates, scatter_candidates, sparse_output_pays

_REDUCTIONS = ("mean", "sum", "none")


def _dead_row_safe(c: Tensor) -> Tensor:
    """Row maxima with ``-inf`` (rows without a finite score) replaced by 0."""
    return torch.where(c == float("-inf"), 0, c)


class Regularizer:
    """``Omega`` of a Fenchel-Young loss: its mapping and conjugate (subclasses).

    ``probs_conj(z, impl)`` gets scores ``z: (N, V)`` (``-inf`` allowed; a row of only ``-inf``:
    anything may come back for it, the loss masks it) and returns ``p (N, V)`` (a fresh tensor,
    overwritten by the caller), ``Omega*(z - zmax): (N,)`` and the row maxima ``zmax: (N, 1)``
    (0 for rows without a finite score, NaN for rows holding NaN or ``+inf``).
    """

    def omega_of_power_sum(self, s: Tensor) -> Tensor:
        """``Omega(y)`` from ``s = sum_i y_i^alpha`` (Tsallis) / ``sum_i y_i log y_i`` (Shannon)."""
        raise NotImplementedError

    def power_sum(self, y: Tensor) -> Tensor:
        """``sum_i phi(y_i)`` per row of ``y: (N, V) -> (N,)`` (``y >= 0``)."""
        raise NotImplementedError

    def phi(self, v: Tensor) -> Tensor:
        """The elementwise term of :meth:`power_sum` (``phi(0) = 0``)."""
        raise NotImplementedError

    def omega(self, y: Tensor) -> Tensor:
        """``Omega(y)`` per row: ``y (N, V) -> (N,)``."""
        return self.omega_of_power_sum(self.power_sum(y))

    def probs_conj(self, z: Tensor, impl: str) -> tuple[Tensor, Tensor, Tensor]:
        raise NotImplementedError


class Shannon(Regularizer):
    """Negative Shannon entropy: softmax, cross-entropy."""

    def phi(self, v: Tensor) -> Tensor:
        return torch.where(v > 0, v * torch.where(v > 0, v, 1).log(), 0)

    def power_sum(self, y: Tensor) -> Tensor:
        return self.phi(y).sum(dim=-1)

    def omega_of_power_sum(self, s: Tensor) -> Tensor:
        return s

    def probs_conj(self, z: Tensor, impl: str) -> tuple[Tensor, Tensor, Tensor]:
        logp = torch.log_softmax(z, dim=-1)
        conj = -logp.amax(dim=-1)  # logsumexp(z') = -log p(argmax), exactly 0 for a one-hot p
        zmax = _dead_row_safe(z.amax(dim=-1, keepdim=True))
        return logp.exp_().nan_to_num_(0.0), conj, zmax  # rows of only -inf: NaN -> 0


class Tsallis(Regularizer):
    """Tsallis alpha-negentropy (alpha > 1): alpha-entmax by root finding (``n_iter`` cap)."""

    def __init__(self, alpha: float, n_iter: Optional[int] = None) -> None:
        alpha = float(alpha)
        if not 1 < alpha < math.inf:  # inf: a NaN loss
            raise ValueError(f"Tsallis loss needs a finite alpha > 1 (alpha = 1 is cross-entropy), got {alpha}")
        self.alpha, self.n_iter = alpha, n_iter

    def phi(self, v: Tensor) -> Tensor:
        if self.alpha == 1.5:
            return v * v.sqrt()
        return v * v if self.alpha == 2 else v.pow(self.alpha)

    def power_sum(self, y: Tensor) -> Tensor:
        if self.alpha == 2:
            return torch.linalg.vecdot(y, y)
        if self.alpha == 1.5:
            return torch.linalg.vecdot(y, y.sqrt())
        return y.pow(self.alpha).sum(dim=-1)

    def omega_of_power_sum(self, s: Tensor) -> Tensor:
        return (s - 1) / (self.alpha * (self.alpha - 1))  # exactly 0 at a one-hot y

    def kernel_probs_conj(self, z: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`probs_conj` from one launch of the Triton mapping kernel (CUDA; CPU in Triton's
        interpreter), :func:`nmt.sparse._triton.tsallis_probs_conj`: ``p`` (exact support, closed
        form for alpha 2 / 1.5, float32 precision otherwise) and, reduced in the same kernel while
        the row is on chip, ``Omega*(z') = <z', p> - Omega(p)`` over the support and the row
        maximum. No threshold passes, no host synchronisation; a one-hot ``p`` gives exactly 0."""
        p, conj, zmax = _dispatch.kernels().tsallis_probs_conj(z, self.alpha)
        return p, conj, zmax[:, None]

    def uses_kernel(self, z: Tensor, impl: str) -> bool:
        """Whether ``impl`` means the Triton mapping for ``z`` (never with an ``n_iter`` cap)."""
        return self.n_iter is None and resolve_impl(impl, z) == "triton"

    def probs_conj(self, z: Tensor, impl: str) -> tuple[Tensor, Tensor, Tensor]:
        if self.uses_kernel(z, impl):
            return self.kernel_probs_conj(z)
        am1 = self.alpha - 1
        eps = torch.finfo(z.dtype).eps
        if resolve_impl(impl, z, triton_ok=False) == "pruned" and not torch.compiler.is_compiling():
            if 0 < am1 < 1 and z.dtype is torch.float32:  # float32 rows: one native call
                cap = ROOT_MAX_ITER if self.n_iter is None else self.n_iter
                found = power_probs(z, am1, cap, eps, root=False, stats=True)
                if found is not None:  # the row sums too: no pass over p here
                    p, _, tau, zmax, total, p_sum, pr = found
                    return p, self._conjugate(tau, p_sum, pr, total), zmax[:, None]
            tau, zmax, cand = pruned_shifted_threshold(z, 1 / am1, am1, eps, self.n_iter, candidates=True)
            if sparse_output_pays(cand, zmax, z):  # the powers at the candidates only
                return self._probs_conj_at(cand, zmax, tau, z.shape)
        else:
            tau, zmax = shifted_threshold(z, 1 / am1, am1, impl, eps, self.n_iter)
        r = torch.sub(z, zmax).mul_(am1).sub_(tau).clamp_(min=0)  # [(alpha - 1) z' - tau']_+
        p = torch.square(r) if am1 == 0.5 else r.clone() if am1 == 1 else r.pow(1 / am1)
        total = p.sum(dim=-1, keepdim=True).clamp_(min=torch.finfo(p.dtype).tiny)
        p = p.div_(total)  # renormalised
        conj = self._conjugate(tau[:, 0], p.sum(dim=-1), torch.linalg.vecdot(p, r), total[:, 0])
        return p, conj, zmax

    def _probs_conj_at(self, cand: Candidates, zmax: Tensor, tau: Tensor,
                       shape: torch.Size) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`probs_conj` from the candidates of pruned rows ``(N, V)`` (every other entry has
        ``p = 0``): the same sums over the candidates alone (other rounding than dense sums)."""
        r, p, total = entmax_at_candidates(cand, zmax, tau, self.alpha - 1, renormalise=True)

        def row_sums(values: Tensor) -> Tensor:
            return total.new_zeros(total.shape).index_add_(0, cand.rows, values)

        conj = self._conjugate(tau[:, 0], row_sums(p), row_sums(p * r), total)
        return scatter_candidates(p, cand, shape), conj, zmax

    def _conjugate(self, tau: Tensor, p_sum: Tensor, pr: Tensor, total: Tensor) -> Tensor:
        """``Omega*(z') = <z', p> - Omega(p)`` per row ``(N,)`` of the renormalised ``p = p_raw /
        total`` from the row sums ``p_sum = sum p`` and ``pr = <p, r>``, ``r = [(alpha - 1) z' -
        tau']_+``: with ``(alpha - 1) z'_i = tau' + r_i`` on the support (no product with ``-inf``
        scores) ``<z', p> = (tau' sum p + <p, r>) / (alpha - 1)``, and ``sum p^alpha`` without a
        second power: before renormalising ``p_raw^alpha = p_raw r`` (``alpha / (alpha - 1) = 1 /
        (alpha - 1) + 1``), so ``sum (p_raw / S)^alpha = <p, r> / S^(alpha - 1)``. A one-hot ``p``
        has ``r_t = -tau'`` and ``sum p^alpha = 1``: exactly 0."""
        am1 = self.alpha - 1
        zp = (tau * p_sum + pr) / am1
        return zp - self.omega_of_power_sum(pr / total.pow(am1))


class TsallisSparsemax(Tsallis):
    """alpha = 2, exact: ``p = [z' - tau']_+``, ``Omega* = (tau' + 1) + (|p|^2 - 1) / 2``."""

    def __init__(self) -> None:
        super().__init__(2.0)

    def probs_conj(self, z: Tensor, impl: str) -> tuple[Tensor, Tensor, Tensor]:
        if self.uses_kernel(z, impl):
            return self.kernel_probs_conj(z)
        long = native_long_sparsemax(z, squares=True) if resolve_impl(impl, z) == "pruned" else None
        if long is not None:  # long rows on the CPU: threshold, p and |p|^2 in one native pass a row
            p, squares, tau, zmax = long
            return p, (tau + 1) + 0.5 * (squares - 1), zmax[:, None]
        tau, zmax = shifted_threshold(z, 1.0, impl=impl)  # the front door of sparsemax_threshold
        p = torch.sub(z, zmax).sub_(tau).clamp_(min=0)  # p_t = -tau' at the maximum, exactly
        return p, (tau[:, 0] + 1) + 0.5 * (torch.linalg.vecdot(p, p) - 1), zmax


class TsallisEntmax15(Tsallis):
    """alpha = 1.5, exact: ``p = [z'/2 - tau']_+^2``, ``Omega* = 2 (tau' + 1) + (2/3) (sum p^1.5 - 1)``."""

    def __init__(self) -> None:
        super().__init__(1.5)

    def probs_conj(self, z: Tensor, impl: str) -> tuple[Tensor, Tensor, Tensor]:
        if self.uses_kernel(z, impl):
            return self.kernel_probs_conj(z)
        long = native_long_entmax15(z, root=False, cube=True) if resolve_impl(impl, z) == "pruned" else None
        if long is not None:  # long rows on the CPU: threshold, p and sum p^1.5 in one native pass a row
            p, _, sum15, tau, zmax = long
            return p, 2 * (tau + 1) + (2.0 / 3.0) * (sum15 - 1), zmax[:, None]
        tau, zmax = shifted_threshold(z, 2.0, scale=0.5, impl=impl)  # as entmax15_threshold
        # sqrt(p) = [z/2 - zmax/2 - tau']_+ (halving is exact): r_t = -tau' at the maximum
        r = torch.add(-0.5 * zmax, z, alpha=0.5).sub_(tau).clamp_(min=0)
        p = torch.square(r)
        sum15 = torch.linalg.vecdot(r, p)  # sum p^1.5
        return p, 2 * (tau[:, 0] + 1) + (2.0 / 3.0) * (sum15 - 1), zmax


_SHANNON, _TSALLIS_SPARSEMAX, _TSALLIS_ENTMAX15 = Shannon(), TsallisSparsemax(), TsallisEntmax15()
"""The regularisers without parameters, made once (they hold no state): no objects per loss call."""


class _FenchelYoungFunction(torch.autograd.Function):
    """Per-row loss of ``z: (N, V)`` (any regulariser, any target); backward ``(p - y) * grad``."""

    @staticmethod
    def forward(ctx, z: Tensor, reg: Regularizer, index: Optional[Tensor], dist: Optional[Tensor],
                valid: Tensor, eps: float, impl: str) -> Tensor:  # type: ignore[override]
        p, conj, zmax = reg.probs_conj(z, impl)  # conj of z' = z - zmax
        if eps > 0 or index is None:
            finite = z > float("-inf")
            zs = torch.where(finite, z - zmax, 0)  # z', 0 at the -inf scores
        if eps > 0:
            m = count_true(finite, z.dtype).clamp_(min=1)[:, None]
            smooth = torch.where(finite, eps / m, 0)
        if index is not None:
            idx = index[:, None]
            zt = (z.gather(-1, idx) - zmax)[:, 0]
            impossible = zt == float("-inf")
            if eps > 0:  # y = (1 - eps) e_t + eps / m on the m finite classes
                zf = zs.sum(dim=-1) / m[:, 0]
                zy = (1 - eps) * zt + eps * zf
                a, b = eps / m[:, 0], 1 - eps + eps / m[:, 0]
                omega_y = reg.omega_of_power_sum((m[:, 0] - 1) * reg.phi(a) + reg.phi(b))
                grad = p.sub_(smooth).scatter_add_(-1, idx, torch.full_like(zt, eps - 1)[:, None])
            else:
                zy, omega_y = zt, 0.0  # Omega(e_t) = 0 for every regulariser
                grad = p.scatter_add_(-1, idx, torch.full_like(zt, -1.0)[:, None])
        else:
            y = dist if eps == 0 else (1 - eps) * dist + smooth
            on = y > 0
            impossible = (on & ~finite).any(dim=-1)
            zy = torch.linalg.vecdot(zs, y)
            omega_y = reg.omega(y)
            grad = p.sub_(y)
        loss = conj - zy if isinstance(omega_y, float) else conj - zy + omega_y
        loss = loss.clamp_(min=0)  # >= 0 in exact arithmetic: rounding only
        loss = torch.where(impossible, float("inf"), loss)
        loss = torch.where(valid, loss, 0)
        ctx.save_for_backward(grad, valid)  # ignored rows: zeroed in backward (no extra pass here)
        return loss

    @staticmethod
    def backward(ctx, g: Tensor):  # type: ignore[override]
        grad, valid = ctx.saved_tensors
        return grad * torch.where(valid, g, 0)[:, None], None, None, None, None, None, None


class _CrossEntropyFunction(torch.autograd.Function):
    """Cross-entropy of ``z: (N, V)`` at class indices, the Shannon case of
    :class:`_FenchelYoungFunction` in fewer passes (the torch path: CPU, float64, compiled
    graphs, devices without the Triton kernels). Forward: one ``log_softmax`` and gathers (no
    row maximum, argmax or probability pass), ``-log p_y``; with label smoothing ``eps``
    (``y = (1 - eps) e_t + eps / m`` on the ``m`` finite classes) the KL form
    ``Omega(y) - (1 - eps) log p_t - (eps / m) sum_finite log p`` (``Omega(y)`` in closed form).
    Backward: ``(softmax(z) - y) * grad`` with ``softmax = exp(log_softmax)`` from the saved
    ``log_softmax`` (so an evaluation forward never computes ``p``); float32 rows on the CPU in
    one native pass (:func:`nmt.sparse._native.xent_backward`), else in torch's. A target with score ``-inf``
    (rows of only ``-inf`` included) has loss ``inf``; rows whose ``log_softmax`` is NaN (no
    finite score, or a NaN / ``+inf`` score) get gradient ``p - y`` with ``p = 0``, as in the
    generic function. The loss is a KL divergence, >= 0 (``-log_softmax >= 0`` without
    smoothing; clamped at 0 with it). Exact as ``log_softmax`` is; no host synchronisation."""

    @staticmethod
    def forward(ctx, z: Tensor, index: Tensor, valid: Tensor, eps: float) -> Tensor:  # type: ignore[override]
        logp = torch.log_softmax(z, dim=-1)
        idx = index[:, None]
        logp_t = logp.gather(-1, idx)[:, 0]
        ctx.eps = eps
        if eps > 0:
            stats = xent_smoothing(z, logp)  # float32 CPU rows: one native pass
            if stats is not None:
                m, sum_logp, finite = stats
            else:
                finite = z > float("-inf")
                m = count_true(finite, z.dtype)
                sum_logp = torch.where(finite, logp, 0).sum(dim=-1)
            m = m.clamp_(min=1)
            a = eps / m  # the smoothed target: a on the finite classes, b = 1 - eps + a at t
            b = (1 - eps) + a
            omega_y = (m - 1) * a * a.log() + b * b.log()
            loss = (omega_y - (1 - eps) * logp_t - a * sum_logp).clamp_(min=0)
            ctx.save_for_backward(logp, index, valid, finite, a)
        else:
            loss = -logp_t
            ctx.save_for_backward(logp, index, valid)
        loss = torch.where(z.gather(-1, idx)[:, 0] == float("-inf"), float("inf"), loss)
        return torch.where(valid, loss, 0)

    @staticmethod
    def backward(ctx, g: Tensor):  # type: ignore[override]
        logp, index, valid = ctx.saved_tensors[:3]
        eps = ctx.eps
        g = torch.where(valid, g, 0)  # ignored rows: 0
        # float32 CPU rows: one native pass (the passes below, fused)
        finite, a = ctx.saved_tensors[3:] if eps > 0 else (None, None)
        # (not where the backward is differentiated itself: create_graph)
        found = None if torch.is_grad_enabled() else xent_backward(logp, finite, index, a, eps, g)
        if found is not None:
            return found, None, None, None
        p = logp.exp().nan_to_num_(0.0)  # rows whose log_softmax is NaN: p = 0
        if eps > 0:  # p - smoothing mass on the finite classes
            p = torch.where(finite, p.sub_(a[:, None]), 0)
        p.scatter_add_(-1, index[:, None], torch.full_like(p[:, :1], eps - 1.0))
        return p.mul_(g[:, None]), None, None, None


class _CrossEntropyKernelFunction(torch.autograd.Function):
    """:class:`_CrossEntropyFunction` by the fused Triton kernels (CUDA; CPU in Triton's
    interpreter), :func:`nmt.sparse._triton.cross_entropy_forward` / ``_backward``, from the raw
    targets, reduced in the forward's second launch: the forward reads the scores once and writes
    only per-row values and the reduced loss into two allocations (the loss; ``work``: the factor
    of "mean", the target check's flag, the rows' statistics), refuses a target out of range
    (:func:`_check`, no host sync), and saves nothing ``(N, V)`` but the scores themselves; the
    backward reads them once more and writes ``(softmax - y) * grad``, the factor of "mean"
    included. Same values and conventions (``-inf`` targets, empty / NaN rows, smoothing),
    computed in float32; no host synchronisation."""

    @staticmethod
    def forward(ctx, z: Tensor, target: Tensor, ignore_index: int, eps: float,  # type: ignore[override]
                reduction: str) -> Tensor:
        loss, work = _dispatch.kernels().cross_entropy_forward(z, target, ignore_index, eps, reduction)
        _check(work[1], _out_of_range(z.shape[-1], ignore_index))  # 1: every index accepted
        ctx.ignore_index, ctx.eps = ignore_index, eps
        ctx.save_for_backward(z, target, work)
        return loss

    @staticmethod
    def backward(ctx, g: Tensor):  # type: ignore[override]
        z, target, work = ctx.saved_tensors
        gz = _dispatch.kernels().cross_entropy_backward(z, target, work, g, ctx.ignore_index, ctx.eps)
        return gz, None, None, None, None


class _TsallisKernelFunction(torch.autograd.Function):
    """The Tsallis losses at class indices in the mapping kernel's launch and the reduction's
    (:func:`nmt.sparse._triton.tsallis_index_loss`): ``p``, the conjugate, the loss (0 at
    ``ignore_index``) and the gradient ``p - y`` (0 on ignored rows), the same values as
    :class:`_FenchelYoungFunction` with the kernel's ``p``, reduced, a target out of range refused
    (:func:`_check`); backward ``(p - y) * grad`` (times the factor of "mean"). No host
    synchronisation."""

    @staticmethod
    def forward(ctx, z: Tensor, target: Tensor, ignore_index: int, eps: float, alpha: float,  # type: ignore[override]
                reduction: str) -> Tensor:
        grad, loss, work = _dispatch.kernels().tsallis_index_loss(z, target, ignore_index, eps, alpha, reduction)
        _check(work[1], _out_of_range(z.shape[-1], ignore_index))  # 1: every index accepted
        ctx.reduction = reduction
        if reduction == "mean":
            ctx.save_for_backward(grad, work)
        else:  # (the factor is 1)
            ctx.save_for_backward(grad)
        return loss

    @staticmethod
    def backward(ctx, g: Tensor):  # type: ignore[override]
        grad = ctx.saved_tensors[0]
        if ctx.reduction == "none":
            g = g[:, None]
        elif ctx.reduction == "mean":
            g = g * ctx.saved_tensors[1][0]
        return grad * (g if g.dtype is grad.dtype else g.to(grad.dtype)), None, None, None, None, None


def _out_of_range(n_classes: int, ignore_index: int) -> str:
    """The message refusing a class index outside ``[0, n_classes)``."""
    return f"target class index out of range [0, {n_classes}) (and not ignore_index={ignore_index})"


def _cross_entropy_uses_kernel(z: Tensor, impl: str) -> bool:
    """Whether the index-target cross-entropy takes the fused kernels: ``impl`` ``"auto"`` off the
    CPU or ``"triton"``, where the kernels accept ``z``, not float64 (the torch path keeps its
    precision); while ``torch.compile`` traces too, as custom operators. Otherwise, ``"triton"``
    included, the torch path (cross-entropy never refuses an ``impl``)."""
    if impl not in ("auto", "triton") or z.dtype == torch.float64:
        return False
    if impl == "auto" and z.is_cpu:
        return False
    return _dispatch.triton_available(z)


def _check(ok: Tensor, message: str) -> None:
    """Refuse bad input without a host sync: ``ValueError(message)`` when ``ok`` (a scalar tensor:
    False or 0 refuses) is, raised at once on the CPU in eager mode; on an accelerator (or compiled)
    a device-side assertion that fails the next synchronising call."""
    if ok.is_cpu and not torch.compiler.is_compiling():
        try:
            torch._assert_async(ok, message)
        except RuntimeError:
            raise ValueError(message) from None
    else:
        torch._assert_async(ok, message)


def _simplex_tolerance(dtype: torch.dtype) -> float:
    """How far a distribution target's row sum may be from 1: rounding of its entries."""
    return max(1e-4, 16 * torch.finfo(dtype).eps)


def checked_distribution(target: Tensor, scores: Tensor, dtype: torch.dtype) -> Tensor:
    """A distribution ``target`` (..., V) of ``scores``' shape as (N, V) rows in ``dtype``, checked to
    lie on the simplex (entries >= 0, rows summing to 1 within rounding; :func:`_check`: a ValueError on
    the CPU in eager mode, a device-side assertion elsewhere). ValueError for another shape."""
    if target.shape != scores.shape:
        raise ValueError(f"distribution target of shape {tuple(target.shape)} must match scores "
                         f"{tuple(scores.shape)}")
    tol = _simplex_tolerance(target.dtype)
    dist = target.to(dtype).reshape(-1, scores.shape[-1])
    ok = (dist >= 0).all() & ((dist.sum(dim=-1) - 1).abs() <= tol).all()  # NaN fails too
    _check(ok, f"distribution target must lie on the simplex: entries >= 0, rows summing to 1 (within {tol:g})")
    return dist


def check_index_shape(target: Tensor, scores: Tensor) -> None:
    """ValueError unless class-index ``target`` has ``scores``' shape without the class dim."""
    if target.shape != scores.shape[:-1]:
        raise ValueError(f"index target of shape {tuple(target.shape)} must match scores without "
                         f"the class dim {tuple(scores.shape[:-1])}")


def fenchel_young_loss(reg: Regularizer, scores: Tensor, target: Tensor, ignore_index: int = -100,
                       reduction: str = "mean", label_smoothing: float = 0.0,
                       impl: str = "auto") -> Tensor:
    """Fenchel-Young loss of ``reg`` over the last dim of ``scores: (..., V)``.

    target: long ``(...)`` class indices in ``[0, V)`` or ``ignore_index``, or a float
    distribution ``(..., V)`` (entries >= 0, rows summing to 1 within rounding).
    reduction: "mean" (over non-ignored targets; 0 if none), "sum", or "none" (shape ``(...)``).
    impl: the algorithm (``"auto" | "pruned" | "static" | "triton"``, see
    :mod:`nmt.sparse._dispatch`). Where it means the Triton kernels (``"auto"`` on CUDA), index
    targets take one fused kernel (loss, gradient) and one reduction (the reduced loss, the
    target count and check) and distribution
    targets the mapping kernel's ``p`` and conjugate; otherwise the sparse losses pass it to the
    thresholds. Cross-entropy takes its kernels for ``"auto"`` off the CPU and ``"triton"``
    where they run (not float64), else the torch path; it never refuses an
    ``impl`` that :func:`check_impl` accepts.
    Half precisions are computed in float32; the loss is returned in the scores' dtype.
    No host synchronisation (with a sync-free ``impl``), see the module docstring.
    """
    if not isinstance(scores, Tensor) or not scores.is_floating_point() or scores.dim() == 0:
        raise ValueError("scores must be a floating point tensor of shape (..., V)")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; valid: {', '.join(_REDUCTIONS)}")
    check_impl(impl)
    eps = float(label_smoothing)
    if not 0.0 <= eps <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
    dtype, n_classes = scores.dtype, scores.shape[-1]
    if n_classes == 0:
        raise ValueError(f"scores of shape {tuple(scores.shape)} have no classes (last dim is 0)")
    if not isinstance(target, Tensor):
        raise ValueError(f"target must be a tensor, got {type(target).__name__}")
    z = scores.to(torch.float32) if dtype in (torch.float16, torch.bfloat16) else scores  # inline: no call
    # (compute_dtype's) on this route, whose nmt calls per loss are pinned (tests/sparse/test_host_ops.py)
    z = z if z.dim() == 2 else z.reshape(-1, n_classes)  # no view (nor its node) for 2-D scores
    index = dist = None
    if target.is_floating_point():
        dist = checked_distribution(target, scores, z.dtype)
        valid = torch.ones(z.shape[0], dtype=torch.bool, device=z.device)
    else:
        check_index_shape(target, scores)
        t = target if target.dim() == 1 else target.reshape(-1)
        fused = _fused_index_function(reg, z, impl)
        if fused is not None:  # two launches: loss, gradient, the reduction, the check (in the Function)
            args = (reg.alpha,) if isinstance(reg, Tsallis) else ()  # the Tsallis kernel takes alpha
            loss = fused.apply(z, t if t.device == z.device else t.to(z.device), int(ignore_index), eps,
                               *args, reduction)
            if reduction == "none" and scores.dim() != 2:
                loss = loss.reshape(scores.shape[:-1])
            return loss if loss.dtype == dtype else loss.to(dtype)
        valid = t != ignore_index
        index = torch.where(valid, t, 0).long()
        _check(((index >= 0) & (index < n_classes)).all(), _out_of_range(n_classes, ignore_index))
    with own_precision(z):  # the conjugates' products in z's dtype, not autocast's
        if isinstance(reg, Shannon) and index is not None:
            loss = _CrossEntropyFunction.apply(z, index, valid, eps)
        else:
            loss = _FenchelYoungFunction.apply(z, reg, index, dist, valid, eps, impl)
    return _reduce(loss, reduction, valid, scores.shape[:-1], dtype)


def _fused_index_function(reg: Regularizer, z: Tensor, impl: str) -> Optional[type]:
    """The kernel-backed Function for index targets (loss and gradient in one kernel, reduced and
    checked in one more program) where ``impl`` means the Triton kernels for ``z``
    (cross-entropy: see :func:`_cross_entropy_uses_kernel`), else None (the torch paths)."""
    if isinstance(reg, Shannon):
        return _CrossEntropyKernelFunction if _cross_entropy_uses_kernel(z, impl) else None
    if isinstance(reg, Tsallis) and reg.uses_kernel(z, impl):
        return _TsallisKernelFunction
    return None


def _reduce(loss: Tensor, reduction: str, valid: Tensor, shape: torch.Size, dtype: torch.dtype) -> Tensor:
    """Per-row ``loss`` reduced: "none" (``shape``), "sum", or "mean" over the rows ``valid``
    (bool) marks (0 if none; the count stays on the device); in ``dtype``."""
    if reduction == "none":
        loss = loss if loss.shape == shape else loss.reshape(shape)
        return loss if loss.dtype == dtype else loss.to(dtype)
    total = loss.sum()
    if reduction == "mean":
        total = total / valid.sum().clamp(min=1)
    return total if total.dtype == dtype else total.to(dtype)


def cross_entropy_loss(scores: Tensor, target: Tensor, ignore_index: int = -100,
                       reduction: str = "mean", label_smoothing: float = 0.0,
                       impl: str = "auto") -> Tensor:
    """Cross-entropy ``KL(y || softmax(scores))`` (softmax Fenchel-Young loss); gradient
    ``softmax(scores) - y``. Never synchronises; ``impl`` is accepted for uniformity, unused."""
    return fenchel_young_loss(_SHANNON, scores, target, ignore_index, reduction, label_smoothing, impl)


def sparsemax_loss(scores: Tensor, target: Tensor, ignore_index: int = -100,
                   reduction: str = "mean", label_smoothing: float = 0.0,
                   impl: str = "auto") -> Tensor:
    """Sparsemax loss (exact); gradient ``sparsemax(scores) - y``."""
    return fenchel_young_loss(_TSALLIS_SPARSEMAX, scores, target, ignore_index, reduction,
                              label_smoothing, impl)


def entmax15_loss(scores: Tensor, target: Tensor, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0,
                  impl: str = "auto") -> Tensor:
    """1.5-entmax loss (exact); gradient ``entmax15(scores) - y``."""
    return fenchel_young_loss(_TSALLIS_ENTMAX15, scores, target, ignore_index, reduction,
                              label_smoothing, impl)


def _bisect_regularizer(alpha: Union[float, Tensor], n_iter: Optional[int]) -> Regularizer:
    """The regulariser of one alpha: the exact closed forms at 1 (Shannon), 1.5 and 2 (the
    same loss as root finding gives, without its iterations), else root finding.

    A one-element tensor alpha is read on the host here, once, and checked as a float is (the
    loss has no gradient in alpha, no per-row alphas); ValueError for any other tensor and for a
    value that is not a finite number >= 1."""
    if isinstance(alpha, Tensor):
        if alpha.numel() != 1:
            raise ValueError("entmax_bisect_loss takes one alpha (a float or a one-element tensor), "
                             f"got a tensor of shape {tuple(alpha.shape)}")
        alpha = alpha.detach()
    alpha = float(alpha)
    if not 1 <= alpha < math.inf:  # inf: a NaN loss; NaN fails every comparison
        raise ValueError(f"entmax_bisect_loss needs a finite alpha >= 1 (1: cross-entropy), got {alpha}")
    if alpha == 1.0:
        return _SHANNON
    if alpha == 1.5:
        return _TSALLIS_ENTMAX15
    return _TSALLIS_SPARSEMAX if alpha == 2.0 else Tsallis(alpha, n_iter)


def entmax_bisect_loss(scores: Tensor, target: Tensor, alpha: Union[float, Tensor] = 1.5, ignore_index: int = -100,
                       reduction: str = "mean", label_smoothing: float = 0.0,
                       n_iter: Optional[int] = None, impl: str = "auto") -> Tensor:
    """alpha-entmax loss for a finite ``alpha >= 1`` (1: cross-entropy), a float or a one-element
    tensor (read on the host); gradient ``entmax_bisect - y``."""
    return fenchel_young_loss(_bisect_regularizer(alpha, n_iter), scores, target, ignore_index,
                              reduction, label_smoothing, impl)


class FenchelYoungLoss(nn.Module):
    """Module form: ``FenchelYoungLoss(reg, ignore_index, reduction, label_smoothing, impl)(scores, target)``."""

    def __init__(self, reg: Regularizer, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0, impl: str = "auto") -> None:
        super().__init__()
        if reduction not in _REDUCTIONS:
            raise ValueError(f"unknown reduction {reduction!r}; valid: {', '.join(_REDUCTIONS)}")
        check_impl(impl)
        self.reg, self.ignore_index = reg, ignore_index
        self.reduction, self.label_smoothing, self.impl = reduction, label_smoothing, impl

    def forward(self, scores: Tensor, target: Tensor) -> Tensor:
        return fenchel_young_loss(self.reg, scores, target, self.ignore_index, self.reduction,
                                  self.label_smoothing, self.impl)


class CrossEntropyLoss(FenchelYoungLoss):
    def __init__(self, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                 impl: str = "auto") -> None:
        super().__init__(Shannon(), ignore_index, reduction, label_smoothing, impl)


class SparsemaxLoss(FenchelYoungLoss):
    def __init__(self, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                 impl: str = "auto") -> None:
        super().__init__(TsallisSparsemax(), ignore_index, reduction, label_smoothing, impl)


class Entmax15Loss(FenchelYoungLoss):
    def __init__(self, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                 impl: str = "auto") -> None:
        super().__init__(TsallisEntmax15(), ignore_index, reduction, label_smoothing, impl)


class EntmaxBisectLoss(FenchelYoungLoss):
    def __init__(self, alpha: float = 1.5, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0, n_iter: Optional[int] = None, impl: str = "auto") -> None:
        super().__init__(_bisect_regularizer(alpha, n_iter), ignore_index, reduction, label_smoothing, impl)
