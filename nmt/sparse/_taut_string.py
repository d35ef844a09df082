"""Exact taut strings, batched over rows of different lengths: the engine of the structured proxes.

For a row ``x`` of length ``m`` with running sums ``r_k = x_1 + .. + x_k`` (``r_0 = 0``) the taut
string is the shortest path ``s`` from ``(0, 0)`` to ``(m, r_m)`` through the gates
``r_k - lam_low <= s_k <= r_k + lam_up`` (``k = 1 .. m-1``); its slopes ``y_i = s_i - s_{i-1}`` solve::

    min_y 1/2 ||y - x||^2 + sum_k  lam_up * max(y_{k+1} - y_k, 0) + lam_low * max(y_k - y_{k+1}, 0)

* ``lam_low = lam_up = lam``: the prox of ``lam`` times 1-d total variation (fused lasso);
* ``lam_low = 0, lam_up = inf``: the least concave majorant of ``r``, i.e. the least-squares
  non-increasing (isotonic) fit of ``x``.

The string is straight between *knots* on the walls; it bends up (``y`` jumps up) at the upper
wall and down at the lower wall. Once the knots and their walls are known, every slope is the
closed form ``(sum of x over the segment + offset(end) - offset(start)) / length`` with
``offset = +lam_up`` at an upper knot, ``-lam_low`` at a lower knot, 0 at the two ends.

Finding the knots, exactly:

1. Primal-dual active set on the dual box QP (Hintermueller, Ito & Kunisch 2003): guess the
   knots, interpolate the string, move violated gates in and knots with a wrong-signed bend out;
   stop when the guess repeats. A repeated guess satisfies the KKT conditions, so it *is* the
   solution (up to rounding). Starting from the knots of ``y = x`` (for TV without the gates
   where neighbours differ by at most ``2 lam``) this takes a handful of iterations in practice
   (3 or 4 on attention rows), each about 30 tensor ops over the whole batch.
2. Rows that have not settled after ``max_iter`` rounds (possible in theory) are solved by the
   funnel scan: from a knot at node ``a``, walk ``j = a+1 ..`` keeping the smallest slope to the
   upper walls (``hi``) and the largest to the lower walls (``lo``); at the first ``k`` with
   ``lo > hi`` the string bends at the upper node that set ``hi`` if the lower wall at ``k`` rose
   above it, else at the lower node that set ``lo``. The next knot is computed from every
   possible knot at once (``O(m^2)`` work, fixed number of ops) and the path from the origin is read
   off by pointer doubling (``O(log m)`` gathers). No loop over rows or positions in either.

Host synchronisation: the active set's convergence test (one per round, a handful of rounds) and
selecting the rows left for the funnel. ``static=True`` runs the funnel scan on every row instead:
exact, static shapes, no host sync (``O(m^2)`` work per row, for accelerators and short rows).

On the CPU in eager mode (not ``static``) the native library does it instead
(:func:`nmt.sparse._native.taut_string`: the same funnel scan one start at a time, row by row, and
pool-adjacent-violators for the isotonic fit; the prox of TV 7-21x faster than the active set's
tensor rounds at attention shapes), the torch paths staying the fallback where no C compiler is.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from ._native import taut_string as native_taut_string

#: Active-set rounds before the remaining rows go to the funnel scan.
MAX_ACTIVE_SET_ROUNDS = 64
#: Rows per funnel chunk are chosen so the (rows, 2, n+1, n+1) scan stays under this many entries.
MAX_SCAN_ENTRIES = 1 << 24


def _wall(r: Tensor, interior: Tensor, offset: float) -> Tensor:
    """``r + offset`` at interior nodes, ``r`` at the pinned ends (``offset`` may be +-inf)."""
    return torch.where(interior, r + offset, r)


def _knot_bounds(knot: Tensor) -> tuple[Tensor, Tensor]:
    """knot: (B, N) bool. Returns two (B, N) long: the nearest knot at or before / at or after
    every node (node 0 and node N-1 must be knots)."""
    N = knot.shape[-1]
    node = torch.arange(N, device=knot.device)
    before = torch.where(knot, node, 0).cummax(dim=-1).values
    after = torch.where(knot, node, N - 1).flip(-1).cummin(dim=-1).values.flip(-1)
    return before, after


def _active_set(x: Tensor, r: Tensor, interior: Tensor, lam_low: float, lam_up: float,
                max_iter: int) -> tuple[Tensor, Tensor, Optional[tuple[Tensor, Tensor]]]:
    """Primal-dual active set. Returns ``(tau, settled, bounds)``: (B, N) knot walls in
    {-1, 0, +1} (lower, none, upper), (B,) bool, the rows whose guess repeated (exact
    solutions), and :func:`_knot_bounds` of ``tau`` when every row settled (else None).

    One round: interpolate the string through the guessed knots; with the dual variable
    ``u = s - r`` and the multiplier estimate ``bend`` (slope change at a knot: >= 0 at a valid
    upper knot, <= 0 at a valid lower one) a free gate becomes a knot when ``u`` leaves
    ``[-lam_low, lam_up]`` and a knot is freed when its bend has the wrong sign. A rounding-sized
    hysteresis keeps ties in their current state.

    A round is about 30 tensor ops, all in the float dtype of ``r`` where possible (bool and
    integer intermediates cost conversions): knot indicators are ``tau**2``, and one ``cummax``
    of ``(node + 1) * knot`` gives both the last knot ``p`` (its index) and ``p + 1`` (its value).
    """
    B, N = r.shape
    dev, dt = r.device, r.dtype
    node1 = torch.arange(1, N + 1, device=dev, dtype=dt)                      # node + 1
    finite = [v for v in (lam_low, lam_up) if math.isfinite(v)]
    tol = r.abs().amax(dim=-1, keepdim=True).add_(1 + max(finite, default=0.0))
    tol.mul_(32 * torch.finfo(dt).eps)
    ends_f = (~interior).to(dt)
    can_up, can_low = lam_up < math.inf, lam_low < math.inf
    tau = torch.zeros_like(r)
    dx = x[:, 1:] - x[:, :-1]
    torch.sign(dx, out=tau[:, 1:-1])                                             # knots of y = x
    if lam_low == lam_up and 0 < lam_up < math.inf:
        # TV: a lone pair of neighbours fuses iff they differ by at most 2 lam; starting with
        # those gates free saves about one round (the result does not depend on the start)
        tau[:, 1:-1].mul_(dx.abs_() > 2 * lam_up)
    tau.clamp_(min=-1.0 if can_low else 0.0, max=1.0 if can_up else 0.0).mul_(1 - ends_f)
    if lam_low == lam_up or not (can_up and can_low):                # knot height r + c * tau
        c = lam_up if can_up else (lam_low if can_low else 0.0)
        heights = None
    else:
        heights = (_wall(r, interior, -lam_low), _wall(r, interior, lam_up))
    up_thr = tol + lam_up if can_up else None
    low_thr = -tol - lam_low if can_low else None
    new = torch.full_like(tau, 2.0)                                  # no round yet: nothing settled
    for _ in range(max_iter):
        knot = torch.addcmul(ends_f, tau, tau)                       # 1 at knots (and the ends)
        if heights is None:
            height = torch.add(r, tau, alpha=c) if c else r
        else:
            height = torch.where(tau > 0, heights[1], torch.where(tau < 0, heights[0], r))
        # last knot p <= i (one cummax gives p and p + 1) and next knot q >= i (flipped)
        p1, p = (node1 * knot).cummax(dim=-1)                        # p1 = p + 1
        qv, q = (node1 * knot.flip(-1)).cummax(dim=-1)               # N - q, N - 1 - q (flipped)
        q = torch.rsub(q.flip(-1), N - 1)
        frac = torch.sub(node1, p1).div_(torch.rsub(qv.flip(-1).add_(p1), N + 1).clamp_(min=1))
        s = torch.lerp(height.gather(1, p), height.gather(1, q), frac)             # the string
        d = s.diff(dim=-1)
        bend = torch.zeros_like(s)
        torch.sub(d[:, 1:], d[:, :-1], out=bend[:, 1:-1])
        u = s.sub_(r)
        # free gates: +1 / -1 when u leaves [low_thr, up_thr] (at a knot u is on its wall, inside
        # the tolerance: 0); knots: kept (+tau) while tau * bend > -tol
        new = (u - u.clamp(low_thr, up_thr)).sign_()
        new.addcmul_(torch.addcmul(tol, bend, tau).sign_().clamp_(min=0), tau)
        if torch.equal(new, tau):
            return tau, torch.ones(B, dtype=torch.bool, device=dev), (p, q)
        tau, new = new, tau
    return tau, (tau == new).all(dim=-1), None


def _funnel_next(low: Tensor, up: Tensor, lengths: Tensor) -> Tensor:
    """Next knot of the taut string from every possible knot (the funnel scan, all starts at once).

    low, up: (B, N) walls at nodes 0..N-1 (equal at the ends); lengths: (B,) long ``m``.
    A state is ``t * N + a`` (node ``a``, wall ``t``: 0 lower, 1 upper). Returns (B, 2N) long,
    the state of the next knot; the end state ``(0, m)`` points to itself.
    """
    B, N = up.shape
    node = torch.arange(N, device=up.device)
    beyond = node > lengths[:, None]
    inf = torch.full((), float("inf"), dtype=up.dtype, device=up.device)
    up_t = torch.where(beyond, inf, up)[:, None, None, :]           # targets past the end never bind
    low_t = torch.where(beyond, -inf, low)[:, None, None, :]
    start = torch.stack((low, up), dim=1)[..., None]                 # (B, 2, N, 1): knot heights
    step = (node[None, :] - node[:, None]).to(up.dtype)              # (a, j): j - a
    behind = step <= 0
    inv = torch.where(behind, torch.zeros_like(step), 1.0 / step.clamp(min=1))
    s_up = ((up_t - start) * inv).masked_fill_(behind, float("inf"))    # (B, 2, N, N)
    s_low = ((low_t - start) * inv).masked_fill_(behind, float("-inf"))
    hi, hi_at = torch.cummin(s_up, dim=-1)
    lo, lo_at = torch.cummax(s_low, dim=-1)
    k = N - (lo > hi).sum(dim=-1, keepdim=True)                     # first crossing node (N: none)
    crossed = k < N
    k = k.clamp(max=N - 1)
    prev = (k - 1).clamp(min=0)
    bend_up = s_low.gather(-1, k) > hi.gather(-1, prev)              # lower wall at k rose above hi
    nxt_a = torch.where(bend_up, hi_at.gather(-1, prev), lo_at.gather(-1, prev))
    nxt_a = torch.where(crossed, nxt_a, lengths[:, None, None, None])
    nxt_t = (bend_up & crossed).long()
    return (nxt_t * N + nxt_a).reshape(B, 2 * N)


def _funnel(r: Tensor, interior: Tensor, lengths: Tensor, lam_low: float, lam_up: float) -> Tensor:
    """Knot walls (B, N) in {-1, 0, +1} by the funnel scan and pointer doubling."""
    B, N = r.shape
    nxt = _funnel_next(_wall(r, interior, -lam_low), _wall(r, interior, lam_up), lengths)
    jumps = [nxt]
    for _ in range(max(1, N.bit_length()) - 1):
        jumps.append(jumps[-1].gather(1, jumps[-1]))
    node = torch.arange(N, device=r.device)
    cur = torch.zeros(B, N, dtype=torch.long, device=r.device)       # last knot state at node <= k
    for table in reversed(jumps):
        cand = table.gather(1, cur)
        cur = torch.where(cand % N <= node, cand, cur)
    tau = torch.zeros_like(r).scatter_(1, cur % N, 2.0 * (cur // N).to(r.dtype) - 1.0)
    return torch.where(interior, tau, torch.zeros_like(tau))


def _funnel_rows(r: Tensor, interior: Tensor, lengths: Tensor, lam_low: float,
                 lam_up: float) -> Tensor:
    """:func:`_funnel` over row chunks bounding the memory of the all-starts scan."""
    B, N = r.shape
    rows = max(1, MAX_SCAN_ENTRIES // (2 * N * N))
    return torch.cat([_funnel(r[i:i + rows], interior[i:i + rows], lengths[i:i + rows],
                              lam_low, lam_up) for i in range(0, B, rows)])


def taut_string(x: Tensor, lengths: Tensor, lam_low: float, lam_up: float,
                max_iter: int = MAX_ACTIVE_SET_ROUNDS, static: bool = False,
                native: bool = True) -> tuple[Tensor, Tensor]:
    """Slopes of the taut string of each row prefix (see the module docstring).

    x: (B, n) float32/float64, positions ``>= lengths[b]`` ignored; lengths: (B,) long;
    lam_low, lam_up >= 0 (``inf`` allowed). ``static``: the funnel scan on every row (no host
    sync, ``O(n^2)`` per row) instead of the active set (a few synchronising rounds). ``native``
    (CPU, eager, not ``static``): the native scan (:func:`nmt.sparse._native.taut_string`) where
    the library is built; False keeps the torch active set (``max_iter`` applies to it alone).
    Returns ``(y, groups)``, both (B, n): the slopes
    (0 past the length) and, for every position, the first position of its straight segment
    (positions sharing it form one group of equal ``y``; padding positions get group ``m``).
    """
    if native and not static and x.device.type == "cpu" and not torch.compiler.is_compiling():
        found = native_taut_string(x, lengths, lam_low, lam_up)
        if found is not None:  # (None: no native library, or another dtype)
            return found
    B, n = x.shape
    N = n + 1
    node = torch.arange(N, device=x.device)
    valid = node[:-1] < lengths[:, None]
    x = x.masked_fill(~valid, 0.0)
    r = torch.nn.functional.pad(x.cumsum(dim=-1), (1, 0))
    interior = (node < lengths[:, None]).logical_and_(node >= 1)
    if static:
        tau = _funnel_rows(r, interior, lengths, lam_low, lam_up)
        bounds = _knot_bounds((tau != 0) | ~interior)
    else:
        tau, settled, bounds = _active_set(x, r, interior, lam_low, lam_up, max_iter)
    if bounds is None:
        rows = (~settled).nonzero().squeeze(1)
        tau = tau.index_copy(0, rows, _funnel_rows(r[rows], interior[rows], lengths[rows],
                                                   lam_low, lam_up))
        bounds = _knot_bounds((tau != 0) | ~interior)
    start, end = bounds[0][:, :-1], bounds[1][:, 1:]     # knot <= i and knot >= i + 1
    y = x.new_zeros(B, N).scatter_add_(1, start, x).gather(1, start)        # sum over the segment
    if lam_up == lam_low:                                 # offset lam * tau (0 at the ends)
        if lam_up > 0:
            y.add_(tau.gather(1, end).sub_(tau.gather(1, start)), alpha=lam_up)
    elif (lam_up < math.inf and lam_up > 0) or (lam_low < math.inf and lam_low > 0):
        offset = (tau.clamp(min=0) * (lam_up if lam_up < math.inf else 0.0)
                  + tau.clamp(max=0) * (lam_low if lam_low < math.inf else 0.0))
        y.add_(offset.gather(1, end).sub_(offset.gather(1, start)))
    y.div_((end - start).clamp_(min=1)).masked_fill_(~valid, 0.0)
    return y, torch.where(valid, start, lengths[:, None])
