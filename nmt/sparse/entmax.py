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

import math
from typing import Optional, Union

import torch
from torch import Tensor, nn

from . import _dispatch
from ._common import (apply_last, apply_mask, broadcasts_to, check_scores, compute_dtype, fresh_output,
                      own_precision, row_exponent, rows, shaped)
from ._dispatch import check_impl, resolve_impl, shifted_threshold, takes_half
from ._softmax import softmax
from ._native import POWER_PROBS_MAX_N, power_backward, power_probs, support_backward, support_backward_serves
from ._threshold import (ROOT_MAX_ITER, Candidates, native_long_entmax15, native_sorted_probs,
                         pruned_shifted_threshold)
from .sparsemax import sparsemax

_NAN = float("nan")


NATIVE_BACKWARD_MAX_SHORT = 1 << 16
"""The float-alpha backward of short rows (at most :data:`nmt.sparse._native.POWER_PROBS_MAX_N`
entries) takes the native call up to this many entries: there torch's five operations cost more
than their arithmetic; beyond it torch's float32 powers (16 lanes) beat the native double ones (8)
on rows whose support is dense (4096 x 50 at alpha 1.3: 0.22 against 0.28 ms). Long rows always
take it (mostly chunks without support: 1024 x 8,000, 4.2 against 9.8-11.9 ms)."""


def entmax15_threshold(x: Tensor, impl: str = "auto") -> Tensor:
    """Exact threshold ``tau: (..., 1)`` of 1.5-entmax, ``p = [x/2 - tau]_+^2``, for ``x: (..., n)``.

    ``+inf`` for rows without finite entries, NaN for rows holding NaN or ``+inf``. ``impl``:
    ``"auto" | "pruned" | "static" | "triton"`` (= static here), see :mod:`nmt.sparse._dispatch`.
    """
    tau, zmax = shifted_threshold(x, 2.0, scale=0.5, impl=impl)
    return tau + 0.5 * zmax


def entmax_threshold(x: Tensor, alpha: Union[float, Tensor] = 1.5, impl: str = "auto",
                     n_iter: Optional[int] = None) -> Tensor:
    """Threshold ``tau: (..., 1)`` of alpha-entmax, ``p = [(alpha - 1) x - tau]_+^(1/(alpha-1))``
    summing to one, for ``x: (..., n)`` and ``alpha > 1`` (a float, or a tensor broadcastable
    to ``(..., 1)``, one alpha per row).

    Exact for a float alpha of 1.5 or 2; otherwise to float precision. ``n_iter``: cap on the
    pruned path's steps / the static path's number of steps. ``impl`` as in
    :func:`entmax15_threshold`. ``+inf`` for rows without finite entries.
    """
    if not isinstance(alpha, Tensor):
        if not float(alpha) > 1:
            raise ValueError(f"entmax_threshold needs alpha > 1, got {alpha}")
        am1 = float(alpha) - 1
        q = 1 / am1
        tol = None if q in (1.0, 2.0) else torch.finfo(x.dtype).eps
        tau, zmax = shifted_threshold(x, q, am1, impl, tol, n_iter)
        return tau + am1 * zmax
    am1 = alpha.to(x.dtype) - 1
    zmax = _row_max(x)
    tau, zmax2 = shifted_threshold((x - zmax) * am1, 1 / am1, 1.0, impl, torch.finfo(x.dtype).eps, n_iter)
    return tau + zmax2 + am1 * zmax


def _row_max(x: Tensor) -> Tensor:
    """Row maxima ``(..., 1)``: 0 for rows without finite entries, NaN for rows with NaN or ``+inf``."""
    zmax = x.amax(dim=-1, keepdim=True)
    zmax = torch.where(zmax == float("-inf"), 0, zmax)
    return torch.where(zmax == float("inf"), _NAN, zmax)


def _sqrt_probs_at(cand: Candidates, zmax: Tensor, tau: Tensor, shape: torch.Size) -> Tensor:
    """``sqrt(p) = [x/2 - zmax/2 - tau]_+`` of 1.5-entmax at the candidates ``cand`` of the rows
    (``zmax, tau: (..., 1)``), zeros elsewhere: a new tensor of ``shape`` with, at the candidates,
    the values of the dense formula of :class:`Entmax15Function`, bit for bit."""
    rows = cand.rows
    r = torch.add(-0.5 * zmax.reshape(-1)[rows], cand.values, alpha=0.5).sub_(tau.reshape(-1)[rows]).clamp_(min=0)
    return scatter_candidates(r, cand, shape)


def sparse_output_pays(cand: Optional[Candidates], zmax: Tensor, x: Tensor) -> bool:
    """Whether a mapping's output is written at the candidates only (zeros elsewhere) instead of
    computed over every entry: every row was pruned (``cand`` given), the candidates are at most
    :data:`SPARSE_OUTPUT_SHARE` of the entries, and no row is NaN (whose output is all NaN). One
    host read of the row maxima (the CPU path's)."""
    return (cand is not None and cand.index.numel() <= SPARSE_OUTPUT_SHARE * x.numel()
            and not bool(zmax.isnan().any()))


SPARSE_OUTPUT_SHARE = 0.25
"""Largest share of candidates among the entries for which :func:`sparse_output_pays`."""


def entmax_at_candidates(cand: Candidates, zmax: Tensor, tau: Tensor, am1: float,
                         renormalise: bool) -> tuple[Tensor, Tensor, Tensor]:
    """alpha-entmax (float ``am1 = alpha - 1``) at the candidates ``cand`` of the rows (every
    other entry is 0): ``r = [(alpha - 1)(x - zmax) - tau]_+`` and ``p = r^(1 / (alpha - 1))``
    as :class:`EntmaxBisectFunction`'s dense formula computes them (the same operations on the
    same values; a power may differ by an ulp between torch's vectorised and scalar loops), and
    ``p`` divided by its row sum where ``renormalise`` (summed over the candidates: other
    rounding than a dense sum). Only the candidates, a few percent of an output row, take the
    power. ``zmax, tau: (R, 1)``. Returns ``(r, p, total)``: ``(M,)``, ``(M,)`` and the row sums
    of the unnormalised ``p``, ``(R,)`` (clamped at the smallest normal number)."""
    rows = cand.rows
    r = torch.sub(cand.values, zmax.reshape(-1).index_select(0, rows)).mul_(am1)
    r = r.sub_(tau.reshape(-1).index_select(0, rows)).clamp_(min=0)
    p = r * r if am1 == 0.5 else r.clone() if am1 == 1 else r.pow(1 / am1)
    total = p.new_zeros(zmax.numel()).index_add_(0, rows, p).clamp_(min=torch.finfo(p.dtype).tiny)
    if renormalise:
        p = p.div_(total.index_select(0, rows))
    return r, p, total


def scatter_candidates(values: Tensor, cand: Candidates, shape: torch.Size) -> Tensor:
    """A new tensor of ``shape`` holding ``values: (M,)`` at the candidates' positions, 0 elsewhere."""
    out = values.new_zeros(shape)
    out.view(-1).index_copy_(0, cand.index, values)
    return out


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
    power = row_exponent(power, p) if isinstance(power, Tensor) else power
    return torch.where(supp, torch.where(supp, p, 1).pow(power), 0)


class Entmax15Function(torch.autograd.Function):
    """1.5-entmax over the last dim of a float32/float64 tensor; ``impl`` as in
    :func:`entmax15_threshold` (``"triton"``: the fused kernels)."""

    @staticmethod
    def forward(ctx, x: Tensor, impl: str = "auto") -> Tensor:  # type: ignore[override]
        kind = resolve_impl(impl, x)
        ctx.triton, ctx.native, ctx.pruned = kind == "triton", False, kind == "pruned"
        if ctx.triton:  # the kernels take (..., n) rows as they are: no view, nor its node
            p = _dispatch.kernels().entmax15_forward(x)
            ctx.save_for_backward(p)
            return p
        r = None
        if kind == "pruned" and not torch.compiler.is_compiling():
            fused = native_sorted_probs(x, 2.0, root=ctx.needs_input_grad[0])
            if fused is not None:  # threshold, r and p in one native call
                p, r = fused
                ctx.native = True
                ctx.save_for_backward(r)
                return p
            long = native_long_entmax15(x, root=ctx.needs_input_grad[0], cube=False)
            if long is not None:  # long rows: the same in one native pass a row
                p, r = long[0], long[1]
                if r is not None:
                    ctx.save_for_backward(r)
                return p
            tau, zmax, cand = pruned_shifted_threshold(x, 2.0, 0.5, candidates=True)
            if sparse_output_pays(cand, zmax, x):  # zeros but at the candidates
                r = _sqrt_probs_at(cand, zmax, tau, x.shape)
        else:
            tau, zmax = shifted_threshold(x, 2.0, scale=0.5, impl=kind)
        if r is None:  # [x/2 - zmax/2 - tau]_+: relative to the row max (x/2 - zmax/2 is exact: one pass)
            r = torch.add(-0.5 * zmax, x, alpha=0.5).sub_(tau).clamp_(min=0)
        if not ctx.needs_input_grad[0]:  # inference: square in place, no second large buffer
            return r.square_()
        ctx.save_for_backward(r)  # r = sqrt(p) = p^(2 - alpha): no sqrt needed in backward
        return r * r

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        (r,) = ctx.saved_tensors
        if ctx.triton:  # saved p: the kernel takes s = sqrt(p)
            return _dispatch.kernels().entmax15_backward(r, grad), None
        if ctx.native or (ctx.pruned and support_backward_serves(r)):  # one native pass (the static path: torch's)
            return shaped(support_backward(rows(r), rows(grad), indicator=False), r.shape), None
        return _entmax_backward(r, grad), None


def entmax15(scores: Tensor, dim: int = -1, mask: Optional[Tensor] = None, impl: str = "auto") -> Tensor:
    """Exact 1.5-entmax of ``scores`` along ``dim``.

    scores: any shape, float (half precisions computed in float32, returned in the input
    dtype); mask: bool, broadcastable, True = keep. Masked / ``-inf`` entries get exact
    zeros; rows with nothing kept are all zeros; rows holding NaN or ``+inf`` are all NaN.
    ``impl``: ``"auto" | "pruned" | "static" | "triton"`` (see :mod:`nmt.sparse._dispatch`;
    ``"static"`` never synchronises with the host). Returns probabilities shaped like ``scores``.
    """
    check_impl(impl)
    return apply_last(lambda x: Entmax15Function.apply(x, impl), scores, dim, mask, takes_half(impl))


class EntmaxBisectFunction(torch.autograd.Function):
    """alpha-entmax over the last dim; ``alpha: (..., 1)`` >= 1 a row, or broadcast to the rows (one
    a head: the backward returns one gradient a row, which autograd sums to ``alpha``'s shape).

    ``alpha_float``: the one alpha of every row as a float (scalar arithmetic), else None.
    ``span``: a tensor alpha's least and largest values where the caller read them (the host path),
    else None: all in (1, 2) on the CPU sends float32 rows to the native call.
    Rows whose tensor alpha is invalid (NaN, < 1 or +inf; only the sync-free paths get them) are NaN.
    """

    @staticmethod
    def forward(ctx, x: Tensor, alpha: Tensor, n_iter: Optional[int], alpha_float: Optional[float],
                impl: str = "auto", span: Optional[tuple[float, float]] = None) -> Tensor:  # type: ignore[override]
        kind = resolve_impl(impl, x)
        ctx.alpha, ctx.triton, ctx.weights = alpha_float, kind == "triton", False
        if ctx.triton:  # float alpha 2 / 1.5: the dedicated exact kernels; (..., n) rows as they are
            kernels = _dispatch.kernels()
            if alpha_float == 2.0:
                p = kernels.sparsemax_forward(x)
                ctx.save_for_backward(p)
            elif alpha_float == 1.5:
                p = kernels.entmax15_forward(x)
                ctx.save_for_backward(p)
            elif alpha_float is not None:  # one alpha for every row: a number to the kernels (no tensor)
                p = kernels.entmax_forward_scalar(x, alpha_float)
                ctx.save_for_backward(p)
            else:  # a tensor alpha, broadcastable to the rows: the kernels read it where it lies (alpha
                # 1: softmax rows, with a zero alpha-gradient, in the kernels)
                p = kernels.entmax_forward(x, alpha)
                ctx.save_for_backward(p, alpha)
                ctx.alpha_dtype = alpha.dtype
            return p
        tiny, eps = torch.finfo(x.dtype).tiny, torch.finfo(x.dtype).eps
        if alpha_float is not None:  # one alpha for all rows: scalar arithmetic on the big tensor
            am1 = alpha_float - 1
            q = 1 / am1  # q in {1, 2}: exact (verified closed form)
            tol = None if q in (1.0, 2.0) else eps
            renormalise = tol is not None or n_iter is not None  # not an exact threshold
            grads = any(ctx.needs_input_grad[:2])
            fused = _native_probs(x, am1, n_iter, eps, weights=grads) if kind == "pruned" and 0 < am1 < 1 else None
            if fused is not None:  # float32 rows: threshold, p and the backward's s = r^(q - 1) in one native call
                p, s, _ = fused
                if grads:
                    ctx.save_for_backward(s, None)
                    ctx.weights = True
                return p
            if kind == "pruned" and not torch.compiler.is_compiling():
                tau, zmax, cand = pruned_shifted_threshold(x, q, am1, tol, n_iter, candidates=True)
                if sparse_output_pays(cand, zmax, x):  # the powers at the candidates only
                    r, p, _ = entmax_at_candidates(cand, zmax, tau, am1, renormalise)
                    if grads:
                        ctx.save_for_backward(scatter_candidates(r, cand, x.shape), alpha)
                    return scatter_candidates(p, cand, x.shape)
            else:
                tau, zmax = shifted_threshold(x, q, am1, kind, tol, n_iter)
            if am1 in (0.5, 1.0):  # exact products: one pass for the shifted scores
                r = torch.add(-am1 * zmax, x, alpha=am1)
            else:
                r = torch.sub(x, zmax).mul_(am1)
            r = r.sub_(tau).clamp_(min=0)  # [(alpha - 1)(x - zmax) - tau]_+
            if not grads:  # inference: in place, no second large buffer
                p = r.square_() if am1 == 0.5 else r if am1 == 1 else r.pow_(1 / am1)
                if not renormalise:  # the exact threshold: sums to one already
                    return p
                return p.div_(p.sum(dim=-1, keepdim=True).clamp_(min=tiny))
            p = r * r if am1 == 0.5 else r.clone() if am1 == 1 else r.pow(1 / am1)
            # p^(2 - alpha) is proportional to r^((2 - alpha) / (alpha - 1)) per row and the
            # backward is invariant to a per-row scale of s: keep r, skip a pow in backward
            ctx.save_for_backward(r, alpha)
        else:
            # one alpha a row here (no autograd inside the Function: an alpha broadcast to the rows,
            # one a head, costs no expand node, and autograd sums the rows' gradient to its shape)
            alpha = alpha if alpha.shape[:-1] == x.shape[:-1] else alpha.expand(*x.shape[:-1], 1)
            am1 = alpha - 1
            # alphas in (1, 2) (the caller's host read), float32 rows: one native call
            if (kind == "pruned" and x.dtype is torch.float32 and not torch.compiler.is_compiling()
                    and span is not None and 1 < span[0] and span[1] < 2):
                # with gradients: the backward's s and (a learnable alpha) dp/dalpha from the same
                # call, so the backward takes no power and no logarithm; long rows with a learnable
                # alpha: p, whose powers and logarithms the backward takes
                grads, galpha = any(ctx.needs_input_grad[:2]), ctx.needs_input_grad[1]
                fast = grads and (not galpha or x.shape[-1] <= POWER_PROBS_MAX_N)
                fused = _native_probs(x, am1, n_iter, eps, weights=fast, dalpha=fast and galpha)
                if fused is not None:
                    p, s, dp = fused
                    if fast:
                        ctx.save_for_backward(s, dp)
                        ctx.weights, ctx.alpha_dtype = True, alpha.dtype
                    elif grads:
                        ctx.save_for_backward(p, alpha)
                    return p
            z = (x - _row_max(x)) * am1
            tau, zmax = shifted_threshold(z, 1 / am1, 1.0, kind, eps, n_iter)
            p = torch.sub(z, zmax).sub_(tau).clamp_(min=0).pow_(row_exponent(1 / am1, z))
            renormalise = True
        if renormalise:
            p = p.div_(p.sum(dim=-1, keepdim=True).clamp_(min=tiny))
        if alpha_float is None:
            # NaN / < 1 / +inf alpha (static path; inf would give uniform rows): a NaN row, no host read
            p = torch.where((alpha >= 1) & (alpha < math.inf), p, _NAN)
            ctx.save_for_backward(p, alpha)
        return fresh_output(p)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        if ctx.triton:  # the kernels for x and, in the same launch, a learnable alpha's gradient
            p, *a = ctx.saved_tensors  # p: shaped like x
            kernels = _dispatch.kernels()
            if ctx.needs_input_grad[1]:  # a learnable (tensor) alpha: both gradients in one launch
                gx, ga = kernels.entmax_backward_alpha(p, grad, a[0])
                gx = gx if ctx.needs_input_grad[0] else None
                # one per row (..., 1): autograd sums it to a broadcast alpha's shape (one per head)
                ga = ga.view(*p.shape[:-1], 1)
                return gx, ga if ga.dtype is ctx.alpha_dtype else ga.to(ctx.alpha_dtype), None, None, None, None
            if ctx.alpha == 2.0:
                gx = kernels.sparsemax_backward(p, grad)
            elif ctx.alpha == 1.5:
                gx = kernels.entmax15_backward(p, grad)
            elif ctx.alpha is not None:
                gx = kernels.entmax_backward_scalar(p, grad, ctx.alpha)
            else:
                gx = kernels.entmax_backward(p, grad, a[0])
            return gx, None, None, None, None, None
        if ctx.weights:  # saved s = r^(q - 1) (the native forward's last powers): no power here
            s, dp = ctx.saved_tensors  # (R, n) rows; dp: dp/dalpha (a learnable alpha), else None
            g2, found = rows(grad), None
            if not torch.compiler.is_compiling():
                found = power_backward(s, g2, 1.0, da=dp)
            if found is None:  # (the library went away between the passes: torch's formulas)
                gx = shaped(_entmax_backward(s, g2), grad.shape)
                galpha = None if dp is None else torch.linalg.vecdot(g2, dp).view(*grad.shape[:-1], 1)
            else:
                gx = shaped(found[0], grad.shape)
                galpha = None if dp is None else found[1].view(*grad.shape[:-1], 1)
            if dp is not None:
                galpha = galpha if galpha.dtype is ctx.alpha_dtype else galpha.to(ctx.alpha_dtype)
            return gx if ctx.needs_input_grad[0] else None, galpha, None, None, None, None
        if ctx.alpha is not None and not ctx.triton:  # saved r = [(alpha - 1) x - tau]_+, alpha a float
            r, _ = ctx.saved_tensors
            e = (2 - ctx.alpha) / (ctx.alpha - 1)
            if (e != 1 and r.dtype is torch.float32 and r.device.type == "cpu" and not torch.compiler.is_compiling()
                    and (r.shape[-1] > POWER_PROBS_MAX_N or r.numel() <= NATIVE_BACKWARD_MAX_SHORT)):
                found = power_backward(rows(r), rows(grad), e)  # s = r^e and J^T grad in one native call
                if found is not None:
                    return shaped(found[0], r.shape), None, None, None, None, None
            s = r if e == 1 else _support_power(r, e)
            return _entmax_backward(s, grad), None, None, None, None, None
        p, alpha = ctx.saved_tensors
        if p.dtype is torch.float32 and p.device.type == "cpu" and not torch.compiler.is_compiling():
            # one native call: s = p^(2 - alpha), J^T grad and, in the same pass, alpha's gradient
            a = alpha.detach().reshape(-1)  # (one a row: the forward expanded it)
            found = power_backward(rows(p), rows(grad), 2 - a, a - 1 if ctx.needs_input_grad[1] else None)
            if found is not None:
                gx = shaped(found[0], p.shape) if ctx.needs_input_grad[0] else None
                galpha = found[1].view(*p.shape[:-1], 1).to(alpha.dtype) if ctx.needs_input_grad[1] else None
                return gx, galpha, None, None, None, None
        s = _support_power(p, 2 - alpha)
        gx = _entmax_backward(s, grad) if ctx.needs_input_grad[0] else None
        galpha = _alpha_grad(p, alpha, grad, s) if ctx.needs_input_grad[1] else None
        return gx, galpha, None, None, None, None


def _native_probs(x: Tensor, am1: Union[float, Tensor], n_iter: Optional[int], eps: float,
                  weights: bool, dalpha: bool = False) -> Optional[tuple[Tensor, Optional[Tensor], Optional[Tensor]]]:
    """``(p, s, dp)`` of alpha-entmax over the last dim of ``x`` with ``alpha - 1 = am1`` in (0, 1) (a
    float, or a tensor ``(..., 1)`` of ``x``'s leading shape: one a row), by :func:`nmt.sparse._native.power_probs`: ``p`` shaped like
    ``x``; ``s = r^(q - 1)``, the backward's weights, where ``weights`` (else None), ``dp = dp/dalpha``
    where ``dalpha`` (else None; needs ``weights``, the backward takes both; rows of at most
    :data:`nmt.sparse._native.POWER_PROBS_MAX_N` entries), these two as ``(R, n)`` rows, as the
    backward reads them (no views: a view of a 3- or 4-D tensor costs 1-3 us of host time); None
    where it does not serve: not float32
    on the CPU in eager mode, no native library, or ``dalpha`` on longer rows (the torch path then
    runs)."""
    if x.dtype is not torch.float32 or x.device.type != "cpu" or torch.compiler.is_compiling():
        return None
    found = power_probs(rows(x), am1, ROOT_MAX_ITER if n_iter is None else n_iter, eps, False,
                        weights=weights, dalpha=weights and dalpha)
    if found is None:
        return None
    return shaped(found[0], x.shape), found[2] if weights else None, found[3] if weights and dalpha else None


def _alpha_grad(p: Tensor, alpha: Tensor, grad: Tensor, s: Optional[Tensor] = None) -> Tensor:
    """``<grad, dp/dalpha>`` per row ``(..., 1)`` at output ``p``; ``s = p^(2 - alpha)`` on the
    support (computed if not given). No host sync."""
    am1 = alpha - 1
    if s is None:
        s = _support_power(p, 2 - alpha)
    supp = p > 0
    logp = torch.where(supp, p, 1).log()
    w = p * (1 - am1 * logp) / (am1 * am1)
    ssum = s.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(s.dtype).tiny)
    dp = w - s * (w.sum(dim=-1, keepdim=True) / ssum)
    return (grad * dp).sum(dim=-1, keepdim=True)


def _float_alpha(alpha: float) -> float:
    """``alpha`` as a float, or ValueError unless it is finite and at least 1."""
    a = float(alpha)
    if not 1 <= a < math.inf:  # inf gave uniform rows
        raise ValueError(f"entmax_bisect needs a finite alpha >= 1, got alpha={alpha}")
    return a


def _alpha_rows(alpha: Union[float, Tensor], scores: Tensor, dim: int, check: bool,
                dtype: torch.dtype) -> tuple[Tensor, Optional[tuple[float, float]]]:
    """``(a, span)``: alpha as a ``dtype`` tensor ``(..., 1)`` matching ``scores`` (its shape and
    device only) with ``dim`` moved last, and ``span`` (a tensor alpha's least and largest values
    where ``check``, else None).

    ``check``: read a tensor alpha's extremes (one host read: only on the host path) and refuse a
    value < 1, NaN or +inf (the static path gives such rows NaN instead of synchronising).
    """
    if not isinstance(alpha, Tensor):
        a = _float_alpha(alpha)
        return scores.new_full((1,) * scores.dim(), a, dtype=dtype).movedim(dim, -1), None
    # no-op conversions skipped: each costs a dispatch (and a view its autograd node in backward)
    a = alpha if alpha.dtype is dtype else alpha.to(dtype)
    if a.dim() > scores.dim():
        raise ValueError(f"alpha of shape {tuple(alpha.shape)} has more dims than scores {tuple(scores.shape)}")
    if a.dim() < scores.dim():
        a = a.reshape((1,) * (scores.dim() - a.dim()) + tuple(a.shape))
    if a.shape[dim] != 1:
        raise ValueError(f"alpha of shape {tuple(alpha.shape)} must have size 1 along dim={dim} "
                         f"of scores {tuple(scores.shape)} (one alpha per row)")
    if not broadcasts_to(a.shape, scores.shape):
        raise ValueError(f"alpha of shape {tuple(alpha.shape)} does not broadcast to scores "
                         f"{tuple(scores.shape)}")
    span = None
    if check:  # one host read of the small alpha tensor: its extremes
        lo, hi = torch.stack(torch.aminmax(a.detach())).tolist()  # (NaN: both NaN)
        if not (lo >= 1 and hi < math.inf):  # inf gave uniform rows, as a float alpha
            raise ValueError("entmax_bisect needs a finite alpha >= 1 in every row (got a value < 1, NaN or inf)")
        span = (lo, hi)
    return (a if dim == a.dim() - 1 else a.movedim(dim, -1)), span


def entmax_bisect(scores: Tensor, alpha: Union[float, Tensor] = 1.5, dim: int = -1,
                  mask: Optional[Tensor] = None, n_iter: Optional[int] = None,
                  impl: str = "auto") -> Tensor:
    """alpha-entmax of ``scores`` along ``dim`` for any ``alpha >= 1``.

    alpha: float, or a tensor broadcastable to ``scores`` with size 1 along ``dim`` (one
    alpha per row; gradients flow to it). ``alpha = 1`` is softmax, ``2`` sparsemax.
    n_iter: cap on root-finding steps (pruned path; None: until the dtype's precision, which
    takes few steps) or the number of steps (static path; None: enough for the dtype's
    precision); the result is renormalised to sum to one. mask: bool, True = keep.
    impl: ``"auto" | "pruned" | "static" | "triton"`` (see :mod:`nmt.sparse._dispatch`).
    A tensor alpha below 1, NaN or +inf raises ValueError on the host path (``"pruned"`` in eager
    mode); on the static path (no host synchronisation) and in compiled graphs its rows are NaN
    instead.
    Half precisions are computed in float32. Returns probabilities shaped like ``scores``.
    Rows with ``alpha == 1`` (tensor alpha) use softmax and get a zero alpha-gradient (off the
    host path: a softmax of every row, selected by a mask; see :func:`entmax_bisect_above_one`).
    """
    return _entmax_bisect(scores, alpha, dim, mask, n_iter, impl, above_one=False)


def entmax_bisect_above_one(scores: Tensor, alpha: Tensor, dim: int = -1, mask: Optional[Tensor] = None,
                            n_iter: Optional[int] = None, impl: str = "auto") -> Tensor:
    """:func:`entmax_bisect` for a tensor ``alpha`` the caller keeps above 1 (the learned heads,
    clamped at 1.01): no rows take softmax, so none is computed (off the host path
    :func:`entmax_bisect` computes a softmax of every row to select those with ``alpha == 1``).
    Rows with ``alpha == 1`` would get 2-entmax here."""
    return _entmax_bisect(scores, alpha, dim, mask, n_iter, impl, above_one=True)


def _entmax_bisect(scores: Tensor, alpha: Union[float, Tensor], dim: int, mask: Optional[Tensor],
                   n_iter: Optional[int], impl: str, above_one: bool) -> Tensor:
    d = check_scores(scores, dim)
    check_impl(impl)
    if not isinstance(alpha, Tensor) and float(alpha) == 1.0:
        return softmax(scores, dim=d, mask=mask)
    if not isinstance(alpha, Tensor) and n_iter is None and float(alpha) in (1.5, 2.0):
        # the exact closed forms: the same values and gradients as below, without the alpha plumbing
        exact = entmax15 if float(alpha) == 1.5 else sparsemax
        return exact(scores, dim=d, mask=mask, impl=impl)
    if n_iter is not None and (isinstance(n_iter, bool) or not isinstance(n_iter, int) or n_iter < 1):
        raise ValueError(f"n_iter must be a positive int or None, got {n_iter!r}")
    dtype = scores.dtype
    cdt = compute_dtype(dtype)
    if scores.numel() == 0:
        return scores.clone()
    last = d == scores.dim() - 1
    x = apply_mask(scores, mask)
    x = x if last else x.movedim(d, -1)
    kind = resolve_impl(impl, x)
    if kind != "triton":  # the kernels take half precisions themselves (computed in float32)
        x = x if x.dtype is cdt else x.to(cdt)
    host = kind == "pruned" and not torch.compiler.is_compiling()  # host reads only in eager mode
    triton = kind == "triton"
    span = None  # a tensor alpha's least and largest values (read on the host path only)
    if triton and not isinstance(alpha, Tensor):  # a float: a number to the kernels, no tensor
        a = _float_alpha(alpha)
    else:
        a, span = _alpha_rows(alpha, scores, d, check=host, dtype=cdt)
        # as it broadcasts (one per head): the kernels read it where it lies, the Function's CPU
        # path expands it inside (no expand node in the graph; autograd sums the rows' gradient)
    with own_precision(x):
        if isinstance(alpha, Tensor) and (above_one or triton):  # (the kernels: alpha = 1 rows are softmax)
            p = EntmaxBisectFunction.apply(x, a, n_iter, None, kind, span)
        elif isinstance(alpha, Tensor):
            if span is not None and span[0] > 1:  # no row with alpha = 1 (the host read above)
                p = EntmaxBisectFunction.apply(x, a, n_iter, None, kind, span)
            else:  # the rows with alpha = 1 take softmax (selected by a mask: no host read)
                one = a == 1
                p = EntmaxBisectFunction.apply(x, torch.where(one, 2.0, a), n_iter, None, kind)
                p = torch.where(one, softmax(x, dim=-1), p)
        else:
            p = EntmaxBisectFunction.apply(x, None if triton else a, n_iter, float(alpha), kind)
    p = p if last else p.movedim(-1, d)
    return p if p.dtype is dtype else p.to(dtype)


class Entmax15(nn.Module):
    """Module form of :func:`entmax15` over a fixed ``dim``."""

    def __init__(self, dim: int = -1, impl: str = "auto") -> None:
        super().__init__()
        self.dim, self.impl = dim, check_impl(impl)

    def forward(self, scores: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return entmax15(scores, dim=self.dim, mask=mask, impl=self.impl)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, impl={self.impl!r}"


class EntmaxBisect(nn.Module):
    """Module form of :func:`entmax_bisect`; ``alpha`` may be a float or a learnable tensor."""

    def __init__(self, alpha: Union[float, Tensor] = 1.5, dim: int = -1, n_iter: Optional[int] = None,
                 impl: str = "auto") -> None:
        super().__init__()
        self.alpha, self.dim, self.n_iter, self.impl = alpha, dim, n_iter, check_impl(impl)

    def forward(self, scores: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return entmax_bisect(scores, alpha=self.alpha, dim=self.dim, mask=mask, n_iter=self.n_iter,
                             impl=self.impl)

    def extra_repr(self) -> str:
        a = self.alpha if not isinstance(self.alpha, Tensor) else f"tensor{tuple(self.alpha.shape)}"
        return f"alpha={a}, dim={self.dim}, n_iter={self.n_iter}, impl={self.impl!r}"
