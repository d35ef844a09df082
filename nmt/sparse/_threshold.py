"""Thresholds of alpha-entmax: ``p_i = max(z_i - tau, 0) ** q`` with ``sum_i p_i = 1``.

Here ``z = (alpha - 1) * x`` and ``q = 1 / (alpha - 1)`` (sparsemax: ``q = 1``;
1.5-entmax: ``q = 2``). Two solvers, both batched over rows without Python loops per row:

* :func:`sort_threshold` (``q`` in {1, 2}): exact, on the sorted row (Peters et al. 2019);
  the support size is counted with one comparison per entry (:func:`sorted_threshold`). On
  the CPU native code solves short rows at any size and other small inputs
  (``_sorted_threshold.c``, built on first use by :mod:`nmt.sparse._native`: rows side by side
  in vectors, a sorting network; attention-sized inputs are bound by per-operation overhead),
  else (larger inputs, or no C compiler at hand) NumPy (:func:`_numpy_sorted_shifted_threshold`),
  the same bits;
  :func:`prefer_sort` says where this beats Newton
  (attention-sized inputs, and the pruned candidates of long rows).
* :func:`root_threshold` (any ``q > 0``): Newton from below on a convex decreasing function
  of ``tau``, which increases monotonically to the root.

  - ``q > 1`` (1.5-entmax, entmax_bisect with alphas in (1, 2), a float or one per row):
    :func:`_newton_norm`, Newton on ``||[z - tau]_+||_q - 1`` with one in-place buffer
    (two passes and two reductions per step). For ``q = 2`` it ends *exactly*: the closed
    form on the support of the last iterate is accepted once *verified* (the entries at or
    above it are exactly that support); rows failing it (ties within rounding) are sorted.
    Otherwise it stops when the step is below ``tol``; there, for float32 rows on the CPU where
    the native library is built, the same loop runs natively
    (:func:`nmt.sparse._native.power_threshold`, ``_power_threshold.c``: one pass a step over a row
    in cache, the powers by polynomials in doubles, short rows a block of rows at a time): the
    torch loop's twenty operations a step and its per-step host read are gone.
  - ``q = 1`` (exact), ``q <= 1`` and per-row ``q`` tensors with some ``q <= 1``:
    :func:`_newton`, safeguarded Newton on ``f(tau) = sum p_i - 1`` (bisection safeguards
    ``q < 1``), for ``q = 1`` with the same verified closed-form finish at every step.

  Long rows are first pruned: a Newton lower bound of the threshold of the vector of block
  maxima is a lower bound of ``tau`` (a sub-vector has a smaller ``f``), so only entries
  above it (found by reading the blocks whose maximum exceeds it) can be in the support.
  The threshold of the pruned row equals that of the full row; it is found by sorting
  (:func:`prefer_sort`) or Newton. Rows where that bound keeps more than half of the blocks
  *and* more than half of the entries (broad rows, e.g. output layers early in training) are
  solved on the full row instead; the split is per row. (At alphas below 1.5 the block bound
  is loose: random rows of 8,000 entries keep ~90% of their blocks but ~4% of their entries,
  which one comparison pass finds.)

  Where the native library is built, exact sparsemax and 1.5-entmax thresholds (``q`` in
  {1, 2}) of long rows on the CPU skip that pruning: one native pass a row
  (:func:`nmt.sparse._native.bound_threshold`) takes its maximum and the maxima of its segments
  (about 64 entries each), keeps the entries above the segment maxima's own threshold (a lower
  bound of the row's; never below ``v = -1 - 2^-10``: the threshold is at least -1) and runs the
  Newton loop on those alone, its closed form verified there; rows it leaves unverified are
  sorted. Broad rows (scores within 1 of each other, as output layers early in training) keep a
  few dozen candidates where the maximum's bound alone kept them all. Sparsemax,
  1.5-entmax and their losses take their outputs from the same pass (:func:`native_long_sparsemax`:
  ``p`` and ``sum p^2``; :func:`native_long_entmax15`: ``p``, ``sqrt(p)`` and ``sum p^1.5``;
  written while the row is in cache), several times fewer passes over a batch of output rows. The
  rows are split over torch's OpenMP threads.

Host synchronisations: the convergence test of the Newton loop (one per step, a few
steps, none in the native loops; one more at the exact finish of ``q = 2``; one reading whether
per-row powers all exceed 1), on long rows the row split (one) and sizing the pruned candidate set (three, if
some row is pruned).
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional, Union

import numpy as np
import torch
from torch import Tensor

from ._common import row_exponent
from ._native import available as native_available
from ._native import (bound_entmax15, bound_sparsemax, bound_threshold, native_sorted_shifted_threshold,
                      newton_threshold, power_threshold, sorted_probs)

SORT_MAX_N = 512
"""Longest rows the exact mappings solve by sorting (see :func:`prefer_sort`)."""

ROOT_MAX_ITER = 200
"""Newton steps of an inexact threshold (alphas other than 1.5 / 2) when the caller sets no cap,
in the torch loop and the native ones alike."""

SORT_MAX_NUMEL = 98304
"""Largest ``rows * n`` solved by sorting when ``n > SORT_ALWAYS_N``: beyond it the sort path's
full-size temporaries cost more than the pruned Newton passes (measured on CPU)."""

SORT_ALWAYS_N = 16
"""Rows up to this length are sorted however many there are."""

NATIVE_SORT_ALWAYS_N = 64
"""Rows up to this length are sorted however many there are where the native code is built (its
vector path, :data:`NATIVE_SOLVE_ANY_N`; large inputs on torch's threads): measured on 2 threads
against the pruned Newton path, random rows of standard deviation 1 and 4, 1.5-entmax / sparsemax:
(5120, 20) 0.31-0.84 vs 1.0-1.4 ms, (20480, 20) 1.2-3.4 vs 4.9-8.2 ms, (8192, 32) 0.7-1.7 vs
2.6-4.5 ms; at (4096, 40) even for broad 1.5-entmax rows. Up to 64 since the native solve splits
its rows over the threads (AMD EPYC, standard deviations 0.05 to 4, forward): (4096, 50)
0.38-0.48 -> 0.20-0.42 ms, (5120, 64) 0.44-0.57 -> 0.29-0.42 ms, (1600, 64) 0.18-0.22 -> 0.11-0.17
ms; forward+backward likewise but for broad (5120, 64) rows, 0.68 -> 0.79 ms."""


def prefer_sort(n_rows: int, n: int) -> bool:
    """Whether the exact threshold of ``n_rows`` rows of length ``n`` is cheaper by sorting (in NumPy
    on the CPU, :func:`_numpy_sorted_shifted_threshold`) than by pruned Newton. Measured on 2 CPU threads
    (glibc tuned as by :func:`nmt.utils.allocator.keep_freed_memory`): the sort path is 1.3-3x
    faster on attention-sized inputs ((64, 16) to (320, 256), (64, 512), (5120, 16)), about even
    at (5120, 32) and (320, 512), and slower beyond ((5120, 64): 1.7x; output layers). Where the
    native code is built, rows up to ``NATIVE_SORT_ALWAYS_N`` entries are sorted at any size."""
    if n <= SORT_ALWAYS_N or (n <= NATIVE_SORT_ALWAYS_N and native_available()):
        return True
    return n <= SORT_MAX_N and n_rows * n <= SORT_MAX_NUMEL


BLOCK = 64
"""Block length of the candidate pruning on long rows (half of it below 4096 entries)."""

LOWER_BOUND_STEPS = 3
"""Newton steps on the block maxima giving the pruning bound."""

WARM_STEPS = 3
"""Unchecked (sync-free) Newton steps before the checked loop of :func:`_newton`."""


Power = Union[float, Tensor]


def sorted_threshold(zs: Tensor, q: float) -> Tensor:
    """Exact threshold ``tau: (R, 1)`` for ``q`` in {1, 2} of rows ``zs: (R, n)`` sorted in
    descending order *relative to their maximum* (``zs[:, 0] = 0``; ``-inf`` allowed).

    Entry ``k`` (1-based) of a sorted row is in the support iff the mapping's function of the
    threshold, evaluated at ``tau = zs_k``, is still below one: ``sum_{j<=k} (zs_j - zs_k) < 1``
    (``q = 1``) or ``sum_{j<=k} (zs_j - zs_k)^2 < 1`` (``q = 2``), i.e. ``cs_k - k zs_k < 1``
    and ``c2_k - zs_k (2 cs_k - k zs_k) < 1`` with prefix sums ``cs``, ``c2`` of ``zs`` and
    ``zs^2``. The support is a prefix; its size ``k*`` counts those entries and ``tau`` is the
    closed form on it: ``(cs - 1) / k`` or the smaller root of ``sum (zs - t)^2 = 1``. Entries
    below ``-2`` (``-inf`` included) are clamped to ``-2``: never in the support (``tau >= -1``),
    and the prefix sums stay finite. No host synchronisation.
    """
    n = zs.shape[-1]
    zs = zs.clamp(min=-2)
    ks = torch.arange(1, n + 1, dtype=zs.dtype, device=zs.device)
    cs = zs.cumsum(dim=-1)
    if q == 1.0:
        k = (torch.addcmul(cs, ks, zs, value=-1) < 1).sum(dim=-1, keepdim=True).clamp_(min=1)
        return cs.gather(-1, k - 1).sub_(1).div_(k)
    if q != 2.0:
        raise ValueError(f"sorted_threshold needs q in {{1, 2}}, got {q}")
    c2 = (zs * zs).cumsum(dim=-1)
    # c2_k - 2 zs_k cs_k + k zs_k^2 = c2_k - 2 zs_k (cs_k - k zs_k / 2)
    test = torch.addcmul(c2, torch.addcmul(cs, ks, zs, value=-0.5), zs, value=-2)
    k = (test < 1).sum(dim=-1, keepdim=True).clamp_(min=1)
    last = k - 1
    kf = k.to(zs.dtype)
    mean = cs.gather(-1, last).div_(kf)
    # smaller root of sum_S (zs - t)^2 = 1: t = mean - sqrt((1 - sum_S zs^2) / k + mean^2)
    return mean - torch.addcmul(c2.gather(-1, last).neg_().add_(1).div_(kf), mean, mean).clamp_(min=0).sqrt_()


def sort_threshold(z: Tensor, q: float, host: bool = True) -> Tensor:
    """Exact threshold for ``q`` in {1, 2}. ``z: (..., n)`` (``-inf`` allowed) -> ``tau: (..., 1)``.

    A row without finite entries gets ``tau = +inf`` (all-zero output); a row holding NaN or
    ``+inf`` gets NaN. See :func:`sorted_threshold`; ``host`` as in :func:`sorted_shifted_threshold`.
    """
    tau, zmax = sorted_shifted_threshold(z, q, host=host)
    return tau + zmax


def sorted_shifted_threshold(z: Tensor, q: float, scale: float = 1.0,
                             host: bool = True) -> tuple[Tensor, Tensor]:
    """``(tau_rel, zmax)``, both ``(..., 1)``, of ``scale * z`` for ``z: (..., n)`` by one sort:
    ``p = [scale * (z - zmax) - tau_rel]_+^q``. ``q`` in {1, 2}, ``scale > 0``.

    The row maximum comes with the sort. Rows without finite entries: ``zmax = 0``,
    ``tau_rel = +inf``; rows holding NaN or ``+inf``: ``zmax = NaN``. No host synchronisation:
    on the CPU (eager, float32/64, not recorded by autograd) with ``host=True`` inputs of rows up
    to ``NATIVE_SOLVE_ANY_N`` entries, or up to ``NATIVE_SOLVE_MAX_NUMEL`` entries in all, are
    solved by the native code (:mod:`nmt.sparse._native`: rows side by side in vectors, sorting
    only the entries that can be in the support by a branch-free network) where it could be
    built, else by NumPy (:func:`_numpy_sorted_shifted_threshold` up to ``NUMPY_SOLVE_MAX_NUMEL``;
    larger ones are sorted by NumPy and finished by torch), the same bits; elsewhere, and with
    ``host=False`` (the static paths' contract), ``torch.sort`` and torch operators.
    """
    if q not in (1.0, 2.0):
        raise ValueError(f"sort_threshold needs q in {{1, 2}}, got {q}")
    lead, n = z.shape[:-1], z.shape[-1]
    if n == 0 or z.numel() == 0:
        return z.new_full((*lead, 1), float("inf")), z.new_zeros(*lead, 1)
    numpy = host and _host_solves(z)
    if numpy and (n <= NATIVE_SOLVE_ANY_N or z.numel() <= NATIVE_SOLVE_MAX_NUMEL):  # where built
        solved = native_sorted_shifted_threshold(z.detach().reshape(-1, n), q, scale)
        if solved is not None:
            return solved[0].reshape(*lead, 1), solved[1].reshape(*lead, 1)
    if numpy and z.numel() <= NUMPY_SOLVE_MAX_NUMEL:
        tau, zmax = _numpy_sorted_shifted_threshold(z.detach().reshape(-1, n).numpy(), q, scale)
        return torch.from_numpy(tau).reshape(*lead, 1), torch.from_numpy(zmax).reshape(*lead, 1)
    w = torch.neg(z.reshape(-1, n))  # -z ascending (NaN last): w[:, 0] = -zmax
    if numpy:  # NumPy's sort in place: several times faster than torch.sort on the CPU
        w.detach().numpy().sort(axis=-1)
    else:
        w = torch.sort(w, dim=-1).values
    empty = w[:, :1] == float("inf")
    neg_max = torch.where(empty, 0, w[:, :1])
    # scale * (z - zmax) = -scale * (w - w_0): the same rounding as z - zmax, negated
    tau = sorted_threshold(torch.sub(w, neg_max).mul_(-scale), q)
    tau = torch.where(empty, float("inf"), tau)
    bad = w[:, -1:].isnan() | (neg_max == float("-inf"))  # NaN sorts last, +inf (-w = -inf) first
    zmax = torch.where(bad, float("nan"), -neg_max)
    return tau.reshape(*lead, 1), zmax.reshape(*lead, 1)


def native_sorted_probs(x: Tensor, q: float, root: bool) -> Optional[tuple[Tensor, Optional[Tensor]]]:
    """Sparsemax (``q = 1``) or 1.5-entmax (``q = 2``) of ``x: (..., n)`` in one native call
    (:func:`nmt.sparse._native.sorted_probs`: the threshold and the output, the same bits as the
    torch forward on :func:`sorted_shifted_threshold`) where that threshold would be solved
    natively, up to ``NATIVE_MAPPING_MAX_NUMEL`` entries: CPU, float32/64, eager, outside
    autograd's recording, :func:`prefer_sort`. Returns ``(p, r)`` shaped like ``x``
    (``r = sqrt(p)`` for ``q = 2`` where ``root``, else None), or None (the caller takes the torch
    path). No host synchronisation."""
    n = x.shape[-1]
    if n == 0 or x.numel() == 0 or x.numel() > NATIVE_MAPPING_MAX_NUMEL or not _host_solves(x):
        return None
    rows = x.numel() // n
    if not prefer_sort(rows, n):
        return None
    found = sorted_probs(x.reshape(rows, n), q, root)
    if found is None:
        return None
    p, r = found
    return p.view(x.shape), None if r is None else r.view(x.shape)


def _block_length(n: int) -> int:
    """Block length of the pruning of rows of ``n`` entries (:data:`BLOCK`, half of it below
    4096 entries); rows shorter than eight blocks are not pruned."""
    return BLOCK if n >= 64 * BLOCK else BLOCK // 2


def long_rows(n_rows: int, n: int) -> bool:
    """Whether rows of length ``n`` are long for the exact thresholds of the CPU: not sorted
    (:func:`prefer_sort`) and long enough for :func:`root_threshold` to prune them."""
    return n >= 8 * _block_length(n) and not prefer_sort(n_rows, n)


def native_long_entmax15(x: Tensor, root: bool, cube: bool) -> Optional[tuple]:
    """1.5-entmax of the long rows of ``x: (..., n)`` (:func:`long_rows`) in one native call
    (:func:`nmt.sparse._native.bound_entmax15`): the exact threshold found from the entries
    above its segments' bound, then ``r = [x/2 - zmax/2 - tau]_+`` and ``p = r^2`` as the torch
    forward rounds them, written while each row is in cache. CPU, float32/64, eager, outside
    autograd's recording, the native library built; else None (the caller's torch path). Rows
    the native loop left unverified are solved by sorting. Returns ``(p, r, cube, tau, zmax)``:
    ``p`` (and ``r`` where ``root``, else None) shaped like ``x``, ``cube`` the row sums of
    ``p^1.5`` (where ``cube``, else None), ``tau, zmax: (R,)`` for the ``R`` rows. Host syncs:
    the check of the verification flags (a CPU read)."""
    return _native_long(x, 2.0, root, cube)


def native_long_sparsemax(x: Tensor, squares: bool) -> Optional[tuple]:
    """Sparsemax of the long rows of ``x: (..., n)`` (:func:`long_rows`) in one native call
    (:func:`nmt.sparse._native.bound_sparsemax`), as :func:`native_long_entmax15` computes
    1.5-entmax: ``p = [(x - zmax) - tau]_+`` as the torch forward rounds it, written while each row
    is in cache. Returns ``(p, squares, tau, zmax)``: ``p`` shaped like ``x``, ``squares`` the row
    sums of ``p^2`` (where ``squares``, else None), ``tau, zmax: (R,)``; None where
    :func:`native_long_entmax15` is. Host syncs: the check of the verification flags (a CPU read)."""
    found = _native_long(x, 1.0, False, squares)
    return None if found is None else (found[0], *found[2:])


def _native_long(x: Tensor, q: float, root: bool, power_sum: bool) -> Optional[tuple]:
    """:func:`native_long_entmax15` (``q = 2``) or :func:`native_long_sparsemax` (``q = 1``):
    ``(p, r, power_sum, tau, zmax)`` (``r``: 1.5-entmax's ``sqrt(p)`` where ``root``; the row sums of
    ``p^alpha``, alpha = 1 + 1/q, where ``power_sum``), or None."""
    n = x.shape[-1]
    rows = x.numel() // max(n, 1)
    if x.numel() == 0 or not long_rows(rows, n) or not _host_solves(x) or not native_available():
        return None
    z = x.reshape(rows, n)
    max_iter = 4 * n + 60
    found = bound_entmax15(z, max_iter, root, power_sum) if q == 2.0 else bound_sparsemax(z, max_iter, power_sum)
    if found is None:
        return None
    tau, zmax, ok, p, *rest = found
    r, sums = rest if q == 2.0 else (None, rest[0])  # sparsemax: no root
    if not bool(ok.all()):  # ties within rounding of the threshold (rare): sort, then the formula
        bad = (~ok).nonzero()[:, 0]
        zmax_bad, z_bad = zmax.index_select(0, bad)[:, None], z.index_select(0, bad)
        # the shifted rows as the forward rounds them: what the sort solves and the formula reads
        if q == 2.0:  # [x/2 - zmax/2]
            shifted = torch.add(-0.5 * zmax_bad, z_bad, alpha=0.5)
        else:  # [x - zmax]
            shifted = torch.sub(z_bad, zmax_bad)
        # the native pass's bound of these rows: no entry at or below it is in the support, so the
        # sort takes the others alone (and the formula gives those entries zeros all the same)
        shifted = shifted.masked_fill_(shifted <= tau.index_select(0, bad)[:, None], float("-inf"))
        tau[bad] = sort_threshold(shifted, q)[:, 0]
        r_bad = shifted.sub_(tau[bad, None]).clamp_(min=0)
        p_bad = r_bad * r_bad if q == 2.0 else r_bad
        p[bad] = p_bad
        if r is not None:
            r[bad] = r_bad
        if sums is not None:
            sums[bad] = torch.linalg.vecdot(r_bad, p_bad)  # sum p^1.5 = <r, p>; sum p^2 = <p, p>
    return p.view(x.shape), None if r is None else r.view(x.shape), sums, tau, zmax


NATIVE_MAPPING_MAX_NUMEL = 16384
"""Largest input whose sparsemax / 1.5-entmax (forward and backward) the native code computes in
one call each (:func:`native_sorted_probs`, :func:`nmt.sparse._native.support_backward`): there
the handful of tensor operations around the threshold cost more than their arithmetic. Measured on
2 threads, forward+backward of random rows against the torch operations on the same native
threshold: (64, 20) 214 -> 157 us (1.5-entmax), 194 -> 149 us (sparsemax); (320, 50) 372 -> 331 and
287 -> 265 us; but (3840, 16) 713 -> 743 and 643 -> 724 us, (5120, 20) slower too (torch's
vectorised two-thread passes win on larger inputs)."""

NATIVE_SOLVE_ANY_N = 64
"""Rows up to this length are solved by the native code at any size (its vector path sorts up to
64 candidates a row by a network). Measured on 2 threads against the NumPy / torch sort of the same
inputs (random rows of standard deviation 1 and 4, sparsemax and 1.5-entmax): 1.1-4.4x faster from
(2048, 8) to (1024, 64) and (32768, 8); beyond the sort path's sizes (:func:`prefer_sort`) the
pruned Newton path serves rows longer than 16 anyway."""

NATIVE_SOLVE_MAX_NUMEL = 16384
"""Largest input with rows longer than ``NATIVE_SOLVE_ANY_N`` that the native code solves: broad
1.5-entmax rows of 128-512 entries have more candidates than the network takes, and the row-by-row
sort lost to NumPy's vectorised sort beyond this size (0.29 vs 0.32 ms at (128, 128), 1.39 vs
0.53 ms at (512, 128))."""

NUMPY_SOLVE_MAX_NUMEL = 4096
"""Largest input the sorted threshold solves wholly in NumPy on the CPU (single-threaded ufuncs with
little per-call overhead); larger ones sort in NumPy and finish with torch operators (two threads).
Measured on 2 threads: (64, 20) forward+backward 0.63-0.72 -> 0.45 ms, but (3840, 16) 1.7-1.9 ->
2.1-2.2 ms and (320, 50) mixed."""


def _host_solves(z: Tensor) -> bool:
    """Whether :func:`sorted_shifted_threshold` may hand ``z`` to the native loop or NumPy:
    float32/float64 on the CPU, in eager mode, outside autograd's recording (the thresholds are
    not differentiated)."""
    return (z.device.type == "cpu" and z.dtype in (torch.float32, torch.float64)
            and not (z.requires_grad and torch.is_grad_enabled()) and not torch.compiler.is_compiling())


def _numpy_sorted_shifted_threshold(a: np.ndarray, q: float, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`sorted_shifted_threshold` of the rows ``a: (R, n)`` in NumPy: ``(tau_rel, zmax)``, each
    ``(R, 1)`` of ``a``'s dtype.

    The same computation as the torch path (sort, the support count on prefix sums, the closed
    form; :func:`sorted_threshold`), in place on one sorted copy. NumPy's vectorised sort is
    several times faster than ``torch.sort`` on the CPU (27 vs 500 us at (320, 50), 0.4 vs 4.7 ms
    at (5120, 64)), and attention-sized rows are bound by per-operation overhead, which is 2-5x
    smaller for NumPy's ufuncs than for torch operators. The thresholds agree with the torch path
    to the last bit or two (an FMA in ``addcmul``); NaN sorts last in both.
    """
    n_rows, n = a.shape
    w = np.negative(a)
    w.sort(axis=-1)  # -z ascending: NaN last, +inf scores (-inf here) first
    neg_max = w[:, :1]
    with np.errstate(invalid="ignore", over="ignore"):
        empty = neg_max == np.inf
        neg_max = np.where(empty, w.dtype.type(0), neg_max)
        bad = np.isnan(w[:, -1:]) | (neg_max == -np.inf)
        np.subtract(w, neg_max, out=w)  # scale * (z - zmax) = -scale * (w - w_0), as on the torch path
        np.multiply(w, -scale, out=w)
        np.maximum(w, w.dtype.type(-2), out=w)  # never in the support (tau >= -1); finite prefix sums
        cs = _cumsum(w)
        test = np.arange(1, n + 1, dtype=w.dtype) * w
        if q == 1.0:  # cs_k - k zs_k < 1
            np.subtract(cs, test, out=test)
            k = np.maximum(np.count_nonzero(test < 1, axis=-1), 1).reshape(n_rows, 1)
            tau = (np.take_along_axis(cs, k - 1, -1) - 1) / k.astype(w.dtype)
        else:  # c2_k - 2 zs_k (cs_k - k zs_k / 2) < 1
            c2 = _cumsum(np.square(w))
            test *= -0.5
            test += cs
            test *= w
            test *= -2
            test += c2
            k = np.maximum(np.count_nonzero(test < 1, axis=-1), 1).reshape(n_rows, 1)
            kf = k.astype(w.dtype)
            mean = np.take_along_axis(cs, k - 1, -1) / kf
            rad = (1 - np.take_along_axis(c2, k - 1, -1)) / kf + mean * mean
            tau = mean - np.sqrt(np.maximum(rad, 0))
        tau = np.where(empty, np.inf, tau).astype(w.dtype, copy=False)
        zmax = np.where(bad, np.nan, -neg_max).astype(w.dtype, copy=False)
    return tau, zmax


def _cumsum(a: np.ndarray) -> np.ndarray:
    """Prefix sums along the rows, accumulated in float64 as ``torch.cumsum`` does on the CPU
    (float32 rows: the same values as the torch path, not float32 running sums)."""
    return np.cumsum(a, axis=-1, dtype=np.float64).astype(a.dtype, copy=False)


def _newton(z: Tensor, q: Power, lo: Tensor, max_iter: int, tol: Optional[float],
            empty: Tensor) -> Tensor:
    """Root of ``f`` per row of ``z: (R, m)`` (max 0 per row, ``-inf`` allowed).

    ``lo: (R,)`` is a lower bound of the root, ``empty: (R,)`` marks rows without finite
    entries (left alone). ``q``: float or ``(R,)`` tensor. ``tol=None`` asks for the exact
    closed-form finish (``q`` in {1, 2}); otherwise iterate until the bracket or the step is
    below ``tol * max(1, |tau|)`` or ``max_iter`` steps. Returns ``tau: (R,)``.
    """
    exact = tol is None
    hi = torch.zeros_like(lo)  # f(0) = -1: the row maximum is 0
    tau = lo.clone()
    dx_old = torch.ones_like(lo)
    finished = empty.clone()
    qc = q[:, None] if isinstance(q, Tensor) else q
    qm1 = row_exponent(qc - 1, z) if isinstance(q, Tensor) else q - 1  # the powers' exponent, once
    for _ in range(max_iter):
        d = (z - tau[:, None]).clamp_(min=0)
        if exact:
            k = torch.sign(d).sum(dim=-1)
            s1 = d.sum(dim=-1)
            dmin = d.masked_fill(d <= 0, float("inf")).amin(dim=-1)
            if q == 1.0:  # Newton step = closed form on the current support
                delta = (s1 - 1) / k
                done = dmin >= delta
                new = tau + delta
            else:  # q == 2: closed form on the support (smaller root), else Newton
                s2 = torch.linalg.vecdot(d, d)
                disc = s1 * s1 - k * (s2 - 1)
                closed = (s1 - disc.clamp(min=0).sqrt()) / k
                done = (disc >= 0) & (dmin >= closed)
                # Newton on the convex h(tau) = ||d||_2 - 1 rather than ||d||^2 - 1: the same
                # monotone iterates from below, but exact in one step on flat rows (up to 2x
                # longer steps), so near-uniform rows need a handful of steps, not ~20 halvings.
                h = s2.sqrt()
                new = tau + torch.where(done, closed, h * (h - 1) / s1)
        else:
            pos = d > 0
            dq1 = torch.where(pos, torch.where(pos, d, 1).pow(qm1), 0)  # d^(q-1) on the support
            f = torch.linalg.vecdot(dq1, d) - 1
            df = dq1.sum(dim=-1) * q
            lo = torch.where(f >= 0, tau, lo)
            hi = torch.where(f < 0, tau, hi)
            step = f / df
            new = tau + step
            # rtsafe's rule: bisect when Newton leaves the bracket or stalls (for q < 1 a tiny
            # d_i makes f' huge and the Newton steps tiny far from the root)
            bad = ~((new >= lo) & (new <= hi)) | (df == 0) | (2 * step.abs() > dx_old.abs())
            mid = (lo + hi) / 2
            dx_old = torch.where(bad, mid - tau, step)
            new = torch.where(bad, mid, new)
            scale = tau.abs().clamp(min=1)
            # a small Newton step means convergence only where f is convex (q >= 1)
            small = ((new - tau).abs() <= tol * scale) & ~bad & (q >= 1)
            done = small | ((hi - lo) <= tol * scale) | (f == 0)
        tau = torch.where(finished, tau, new)
        finished = finished | done
        if bool(finished.all()):  # host sync: the convergence test
            break
    return tau


def count_true(mask: Tensor, dtype: torch.dtype = torch.int32) -> Tensor:
    """Per-row number of ``True`` in a bool ``(R, m)`` tensor, as ``dtype`` (a byte sum: on the
    CPU several times faster than summing bools)."""
    return mask.view(torch.uint8).sum(dim=-1, dtype=dtype)


def _newton_norm(z: Tensor, q: Power, tau: Tensor, max_iter: int, tol: Optional[float],
                 empty: Tensor) -> Tensor:
    """Threshold for ``q > 1`` (a float, or an ``(R,)`` tensor of per-row powers, all > 1) of the
    rows of ``z: (R, m)`` (max 0, ``-inf`` allowed).

    ``tau: (R,)`` is a lower bound, ``empty: (R,)`` marks rows without finite entries. Newton on
    the convex ``h(tau) = ||d||_q - 1``, ``d = [z - tau]_+`` (a norm of a convex, nonnegative
    function of ``tau``): from below the iterates increase monotonically to the root, and they
    are exact in one step on flat rows, so near-uniform rows need a handful of steps. ``d`` is
    updated in place (``[d - step]_+ = [z - tau - step]_+`` for ``step >= 0``): one buffer, two
    passes and two reductions per step, no temporaries. The loop ends when every step is below
    ``tol * max(1, |tau|)`` (``tol=None``: rounding, ``2 * eps``).

    ``tol=None`` (``q = 2`` only) then finishes *exactly*: the closed form ``t`` on the support
    ``S = {d > 0}`` (smaller root of ``sum_S (d - t)^2 = 1``) is accepted if *verified*: the
    entries ``>= t`` are exactly those of ``S`` (``t`` may lie below the last iterate, which
    rounding can put a hair above the root). Rows failing it (ties within rounding of the
    threshold; rare) are solved by sorting. Host syncs: the convergence test, one per step;
    one more if some row needs sorting. ``max_iter`` reached: the last (lower) iterate.
    """
    exact = tol is None
    eps = torch.finfo(z.dtype).eps
    rtol = 2 * eps if exact else tol
    d = (z - tau[:, None]).clamp_(min=0)
    square = not isinstance(q, Tensor) and q == 2.0
    work = None if square else torch.empty_like(d)
    qm1 = row_exponent(q[:, None] - 1, d) if isinstance(q, Tensor) else q - 1
    finished = empty.clone()
    for _ in range(max_iter):
        if square:
            s1 = d.sum(dim=-1)
            h = torch.linalg.vector_norm(d, dim=-1)
            step = h * (h - 1) / s1
        else:  # h' = -h^(1 - q) sum d^(q - 1); one pow per step: h^q = <d^(q - 1), d>
            w = torch.pow(d, qm1, out=work)
            hq = torch.linalg.vecdot(w, d)
            h = hq.pow(1 / q)
            step = (h - 1) * (hq / h) / w.sum(dim=-1)
        finished = finished | (step <= rtol * tau.abs().clamp(min=1))  # rows stop once settled
        if bool(finished.all()):  # host sync: the convergence test
            break
        # >= 0 (rounding may put an iterate a hair above the root): keeps [d - step]_+ exact
        step = torch.where(finished, 0, step).clamp_(min=0)
        tau = tau + step
        d.sub_(step[:, None]).clamp_(min=0)
    else:
        return tau
    if not exact:
        return tau
    mask = torch.empty_like(d, dtype=torch.bool)
    k = count_true(torch.gt(d, 0, out=mask))
    disc = s1 * s1 - k * (torch.linalg.vecdot(d, d) - 1)
    tau = torch.where(empty, tau, tau + (s1 - disc.clamp(min=0).sqrt()) / k)
    ok = empty | ((disc >= 0) & (count_true(torch.ge(z, tau[:, None], out=mask)) == k))
    if not bool(ok.all()):  # host sync; rare: ties within rounding of the threshold
        bad = (~ok).nonzero()[:, 0]
        tau[bad] = sort_threshold(z[bad], 2.0)[:, 0]
    return tau


def _native_exact_newton(z: Tensor, q: float, tau: Tensor, max_iter: int) -> Tensor:
    """The exact threshold (``q`` in {1, 2}) of the rows of ``z: (R, m)`` (max 0, ``-inf``
    allowed; CPU, float32/64) from the lower bound ``tau: (R,)`` by the native Newton loop
    (:func:`nmt.sparse._native.newton_threshold`: the iteration and the verified closed-form finish
    of :func:`_newton_norm` / :func:`_newton`, each step one pass over a row in cache, sums in
    doubles). Rows it could not verify (ties within rounding of the threshold; rare) are solved
    by sorting. Host syncs: none beyond the CPU's (the check of the flags reads them)."""
    tau, ok = newton_threshold(z, q, tau, max_iter)
    return _sort_unverified(tau, ok, q, lambda bad: z[bad])


def _sort_unverified(tau: Tensor, ok: Tensor, q: float, shifted_rows: Callable[[Tensor], Tensor],
                     bounds: bool = False) -> Tensor:
    """``tau: (R,)`` with the rows a native loop left unverified (``ok`` False: ties within
    rounding of the threshold; rare) solved by sorting ``shifted_rows(bad)``, those rows shifted
    to maximum 0 and scaled as the loop saw them. ``bounds``: the loop left a lower bound of the
    threshold in ``tau`` for those rows (:func:`nmt.sparse._native.bound_threshold`), so only the
    entries above it are sorted. Host sync: reading ``ok`` (a CPU tensor)."""
    if not bool(ok.all()):
        bad = (~ok).nonzero()[:, 0]
        shifted = shifted_rows(bad)
        if bounds:
            shifted = shifted.masked_fill(shifted <= tau.index_select(0, bad)[:, None], float("-inf"))
        tau[bad] = sort_threshold(shifted, q)[:, 0]
    return tau


def _newton_lower_bound(z: Tensor, q: Power, steps: int) -> Tensor:
    """A lower bound ``(R, 1)`` of the threshold of ``z: (R, m)`` (row max 0), without host sync.

    Newton from ``-1`` (a lower bound: the maximum has ``p <= 1``) stays below the root of
    the convex ``f`` (``q >= 1``); rows with ``q < 1`` keep ``-1``.
    """
    lo = torch.full_like(z[:, :1], -1.0)
    if not isinstance(q, Tensor):
        if q < 1:
            return lo
        tiny = torch.finfo(z.dtype).tiny
        for _ in range(steps):  # f >= 0 and f' > 0 below the root: the step is never negative
            d = (z - lo).clamp_(min=0)
            if q == 1.0:
                f, df = d.sum(dim=-1, keepdim=True) - 1, d.sign().sum(dim=-1, keepdim=True)
            elif q == 2.0:  # Newton on the convex ||d||_2 - 1 (see _newton)
                h = torch.linalg.vecdot(d, d).unsqueeze(-1).sqrt()
                f, df = h * (h - 1), d.sum(dim=-1, keepdim=True)
            else:
                dq1 = d.pow(q - 1)
                f, df = torch.linalg.vecdot(dq1, d).unsqueeze(-1) - 1, q * dq1.sum(dim=-1, keepdim=True)
            lo = lo + (f / df.clamp(min=tiny)).clamp(min=0)  # empty rows (f = -1) stay put
        return lo
    qc = q[:, None]
    qm1 = row_exponent(qc - 1, z)
    for _ in range(steps):
        d = (z - lo).clamp_(min=0)
        dq1 = torch.where(d > 0, torch.where(d > 0, d, 1).pow(qm1), 0)
        f = torch.linalg.vecdot(dq1, d)[:, None] - 1
        df = dq1.sum(dim=-1, keepdim=True) * qc
        ok = (df > 0) & (f > 0) & (qc >= 1)
        lo = torch.where(ok, lo + f / torch.where(ok, df, 1), lo)
    return lo


def _whole_blocks(z: Tensor, block: int) -> Tensor:
    """The whole blocks of the rows of ``z: (R, n)`` as a ``(R, n // block, block)`` view (no copy:
    a shorter last block is left out by the strides; ``z`` has unit stride along its rows)."""
    n_rows, n = z.shape
    return z.as_strided((n_rows, n // block, block), (z.stride(0), block, 1))


def _block_max(z: Tensor, block: int) -> Tensor:
    """Maxima of consecutive blocks of ``block`` entries: ``(R, n) -> (R, ceil(n / block))``."""
    n_rows, n = z.shape
    nb = n // block
    bmax = _whole_blocks(z, block).amax(dim=-1)
    if nb * block < n:
        bmax = torch.cat([bmax, z[:, nb * block:].amax(dim=-1, keepdim=True)], dim=-1)
    return bmax


class Candidates(NamedTuple):
    """The entries of rows ``(R, n)`` that can be in the support (all others are certainly below
    the threshold), as flat lists of equal length ``M``."""

    rows: Tensor
    """``(M,)`` long: the row of each candidate."""
    index: Tensor
    """``(M,)`` long: its position in the flattened rows, ``row * n + column``."""
    values: Tensor
    """``(M,)``: its score."""


def _gather_candidates(z: Tensor, bmax: Tensor, lo: Tensor, block: int) -> tuple[Tensor, Candidates]:
    """Entries ``> lo`` of each row, left-aligned in a ``(R, K)`` tensor padded with ``-inf``,
    and the same entries as :class:`Candidates` (their rows and flat positions in ``z``).

    ``z: (R, n)`` contiguous, ``bmax: (R, nb)`` its block maxima (a shorter last block
    included), ``lo: (R, 1)``. Only blocks whose maximum exceeds ``lo`` are read. The
    candidates of the full blocks come row-major from ``nonzero``; those of the shorter last
    block go after them in their row (no sort). Host syncs: the sizes of the selections.
    """
    n_rows, n = z.shape
    nb = n // block
    rows, blocks = (bmax[:, :nb] > lo).nonzero().unbind(1)
    if nb * block == n:  # index_select of whole blocks: much cheaper than 2-D advanced indexing
        vals = z.view(n_rows * nb, block).index_select(0, rows * nb + blocks)  # (M, block)
    else:
        vals = _whole_blocks(z, block)[rows, blocks]
    blk, off = (vals > lo.index_select(0, rows)).nonzero().unbind(1)
    crow, cval = rows.index_select(0, blk), vals.view(-1).index_select(0, blk * block + off)
    ccol = blocks.index_select(0, blk).mul_(block).add_(off)
    counts = torch.bincount(crow, minlength=n_rows)
    pos = torch.arange(crow.numel(), device=z.device) - (counts.cumsum(0) - counts)[crow]
    if nb * block < n:  # the shorter last block: filter it for every row, append per row
        tail = z[:, nb * block:]
        trow, toff = (tail > lo).nonzero().unbind(1)
        tcounts = torch.bincount(trow, minlength=n_rows)
        tpos = torch.arange(trow.numel(), device=z.device) - (tcounts.cumsum(0) - tcounts)[trow]
        crow, cval = torch.cat([crow, trow]), torch.cat([cval, tail[trow, toff]])
        ccol = torch.cat([ccol, toff + nb * block])
        pos = torch.cat([pos, tpos + counts[trow]])
        counts = counts + tcounts
    return _left_aligned(z, crow, ccol, cval, counts, pos)


def _mask_candidates(z: Tensor, above: Tensor) -> tuple[Tensor, Candidates]:
    """What :func:`_gather_candidates` returns, from the entries' mask ``above = z > lo: (R, n)``
    (already computed) instead of the block maxima: one selection over every entry, cheaper where
    most blocks would be read anyway (broad rows, alphas below 1.5). The same candidates, in the
    same order within each row (ascending columns; the flat lists hold a short last block's
    candidates in their row's place, not after all others). Host syncs: the selections' sizes."""
    n_rows, n = z.shape
    crow, ccol = above.nonzero().unbind(1)
    cval = z.view(-1).index_select(0, crow * n + ccol)
    counts = torch.bincount(crow, minlength=n_rows)
    pos = torch.arange(crow.numel(), device=z.device) - (counts.cumsum(0) - counts)[crow]
    return _left_aligned(z, crow, ccol, cval, counts, pos)


def _left_aligned(z: Tensor, crow: Tensor, ccol: Tensor, cval: Tensor, counts: Tensor,
                  pos: Tensor) -> tuple[Tensor, Candidates]:
    """The candidates (rows ``crow``, columns ``ccol``, values ``cval``; ``counts`` per row, ``pos``
    the place of each in its row) left-aligned in an ``(R, K)`` tensor padded with ``-inf``, and as
    :class:`Candidates`."""
    n_rows, n = z.shape
    width = int(counts.max()) if crow.numel() else 0
    out = z.new_full((n_rows, max(width, 1)), float("-inf"))
    out[crow, pos] = cval
    return out, Candidates(crow, crow * n + ccol, cval)


def root_threshold(z: Tensor, q: Power, *, tol: Optional[float] = None,
                   max_iter: Optional[int] = None, scale: float = 1.0,
                   relative: bool = False, candidates: bool = False) -> Union[Tensor, tuple]:
    """Threshold of ``scale * z`` for ``z: (..., n)`` (``-inf`` allowed) -> ``tau: (..., 1)``.

    ``+inf`` for rows without finite entries. ``q``: float, or a tensor broadcastable to
    ``(..., 1)`` (per-row power). ``tol=None``: exact (``q`` in {1, 2}); else relative
    tolerance of the Newton/bisection loop. ``scale > 0``. The rows are solved *relative to
    their maximum*: ``relative=True`` returns ``(tau_rel, zmax)`` (both ``(..., 1)``) with
    ``p = [scale * (z - zmax) - tau_rel]_+^q``, which keeps float precision for rows with a
    large offset; otherwise ``scale * zmax + tau_rel``. Rows without finite entries get
    ``zmax = 0``, ``tau_rel = +inf``. Exact ``q = 2`` on the CPU with the native library: the
    native pass of long rows (module docstring; ``cand`` None). Otherwise long rows are pruned to the entries above the
    block-maxima threshold first; rows where that bound keeps more than half of the blocks and
    of the entries (broad rows, e.g. early in training) are solved on the full row instead.
    ``candidates=True`` returns ``(tau_rel, zmax, cand)``: ``cand`` the :class:`Candidates` of
    the rows ``z.reshape(-1, n)`` when every row was pruned (every entry outside them is below
    the threshold: the output is zero there), else None.
    """
    if candidates:
        relative = True
    exact = tol is None
    if exact and not _is_exact_q(q):
        raise ValueError(f"the exact threshold needs q in {{1, 2}}, got {q}")
    lead, n = z.shape[:-1], z.shape[-1]
    z2 = z.reshape(-1, n).contiguous()
    n_rows = z2.shape[0]
    if n_rows == 0 or n == 0:
        tau, zmax = z.new_full((*lead, 1), float("inf")), z.new_zeros(*lead, 1)
        return (tau, zmax, None) if candidates else (tau, zmax) if relative else tau
    if isinstance(q, Tensor):
        q = q.expand(*lead, 1).reshape(n_rows)
    if max_iter is None:
        max_iter = 4 * n + 60 if exact else ROOT_MAX_ITER
    eps = torch.finfo(z.dtype).eps
    sub_tol = None if exact else tol
    exact_scale = _power_of_two(scale)

    def shift(rows_z: Tensor, owned: bool) -> tuple[Tensor, Tensor, Tensor]:
        """``(scale * (rows_z - zmax), zmax, empty)``, all rows; ``owned``: overwrite ``rows_z``."""
        zmax = rows_z.amax(dim=-1, keepdim=True)
        empty = zmax == float("-inf")
        zmax = torch.where(empty, 0, zmax)
        if exact_scale:  # scale * z - scale * zmax is exactly scale * (z - zmax): one pass
            if owned:
                zs = rows_z.mul_(scale).sub_(zmax * scale) if scale != 1 else rows_z.sub_(zmax)
            else:
                zs = torch.add(-zmax * scale, rows_z, alpha=scale)
        else:
            zs = (rows_z.sub_(zmax) if owned else rows_z - zmax).mul_(scale)
        return zs, zmax, empty

    def solve(rows_z: Tensor, lo: Optional[Tensor], q: Power, owned: bool = False) -> tuple[Tensor, Tensor]:
        """``(tau_rel, zmax)`` for the rows ``rows_z: (R, m)`` given a lower bound ``lo: (R, 1)``
        of the threshold of ``scale * rows_z`` (``owned``: ``rows_z`` is a temporary)."""
        zs, zmax, empty = shift(rows_z, owned)
        # exact thresholds by the native loop where built: one pass a step, row by row in cache
        native = exact and _host_solves(zs) and native_available()
        # per-row powers take the norm Newton too when all exceed 1 (learned alphas in (1, 2): a
        # host read of the small q, on this CPU path; 3x fewer passes than the safeguarded loop)
        if isinstance(q, Tensor):
            norm = not exact and bool((q > 1).all())
        else:
            norm = q == 2.0 or (q > 1 and not exact)
        if native or norm:  # Newton from -1 (or lo) directly: no separate warm steps
            start = torch.full_like(zmax, -1.0)
        else:  # a few sync-free Newton steps first: the checked loop then ends after one or two
            start = _newton_lower_bound(zs, q, WARM_STEPS)
            start = start - 4 * (sub_tol or eps) * start.abs().clamp(min=1)
        if lo is not None:
            start = torch.maximum(start, torch.where(empty, -1, lo - scale * zmax))
        if native:
            tau = _native_exact_newton(zs, q, start[:, 0], max_iter)
        elif norm:
            # any power above 1, float32: the native loop (one pass a step, no torch operations)
            tau = None if exact or not _host_solves(zs) else power_threshold(zs, q, start[:, 0], max_iter, sub_tol)
            if tau is None:
                tau = _newton_norm(zs, q, start[:, 0], max_iter, sub_tol, empty[:, 0])
        else:
            tau = _newton(zs, q, start[:, 0], max_iter, sub_tol, empty[:, 0])
        return torch.where(empty, float("inf"), tau[:, None]), zmax

    def finish(tau: Tensor, zmax: Tensor, cand: Optional[Candidates] = None):
        tau, zmax = tau.reshape(*lead, 1), zmax.reshape(*lead, 1)
        if candidates:
            return tau, zmax, cand
        return (tau, zmax) if relative else tau + scale * zmax

    block = _block_length(n)
    if n < 8 * block:
        return finish(*solve(z2, None, q))
    if exact and q in (1.0, 2.0) and _host_solves(z2) and native_available():
        # the native pass per row: its maximum and segment maxima, the entries above their bound,
        # Newton on them (no masks or selections over the whole input)
        found = bound_threshold(z2, q, scale, exact_scale, max_iter)
        if found is not None:
            tau, zmax, ok = found
            tau = _sort_unverified(tau, ok, q, lambda bad: shift(z2.index_select(0, bad), owned=True)[0],
                                   bounds=True)
            return finish(tau[:, None], zmax[:, None])
    bmax = _block_max(z2, block)
    # a lower bound of the threshold of a sub-vector (the block maxima) bounds the row's
    sub = bmax * scale
    smax = sub.amax(dim=-1, keepdim=True)
    # a NaN or +inf score reaches the block maxima (amax propagates NaN) but not the candidates
    nan_row = smax.isnan() | (smax == float("inf"))
    smax = torch.where(smax == float("-inf"), 0, smax)
    lo = _newton_lower_bound(sub - smax, q, LOWER_BOUND_STEPS) + smax
    lo = lo - 4 * (sub_tol or eps) * lo.abs().clamp(min=1)
    broad = (sub > lo).sum(dim=-1) * 2 > bmax.shape[-1]
    n_broad = int(broad.sum())  # host sync: how to split the rows
    above = None  # the entries above lo, where computed
    if n_broad:  # rows broad by their blocks may hold few entries above lo: one comparison pass
        above = z2 > lo / scale
        broad = broad & (count_true(above) * 2 > n)
        # most rows broad by their blocks: select the candidates from the entries, not the blocks
        above = above if n_broad * 2 > n_rows else None
        n_broad = int(broad.sum())  # host sync
    if n_broad == n_rows:
        return finish(*solve(z2, lo, q))

    def pruned(rows_z: Tensor, rows_bmax: Tensor, rows_lo: Tensor, q: Power,
               rows_above: Optional[Tensor]) -> tuple[Tensor, Tensor, Candidates]:
        if rows_above is not None:
            cand, found = _mask_candidates(rows_z, rows_above)
        else:
            cand, found = _gather_candidates(rows_z, rows_bmax, rows_lo / scale, block)
        if exact and prefer_sort(*cand.shape):
            return (*sorted_shifted_threshold(cand, q, scale), found)
        return (*solve(cand, rows_lo, q, owned=True), found)

    if n_broad == 0:
        tau, zmax, found = pruned(z2, bmax, lo, q, above)
        return finish(tau, torch.where(nan_row, float("nan"), zmax), found)
    tau, zmax = torch.empty_like(lo), torch.empty_like(lo)
    idx_b, idx_n = broad.nonzero()[:, 0], (~broad).nonzero()[:, 0]
    q_b, q_n = (q[idx_b], q[idx_n]) if isinstance(q, Tensor) else (q, q)
    tau[idx_b], zmax[idx_b] = solve(z2.index_select(0, idx_b), lo[idx_b], q_b, owned=True)
    tau[idx_n], zmax[idx_n], _ = pruned(z2.index_select(0, idx_n), bmax[idx_n], lo[idx_n], q_n,
                                        None if above is None else above.index_select(0, idx_n))
    return finish(tau, torch.where(nan_row, float("nan"), zmax))


def _power_of_two(scale: float) -> bool:
    """Whether multiplying by ``scale`` is exact (a power of two)."""
    m, _ = math.frexp(scale)
    return m == 0.5


def _is_exact_q(q: Power) -> bool:
    return not isinstance(q, Tensor) and q in (1.0, 2.0)


def pruned_shifted_threshold(x: Tensor, q: Power, scale: float = 1.0, tol: Optional[float] = None,
                             n_iter: Optional[int] = None, candidates: bool = False) -> tuple:
    """The CPU algorithm of the threshold front door: ``(tau_rel, zmax)``, both ``(..., 1)``, of
    ``scale * x`` for ``x: (..., n)``, with ``p = [scale * (x - zmax) - tau_rel]_+^q``.

    Exact thresholds (``tol=None``, ``q`` in {1, 2}) of attention-sized inputs by one sort
    (:func:`prefer_sort`), the others by :func:`root_threshold`. Rows holding NaN or ``+inf``
    get ``zmax = NaN``; rows without finite entries ``zmax = 0``, ``tau_rel = +inf``. Host
    synchronisations: see the module docstring (a NumPy hand-over on the CPU).
    ``candidates=True`` adds a third result, the :class:`Candidates` of :func:`root_threshold`
    (None where not every row was pruned: short rows, broad rows).
    """
    n = x.shape[-1]
    if tol is None and not isinstance(q, Tensor) and prefer_sort(x.numel() // max(n, 1), n):
        found = sorted_shifted_threshold(x, q, scale)  # NaN / +inf rows: zmax NaN already
        return (*found, None) if candidates else found
    tau, zmax, *cand = root_threshold(x, q, tol=tol, max_iter=n_iter, scale=scale, relative=True,
                                      candidates=candidates)
    return (tau, nan_rows(zmax), *cand)


def nan_rows(zmax: Tensor) -> Tensor:
    """Row maxima with NaN where a row holds NaN or ``+inf`` (its output is all NaN)."""
    return torch.where(zmax.isnan() | (zmax == float("inf")), float("nan"), zmax)
