"""Structured sparse attention (Niculae & Blondel 2017): fusedmax and oscarmax.

Both map scores to the simplex through a structured regulariser::

    fusedmax(x) = sparsemax(prox_TV(x / gamma))       TV(y) = lam * sum_i |y_{i+1} - y_i|
    oscarmax(x) = sparsemax(prox_OSCAR(x / gamma))    OSCAR(y) = lam * sum_{i<j} max(|y_i|, |y_j|)

For fusedmax the composition is *exactly* the regularised map
``argmax_{p in simplex} <p, x> - gamma (1/2 ||p||^2 + TV(p))`` (their Prop. 2): adjacent
positions with close scores receive one shared weight. For oscarmax the composition is, as the
authors' erratum says, only an *approximation* of the OSCAR-regularised map; it is what is
implemented here (and in their reference code), under the name oscarmax. It groups positions of
equal score magnitude, wherever they are. ``oscarmax_exact`` is the exact OSCAR-regularised map
(on the simplex the penalty loses its absolute values, and that prox composes exactly).

Both proxes are exact and batched over rows (see ``_prox_tv`` and ``_prox_oscar``); the backward
composes their group-averaging Jacobians (Prop. 3) with the sparsemax Jacobian, as
Jacobian-vector products. The whole map (compaction, prox, projection) is one autograd node:
its forward records nothing, and on attention-sized rows the cost is the count of small tensor
ops, so rows that are already a prefix skip the compaction and rows up to ``SORT_MAX_N`` get
the one-sort simplex threshold. Masked positions are removed from the row before the prox (kept
entries are moved, in order, to a prefix: TV then fuses positions that are adjacent among the
kept ones) and get exact zeros. ``lam = 0`` is exactly ``sparsemax(x / gamma)``. As sparsemax,
fusedmax and oscarmax_exact work on the scores relative to the row maximum (their proxes are
shift-equivariant), and every projection subtracts the row maximum before its threshold.

Host synchronisation (``impl``): ``"static"`` (the default on accelerators, and on the CPU while
``torch.compile`` traces, ``"auto"``) has none:
every row is compacted (no test whether it is a prefix), the taut string is found by the funnel
scan on every row (``O(n^2)`` per row, exact), the simplex threshold comes from one sort (``lam =
0``: the sparsemax mapping's static path, bit for bit). ``"pruned"`` (the default on the CPU)
reads back a few values per call: whether compaction is needed (``torch.equal``), the active
set's convergence test (one per round, 3-4 rounds on attention rows) and, beyond ``SORT_MAX_N``
entries, the sparsemax threshold's own checks. ``"triton"`` has no fused kernel here: static.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from torch import Tensor, nn

from ._common import apply_mask, check_scores, compute_dtype, fresh_output
from ._dispatch import check_impl
from ._groups import group_average
from ._prox_oscar import ordered_fit, prox_oscar
from ._prox_tv import prox_tv
from ._threshold import sorted_shifted_threshold
from .sparsemax import sparsemax_backward, sparsemax_probs


def _check_params(name: str, lam: float, gamma: float) -> None:
    for key, value, low in (("lam", lam, "0 <= "), ("gamma", gamma, "0 < ")):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not (ok and (value >= 0 if key == "lam" else value > 0)):
            raise ValueError(f"{name}: {key} must be a finite number, {low}{key}, got {value!r}")


def _prox_tv(z: Tensor, lengths: Tensor, lam: float, static: bool) -> tuple[Tensor, Tensor, Optional[Tensor]]:
    y, groups = prox_tv(z, lengths, lam, static)
    return y, groups, None


def _prox_ordered(z: Tensor, lengths: Tensor, lam: float, static: bool) -> tuple[Tensor, Tensor, Optional[Tensor]]:
    y, groups = ordered_fit(z, lengths, lam, static)
    return y, groups, None


_PROXES: dict[str, Callable[[Tensor, Tensor, float, bool], tuple[Tensor, Tensor, Optional[Tensor]]]] = {
    "fusedmax": _prox_tv, "oscarmax": prox_oscar, "oscarmax_exact": _prox_ordered}

_SHIFT_EQUIVARIANT = ("fusedmax", "oscarmax_exact")
"""The maps whose prox is shift-equivariant (``prox(z + c) = prox(z) + c``): computed on the scores
relative to the row maximum, as sparsemax is (a common offset of 2^20 cost float32 rows errors up to
0.27). oscarmax's prox takes magnitudes: not shift-equivariant."""


#: Rows up to this length get the sort-based simplex threshold after the prox (cheaper than the
#: Newton threshold sparsemax uses beyond 32 entries, up to about this length, on CPU).
SORT_MAX_N = 128


class _StructuredFunction(torch.autograd.Function):
    """``sparsemax(prox(x / gamma))`` over the kept (finite) entries of every row of a 2-d ``x``
    (``-inf`` = masked), as one autograd node: the forward runs without recording, the backward
    is the sparsemax Jacobian-vector product followed by the prox's group averaging."""

    @staticmethod
    def forward(ctx, x: Tensor, name: str, lam: float, gamma: float,  # type: ignore[override]
                static: bool) -> Tensor:
        R, n = x.shape
        pos = torch.arange(n, device=x.device)
        keep = x != float("-inf")
        lengths = keep.sum(dim=-1)
        prefix = pos < lengths[:, None]
        slot = None
        if static or not torch.equal(keep, prefix):  # host sync (not static): skip the compaction
            # Kept entries move, in order, to a prefix: ``slot`` is each entry's place in the
            # compact row (a permutation of the positions).
            kept = keep.long().cumsum(dim=-1)
            slot = torch.where(keep, kept - 1, lengths[:, None] + pos - kept)
            x = torch.full_like(x, float("-inf")).scatter_(-1, slot, x)
        z = x / gamma if gamma != 1 else x
        groups = coef = p = None
        if lam > 0:
            if name in _SHIFT_EQUIVARIANT:  # relative to the row maximum: no precision lost to an offset
                zmax = z.amax(dim=-1, keepdim=True)
                z = z - torch.where(zmax == float("-inf"), 0, zmax)  # +inf / NaN rows: NaN
            y, groups, coef = _PROXES[name](z, lengths, float(lam), static)
            z = y.masked_fill_(~prefix, float("-inf"))
            if n <= SORT_MAX_N or static:  # p = [z - zmax - tau_rel]_+ (as sparsemax: zmax + tau_rel rounds)
                # an empty row gets the threshold +inf: all zeros (and zero gradient)
                tau, zmax = sorted_shifted_threshold(z, 1.0, host=not static)
                p = torch.sub(z, zmax).sub_(tau).clamp_(min=0)
        if lam == 0 or p is None:   # lam = 0: bit for bit sparsemax; long rows: its threshold
            p = sparsemax_probs(z, impl="static" if static else "auto")
        ctx.gamma = gamma
        p = fresh_output(p)
        ctx.save_for_backward(p, slot, groups, coef, prefix)
        return p if slot is None else p.gather(-1, slot)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        p, slot, groups, coef, prefix = ctx.saved_tensors
        if slot is not None:
            grad = torch.empty_like(grad).scatter_(-1, slot, grad)
        g = sparsemax_backward(p, grad)
        if groups is not None:
            n1 = g.shape[-1] + 1
            if coef is None:
                g = group_average(g, groups, prefix, n1)
            else:
                g = coef * group_average(coef * g, groups, coef != 0, n1)
        if ctx.gamma != 1:
            g = g / ctx.gamma
        if slot is not None:
            g = g.gather(-1, slot)
        return g, None, None, None, None


def _structured_map(name: str, scores: Tensor, lam: float, gamma: float, dim: int,
                    mask: Optional[Tensor], impl: str) -> Tensor:
    """sparsemax(prox(scores / gamma)) along ``dim`` over the kept entries of every row."""
    _check_params(name, lam, gamma)
    check_impl(impl)
    dim = check_scores(scores, dim)
    dtype = scores.dtype
    x = apply_mask(scores, mask).to(compute_dtype(dtype)).movedim(dim, -1)
    shape = x.shape
    if x.numel() == 0:
        return scores.clone()  # in the graph (an empty gradient), as the other mappings
    # "auto" while torch.compile traces: the static path (the pruned one's host reads do not trace)
    static = impl in ("static", "triton") or (impl == "auto" and (x.device.type != "cpu"
                                                                  or torch.compiler.is_compiling()))
    p = _StructuredFunction.apply(x.reshape(-1, shape[-1]), name, lam, gamma, static)
    return p.reshape(shape).movedim(-1, dim).to(dtype)


def fusedmax(x: Tensor, lam: float = 0.1, gamma: float = 1.0, dim: int = -1,
             mask: Optional[Tensor] = None, impl: str = "auto") -> Tensor:
    """Fusedmax: ``sparsemax(prox_{lam TV}(x / gamma))`` along ``dim``, exact (Prop. 2).

    x: scores of any shape (e.g. ``(batch, n)``), float; half precisions are computed in
    float32 and returned in the input dtype. lam >= 0: fused-lasso strength (0 gives
    ``sparsemax(x / gamma)``); gamma > 0: temperature. mask: bool, broadcastable to ``x``,
    True = keep; masked and ``-inf`` entries get exact zeros, and TV fuses entries adjacent among
    the kept ones. A row with nothing kept is all zeros with zero gradient. impl: ``"auto"``
    (``"static"`` on accelerators: no host sync; ``"pruned"`` on the CPU), see the module docstring.
    Returns probabilities shaped like ``x``, summing to one along ``dim``, piecewise constant
    over runs of adjacent positions.
    """
    return _structured_map("fusedmax", x, lam, gamma, dim, mask, impl)


def oscarmax(x: Tensor, lam: float = 0.01, gamma: float = 1.0, dim: int = -1,
             mask: Optional[Tensor] = None, impl: str = "auto") -> Tensor:
    """Oscarmax: ``sparsemax(prox_{lam OSCAR}(x / gamma))`` along ``dim``.

    The prox and the projection are each exact; their composition is the approximation of the
    OSCAR-regularised map used by Niculae & Blondel (2017, see their erratum), not that map
    itself. Arguments and masking as :func:`fusedmax`. Returns probabilities shaped like ``x``
    in which positions with scores of close magnitude, anywhere in the row, share one weight.
    """
    return _structured_map("oscarmax", x, lam, gamma, dim, mask, impl)


def oscarmax_exact(x: Tensor, lam: float = 0.01, gamma: float = 1.0, dim: int = -1,
                   mask: Optional[Tensor] = None, impl: str = "auto") -> Tensor:
    """The exact OSCAR-regularised map ``argmax_{p in simplex} <p, x> - gamma (1/2 ||p||^2 + OSCAR(p))``.

    On the simplex ``|p_i| = p_i``, so the penalty is ``lam * sum_{i<j} max(p_i, p_j)``; its prox
    sorts the scores themselves (not their magnitudes) and is shift-equivariant, which makes
    ``sparsemax(prox(x / gamma))`` exact (as Prop. 2 for fusedmax). It differs from
    :func:`oscarmax` when scores have mixed signs: a negative score is never pooled with a
    positive one of the same magnitude. Arguments, masking and returns as :func:`fusedmax`.
    """
    return _structured_map("oscarmax_exact", x, lam, gamma, dim, mask, impl)


class _StructuredModule(nn.Module):
    """Shared module plumbing: a structured map with fixed ``lam``, ``gamma`` and ``dim``."""

    function: Callable[..., Tensor]

    def __init__(self, lam: float, gamma: float = 1.0, dim: int = -1) -> None:
        super().__init__()
        _check_params(type(self).__name__, lam, gamma)
        self.lam, self.gamma, self.dim = lam, gamma, dim

    def forward(self, scores: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return type(self).function(scores, lam=self.lam, gamma=self.gamma, dim=self.dim, mask=mask)

    def extra_repr(self) -> str:
        return f"lam={self.lam}, gamma={self.gamma}, dim={self.dim}"


class Fusedmax(_StructuredModule):
    """Module form of :func:`fusedmax`: ``Fusedmax(lam=0.1, gamma=1.0, dim=-1)(scores, mask)``."""

    function = staticmethod(fusedmax)

    def __init__(self, lam: float = 0.1, gamma: float = 1.0, dim: int = -1) -> None:
        super().__init__(lam, gamma, dim)


class Oscarmax(_StructuredModule):
    """Module form of :func:`oscarmax`: ``Oscarmax(lam=0.01, gamma=1.0, dim=-1)(scores, mask)``."""

    function = staticmethod(oscarmax)

    def __init__(self, lam: float = 0.01, gamma: float = 1.0, dim: int = -1) -> None:
        super().__init__(lam, gamma, dim)


class OscarmaxExact(_StructuredModule):
    """Module form of :func:`oscarmax_exact`: ``OscarmaxExact(lam=0.01, gamma=1.0, dim=-1)``."""

    function = staticmethod(oscarmax_exact)

    def __init__(self, lam: float = 0.01, gamma: float = 1.0, dim: int = -1) -> None:
        super().__init__(lam, gamma, dim)
