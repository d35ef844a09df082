"""Private kernels for :func:`nmt.sparse.continuous.rbf_expectations`.

For a location-scale density ``p(t) = p_1((t - mu) / a) / a`` and Gaussian basis
functions ``g_j(t) = N(t; b_j, s_j^2)`` we need ``r_j = E_p[g_j]`` and its derivatives

    dr/dmu = E_p[g_j'(t)],        dr/da = E_p[(t - mu) g_j'(t)] / a,

with ``g'(t) = -(z / s) g(t)``, ``z = (t - b) / s``. All three come out of one forward pass
(the backward only contracts them with the incoming gradient). The moment expansion runs in
float64 (it needs the digits); the quadrature branch in float64 for float64 inputs and in
float32 otherwise (it sums positive, smooth terms and loses nothing that float32 outputs keep).

beta = 0 (Gaussian, a = sigma): ``r = N(mu; b, a^2 + s^2)``.

beta >= 1: ``p(t) = (a^2 - (t - mu)^2)^beta / (K a^(2 beta + 1))`` on ``[mu - a, mu + a]``.
Substituting ``t = b + s z`` gives ``a^2 - (t - mu)^2 = s^2 (hi - z)(z - lo)`` with
``lo, hi = (mu -+ a - b) / s``, so

    E_p[z^m g] = W int_lo^hi ((hi - z)(z - lo))^beta z^m phi(z) dz = W sum_k q_k M_{k+m},
    W = (s / a)^(2 beta) / (K a),

where ``q_k`` are the coefficients of ``(-z^2 + (hi + lo) z - hi lo)^beta`` and ``M_k`` the
truncated standard-normal moments on [lo, hi] (erf/erfc, then the recursion
``M_k = (k - 1) M_{k-2} + lo^(k-1) phi(lo) - hi^(k-1) phi(hi)``). When the basis function is
wider than the support (``s > a``) the monomial expansion cancels badly, and the smooth
integrand is integrated instead with 12 Gauss-Legendre nodes on the support (checked
against 200 nodes: relative error < 1e-11 for s >= a and beta <= 3).
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

from ._common import own_precision

_SQRT2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_QUAD_NODES = 12  # error < 1e-11 in the regime it is used for (s > a), vs 200 nodes
_node_cache: dict[tuple[int, torch.device], tuple[Tensor, Tensor]] = {}


def _legendre(n: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Gauss-Legendre nodes and weights on [-1, 1] (float64, cached per device)."""
    key = (n, device)
    if key not in _node_cache:
        nodes, weights = np.polynomial.legendre.leggauss(n)
        _node_cache[key] = (torch.tensor(nodes, dtype=torch.float64, device=device),
                            torch.tensor(weights, dtype=torch.float64, device=device))
    return _node_cache[key]


def unit_mass(beta: int) -> float:
    """``K_beta = int_{-1}^{1} (1 - u^2)^beta du = sqrt(pi) Gamma(beta + 1) / Gamma(beta + 3/2)``."""
    return math.sqrt(math.pi) * math.gamma(beta + 1) / math.gamma(beta + 1.5)


def _normal_interval_mass(lo: Tensor, hi: Tensor) -> Tensor:
    """``Phi(hi) - Phi(lo)`` as a difference of erfc values on the upper side (by symmetry),
    accurate to full relative precision in both tails."""
    flip = hi < 0
    x = torch.where(flip, -hi, lo)
    y = torch.where(flip, -lo, hi)
    return 0.5 * (torch.erfc(x / _SQRT2) - torch.erfc(y / _SQRT2))


@lru_cache(maxsize=None)
def _constants(beta: int, n_moments: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Constant tensors of the moment expansion (float64, cached).

    Returns ``(recursion, multinomial)``:
    ``recursion`` (K, K) maps ``[M_0, B_1 .. B_{K-1}]`` to ``[M_0 .. M_{K-1}]`` where
    ``B_k = lo^(k-1) phi(lo) - hi^(k-1) phi(hi)`` and ``M_k = (k - 1) M_{k-2} + B_k``;
    ``multinomial`` (2 beta + 1, (beta + 1)^2) maps the monomials
    ``(-P)^i S^j`` to the coefficients of ``z^k`` in ``(-P + S z - z^2)^beta``.
    """
    rows = [[0.0] * n_moments for _ in range(n_moments)]
    for k in range(n_moments):
        rows[k][k] = 1.0
        if k >= 2:
            rows[k] = [(k - 1) * x + y for x, y in zip(rows[k - 2], rows[k])]
    multinomial = torch.zeros(2 * beta + 1, beta + 1, beta + 1, dtype=torch.float64)
    for i in range(beta + 1):
        for j in range(beta + 1 - i):
            l = beta - i - j  # noqa: E741
            count = math.factorial(beta) // (math.factorial(i) * math.factorial(j) * math.factorial(l))
            multinomial[j + 2 * l, i, j] = count * (-1) ** l
    return (torch.tensor(rows, dtype=torch.float64, device=device),
            multinomial.reshape(2 * beta + 1, -1).to(device))


def _powers(x: Tensor, top: int) -> Tensor:
    """``x^0 .. x^top`` stacked on a new last dimension (a cumulative product, exact signs)."""
    ones = torch.ones_like(x).unsqueeze(-1)
    if top == 0:
        return ones
    return torch.cat([ones, x.unsqueeze(-1).expand(*x.shape, top)], -1).cumprod(-1)


def _closed_form(diff: Tensor, a: Tensor, s: Tensor, beta: int, grads: bool) -> tuple[Tensor, ...]:
    """Moment expansion; diff = b - mu (..., N), a (..., 1), s (N,). Returns r[, dr/dmu, dr/da]."""
    degree = 2 * beta + 1                                    # number of coefficients of q
    n_moments = degree + (2 if grads else 0)
    recursion, multinomial = _constants(beta, n_moments, diff.device)
    lo = (-a - diff) / s
    hi = (a - diff) / s
    ends = torch.stack([lo, hi], -1)                                        # (..., N, 2)
    phi = torch.exp(-0.5 * ends * ends) * _INV_SQRT_2PI
    boundary = _powers(ends, n_moments - 2) * phi.unsqueeze(-1)             # (..., N, 2, K-1)
    first = torch.cat([_normal_interval_mass(lo, hi).unsqueeze(-1), boundary[..., 0, :] - boundary[..., 1, :]], -1)
    moments = first @ recursion.T                                           # (..., N, K)
    mono = _powers(-(lo * hi), beta).unsqueeze(-1) * _powers(lo + hi, beta).unsqueeze(-2)
    q = mono.flatten(-2) @ multinomial.T                                    # (..., N, degree)
    sums = (moments.unfold(-1, degree, 1) * q.unsqueeze(-2)).sum(-1)       # (..., N, 1 or 3)
    weight = (s / a) ** (2 * beta) / (unit_mass(beta) * a)
    r = weight * sums[..., 0]
    if not grads:
        return (r,)
    m1, m2 = sums[..., 1], sums[..., 2]
    return r, -weight * m1 / s, -weight * (diff / s * m1 + m2) / a


def _quadrature(mu: Tensor, a: Tensor, basis_mu: Tensor, s: Tensor, beta: int,
                grads: bool) -> tuple[Tensor, ...]:
    """Gauss-Legendre over the support; mu, a (..., 1); basis (N,). Returns r[, dr/dmu, dr/da].

    Runs in the dtype of ``mu`` (float32 is enough here: every term is positive or smooth).
    """
    nodes, weights = _legendre(_QUAD_NODES, mu.device)
    nodes, s = nodes.to(mu.dtype), s.to(mu.dtype).unsqueeze(-1)                      # (n,), (N, 1)
    scale = (weights * (1 - nodes * nodes) ** beta * (_INV_SQRT_2PI / unit_mass(beta))).to(mu.dtype) / s
    z = (mu.unsqueeze(-1) + a.unsqueeze(-1) * nodes) / s - basis_mu.to(mu.dtype).unsqueeze(-1) / s  # (..., N, n)
    g = torch.exp(-0.5 * (z * z)) * scale
    r = g.sum(-1)
    if not grads:
        return (r,)
    with own_precision(z):  # in mu's dtype: autocast would lower the product
        moments = (z * g) @ torch.stack([torch.ones_like(nodes), nodes], -1)         # (..., N, 2)
    return r, -moments[..., 0] / s.squeeze(-1), -moments[..., 1] / s.squeeze(-1)


def _expectations(mu: Tensor, a: Tensor, basis_mu: Tensor, s: Tensor, beta: int, grads: bool,
                  quad_dtype: torch.dtype = torch.float64) -> tuple[Tensor, ...]:
    """r (..., N) and, if ``grads``, dr/dmu and dr/da; inputs float64 (quadrature in ``quad_dtype``)."""
    mu, a = mu.unsqueeze(-1), a.unsqueeze(-1)
    diff = basis_mu - mu
    if beta == 0:
        var = a * a + s * s
        r = torch.exp(-0.5 * diff * diff / var) * _INV_SQRT_2PI / var.sqrt()
        if not grads:
            return (r,)
        return r, r * diff / var, r * (diff * diff / var - 1) * a / var
    closed = _closed_form(diff, a, s, beta, grads)
    quad = _quadrature(mu.to(quad_dtype), a.to(quad_dtype), basis_mu, s, beta, grads)
    wide = s > a
    return tuple(torch.where(wide, qv.to(cv.dtype), cv) for qv, cv in zip(quad, closed))


class _RBFExpectations(torch.autograd.Function):
    """r = E_p[g] with the exact derivatives computed in the forward pass."""

    @staticmethod
    def forward(ctx, mu: Tensor, scale: Tensor, basis_mu: Tensor, basis_sigma: Tensor,  # type: ignore[override]
                beta: int) -> Tensor:
        grads = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        out_dtype = torch.promote_types(mu.dtype, scale.dtype)
        quad_dtype = torch.float64 if out_dtype == torch.float64 else torch.float32
        out = _expectations(mu.double(), scale.double(), basis_mu.double(), basis_sigma.double(), beta, grads,
                            quad_dtype)
        if grads:
            ctx.save_for_backward(out[1], out[2])
        ctx.dtypes = (mu.dtype, scale.dtype)
        return out[0].to(out_dtype)

    @staticmethod
    def backward(ctx, grad_r: Tensor):  # type: ignore[override]
        d_mu, d_a = ctx.saved_tensors
        grad_r = grad_r.double()
        grad_mu = (grad_r * d_mu).sum(-1).to(ctx.dtypes[0]) if ctx.needs_input_grad[0] else None
        grad_a = (grad_r * d_a).sum(-1).to(ctx.dtypes[1]) if ctx.needs_input_grad[1] else None
        return grad_mu, grad_a, None, None, None


def rbf_expectations_scaled(mu: Tensor, scale: Tensor, basis_mu: Tensor, basis_sigma: Tensor,
                            beta: int) -> Tensor:
    """``E_p[N(t; basis_mu, basis_sigma^2)]`` for the density of location mu and scale a.

    mu, scale: (...,) same shape; basis (N,); returns (..., N). beta = 0 is the Gaussian
    (scale = sigma), beta >= 1 the density ``(a^2 - (t - mu)^2)_+^beta`` (scale = half-width).
    Differentiable w.r.t. mu and scale (the basis is treated as constant).
    """
    if mu.shape != scale.shape:
        mu, scale = torch.broadcast_tensors(mu, scale)
    return _RBFExpectations.apply(mu, scale, basis_mu, basis_sigma, beta)
