"""Continuous entmax densities, RBF expectations and ridge value functions.

Independent truth: the density is rebuilt in the tests from its definition
``p = [(alpha - 1) f - tau]_+^(1 / (alpha - 1))`` with ``tau`` found by root finding on
``int p = 1`` (scipy.integrate.quad + brentq), and every expectation is a scipy quadrature.
"""
from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import pytest
import torch
from scipy import integrate, optimize

from nmt.sparse.continuous import (
    ALPHAS, RidgeValueCache, alpha_to_beta, default_basis, density, gaussian_rbf, normalizer,
    rbf_expectations, ridge_value_matrix, scale_from_sigma_sq, sigma_sq_from_scale, sigma_sq_from_variance,
    source_positions, support, variance,
)

ALPHA_IDS = ["gauss", "triweight", "biweight", "parabola"]
F64 = torch.float64


def t64(x) -> torch.Tensor:
    return torch.as_tensor(x, dtype=F64)


@lru_cache(maxsize=None)
def reference_density(mu: float, sigma_sq: float, alpha: float):
    """(p(t) as a Python function, support interval) from the definition, by root finding."""
    f = lambda t: -(t - mu) ** 2 / (2 * sigma_sq)  # noqa: E731
    if alpha == 1.0:
        z = integrate.quad(lambda t: math.exp(f(t)), -math.inf, math.inf, points=None)[0]
        sd = math.sqrt(sigma_sq)
        return (lambda t: math.exp(f(t)) / z), (mu - 40 * sd, mu + 40 * sd)
    e = 1.0 / (alpha - 1.0)

    def mass(tau: float) -> float:
        half = math.sqrt(-2 * sigma_sq * tau / (alpha - 1))
        return integrate.quad(lambda t: max((alpha - 1) * f(t) - tau, 0.0) ** e, mu - half, mu + half,
                              epsabs=1e-15, epsrel=1e-13, limit=200)[0] - 1.0

    near, far = -1e-12, -1e-12          # tau < 0; the mass grows as tau decreases
    while mass(far) < 0:
        far *= 10
    tau = optimize.brentq(mass, far, near, xtol=1e-300, rtol=1e-15, maxiter=500)
    half = math.sqrt(-2 * sigma_sq * tau / (alpha - 1))
    return (lambda t: max((alpha - 1) * f(t) - tau, 0.0) ** e), (mu - half, mu + half)


def reference_expectation(mu: float, sigma_sq: float, alpha: float, g) -> float:
    p, (lo, hi) = reference_density(mu, sigma_sq, alpha)
    pts = [x for x in (mu,) if lo < x < hi]
    return integrate.quad(lambda t: p(t) * g(t), lo, hi, points=pts, limit=400, epsabs=1e-13, epsrel=1e-12)[0]


def normal_pdf(t: float, b: float, s: float) -> float:
    return math.exp(-0.5 * ((t - b) / s) ** 2) / (s * math.sqrt(2 * math.pi))


# ---------------------------------------------------------------- densities
@pytest.mark.parametrize("alpha", ALPHAS, ids=ALPHA_IDS)
@pytest.mark.parametrize("mu,sigma_sq", [(0.3, 1e-4), (1.4, 0.02), (-0.5, 0.5)])
def test_density_normalised_support_and_normaliser(alpha: float, mu: float, sigma_sq: float) -> None:
    _, (ref_lo, ref_hi) = reference_density(mu, sigma_sq, alpha)
    lo, hi = support(t64(mu), t64(sigma_sq), alpha)
    p = lambda t: density(t64(t), t64(mu), t64(sigma_sq), alpha).item()  # noqa: E731
    if alpha == 1.0:
        assert math.isinf(lo.item()) and math.isinf(hi.item())
        sd = math.sqrt(sigma_sq)
        lo_q, hi_q = mu - 40 * sd, mu + 40 * sd
        assert normalizer(t64(sigma_sq), alpha).item() == pytest.approx(0.5 * math.log(2 * math.pi * sigma_sq))
    else:
        # closed-form support = the interval where the root-found density is positive
        assert lo.item() == pytest.approx(ref_lo, rel=1e-9, abs=1e-12)
        assert hi.item() == pytest.approx(ref_hi, rel=1e-9, abs=1e-12)
        width = hi.item() - lo.item()
        assert p(lo.item() - 1e-9 * width) == 0.0 and p(hi.item() + 1e-9 * width) == 0.0
        assert p(lo.item() + 1e-3 * width) > 0.0 and p(hi.item() - 1e-3 * width) > 0.0
        lo_q, hi_q = lo.item(), hi.item()
        # normaliser: tau with p = [(alpha - 1) f - tau]_+^(1 / (alpha - 1)) has p(mu) = (-tau)^beta
        tau = normalizer(t64(sigma_sq), alpha).item()
        assert p(mu) == pytest.approx((-tau) ** (1 / (alpha - 1)), rel=1e-10)
    total = integrate.quad(p, lo_q, hi_q, points=[mu], epsabs=0, epsrel=1e-12, limit=200)[0]
    assert total == pytest.approx(1.0, abs=1e-9)
    var = integrate.quad(lambda t: (t - mu) ** 2 * p(t), lo_q, hi_q, points=[mu], epsrel=1e-12, limit=200)[0]
    assert variance(t64(sigma_sq), alpha).item() == pytest.approx(var, rel=1e-8)


@pytest.mark.parametrize("alpha", ALPHAS, ids=ALPHA_IDS)
def test_moment_matching_gives_the_requested_variance(alpha: float) -> None:
    target = t64([1e-6, 3e-4, 0.01, 0.09, 2.0])
    sigma_sq = sigma_sq_from_variance(target, alpha)
    assert torch.allclose(variance(sigma_sq, alpha), target, rtol=1e-12)
    for v, s2 in zip(target[1:4].tolist(), sigma_sq[1:4].tolist()):     # against quadrature
        p, (lo, hi) = reference_density(0.5, s2, alpha)
        var = integrate.quad(lambda t: (t - 0.5) ** 2 * p(t), lo, hi, points=[0.5], epsrel=1e-12)[0]
        assert var == pytest.approx(v, rel=1e-8)
    if alpha == 2.0:   # the closed form sigma_sq = 2/3 (5 var)^(3/2)
        assert torch.allclose(sigma_sq, 2 / 3 * (5 * target) ** 1.5, rtol=1e-12)


# ---------------------------------------------------------------- RBF expectations
BASIS_MU = [-0.2, 0.0, 0.35, 1.0]
BASIS_SIGMA = [0.03, 0.1, 0.3]


@pytest.mark.parametrize("alpha", ALPHAS, ids=ALPHA_IDS)
@pytest.mark.parametrize("sigma_sq", [1e-4, 3e-3, 0.05])
def test_rbf_expectations_match_quadrature(alpha: float, sigma_sq: float) -> None:
    mus = [-0.4, 0.02, 0.5, 1.3]                         # means outside [0, 1] included
    bm, bs = np.meshgrid(BASIS_MU, BASIS_SIGMA, indexing="ij")
    bm, bs = bm.ravel(), bs.ravel()
    r = rbf_expectations(t64(mus), t64([sigma_sq] * len(mus)), t64(bm), t64(bs), alpha)
    assert r.shape == (len(mus), len(bm)) and r.dtype == F64
    for i, mu in enumerate(mus):
        for j, (b, s) in enumerate(zip(bm, bs)):
            ref = reference_expectation(mu, sigma_sq, alpha, lambda t: normal_pdf(t, b, s))
            assert abs(r[i, j].item() - ref) < 1e-6 * max(1.0, abs(ref)), (mu, b, s, r[i, j].item(), ref)


@pytest.mark.parametrize("alpha", ALPHAS[1:], ids=ALPHA_IDS[1:])
def test_rbf_expectations_both_regimes_agree_with_quadrature_to_1e10(alpha: float) -> None:
    """Basis widths straddling the support half-width a (closed form below, Gauss rule above)."""
    rng = np.random.default_rng(1)
    a = 10 ** rng.uniform(-2.5, -0.5, 40)
    s = a * 10 ** rng.uniform(-0.4, 0.4, 40)
    mu, b = rng.uniform(-0.5, 1.5, 40), rng.uniform(0, 1, 40)
    sigma_sq = sigma_sq_from_scale(t64(a), alpha)
    assert torch.allclose(scale_from_sigma_sq(sigma_sq, alpha), t64(a), rtol=1e-12)
    for i in range(40):
        r = rbf_expectations(t64(mu[i]), sigma_sq[i], t64([b[i]]), t64([s[i]]), alpha).item()
        ref = reference_expectation(mu[i], sigma_sq[i].item(), alpha, lambda t: normal_pdf(t, b[i], s[i]))
        assert abs(r - ref) < 1e-10 * max(1.0, abs(ref)), (a[i], s[i], mu[i], b[i], r, ref)


@pytest.mark.parametrize("alpha", ALPHAS, ids=ALPHA_IDS)
def test_rbf_expectations_gradcheck(alpha: float) -> None:
    """Hand-computed derivatives vs finite differences, both regimes (narrow and wide basis)."""
    mu = t64([-0.3, 0.1, 0.45, 0.9, 1.2]).requires_grad_()
    sigma_sq = t64([1e-4, 2e-3, 0.01, 0.05, 0.2]).requires_grad_()
    basis_mu, basis_sigma = default_basis(4, (0.01, 0.1, 0.5))
    fn = lambda m, s2: rbf_expectations(m, s2, basis_mu, basis_sigma, alpha)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (mu, sigma_sq), eps=1e-7, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("alpha", [1.0, 2.0], ids=["gauss", "parabola"])
def test_mu_gradient_is_the_expected_basis_derivative(alpha: float) -> None:
    """d/dmu E_p[psi] = E_p[psi'] (location family), by quadrature of psi'."""
    mu, sigma_sq, b, s = 0.37, 0.004, 0.4, 0.1
    m, v = t64(mu).requires_grad_(), t64(sigma_sq)
    rbf_expectations(m, v, t64([b]), t64([s]), alpha).sum().backward()
    ref = reference_expectation(mu, sigma_sq, alpha, lambda t: -(t - b) / s ** 2 * normal_pdf(t, b, s))
    assert m.grad.item() == pytest.approx(ref, rel=1e-8)


@pytest.mark.parametrize("alpha", ALPHAS, ids=ALPHA_IDS)
def test_gradients_match_generalised_covariance(alpha: float) -> None:
    """Prop. 3 of Martins et al. 2020: grad_theta E_p[psi] = cov_{p, 2 - alpha}(phi, psi) with
    phi(t) = (t, t^2), theta = (mu / sigma_sq, -1 / (2 sigma_sq)); chained to (mu, sigma_sq)."""
    mu, sigma_sq, b, s = 0.62, 0.006, 0.55, 0.1
    p, (lo, hi) = reference_density(mu, sigma_sq, alpha)
    psi = lambda t: normal_pdf(t, b, s)  # noqa: E731

    def escort(g) -> float:            # int p^(2 - alpha) g
        return integrate.quad(lambda t: p(t) ** (2 - alpha) * g(t) if p(t) > 0 else 0.0, lo, hi, points=[mu],
                              limit=400, epsabs=1e-14, epsrel=1e-12)[0]

    norm = escort(lambda t: 1.0)
    cov = [escort(lambda t, k=k: t ** k * psi(t)) - escort(lambda t, k=k: t ** k) * escort(psi) / norm
           for k in (1, 2)]
    grad_mu = cov[0] / sigma_sq
    grad_sigma_sq = -mu / sigma_sq ** 2 * cov[0] + cov[1] / (2 * sigma_sq ** 2)
    m, v = t64(mu).requires_grad_(), t64(sigma_sq).requires_grad_()
    rbf_expectations(m, v, t64([b]), t64([s]), alpha).sum().backward()
    assert m.grad.item() == pytest.approx(grad_mu, rel=1e-7)
    assert v.grad.item() == pytest.approx(grad_sigma_sq, rel=1e-7)


def test_rbf_expectations_dtypes_and_broadcasting() -> None:
    basis_mu, basis_sigma = default_basis()
    mu = torch.rand(2, 3)
    r32 = rbf_expectations(mu, torch.tensor(0.01), basis_mu, basis_sigma, 2.0)
    assert r32.shape == (2, 3, 30) and r32.dtype == torch.float32
    r16 = rbf_expectations(mu.half(), torch.tensor(0.01, dtype=torch.half), basis_mu, basis_sigma, 2.0)
    assert r16.dtype == torch.half                        # computed in float64, rounded once at the end
    r_ref = rbf_expectations(mu.half().double(), torch.tensor(0.01, dtype=torch.half).double(), basis_mu,
                             basis_sigma, 2.0)
    assert torch.equal(r16, r_ref.half())
    assert torch.isfinite(r32).all() and (r32 >= 0).all()


# ---------------------------------------------------------------- validation
@pytest.mark.parametrize("alpha,beta", [(1, 0), (1.0, 0), (4 / 3, 3), (1.333, 3), ("4/3", 3), (1.5, 2), ("3/2", 2),
                                        (2, 1)])
def test_alpha_accepted(alpha, beta: int) -> None:
    assert alpha_to_beta(alpha) == beta


@pytest.mark.parametrize("alpha", [1.2, 3.0, 0.5, "two", None, "1/0"])
def test_alpha_rejected_with_key(alpha) -> None:
    with pytest.raises(ValueError, match=r"^model\.attention\.continuous\.alpha: "):
        alpha_to_beta(alpha, key="model.attention.continuous.alpha")


# ---------------------------------------------------------------- ridge value function
def test_source_positions() -> None:
    pos = source_positions(torch.tensor([4, 1, 2]), 4)
    assert torch.equal(pos, torch.tensor([[0.25, 0.5, 0.75, 1.0], [1.0, 0, 0, 0], [0.5, 1.0, 0, 0]]))


def test_gaussian_rbf_values() -> None:
    t = torch.tensor([0.0, 0.5])
    out = gaussian_rbf(t, torch.tensor([0.0, 1.0]), torch.tensor([0.1, 0.5]))
    expected = [[normal_pdf(x, b, s) for b, s in ((0.0, 0.1), (1.0, 0.5))] for x in (0.0, 0.5)]
    assert torch.allclose(out, torch.tensor(expected), rtol=1e-6)


@pytest.mark.parametrize("length", [1, 5, 40])
def test_ridge_value_matrix_solves_the_ridge_problem(length: int) -> None:
    """B = H G minimises ||B F - H||^2 + lam ||B||^2: its gradient (B F - H) F^T + lam B is 0."""
    basis_mu, basis_sigma = default_basis()
    lam = 0.01
    G = ridge_value_matrix(length, basis_mu, basis_sigma, lam).numpy()
    assert G.shape == (length, 30)
    t = np.arange(1, length + 1) / length
    F = np.array([[normal_pdf(x, b, s) for x in t] for b, s in zip(basis_mu.tolist(), basis_sigma.tolist())])
    H = np.random.default_rng(0).normal(size=(3, length))
    B = H @ G
    grad = (B @ F - H) @ F.T + lam * B
    assert np.abs(grad).max() < 1e-8 * max(1.0, np.abs(H @ F.T).max())


def test_ridge_value_cache_gathers_each_length_and_grows() -> None:
    basis_mu, basis_sigma = default_basis(5, (0.1, 0.3))
    cache = RidgeValueCache(basis_mu, basis_sigma, ridge=0.1, granularity=4)
    lengths = torch.tensor([3, 1, 2])
    got = cache.gather(lengths, 3, F64)
    assert got.shape == (3, 3, 10) and cache.stack(3, torch.device("cpu"), F64).shape[0] == 4
    for i, n in enumerate(lengths.tolist()):
        assert torch.allclose(got[i, :n], ridge_value_matrix(n, basis_mu, basis_sigma, 0.1), atol=1e-12)
        assert (got[i, n:] == 0).all()
    grown = cache.gather(torch.tensor([9, 2]), 9, F64)           # growth keeps earlier lengths
    assert cache.stack(9, torch.device("cpu"), F64).shape[0] == 12
    assert torch.allclose(grown[0], ridge_value_matrix(9, basis_mu, basis_sigma, 0.1), atol=1e-12)
    assert torch.allclose(grown[1, :2], got[2, :2], atol=1e-12) and (grown[1, 2:] == 0).all()
    assert cache.gather(lengths, 3, torch.float32).dtype == torch.float32
