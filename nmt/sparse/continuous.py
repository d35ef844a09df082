"""1-d continuous entmax densities, Gaussian RBF expectations and ridge value functions.

Martins et al. 2020 ("Sparse and Continuous Attention Mechanisms") and 2022 ("Sparse
Continuous Distributions and Fenchel-Young Losses"). For the quadratic score
``f(t) = -(t - mu)^2 / (2 sigma_sq)`` the continuous alpha-entmax density is

    p(t) = [(alpha - 1) f(t) - tau]_+ ^ (1 / (alpha - 1))        (alpha > 1)
    p(t) = exp(f(t) - A),  A = log sqrt(2 pi sigma_sq)           (alpha = 1)

With ``beta = 1 / (alpha - 1)`` (3 triweight, 2 biweight, 1 truncated parabola) the
density is ``p(t) = (a^2 - (t - mu)^2)_+^beta / (K_beta a^(2 beta + 1))`` on
``[mu - a, mu + a]``, with ``K_beta = int_{-1}^{1} (1 - u^2)^beta du`` and half-width
``a = ((2 beta sigma_sq)^beta / K_beta)^(1 / (2 beta + 1))``; its variance is
``a^2 / (2 beta + 3)``. Every density here is a location-scale family
``p(t) = p_1((t - mu) / a) / a`` with *scale* ``a`` (``a = sigma`` for the Gaussian), which
is what the kernels work with.

Value functions: Gaussian RBFs ``psi_j(t) = N(t; basis_mu[j], basis_sigma[j]^2)``; a
sequence of L vectors ``H = (h_1 .. h_L)`` at positions ``t_l = l / L`` is approximated
by ``V(t) = B psi(t)`` with the ridge solution ``B = H G``,
``G = F^T (F F^T + lambda I)^{-1}``, ``F[j, l] = psi_j(t_l)``. The continuous context is
``B E_p[psi] = H (G r)``.

Host synchronisation: none in :func:`rbf_expectations` (forward and backward: closed forms and
a fixed quadrature, branch choices by ``torch.where``) nor in :meth:`RidgeValueCache.gather` once
the cache covers the batch's padded length (one ``index_select``); tests count 0 calls. Growing
the cache (the first time a longer padded length is seen, rounded up to 32 lengths) copies the
basis to the device and solves the ridge systems there: a one-time cost per 32 lengths, not per step.
"""
from __future__ import annotations

import math
from fractions import Fraction

import torch
from torch import Tensor

from nmt.sparse._continuous_kernels import rbf_expectations_scaled, unit_mass as _unit_mass

ALPHAS: tuple[float, ...] = (1.0, 4.0 / 3.0, 1.5, 2.0)
"""The alphas with closed forms: Gaussian, triweight, biweight, truncated parabola."""

_ALPHA_NAMES = "1, 4/3, 3/2, 2"


def alpha_to_beta(alpha: float | int | str, key: str = "alpha") -> int:
    """Validate ``alpha`` and return ``beta = 1 / (alpha - 1)`` (0 stands for the Gaussian).

    Accepts the numbers 1, 4/3, 3/2, 2 (within 1e-3, so ``1.333`` in a YAML file works)
    or strings such as ``"4/3"``. Anything else: ValueError naming ``key``.
    """
    value: float
    try:
        value = float(Fraction(alpha)) if isinstance(alpha, str) else float(alpha)
    except (TypeError, ValueError, ZeroDivisionError):
        raise ValueError(f"{key}: expected one of {_ALPHA_NAMES}, got {alpha!r}") from None
    for beta, candidate in zip((0, 3, 2, 1), ALPHAS):
        if abs(value - candidate) < 1e-3:
            return beta
    raise ValueError(f"{key}: continuous entmax has closed forms only for alpha in {{{_ALPHA_NAMES}}}, got {alpha!r}")


def _unit_variance(beta: int) -> float:
    """Variance of the scale-1 density: 1 (Gaussian) or ``1 / (2 beta + 3)``."""
    return 1.0 if beta == 0 else 1.0 / (2 * beta + 3)


def scale_from_sigma_sq(sigma_sq: Tensor, alpha: float = 1.0) -> Tensor:
    """Scale ``a`` of the density: ``sqrt(sigma_sq)`` (alpha = 1) or the support half-width."""
    beta = alpha_to_beta(alpha)
    if beta == 0:
        return sigma_sq.sqrt()
    return ((2 * beta * sigma_sq) ** beta / _unit_mass(beta)) ** (1.0 / (2 * beta + 1))


def sigma_sq_from_scale(scale: Tensor, alpha: float = 1.0) -> Tensor:
    """Inverse of :func:`scale_from_sigma_sq`: ``sigma_sq = (K a^(2 beta + 1))^(1 / beta) / (2 beta)``."""
    beta = alpha_to_beta(alpha)
    if beta == 0:
        return scale * scale
    return (_unit_mass(beta) * scale ** (2 * beta + 1)) ** (1.0 / beta) / (2 * beta)


def variance(sigma_sq: Tensor, alpha: float = 1.0) -> Tensor:
    """Exact variance of the alpha-entmax density with parameter ``sigma_sq`` (same shape)."""
    beta = alpha_to_beta(alpha)
    return scale_from_sigma_sq(sigma_sq, alpha) ** 2 * _unit_variance(beta)


def scale_from_variance(var: Tensor, alpha: float = 1.0) -> Tensor:
    """Scale ``a`` of the alpha-entmax density whose variance is ``var`` (moment matching)."""
    beta = alpha_to_beta(alpha)
    return (var / _unit_variance(beta)).sqrt()


def sigma_sq_from_variance(var: Tensor, alpha: float = 1.0) -> Tensor:
    """``sigma_sq`` whose alpha-entmax density has variance exactly ``var`` (JMLR 2022, Prop. 17).

    alpha = 1: ``sigma_sq = var``; otherwise ``a = sqrt((2 beta + 3) var)`` and
    ``sigma_sq = (K_beta a^(2 beta + 1))^(1 / beta) / (2 beta)``; e.g. alpha = 2 gives
    ``sigma_sq = (2 / 3) (5 var)^(3 / 2)``.
    """
    return sigma_sq_from_scale(scale_from_variance(var, alpha), alpha)


def support(mu: Tensor, sigma_sq: Tensor, alpha: float = 1.0) -> tuple[Tensor, Tensor]:
    """Closed-form support ``[mu - a, mu + a]`` (alpha > 1) or ``(-inf, inf)`` (alpha = 1)."""
    mu, sigma_sq = torch.broadcast_tensors(mu, sigma_sq)
    if alpha_to_beta(alpha) == 0:
        inf = torch.full_like(mu, math.inf)
        return -inf, inf
    a = scale_from_sigma_sq(sigma_sq, alpha)
    return mu - a, mu + a


def normalizer(sigma_sq: Tensor, alpha: float = 1.0) -> Tensor:
    """The constant making ``p`` a density: log-partition ``A`` (alpha = 1) or threshold ``tau``.

    alpha = 1: ``A = log sqrt(2 pi sigma_sq)``, ``p = exp(f - A)``; alpha > 1:
    ``tau = -a^2 / (2 beta sigma_sq)``, ``p = [(alpha - 1) f - tau]_+^beta``.
    """
    beta = alpha_to_beta(alpha)
    if beta == 0:
        return 0.5 * torch.log(2 * math.pi * sigma_sq)
    a = scale_from_sigma_sq(sigma_sq, alpha)
    return -(a * a) / (2 * beta * sigma_sq)


def density(t: Tensor, mu: Tensor, sigma_sq: Tensor, alpha: float = 1.0) -> Tensor:
    """Evaluate the alpha-entmax density of ``f(t) = -(t - mu)^2 / (2 sigma_sq)`` at ``t``.

    Shapes broadcast (e.g. t (..., M), mu and sigma_sq (..., 1)). Exact zeros outside the
    support when alpha > 1.
    """
    beta = alpha_to_beta(alpha)
    f = -((t - mu) ** 2) / (2 * sigma_sq)
    if beta == 0:
        return torch.exp(f - normalizer(sigma_sq, alpha))
    return torch.clamp(f / beta - normalizer(sigma_sq, alpha), min=0) ** beta


def gaussian_rbf(t: Tensor, basis_mu: Tensor, basis_sigma: Tensor) -> Tensor:
    """Basis functions ``psi_j(t) = N(t; basis_mu[j], basis_sigma[j]^2)``: t (...,) -> (..., N)."""
    z = (t.unsqueeze(-1) - basis_mu) / basis_sigma
    return torch.exp(-0.5 * z * z) / (basis_sigma * math.sqrt(2 * math.pi))


def default_basis(num_mu: int = 10, sigmas: tuple[float, ...] | list[float] = (0.03, 0.1, 0.3),
                  dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    """The 2020 paper's MT basis: every sigma paired with ``num_mu`` centres in [0, 1].

    Returns ``(basis_mu, basis_sigma)``, both (num_mu * len(sigmas),), sigma-major.
    """
    if num_mu < 1 or not sigmas or min(sigmas) <= 0:
        raise ValueError(f"basis: need num_mu >= 1 and positive sigmas, got {num_mu}, {list(sigmas)}")
    centres = torch.linspace(0.0, 1.0, num_mu, dtype=dtype) if num_mu > 1 else torch.full((1,), 0.5, dtype=dtype)
    sig = torch.tensor([float(s) for s in sigmas], dtype=dtype)
    return centres.repeat(len(sigmas)), sig.repeat_interleave(num_mu)


def rbf_expectations(mu: Tensor, sigma_sq: Tensor, basis_mu: Tensor, basis_sigma: Tensor,
                     alpha: float = 1.0) -> Tensor:
    """``r[..., j] = E_p[N(t; basis_mu[j], basis_sigma[j]^2)]`` for the alpha-entmax density p.

    mu, sigma_sq: (...,) (broadcast); basis_mu, basis_sigma: (N,); returns r (..., N) in
    the promoted dtype of mu and sigma_sq (computed in float64 internally).
    Exact closed forms: a Gaussian product for alpha = 1; for alpha = (beta + 1) / beta a
    polynomial times a Gaussian, integrated with erf and truncated-normal moments. Where a
    basis function is wider than the support (basis_sigma > a) that expansion loses
    digits to cancellation, so a 12-node Gauss-Legendre rule over the support is used
    instead (the integrand is then smooth; error < 1e-11). Gradients w.r.t. mu and
    sigma_sq are exact (expectations of the basis derivative, computed in the same pass).
    """
    out_dtype = torch.promote_types(mu.dtype, sigma_sq.dtype)
    mu, sigma_sq = torch.broadcast_tensors(mu.double(), sigma_sq.double())
    scale = scale_from_sigma_sq(sigma_sq, alpha)
    return rbf_expectations_scaled(mu, scale, basis_mu, basis_sigma, alpha_to_beta(alpha)).to(out_dtype)


def source_positions(lengths: Tensor, max_len: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """Positions ``t_l = l / L_b`` (l = 1..L_b) of each sentence; 0 on padding.

    lengths: (B,) long; returns (B, max_len) in ``dtype``.
    """
    steps = torch.arange(1, max_len + 1, device=lengths.device, dtype=dtype)
    len_f = lengths.to(dtype).clamp(min=1).unsqueeze(-1)
    return torch.where(steps <= len_f, steps / len_f, torch.zeros((), device=lengths.device))


def ridge_value_matrices(lengths: Tensor, max_len: int, basis_mu: Tensor, basis_sigma: Tensor,
                         ridge: float) -> Tensor:
    """``G_L = F^T (F F^T + ridge I)^{-1}`` for each length, zero-padded: (K, max_len, N).

    lengths: (K,) long, each in [1, max_len]; rows ``l >= L`` of ``G_L`` are 0 (their
    columns of F are masked). Solved in float64; returned in float64.
    """
    basis_mu64, basis_sigma64 = basis_mu.double(), basis_sigma.double()
    positions = source_positions(lengths, max_len, torch.float64)                 # (K, L)
    valid = torch.arange(max_len, device=lengths.device) < lengths.unsqueeze(-1)
    F = gaussian_rbf(positions, basis_mu64, basis_sigma64) * valid.unsqueeze(-1)  # (K, L, N)
    F = F.transpose(1, 2)                                                    # (K, N, L)
    eye = torch.eye(F.shape[1], dtype=F.dtype, device=F.device)
    gram = F @ F.transpose(1, 2) + ridge * eye                               # (K, N, N)
    return torch.linalg.solve(gram, F).transpose(1, 2)                       # (K, L, N)


def ridge_value_matrix(length: int, basis_mu: Tensor, basis_sigma: Tensor, ridge: float) -> Tensor:
    """``G = F^T (F F^T + ridge I)^{-1}`` for one source length: (length, N), float64."""
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    lengths = torch.tensor([length], device=basis_mu.device)
    return ridge_value_matrices(lengths, length, basis_mu, basis_sigma, ridge)[0]


class RidgeValueCache:
    """Per-length cache of ``G`` as one padded stack ``(capacity, capacity, N)``.

    ``stack[L - 1, :L] = G_L`` and the rest is 0, so a batch with lengths ``(B,)`` gathers
    its matrices with one ``index_select`` (no host sync). The stack grows (rounded up to
    a multiple of 32 lengths) the first time a longer padded length is seen; only the
    new lengths are solved. Memory: ``capacity^2 * N`` numbers per (device, dtype).
    """

    def __init__(self, basis_mu: Tensor, basis_sigma: Tensor, ridge: float, granularity: int = 32) -> None:
        self.basis_mu = basis_mu.detach().double().cpu()
        self.basis_sigma = basis_sigma.detach().double().cpu()
        self.ridge = float(ridge)
        self.granularity = int(granularity)
        self._stacks: dict[tuple[torch.device, torch.dtype], Tensor] = {}

    def stack(self, max_len: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """The padded stack covering lengths ``1..capacity >= max_len``, on device/dtype."""
        key = (torch.device(device), dtype)
        current = self._stacks.get(key)
        if current is not None and current.shape[0] >= max_len:
            return current
        old = 0 if current is None else current.shape[0]
        capacity = -(-max_len // self.granularity) * self.granularity
        lengths = torch.arange(old + 1, capacity + 1, device=device)
        new = ridge_value_matrices(lengths, capacity, self.basis_mu.to(device), self.basis_sigma.to(device),
                                   self.ridge).to(dtype)
        if current is not None:
            grown = torch.zeros(old, capacity, new.shape[-1], device=device, dtype=dtype)
            grown[:, :old] = current
            new = torch.cat([grown, new], dim=0)
        self._stacks[key] = new
        return new

    def gather(self, lengths: Tensor, max_len: int, dtype: torch.dtype) -> Tensor:
        """``G`` of each sentence: lengths (B,) long in [1, max_len] -> (B, max_len, N)."""
        stack = self.stack(max_len, lengths.device, dtype)
        return stack[:, :max_len].index_select(0, lengths - 1)


__all__ = [
    "ALPHAS", "RidgeValueCache", "alpha_to_beta", "default_basis", "density", "gaussian_rbf", "normalizer",
    "rbf_expectations", "ridge_value_matrices", "ridge_value_matrix", "scale_from_sigma_sq",
    "scale_from_variance", "sigma_sq_from_scale", "sigma_sq_from_variance", "source_positions", "support",
    "variance",
]
