"""Fused Triton kernels for sparsemax, 1.5-entmax and alpha-entmax (forward and backward).

Optional: ``triton`` is imported lazily, on the first kernel launch, and this module imports
without it (:func:`is_available` then says False). Kernels run on CUDA tensors, or on CPU
tensors under the Triton interpreter (``TRITON_INTERPRET=1``, how the tests check them without
a GPU; it must be set before ``triton`` is first imported, which builds its library functions
for the interpreter or the compiler). The kernels are built on first use, for that setting.

Layout: ``(..., n)`` tensors, ``R`` rows of ``n`` normalised along the last dim (made contiguous
where they are not; taken with their shape: no view, nor its autograd node, around a launch; the
losses take ``(R, n)``). Inputs of any
float dtype are computed in float32 and returned in the input dtype (so float64 inputs lose
precision: callers wanting float64 results use the torch path).

Design: one program per row; the row is loaded once into registers (``BLOCK`` = the next
power of two >= n, at most :data:`MAX_N` = 65536 entries) and every pass below reads it there
(ptxas for sm_90 reports no spills up to 16384 entries; longer rows spill a little to local
memory with 32 warps).
With ``z = (alpha - 1) x - max((alpha - 1) x)`` the threshold ``tau`` of
``p = [z - tau]_+^q``, ``q = 1 / (alpha - 1)``, lies in ``[-1, -k^(1 - alpha)]`` (``k`` the
number of finite entries). The kernel

1. bisects that bracket a fixed number of times (``f(tau) = sum p - 1`` is decreasing);
2. refines from the lower end (``f >= 0``) by Newton steps, safeguarded by the bracket (for
   ``q >= 1`` ``f`` is convex and the iterates increase monotonically to the root; for
   ``q < 1``, i.e. alpha > 2, ``f`` is concave with unbounded slope at the kinks, and plain
   bisection continues instead);
3. for ``q`` in {1, 2} (sparsemax, 1.5-entmax, and alpha-entmax rows with alpha 2 or 1.5)
   takes at every iterate the closed form on the support ``S = {z > tau}`` (sparsemax: the
   mean, ``t = (sum_S z - 1) / |S|``; 1.5-entmax: the smaller root of
   ``sum_S (z - t)^2 = 1``) and accepts it once *verified*: every entry of ``S`` is ``>= t``
   and every other ``<= t``, which makes ``t`` a root of ``f`` and so the exact threshold.
   Other ``q``: stop once a Newton step or the bracket is below ``2 eps`` (relative), then
   renormalise ``p`` to sum to one (as the torch path does).

The refinement loop runs on the device with a data-dependent trip count capped at
``MAX_ITER`` (64); rows that reach the cap unverified (ties within rounding of the threshold;
not seen in the tests) keep the last iterate and are renormalised. Grid sizes and launch
parameters depend on shapes only: the wrappers never synchronise with the host.

``-inf`` entries (masks) get exact zeros; a row without finite entries maps to all zeros (and
a zero gradient), as in the torch implementation; a row holding NaN or ``+inf`` maps to all
NaN. alpha-entmax rows with ``alpha == 1`` are computed as softmax; the supported range of
``alpha_rows`` is ``[1, inf)`` (tested up to 3; beyond about 7 the threshold of long rows
underflows float32); rows with ``alpha < 1``, NaN or ``+inf`` are all NaN.

Backward: ``dx = s * g - s * (<s, g> / sum s)`` with ``s = p^(2 - alpha)`` on the support
(sparsemax: the support indicator; 1.5-entmax: ``sqrt(p)``; alpha = 1: ``p``, softmax's
Jacobian), one program per row.

Fenchel-Young losses (:mod:`nmt.sparse.losses`) reuse the forward kernel with an epilogue
(``LOSS_MODE``): the Tsallis conjugate ``Omega*(x - max x)`` (:func:`tsallis_probs_conj`; for
sparsemax / 1.5-entmax from the threshold and row sums, the closed form the static torch path
uses) and, for class-index targets, the loss and its gradient ``p - y`` in place of ``p``
(:func:`tsallis_index_loss`). Cross-entropy has its own two small kernels
(:func:`cross_entropy_forward`: one read of the row, per-row outputs only;
:func:`cross_entropy_backward`: ``(softmax - y) * g`` recomputed from the scores). Index-target
kernels write a status per row (counted, refused), which one program of :func:`_finish_kernel`
reads with the rows' losses: the sum or mean in row order (deterministic), the factor of the
mean for the backward and the flag of the caller's range check, all of it in one ``work`` buffer
beside the loss (:func:`_index_loss_outputs`: two allocations a loss). alpha-entmax takes one
alpha for every row as a number (no tensor made for it), or a tensor read where it lies, one per
row or broadcast over leading dims (one per head: :func:`_alpha`). None of them synchronises
with the host.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Optional

import torch
from torch import Tensor

MAX_N = 65536
"""Longest row the kernels take (the row is held on chip as one block)."""

N_BISECT = 8
"""Bisection steps before the Newton refinement (fixed)."""

MAX_ITER = 64
"""Cap on the in-kernel refinement loop (data-dependent trip count on the device only)."""

_SPARSEMAX, _ENTMAX15, _ALPHA = 0, 1, 2

_KERNELS: Dict[Any, Any] = {}
"""Every jitted kernel, per (function, ``TRITON_INTERPRET`` setting) (:func:`jitted`), and this
module's namespace of them per setting (:func:`_kernels`): clearing it builds them all anew."""
_TRITON: Optional[Any] = None
_IMPORT_ERROR: Optional[BaseException] = None
_LIBRARY_INTERPRETED: Optional[bool] = None
tl: Any = None  # triton.language, bound on first use (the kernels resolve it from the module globals)


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _import_triton() -> Optional[Any]:
    """``triton`` or None (cached; never raises)."""
    global _TRITON, _IMPORT_ERROR, tl
    if _TRITON is None and _IMPORT_ERROR is None:
        try:
            import triton
            import triton.language as language
        except Exception as e:  # ImportError, or a broken install
            _IMPORT_ERROR = e
        else:
            _TRITON, tl = triton, language
    return _TRITON


def _runs_here(x: Tensor) -> bool:
    """Whether a kernel can run on ``x``'s device in this process: CUDA with compiled kernels
    (``triton.language`` imported for the compiler), or CPU with ``TRITON_INTERPRET=1``, which must
    also have been set when ``triton.language`` was first imported (its library functions are built
    for the interpreter or the compiler then). The environment is read for CPU tensors only: a
    CUDA call, at every decoder step of a host-bound GPU step, does not pay for it."""
    if x.is_cuda:
        return _import_triton() is not None and not _library_interpreted()
    if not (x.is_cpu and _interpret()) or _import_triton() is None:
        return False
    return _library_interpreted()


def _interpreted(x: Optional[Tensor] = None) -> bool:
    """Which kernels run on ``x`` where :func:`_runs_here` accepts it: the interpreter's on the CPU,
    the compiled ones on CUDA (the tensor's device only: no environment read). Without ``x``, the
    current ``TRITON_INTERPRET`` setting."""
    return _interpret() if x is None else not x.is_cuda


def _library_interpreted() -> bool:
    """Whether triton.language's library functions were built for the interpreter (fixed at
    its import; cached)."""
    global _LIBRARY_INTERPRETED
    if _LIBRARY_INTERPRETED is None:
        from triton.runtime.interpreter import InterpretedFunction
        _LIBRARY_INTERPRETED = isinstance(tl.standard.max, InterpretedFunction)
    return _LIBRARY_INTERPRETED


def is_available(x: Tensor) -> bool:
    """True if the kernels can run on ``x``: triton importable, ``x`` on CUDA (or on CPU with
    ``TRITON_INTERPRET=1`` set, also when triton was first imported), floating point, at least
    1-D with rows of at most :data:`MAX_N` entries. No host sync (shape, dtype, device only)."""
    if not isinstance(x, Tensor) or not x.is_floating_point() or x.dim() == 0:
        return False
    return x.shape[-1] <= MAX_N and _runs_here(x)


# --------------------------------------------------------------------------------------------
# Kernels (plain functions, decorated with triton.jit on first use; see _kernels)
# --------------------------------------------------------------------------------------------

def _forward_kernel(X, Y, A, OK, CONJ, ZMAX, T, LOSS, WORK, n, ignore_index, smoothing, alpha_all,
                    a_inner, a_size, loss_at, MODE: tl.constexpr, HAS_OK: tl.constexpr,
                    LOSS_MODE: tl.constexpr, SMOOTH: tl.constexpr, ALPHA_ROWS: tl.constexpr,
                    BLOCK: tl.constexpr, N_BISECT: tl.constexpr, MAX_ITER: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inb = cols < n
    x = tl.load(X + row * n + cols, mask=inb, other=float("-inf")).to(tl.float32)
    neg_inf = float("-inf")
    finite = x > neg_inf
    if MODE == 0:
        am1 = 1.0
        q = 1.0
        z = x
    elif MODE == 1:
        am1 = 0.5
        q = 2.0
        z = x * 0.5
    else:
        if ALPHA_ROWS:  # row r takes A[(r // a_inner) % a_size]: per row, or broadcast (per head)
            am1 = tl.load(A + (row // a_inner) % a_size).to(tl.float32) - 1.0
        else:  # one alpha for every row (a float32 scalar)
            am1 = alpha_all - 1.0
        q = 1.0 / tl.maximum(am1, 1e-30)
        z = tl.where(finite, x * am1, neg_inf)
    # a NaN or +inf score (or, alpha-entmax, an alpha < 1, NaN or +inf) makes the row NaN
    bad = tl.max(((x != x) | (x == float("inf"))).to(tl.int32), axis=0) > 0
    if MODE == 2:
        bad = bad | (~(am1 >= 0.0)) | (am1 == float("inf"))
    z = tl.where(finite & (x < float("inf")), z, neg_inf)
    m = tl.max(z, axis=0)
    nonempty = m > neg_inf
    z = z - tl.where(nonempty, m, 0.0)
    if LOSS_MODE > 0:  # max x (0 for a row without a finite score) and, smoothing, sum_finite x'
        if MODE == 0:
            xm = tl.where(nonempty, m, 0.0)
            if SMOOTH:
                sz = tl.sum(tl.where(z > neg_inf, z, 0.0), axis=0)
        elif MODE == 1:
            xm = tl.where(nonempty, 2.0 * m, 0.0)  # m = max(x / 2): halving is exact
            if SMOOTH:
                sz = 2.0 * tl.sum(tl.where(z > neg_inf, z, 0.0), axis=0)
        else:
            xm = tl.where(nonempty, tl.max(tl.where(x < float("inf"), x, neg_inf), axis=0), 0.0)
            if SMOOTH:
                sz = tl.sum(tl.where(finite & (x < float("inf")), x - xm, 0.0), axis=0)
    cnt = tl.maximum(tl.sum(finite.to(tl.float32), axis=0), 1.0)
    eps = 1.1920928955078125e-07
    # bracket: f(-1) >= 0 (the maximum alone gives 1), f(-cnt^(1 - alpha)) <= 0
    lo = 0.0 * cnt - 1.0
    hi = -tl.exp2(-am1 * tl.log2(cnt))
    if MODE == 2:  # the threshold may be tiny (alpha > 2): split the bracket geometrically
        hi = tl.minimum(hi, -1e-30)
    for _ in range(N_BISECT):
        if MODE == 2:
            mid = -tl.sqrt(lo * hi)
        else:
            mid = 0.5 * (lo + hi)
        d = tl.maximum(z - mid, 0.0)
        if MODE == 0:
            f = tl.sum(d, axis=0) - 1.0
        elif MODE == 1:
            f = tl.sum(d * d, axis=0) - 1.0
        else:
            pos = d > 0.0
            f = tl.sum(tl.where(pos, tl.exp2(q * tl.log2(tl.where(pos, d, 1.0))), 0.0), axis=0) - 1.0
        up = f >= 0.0
        lo = tl.where(up, mid, lo)
        hi = tl.where(up, hi, mid)
    if MODE == 2:
        exact_q = (q == 1.0) | (q == 2.0)
        go = (nonempty & (am1 > 0.0) & (~bad)).to(tl.int32)
    else:
        exact_q = True
        go = (nonempty & (~bad)).to(tl.int32)
    tau = lo
    ok = 0 * go
    it = 0 * go
    while go != 0:
        d = tl.maximum(z - tau, 0.0)
        s_mask = d > 0.0
        s = s_mask.to(tl.float32)
        k = tl.sum(s, axis=0)
        s1 = tl.sum(d, axis=0)
        s2 = tl.sum(d * d, axis=0)
        if MODE == 0:
            f = s1 - 1.0
            df = k
        elif MODE == 1:
            f = s2 - 1.0
            df = 2.0 * s1
        else:
            dq1 = tl.where(s_mask, tl.exp2((q - 1.0) * tl.log2(tl.where(s_mask, d, 1.0))), 0.0)
            f = tl.sum(dq1 * d, axis=0) - 1.0
            df = q * tl.sum(dq1, axis=0)
        up = f >= 0.0
        lo = tl.where(up, tau, lo)
        hi = tl.where(up, hi, tau)
        # the closed form on the support S = {z > tau}, verified (q in {1, 2})
        kk = tl.maximum(k, 1.0)
        t1 = tau + (s1 - 1.0) / kk
        disc = s1 * s1 - k * (s2 - 1.0)
        t2 = tau + (s1 - tl.sqrt_rn(tl.maximum(disc, 0.0))) / kk
        if MODE == 0:
            t = t1
            valid = k > 0.0
        elif MODE == 1:
            t = t2
            valid = (k > 0.0) & (disc >= 0.0)
        else:
            t = tl.where(q == 1.0, t1, t2)
            valid = exact_q & (k > 0.0) & ((q == 1.0) | (disc >= 0.0))
        zmin_in = tl.min(tl.where(s_mask, z, float("inf")), axis=0)
        zmax_out = tl.max(tl.where(s_mask, neg_inf, z), axis=0)
        verified = valid & (zmin_in >= t) & (zmax_out <= t)
        # next iterate: Newton (q >= 1) inside the bracket, else bisection
        newton = tau + f / tl.maximum(df, 1e-30)
        if MODE == 2:
            mid = -tl.sqrt(lo * hi)
        else:
            mid = 0.5 * (lo + hi)
        if MODE == 2:
            use_newton = (q >= 1.0) & (df > 0.0) & (newton > lo) & (newton < hi)
        else:
            use_newton = (df > 0.0) & (newton > lo) & (newton < hi)
        new = tl.where(use_newton, newton, mid)
        tol = 2.0 * eps * tl.abs(tau)  # tau < 0 (at most the bracket's upper end)
        if MODE == 2:
            step_small = (q >= 1.0) & (df > 0.0) & (tl.abs(newton - tau) <= tol)
            settled = (~exact_q) & ((f == 0.0) | (hi - lo <= tol) | step_small)
        else:
            settled = f != f  # False: exact modes end by verification (or the cap)
        tau = tl.where(verified, t, tl.where(settled, tau, new))
        ok = verified.to(tl.int32)
        it += 1
        go = ((~verified) & (~settled) & (it < MAX_ITER)).to(tl.int32)
    d = tl.maximum(z - tau, 0.0)
    if MODE == 0:
        p = d
    elif MODE == 1:
        p = d * d
    else:
        pos = d > 0.0
        p = tl.where(pos, tl.exp2(q * tl.log2(tl.where(pos, d, 1.0))), 0.0)
    total = tl.sum(p, axis=0)
    renorm = (ok == 0) & (total > 0.0)
    c = tl.where(renorm, 1.0 / tl.where(renorm, total, 1.0), 1.0)
    if LOSS_MODE > 0:
        # Fenchel-Young losses: Omega*(x') = <x', p> - Omega(p) at x' = x - max x. alpha 2 /
        # 1.5 from the threshold and row sums of the (unnormalised) p alone, as the static torch
        # path (no second (n,) array on chip): on the support (alpha - 1) x' = tau + d, so with
        # s = sum d^(q + 1) = sum p^alpha and sum p = 1 a verified row has the closed form
        # Omega* = [(tau + 1) + (1 - 1/alpha)(s - 1)] / (alpha - 1) (one-hot: tau = -1, s = 1:
        # exactly 0); an unverified row (renormalised by c) <x', p> = c (s + tau total) / (alpha - 1)
        if MODE == 0:
            s_next = tl.sum(p * p, axis=0)
            closed = (tau + 1.0) + 0.5 * (s_next - 1.0)
            general = c * (s_next + tau * total) - 0.5 * (c * c * s_next - 1.0)
            conj = tl.where(ok != 0, closed, general)
        elif MODE == 1:
            # sqrt_rn(d * d) = d: sum d^3 (the zeros take sqrt(1): sqrt_rn's slow path, a call on
            # GPUs, serves zeros, subnormals and NaN, and most entries of a sparse row are zeros)
            sq = p > 0.0
            s_next = tl.sum(tl.where(sq, p * tl.sqrt_rn(tl.where(sq, p, 1.0)), p * 0.0), axis=0)
            closed = 2.0 * (tau + 1.0) + (2.0 / 3.0) * (s_next - 1.0)
            general = 2.0 * c * (s_next + tau * total) - (4.0 / 3.0) * (c * tl.sqrt_rn(c) * s_next - 1.0)
            conj = tl.where(ok != 0, closed, general)
    p = p * c
    if MODE == 2:  # alpha == 1: softmax
        e = tl.where(finite, tl.exp(x - tl.where(nonempty, tl.max(x, axis=0), 0.0)), 0.0)
        esum = tl.sum(e, axis=0)
        e = e / tl.where(esum > 0.0, esum, 1.0)
        p = tl.where(am1 > 0.0, p, e)
    p = tl.where(nonempty, p, 0.0)
    p = tl.where(bad, float("nan"), p)
    if LOSS_MODE > 0:
        if MODE == 2:  # x is on chip anyway (the softmax rows): the sums over the support of p
            supp = p > 0.0  # finite scores only: no product with -inf
            zp = tl.sum(tl.where(supp, p * (x - xm), 0.0), axis=0)
            pa = tl.where(supp, tl.exp2((am1 + 1.0) * tl.log2(tl.where(supp, p, 1.0))), 0.0)
            conj = zp - (tl.sum(pa, axis=0) - 1.0) / ((am1 + 1.0) * am1)  # one-hot p: exactly 0
        conj = tl.where(bad, float("nan"), conj)
    if LOSS_MODE == 2:  # the loss at a class index t (ignore_index: 0) and its gradient p - y
        t = tl.load(T + row).to(tl.int64)
        valid = t != ignore_index
        in_range = (t >= 0) & (t < n)
        t = tl.where(valid & in_range, t, 0)  # an index out of range: counted, never read
        tl.store(WORK + 2 + row,  # 1: counted by "mean"; 3: counted and refused (out of range)
                 (valid.to(tl.int32) + 2 * (valid & (~in_range)).to(tl.int32)).to(WORK.dtype.element_ty))
        zt = tl.load(X + row * n + t).to(tl.float32) - tl.where(bad, float("nan"), xm)
        on_t = cols == t
        if SMOOTH:  # y = (1 - eps) e_t + eps / k on the k classes with score > -inf
            if MODE == 2:
                fin = finite
            else:  # reloaded (cached) rather than kept on chip through the threshold loop
                fin = tl.load(X + row * n + cols, mask=inb, other=neg_inf) > neg_inf
            a = smoothing / cnt
            b = (1.0 - smoothing) + a
            if MODE == 0:
                phi = (cnt - 1.0) * (a * a) + b * b
                omega_y = 0.5 * (phi - 1.0)
            elif MODE == 1:
                phi = (cnt - 1.0) * (a * tl.sqrt_rn(a)) + b * tl.sqrt_rn(b)
                omega_y = (4.0 / 3.0) * (phi - 1.0)
            else:
                alpha = am1 + 1.0
                phi = (cnt - 1.0) * tl.exp2(alpha * tl.log2(a)) + tl.exp2(alpha * tl.log2(b))
                omega_y = (phi - 1.0) / (alpha * am1)
            loss = conj - ((1.0 - smoothing) * zt + smoothing * (sz / cnt)) + omega_y
            p = tl.where(fin, p - a, p)
            p = tl.where(on_t, p + (smoothing - 1.0), p)
        else:
            loss = conj - zt
            p = tl.where(on_t, p - 1.0, p)
        loss = tl.where(loss < 0.0, 0.0, loss)  # >= 0 in exact arithmetic (NaN stays NaN)
        loss = tl.where(zt == neg_inf, float("inf"), loss)  # a target with score -inf
        tl.store(LOSS + loss_at + row, tl.where(valid, loss, 0.0).to(LOSS.dtype.element_ty))
        p = tl.where(valid, p, 0.0)  # ignored rows: zero gradient
    tl.store(Y + row * n + cols, p.to(Y.dtype.element_ty), mask=inb)
    if HAS_OK:
        tl.store(OK + row, ok)
    if LOSS_MODE == 1:
        tl.store(CONJ + row, conj.to(CONJ.dtype.element_ty))
        tl.store(ZMAX + row, tl.where(bad, float("nan"), xm).to(ZMAX.dtype.element_ty))


def _backward_kernel(P, G, DX, A, GA, n, alpha_all, a_inner, a_size, MODE: tl.constexpr, ALPHA_GRAD: tl.constexpr,
                     ALPHA_ROWS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inb = cols < n
    p = tl.load(P + row * n + cols, mask=inb, other=0.0).to(tl.float32)
    g = tl.load(G + row * n + cols, mask=inb, other=0.0).to(tl.float32)
    pos = p > 0.0
    if MODE == 0:
        s = pos.to(tl.float32)
    elif MODE == 1:
        # IEEE-rounded (tl.sqrt is approximate on GPUs); zeros take sqrt(1), then 0 (p * 0: NaN kept):
        # sqrt_rn's slow path, a call on GPUs, serves zeros too, most entries of a sparse row
        s = tl.where(pos, tl.sqrt_rn(tl.where(pos, p, 1.0)), p * 0.0)
    else:
        if ALPHA_ROWS:
            alpha = tl.load(A + (row // a_inner) % a_size).to(tl.float32)
        else:
            alpha = alpha_all + 0.0
        lp = tl.log2(tl.where(pos, p, 1.0))  # log2 p on the support, 0 elsewhere
        s = tl.where(pos, tl.exp2((2.0 - alpha) * lp), 0.0)
    ssum = tl.sum(s, axis=0)
    c = tl.sum(s * g, axis=0) / tl.maximum(ssum, 1.1754943508222875e-38)
    tl.store(DX + row * n + cols, (s * (g - c)).to(DX.dtype.element_ty), mask=inb)
    if MODE == 2:
        if ALPHA_GRAD:
            # <g, dp/dalpha> = <g, w> - <g, s> <1, w> / <1, s>, w = p (1 - (alpha - 1) ln p) / (alpha - 1)^2
            # on the support (p * 0 elsewhere: a NaN entry stays NaN, as in torch's formula)
            am1 = alpha - 1.0
            w = tl.where(pos, p * (1.0 - am1 * (lp * 0.6931471805599453)) / (am1 * am1), p * 0.0)
            # a row at alpha = 1 (softmax, the forward's): 0, as the torch path's selection gives it
            tl.store(GA + row, tl.where(am1 == 0.0, 0.0, tl.sum(g * w, axis=0) - c * tl.sum(w, axis=0)))


def _ce_forward_kernel(X, T, LOSS, WORK, n, loss_at, ignore_index, eps, SMOOTH: tl.constexpr,
                       BLOCK: tl.constexpr):
    # WORK (see _index_loss_outputs): [factor, flag, status (R), lse (R), ...]; the rows' losses
    # at LOSS + loss_at
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inb = cols < n
    neg_inf = float("-inf")
    x = tl.load(X + row * n + cols, mask=inb, other=neg_inf).to(tl.float32)
    bad = tl.max(((x != x) | (x == float("inf"))).to(tl.int32), axis=0) > 0  # a NaN row
    m = tl.max(tl.where(x < float("inf"), x, neg_inf), axis=0)
    ms = tl.where(m > neg_inf, m, 0.0)  # the row maximum, 0 for a row without a finite score
    xs = x - ms
    lse = tl.log(tl.sum(tl.where(xs > neg_inf, tl.exp(xs), 0.0), axis=0))  # of x - ms
    t = tl.load(T + row).to(tl.int64)
    valid = t != ignore_index
    in_range = (t >= 0) & (t < n)
    t = tl.where(valid & in_range, t, 0)  # an index out of range: counted, never read
    tl.store(WORK + 2 + row,  # 1: counted by "mean"; 3: counted and refused (out of range)
             (valid.to(tl.int32) + 2 * (valid & (~in_range)).to(tl.int32)).to(WORK.dtype.element_ty))
    xt = tl.load(X + row * n + t).to(tl.float32)
    logp_t = (xt - ms) - lse
    loss = -logp_t
    if SMOOTH:  # y = (1 - eps) e_t + eps / k on the k classes with score > -inf
        finite = x > neg_inf
        cnt = tl.maximum(tl.sum(finite.to(tl.float32), axis=0), 1.0)
        a = eps / cnt
        b = (1.0 - eps) + a
        sum_logp = tl.sum(tl.where(finite, xs - lse, 0.0), axis=0)
        omega_y = (cnt - 1.0) * a * tl.log(a) + b * tl.log(b)
        loss = omega_y - (1.0 - eps) * logp_t - a * sum_logp
        loss = tl.where(loss < 0.0, 0.0, loss)  # a KL divergence: rounding only below 0
    loss = tl.where(bad, float("nan"), loss)
    loss = tl.where(xt == neg_inf, float("inf"), loss)  # an impossible target (or empty row)
    tl.store(LOSS + loss_at + row, tl.where(valid, loss, 0.0).to(LOSS.dtype.element_ty))
    tl.store(WORK + 2 + tl.num_programs(0) + row, lse.to(WORK.dtype.element_ty))


def _finish_kernel(LOSS, WORK, OUT, n_rows, loss_at, REDUCE: tl.constexpr, BLOCK: tl.constexpr):
    # one program over the per-row losses (LOSS + loss_at) and statuses (WORK + 2) of an index-target
    # loss: the reduced loss OUT (REDUCE 1: sum, 2: mean over the counted rows; 0, none: not
    # written), WORK[0] the factor of "mean" (1 / max(count, 1), else 1) and WORK[1] 1 if no index
    # was refused, else 0. Sums in row order, in blocks: deterministic.
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=LOSS.dtype.element_ty)
    count = tl.zeros([BLOCK], dtype=tl.int32)
    refused = tl.zeros([BLOCK], dtype=tl.int32)
    # a while loop over the blocks (Triton 3.6's interpreter cannot range() over an argument);
    # start a tensor even where n_rows is specialised to the constant 1
    start = tl.program_id(0) * 0
    while start < n_rows:
        idx = start + cols
        inb = idx < n_rows
        status = tl.load(WORK + 2 + idx, mask=inb, other=0).to(tl.int32)
        count += status & 1
        refused += status >> 1
        if REDUCE > 0:
            acc += tl.load(LOSS + loss_at + idx, mask=inb, other=0.0)
        start += BLOCK
    denom = tl.maximum(tl.sum(count, axis=0), 1).to(tl.float32)
    if REDUCE == 2:
        # IEEE-rounded divisions (a float32 "/" compiles to an approximate one on GPUs), as torch's
        total = tl.sum(acc, axis=0)
        if LOSS.dtype.element_ty == tl.float32:
            mean = tl.math.div_rn(total, denom)
        else:  # float64: "/" is IEEE-rounded there
            mean = total / denom.to(total.dtype)
        tl.store(OUT, mean.to(OUT.dtype.element_ty))
        tl.store(WORK, tl.math.div_rn(denom * 0.0 + 1.0, denom).to(WORK.dtype.element_ty))
    else:
        if REDUCE == 1:
            tl.store(OUT, tl.sum(acc, axis=0).to(OUT.dtype.element_ty))
        tl.store(WORK, (denom * 0.0 + 1.0).to(WORK.dtype.element_ty))
    tl.store(WORK + 1, (tl.sum(refused, axis=0) == 0).to(WORK.dtype.element_ty))


def _ce_backward_kernel(X, T, WORK, G, DX, n, g_stride, ignore_index, eps, SMOOTH: tl.constexpr,
                        BLOCK: tl.constexpr):
    # WORK: the forward's [factor of "mean" (1 otherwise), flag, status (R), lse (R), ...]
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inb = cols < n
    neg_inf = float("-inf")
    x = tl.load(X + row * n + cols, mask=inb, other=neg_inf).to(tl.float32)
    bad = tl.max(((x != x) | (x == float("inf"))).to(tl.int32), axis=0) > 0
    m = tl.max(tl.where(x < float("inf"), x, neg_inf), axis=0)
    nonempty = m > neg_inf
    xs = x - tl.where(nonempty, m, 0.0)
    lse = tl.load(WORK + 2 + tl.num_programs(0) + row).to(tl.float32)
    t = tl.load(T + row).to(tl.int64)
    valid = t != ignore_index
    t = tl.where(valid & (t >= 0) & (t < n), t, 0)
    g = tl.where(valid, tl.load(G + row * g_stride).to(tl.float32), 0.0)
    g = g * tl.load(WORK).to(tl.float32)  # the factor of "mean" (1: exact for "none" and "sum")
    p = tl.where(xs > neg_inf, tl.exp(xs - lse), 0.0)
    p = tl.where(nonempty & (~bad), p, 0.0)  # rows without a finite score, or with NaN/+inf: 0
    if SMOOTH:
        finite = x > neg_inf
        cnt = tl.maximum(tl.sum(finite.to(tl.float32), axis=0), 1.0)
        d = tl.where(finite, p - eps / cnt, 0.0)
        d = tl.where(cols == t, d + (eps - 1.0), d)
    else:
        d = tl.where(cols == t, p - 1.0, p)
    tl.store(DX + row * n + cols, tl.where(valid, d * g, 0.0).to(DX.dtype.element_ty), mask=inb)


KERNEL_NAMES = ("forward", "backward", "ce_forward", "ce_backward", "finish")
"""The attributes of :func:`_kernels`' namespace: the jitted mapping forward (and losses' main
kernel), mapping backward, cross-entropy forward and backward, and the index losses' reduction."""


def _kernels(x: Optional[Tensor] = None) -> Any:
    """The jitted kernels for launches on ``x`` (:func:`_interpreted`; without ``x``, for the
    current ``TRITON_INTERPRET`` setting), built once per flavour by :func:`jitted`: compiled ones
    launched through :class:`nmt.sparse._triton_launch.CachedLaunch`."""
    interpret = _interpreted(x)
    kernels = _KERNELS.get(interpret)
    if kernels is None:
        functions = (_forward_kernel, _backward_kernel, _ce_forward_kernel, _ce_backward_kernel, _finish_kernel)
        kernels = type("Kernels", (), {name: jitted(f, "nmt.sparse._triton", x)
                                       for name, f in zip(KERNEL_NAMES, functions)})()
        _KERNELS[interpret] = kernels
    return kernels


_FAILED: Dict[str, str] = {}


def launched(label: str, launch: Any) -> bool:
    """Run ``launch()`` (an optional kernel's launch): True, or False where it raises (a kernel
    this Triton or device cannot compile), with one ``RuntimeWarning`` per ``label`` and process;
    after that, False at once (the caller's torch code serves). For the search step's kernels,
    whose GPU runs are not established yet: an acceleration must not stop a translation. Errors the
    device reports later (asynchronously) are not caught here."""
    if label in _FAILED:
        return False
    try:
        launch()
    except Exception as exc:  # noqa: BLE001 - reported once, then the torch code serves
        _FAILED[label] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        import warnings
        warnings.warn(f"{label}: the Triton kernel failed ({_FAILED[label]}); torch's operations serve instead",
                      RuntimeWarning, stacklevel=3)
        return False
    return True


def jitted(fn: Any, label: str, on: Optional[Tensor] = None) -> Any:
    """The kernel function ``fn`` (this module's, or another nmt module's that names ``tl`` as a
    global, bound here: the search step's kernels) jitted for the current ``TRITON_INTERPRET``
    setting, built once per function and setting; compiled ones are launched through
    :class:`nmt.sparse._triton_launch.CachedLaunch` where this Triton allows (>= 3.3), else
    :class:`~nmt.sparse._triton_launch.DeviceLaunch`: either way on the device of the launch's
    first tensor, not the current device.
    ``label`` names the caller in the error raised without triton. ``on``: a tensor the kernel
    will launch on, whose device picks the flavour (:func:`_interpreted`; without it, the current
    ``TRITON_INTERPRET`` setting)."""
    interpret = _interpreted(on)
    kernel = _KERNELS.get((fn, interpret))
    if kernel is None:
        if _import_triton() is None:
            raise RuntimeError(f"{label} needs triton: {_IMPORT_ERROR}")
        fn.__globals__["tl"] = tl
        if interpret:
            from triton.runtime.interpreter import InterpretedFunction as wrap
        else:
            from triton.runtime.jit import JITFunction as wrap
        kernel = wrap(fn)
        if not interpret:  # launched on the device of the tensors (Triton: on the current one)
            from ._triton_launch import CachedLaunch, DeviceLaunch
            try:
                kernel = CachedLaunch(kernel)
            except ImportError:  # Triton < 3.3: its own launch path
                kernel = DeviceLaunch(kernel)
        _KERNELS[(fn, interpret)] = kernel
    return kernel


# --------------------------------------------------------------------------------------------
# Wrappers (shapes decide everything: no host synchronisation)
# --------------------------------------------------------------------------------------------

def pad_pow2(n: int, least: int) -> int:
    """The smallest power of two that is at least ``n`` and at least ``least`` (a power of two):
    a kernel's block or padded vector size for ``n`` entries."""
    return max(least, 1 << max(n - 1, 0).bit_length())


def _block(n: int) -> int:
    return pad_pow2(n, 16)


def _num_warps(block: int) -> int:
    """Warps per row: one warp (shuffle-only reductions) for attention-sized rows, up to 32
    (64 registers a thread) for the longest."""
    for warps, top in ((1, 128), (2, 512), (4, 2048), (8, 8192), (16, 16384)):
        if block <= top:
            return warps
    return 32


_ROW_LAUNCH: Dict[int, tuple[int, int]] = {}


def _row_launch(n: int) -> tuple[int, int]:
    """``(BLOCK, num_warps)`` of the one-program-a-row kernels for rows of ``n`` entries
    (:func:`_block`, :func:`_num_warps`), remembered per ``n``: a launch's host time counts."""
    launch = _ROW_LAUNCH.get(n)
    if launch is None:
        block = _block(n)
        launch = _ROW_LAUNCH[n] = (block, _num_warps(block))
    return launch


def _check(name: str, t: Tensor) -> Tensor:
    """``t`` as the kernels take it: a float tensor of at least one dim whose rows (the last dim,
    at most :data:`MAX_N` entries) lie one after the other (made contiguous where they do not; no
    call where they do: host time), on a device the kernels run on. ValueError / RuntimeError
    otherwise."""
    if not isinstance(t, Tensor) or t.dim() == 0 or not t.is_floating_point():
        raise ValueError(f"{name}: expected a float tensor of at least one dim, got "
                         f"{getattr(t, 'dtype', type(t).__name__)} of shape {tuple(getattr(t, 'shape', ()))}")
    if t.shape[-1] > MAX_N:
        raise ValueError(f"{name}: rows of {t.shape[-1]} entries exceed the kernels' limit of {MAX_N}")
    if not _runs_here(t):
        if _import_triton() is None:
            raise RuntimeError(f"nmt.sparse._triton needs triton: {_IMPORT_ERROR}")
        raise ValueError(f"{name}: the Triton kernels need a CUDA tensor, or a CPU tensor with "
                         f"TRITON_INTERPRET=1 set before triton was imported; got a tensor on "
                         f"{t.device} (TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')})")
    return t if t.is_contiguous() else t.contiguous()


def _n_rows(t: Tensor) -> int:
    """Rows of ``t: (..., n)``: the product of its leading sizes."""
    shape = t.shape
    if len(shape) == 2:
        return shape[0]
    rows = 1
    for size in shape[:-1]:
        rows *= size
    return rows


def _alpha(alpha: Tensor, x: Tensor) -> tuple[Tensor, int, int]:
    """The alphas of the rows of ``x: (..., n)`` as the kernels read them: ``(a, inner, size)``, row
    ``r`` taking ``a[(r // inner) % size]``. ``alpha``: one alpha per row (``R`` elements, any shape,
    in row order: ``inner = 1``, ``size = R``), or a tensor of ``x.dim()`` dims, size 1 along the
    last, broadcastable to ``x``'s rows ``(..., 1)`` (e.g. one per head, ``(1, H, 1, 1)`` against
    ``(B, H, T, n)``): read where it lies when its sizes other than 1 are consecutive dims and
    contiguous there (no copy, no operation), else expanded into one per row. Float32 on ``x``'s
    device (converted where it is not). ValueError for any other shape."""
    if not isinstance(alpha, Tensor):
        raise ValueError(f"alpha_rows must be a tensor with one alpha per row ({_n_rows(x)}), got "
                         f"{type(alpha).__name__}")
    if alpha.dtype is not torch.float32 or alpha.device != x.device:
        alpha = alpha.to(device=x.device, dtype=torch.float32)
    n_rows = _n_rows(x)
    if alpha.numel() == n_rows:  # one per row, in row order
        return (alpha if alpha.is_contiguous() else alpha.contiguous()), 1, max(n_rows, 1)
    lead, shape = x.shape[:-1], alpha.shape
    if len(shape) != len(lead) + 1 or shape[-1] != 1 or any(a != 1 and a != b for a, b in zip(shape, lead)):
        raise ValueError(f"alpha_rows must be a tensor with one alpha per row ({n_rows}) or broadcastable "
                         f"to the rows {tuple(lead) + (1,)}, got shape {tuple(shape)}")
    kept = [i for i, size in enumerate(shape[:-1]) if size != 1]
    if not kept:  # one alpha for every row
        return alpha, 1, 1
    first, last = kept[0], kept[-1] + 1
    inner = 1
    for size in lead[last:]:
        inner *= size
    size, step = 1, 1
    laid_out = True  # the kept dims consecutive, and contiguous in memory
    for i in range(last - 1, first - 1, -1):
        laid_out = laid_out and shape[i] != 1 and alpha.stride(i) == step
        step *= shape[i]
        size *= shape[i]
    if laid_out:
        return alpha, inner, size
    return alpha.expand(*lead, 1).reshape(-1), 1, max(n_rows, 1)  # one per row (a copy)


def _forward(x: Tensor, mode: int, alpha_rows: Optional[Tensor] = None,
             with_ok: bool = False, with_conj: bool = False, alpha: float = 0.0) -> Any:
    """``p`` of ``x: (..., n)`` (its shape); with ``with_ok`` also the per-row verification flags;
    with ``with_conj`` instead ``(p, conj (R,), zmax (R,))`` (see :func:`tsallis_probs_conj`).
    Alpha-entmax (``mode`` :data:`_ALPHA`): ``alpha_rows`` (see :func:`_alpha`), or where it is None
    the float ``alpha`` for every row."""
    x = _check("x", x)
    a, inner, size = _alpha(alpha_rows, x) if mode == _ALPHA and alpha_rows is not None else (x, 1, 1)
    y = torch.empty_like(x)
    if not (with_ok or with_conj):  # (unused pointers get a dummy: no allocation)
        _launch_forward(x, y, a, y, y, y, y, y, y, 0, 0.0, mode, False, 0, alpha, inner, size,
                        alpha_rows is not None)
        return y
    n_rows = _n_rows(x)
    ok = torch.zeros(n_rows, dtype=torch.int32, device=x.device) if with_ok else y
    conj = torch.empty(n_rows, dtype=x.dtype, device=x.device) if with_conj else y
    zmax = torch.empty(n_rows, dtype=x.dtype, device=x.device) if with_conj else y
    _launch_forward(x, y, a, ok, conj, zmax, y, y, y, 0, 0.0, mode, with_ok, 1 if with_conj else 0, alpha,
                    inner, size, alpha_rows is not None)
    if with_conj:
        return y, conj, zmax
    return (y, ok) if with_ok else y


def _launch_forward(x: Tensor, y: Tensor, a: Tensor, ok: Tensor, conj: Tensor, zmax: Tensor,
                    t: Tensor, loss: Tensor, work: Tensor, ignore_index: int, eps: float,
                    mode: int, with_ok: bool, loss_mode: int, alpha: float = 0.0, a_inner: int = 1,
                    a_size: int = 1, alpha_rows: bool = False, loss_at: int = 0) -> None:
    """One launch of :func:`_forward_kernel` over the rows of ``x: (..., n)`` (contiguous)."""
    shape = x.shape
    n = shape[-1]
    n_rows = shape[0] if len(shape) == 2 else _n_rows(x)
    if n_rows and n:
        block, warps = _row_launch(n)
        _kernels(x).forward[(n_rows,)](x, y, a, ok, conj, zmax, t, loss, work, n, ignore_index,
                                       float(eps), float(alpha), a_inner, a_size, loss_at, MODE=mode,
                                       HAS_OK=with_ok, LOSS_MODE=loss_mode, SMOOTH=eps > 0,
                                       ALPHA_ROWS=alpha_rows, BLOCK=block, N_BISECT=N_BISECT,
                                       MAX_ITER=MAX_ITER, num_warps=warps)


def _backward(p: Tensor, g: Tensor, mode: int, alpha_rows: Optional[Tensor] = None,
              alpha_grad: bool = False, alpha: float = 0.0) -> Any:
    """``dx`` (``g``'s shape); with ``alpha_grad`` (alpha-entmax) ``(dx, galpha (R,) float32)``.
    Alpha-entmax: ``alpha_rows`` (see :func:`_alpha`) or, where None, the float ``alpha``."""
    p, g = _check("p", p), _check("g", g)
    if p.shape != g.shape:
        raise ValueError(f"p {tuple(p.shape)} and g {tuple(g.shape)} must have the same shape")
    a, inner, size = _alpha(alpha_rows, p) if mode == _ALPHA and alpha_rows is not None else (p, 1, 1)
    shape = p.shape
    n = shape[-1]
    n_rows = shape[0] if len(shape) == 2 else _n_rows(p)
    same = p.dtype is g.dtype  # (a dtype keyword costs empty_like a third more host time)
    dx = torch.empty_like(g) if same else torch.empty_like(g, dtype=torch.promote_types(p.dtype, g.dtype))
    ga = dx  # a dummy pointer where no alpha-gradient is asked for
    if alpha_grad:  # (rows without entries: 0)
        ga = (torch.empty if n else torch.zeros)(n_rows, dtype=torch.float32, device=p.device)
    if n_rows and n:
        block, warps = _row_launch(n)
        _kernels(p).backward[(n_rows,)](p, g, dx, a, ga, n, float(alpha), inner, size, MODE=mode,
                                        ALPHA_GRAD=alpha_grad, ALPHA_ROWS=alpha_rows is not None, BLOCK=block,
                                        num_warps=warps)
    return (dx, ga) if alpha_grad else dx


def sparsemax_forward(x2d: Tensor) -> Tensor:
    """Exact sparsemax of the rows of ``x2d: (..., n)`` (``-inf`` -> 0; empty rows -> 0).
    Returns ``p`` of ``x2d``'s shape and dtype (computed in float32)."""
    return _forward(x2d, _SPARSEMAX)


def entmax15_forward(x2d: Tensor) -> Tensor:
    """Exact 1.5-entmax of the rows of ``x2d: (..., n)``; returns ``p`` of its shape and dtype."""
    return _forward(x2d, _ENTMAX15)


def entmax_forward(x2d: Tensor, alpha_rows: Tensor) -> Tensor:
    """alpha-entmax of the rows of ``x2d: (..., n)`` with ``alpha_rows`` in ``[1, inf)``: one per
    row (``R`` of them, in row order) or broadcastable to the rows ``(..., 1)`` (see
    :func:`_alpha`) (1: softmax; 1.5 and 2: exact closed-form finish; otherwise Newton/bisection
    to float32 precision, renormalised). Returns ``p`` of ``x2d``'s shape and dtype."""
    return _forward(x2d, _ALPHA, alpha_rows)


def entmax_forward_scalar(x2d: Tensor, alpha: float) -> Tensor:
    """:func:`entmax_forward` with one float ``alpha`` for every row, passed to the kernel as a
    number (no alpha tensor, no operation to make one). ``alpha`` is rounded to float32 (as an
    alpha tensor would be)."""
    return _forward(x2d, _ALPHA, None, alpha=alpha)


def sparsemax_backward(p: Tensor, g: Tensor) -> Tensor:
    """``J^T g`` of sparsemax at output ``p``, both ``(..., n)``: ``s * (g - mean_S g)``."""
    return _backward(p, g, _SPARSEMAX)


def entmax15_backward(p: Tensor, g: Tensor) -> Tensor:
    """``J^T g`` of 1.5-entmax at output ``p`` (``s = sqrt(p)``), both ``(..., n)``."""
    return _backward(p, g, _ENTMAX15)


def entmax_backward(p: Tensor, g: Tensor, alpha_rows: Tensor) -> Tensor:
    """``J^T g`` of alpha-entmax at output ``p: (..., n)``, ``alpha_rows`` as in
    :func:`entmax_forward`: ``s * g - s * (<s, g> / sum s)`` with ``s = p^(2 - alpha)`` on the support."""
    return _backward(p, g, _ALPHA, alpha_rows)


def entmax_backward_scalar(p: Tensor, g: Tensor, alpha: float) -> Tensor:
    """:func:`entmax_backward` with one float ``alpha`` for every row (see :func:`entmax_forward_scalar`)."""
    return _backward(p, g, _ALPHA, None, alpha=alpha)


def entmax_backward_alpha(p: Tensor, g: Tensor, alpha_rows: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`entmax_backward` and, in the same launch, the gradient of a learnable alpha per row:
    ``<g, dp/dalpha> = <g, w> - <g, s> <1, w> / <1, s>`` with ``w = p (1 - (alpha - 1) ln p) /
    (alpha - 1)^2`` on the support (0 elsewhere; a row holding NaN gets NaN; a row at alpha 1,
    softmax, gets 0), as :func:`nmt.sparse.entmax._alpha_grad` computes it in torch.
    ``alpha_rows`` as in :func:`entmax_forward`. Returns ``(dx (..., n), galpha (R,) float32)``, one
    alpha-gradient per row (summed over a broadcast alpha's rows by the caller); no host
    synchronisation."""
    return _backward(p, g, _ALPHA, alpha_rows, alpha_grad=True)


_LOSS_DTYPE = {torch.float64: torch.float64}
"""The index losses' dtype by the scores' (float32 for every other: ``torch.promote_types``
with float32, without its operator call)."""


def _tsallis_mode(alpha: float) -> int:
    """The mapping kernel's mode for a Tsallis loss of ``alpha > 1``: sparsemax (2), 1.5-entmax
    (1.5), else alpha-entmax with ``alpha`` passed as a number."""
    alpha = float(alpha)
    if not alpha > 1:
        raise ValueError(f"the Tsallis losses need alpha > 1, got {alpha}")
    return _SPARSEMAX if alpha == 2.0 else _ENTMAX15 if alpha == 1.5 else _ALPHA


def tsallis_probs_conj(x2d: Tensor, alpha: float) -> tuple[Tensor, Tensor, Tensor]:
    """alpha-entmax ``p`` of the rows of ``x2d: (R, n)`` (float ``alpha > 1``; 2 and 1.5: the exact
    sparsemax / 1.5-entmax kernels, else the alpha kernel) and, from the same launch, what a
    Fenchel-Young loss needs: the Tsallis conjugate at ``x' = x - max x``,
    ``conj = <x', p> - Omega(p)``, ``Omega(p) = (sum p^alpha - 1) / (alpha (alpha - 1))``, over the
    support only (no product with ``-inf`` scores; a one-hot ``p`` gives exactly 0), and the row
    maximum ``zmax``. Returns ``p (R, n)``, ``conj (R,)``, ``zmax (R,)`` in ``x2d``'s dtype,
    computed in float32; rows without a finite score: ``p = 0``, ``zmax = 0``; rows holding NaN
    or ``+inf``: all NaN. No host synchronisation."""
    return _forward(x2d, _tsallis_mode(alpha), None, with_conj=True, alpha=float(alpha))


def _target(target: Tensor, x: Tensor) -> Tensor:
    if not isinstance(target, Tensor) or target.shape != x.shape[:1] or target.is_floating_point():
        raise ValueError(f"target must be an integer tensor of shape ({x.shape[0]},), got "
                         f"{getattr(target, 'dtype', type(target).__name__)} of shape "
                         f"{tuple(getattr(target, 'shape', ()))}")
    if x.shape[1] == 0:
        raise ValueError("index targets need rows with at least one class")
    if target.dtype not in (torch.int32, torch.int64):
        target = target.long()
    if target.device != x.device:  # (no-op conversions skipped: host time)
        target = target.to(x.device)
    return target if target.is_contiguous() else target.contiguous()


REDUCTIONS = {"none": 0, "sum": 1, "mean": 2}
"""The index-target losses' reductions and their codes in :func:`_finish_kernel`."""


def _index_loss_outputs(x: Tensor, reduction: str, per_row: int) -> tuple[Tensor, Tensor, int]:
    """Empty outputs of an index-target loss of ``x: (R, n)``, in the loss dtype (float32; float64
    for float64 scores), in two allocations: ``work`` ``(2 + per_row R)`` = ``[factor of "mean"
    (1 otherwise), range flag (1: every index accepted), status (R): the rows' (1 counted, 3
    counted and refused), the kernel's other per-row values (``per_row - 1`` blocks of R), then,
    unless "none", the per-row losses (R)]``, and ``out``: the per-row losses ``(R,)`` for "none",
    else the reduced loss ``()``. Returns ``(work, out, loss_at)``: where the per-row losses lie,
    relative to the tensor holding them (``out`` for "none", ``work`` else)."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; valid: {', '.join(REDUCTIONS)}")
    dtype = _LOSS_DTYPE.get(x.dtype, torch.float32)
    n_rows = x.shape[0]
    if reduction == "none":
        work = torch.empty(2 + per_row * n_rows, dtype=dtype, device=x.device)
        return work, torch.empty(n_rows, dtype=dtype, device=x.device), 0
    work = torch.empty(2 + (per_row + 1) * n_rows, dtype=dtype, device=x.device)
    return work, torch.empty((), dtype=dtype, device=x.device), 2 + per_row * n_rows


def _finish(work: Tensor, out: Tensor, loss_at: int, reduction: str, n_rows: int) -> None:
    """Launch :func:`_finish_kernel`: one program reduces the ``n_rows`` rows' losses into ``out``
    and writes the factor and the flag at the start of ``work``."""
    _kernels(work).finish[(1,)](out if reduction == "none" else work, work, out, n_rows, loss_at,
                                REDUCE=REDUCTIONS[reduction], BLOCK=1024, num_warps=4)


def tsallis_index_loss(x2d: Tensor, target: Tensor, ignore_index: int = -100, eps: float = 0.0,
                       alpha: float = 1.5, reduction: str = "none") -> tuple[Tensor, Tensor, Tensor]:
    """The Tsallis (alpha-entmax) Fenchel-Young loss of the rows of ``x2d: (R, n)`` at class
    indices ``target: (R,)`` in two launches: the mapping kernel of :func:`tsallis_probs_conj`,
    then, with the row still on chip, ``loss = Omega*(x') - <x', y> + Omega(y)`` (``>= 0``; ``inf``
    where the target's score is ``-inf``, rows without a finite score included; NaN for rows
    holding NaN or ``+inf``) and the gradient ``p - y``, for ``y = e_t`` or with label smoothing
    ``eps`` ``y = (1 - eps) e_t + eps / k`` on the ``k`` classes with score ``> -inf``. Rows whose
    target is ``ignore_index``: loss 0, gradient 0. Then one program reduces the rows.

    Returns ``grad (R, n)`` in ``x2d``'s dtype, ``loss`` and ``work`` as
    :func:`cross_entropy_forward` does (``work``: ``[factor, flag, status (R), ...]``). Exact as
    the mapping kernel is (float32); grids and launches depend on shapes only (no host
    synchronisation)."""
    x = _check("x", x2d)
    if x.dim() != 2:
        raise ValueError(f"x: expected (R, n) scores, got shape {tuple(x.shape)}")
    t = _target(target, x)
    mode = _tsallis_mode(alpha)
    grad = torch.empty_like(x)
    work, out, loss_at = _index_loss_outputs(x, reduction, 1)
    _launch_forward(x, grad, x, grad, grad, grad, t, out if reduction == "none" else work, work,
                    int(ignore_index), eps, mode, False, 2, float(alpha), 1, 1, False, loss_at)
    _finish(work, out, loss_at, reduction, x.shape[0])
    return grad, out, work


def cross_entropy_forward(x2d: Tensor, target: Tensor, ignore_index: int = -100,
                          eps: float = 0.0, reduction: str = "none") -> tuple[Tensor, Tensor]:
    """Cross-entropy ``KL(y || softmax(x))`` of the rows of ``x2d: (R, n)`` at class indices
    ``target: (R,)``, ``y = e_t`` or with label smoothing ``eps`` ``(1 - eps) e_t + eps / k`` on
    the ``k`` classes with score ``> -inf``, in one pass over each row (``eps = 0``:
    ``-log softmax(x)_t``), then one program that reduces the rows. Per row: 0 where the target
    is ``ignore_index``; ``inf`` where the target's score is ``-inf``, rows without a finite score
    included; NaN for rows holding NaN or ``+inf``.

    Returns ``loss``: the rows' losses ``(R,)`` for ``reduction="none"``, else their sum or their
    mean over the rows not ignored (0 if none) ``()``, in float32 (float64 for float64 input);
    and ``work`` (same dtype), for :func:`cross_entropy_backward` and the caller's check:
    ``work[0]`` the factor of "mean" (``1 / max(count, 1)``, else 1), ``work[1]`` 1 if every target
    is ``ignore_index`` or in ``[0, n)``, else 0 (an index out of range is never read; the caller
    refuses it), then the rows' status ``(R)`` and ``lse = log sum exp(x - max x)`` ``(R)`` (and,
    unless "none", the rows' losses). The sums run in row order (deterministic). No ``(R, n)``
    output; computed in float32; no host sync."""
    x = _check("x", x2d)
    if x.dim() != 2:
        raise ValueError(f"x: expected (R, n) scores, got shape {tuple(x.shape)}")
    t = _target(target, x)
    n_rows, n = x.shape
    work, out, loss_at = _index_loss_outputs(x, reduction, 2)
    if n_rows:
        block, warps = _row_launch(n)
        _kernels(x).ce_forward[(n_rows,)](x, t, out if reduction == "none" else work, work, n, loss_at,
                                          int(ignore_index), float(eps), SMOOTH=eps > 0, BLOCK=block,
                                          num_warps=warps)
    _finish(work, out, loss_at, reduction, x.shape[0])
    return out, work


def cross_entropy_backward(x2d: Tensor, target: Tensor, work: Tensor, g: Tensor,
                           ignore_index: int = -100, eps: float = 0.0) -> Tensor:
    """Gradient of :func:`cross_entropy_forward` (``work`` from it: the rows' ``lse`` and the
    factor of "mean"): ``(softmax(x) - y) * g * work[0]`` with ``g`` per row ``(R,)`` (any stride,
    e.g. expanded) or one value ``()`` for every row, ``softmax`` recomputed from ``x2d`` and
    ``lse`` (0 on rows without a finite score or holding NaN / ``+inf``); rows whose target is
    ``ignore_index``: 0. ``(R, n)`` in ``x2d``'s dtype; no host synchronisation."""
    x = _check("x", x2d)
    t = _target(target, x)
    n_rows, n = x.shape
    if not isinstance(g, Tensor) or (g.dim() != 0 and (g.dim() != 1 or g.shape[0] != n_rows)) \
            or work.dim() != 1 or work.shape[0] < 2 + 2 * n_rows:
        raise ValueError(f"g must have shape ({n_rows},) or (), and work at least {2 + 2 * n_rows} entries")
    dx = torch.empty_like(x)
    if n_rows:
        block, warps = _row_launch(n)
        _kernels(x).ce_backward[(n_rows,)](x, t, work, g, dx, n, g.stride(0) if g.dim() else 0,
                                           int(ignore_index), float(eps), SMOOTH=eps > 0, BLOCK=block,
                                           num_warps=warps)
    return dx
