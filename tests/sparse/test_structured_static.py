"""The sync-free path of fusedmax / oscarmax (impl="static", the default on accelerators):
same values and gradients as the CPU path (active set, itself checked against independent
solvers in test_structured.py), no host synchronisation, fullgraph compile."""
from __future__ import annotations

import math

import pytest
import torch

from nmt.sparse._taut_string import taut_string
from nmt.sparse.structured import fusedmax, oscarmax, oscarmax_exact
from nmt.utils.sync_audit import SyncAudit

MAPS = [fusedmax, oscarmax, oscarmax_exact]


def _rows(seed: int, batch: int, n: int, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, n, generator=g, dtype=dtype) * 2
    lengths = torch.randint(0, n + 1, (batch,), generator=g)
    lengths[0] = n
    return x, lengths


@pytest.mark.parametrize("walls", [(0.3, 0.3), (0.0, math.inf), (0.1, 0.7)])
@pytest.mark.parametrize("n", [1, 7, 40])
def test_static_taut_string_equals_active_set(walls, n):
    """The funnel scan on every row gives the active set's slopes and segments (random rows of
    random lengths, and rows of ties)."""
    x, lengths = _rows(n, 32, n)
    x[1] = 1.0  # one long tie
    x[2] = x[2].round()  # ties here and there
    y0, g0 = taut_string(x, lengths, *walls)
    y1, g1 = taut_string(x, lengths, *walls, static=True)
    assert torch.allclose(y0, y1, atol=1e-12)
    assert torch.equal(g0[3:], g1[3:])  # random rows: the same segments
    valid = torch.arange(n) < lengths[:, None]  # tied rows: equal slopes within every segment
    assert torch.allclose(torch.where(valid, y1.gather(1, g1.clamp(max=n - 1)), 0), y1, atol=1e-12)
    with SyncAudit() as audit:
        taut_string(x, lengths, *walls, static=True)
    assert audit.total == 0, audit.report()


@pytest.mark.parametrize("fn", MAPS)
@pytest.mark.parametrize("n", [6, 50, 200])
def test_static_equals_pruned_values_and_gradients(fn, n):
    """Masked positions (not a prefix), an all-masked row, lam = 0 and lam > 0, float32/64."""
    for dtype in (torch.float64, torch.float32):
        x, _ = _rows(n + 1, 10, n, dtype)
        mask = torch.rand(10, n, generator=torch.Generator().manual_seed(n)) > 0.3
        mask[0] = True
        mask[3] = False  # nothing kept
        g = torch.randn(10, n, dtype=dtype)
        for lam in (0.0, 0.2):
            out = []
            for impl in ("pruned", "static"):
                xi = x.clone().requires_grad_()
                p = fn(xi, lam=lam, mask=mask, impl=impl)
                (p * g).sum().backward()
                out.append((p.detach(), xi.grad))
            (p0, g0), (p1, g1) = out
            atol = 1e-12 if dtype == torch.float64 else 1e-5
            assert torch.allclose(p0, p1, atol=atol), (lam, (p0 - p1).abs().max())
            assert torch.equal(p0 == 0, p1 == 0) or dtype == torch.float32
            assert torch.allclose(g0, g1, atol=atol * 10)
            assert not p1[3].any() and not g1[3].any() and not p1[~mask].any()


@pytest.mark.parametrize("fn", MAPS)
def test_static_never_synchronises(fn):
    for n in (9, 200):
        x = torch.randn(6, n, requires_grad=True)
        mask = torch.rand(6, n) > 0.25
        for lam in (0.0, 0.3):
            with SyncAudit() as audit:
                (fn(x, lam=lam, mask=mask, impl="static") * torch.randn(6, n)).sum().backward()
            assert audit.total == 0, (n, lam, audit.report())


def _fullgraph_compile_matches_eager(fn, **kwargs):
    """``fn`` (with ``kwargs``) compiled with ``fullgraph=True`` gives eager's value and gradient."""
    x = torch.randn(4, 12, dtype=torch.float64)
    mask = torch.rand(4, 12) > 0.3
    g = torch.randn(4, 12, dtype=torch.float64)

    def run(s):
        return (fn(s, lam=0.2, mask=mask, **kwargs) * g).sum()

    compiled = torch.compile(run, fullgraph=True, dynamic=False, backend="aot_eager")
    xc, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    lc, le = compiled(xc), run(xe)
    lc.backward()
    le.backward()
    assert torch.allclose(lc, le) and torch.allclose(xc.grad, xe.grad)


@pytest.mark.parametrize("fn", MAPS)
def test_static_fullgraph_compile_matches_eager(fn):
    _fullgraph_compile_matches_eager(fn, impl="static")


def test_unknown_impl_is_refused():
    with pytest.raises(ValueError, match="impl"):
        fusedmax(torch.randn(2, 3), impl="fast")


def test_continuous_expectations_and_cached_values_never_synchronise():
    """Continuous attention's per-step work: RBF expectations (forward and backward, every
    alpha) and the ridge value matrices of a batch once the cache covers its length."""
    from nmt.sparse import continuous as C

    mu = torch.rand(6, requires_grad=True)
    sigma_sq = (torch.rand(6) * 0.1 + 0.01).requires_grad_()
    basis_mu, basis_sigma = C.default_basis()
    cache = C.RidgeValueCache(basis_mu, basis_sigma, 0.1)
    lengths = torch.tensor([3, 7, 5])
    cache.gather(lengths, 7, torch.float32)  # grows the cache: once
    for alpha in C.ALPHAS:
        with SyncAudit() as audit:
            C.rbf_expectations(mu, sigma_sq, basis_mu, basis_sigma, alpha).sum().backward()
            cache.gather(lengths, 7, torch.float32)
        assert audit.total == 0, (alpha, audit.report())


@pytest.mark.parametrize("fn", MAPS)
def test_auto_on_cpu_compiles_fullgraph(fn):
    """``impl="auto"`` on the CPU takes the static path while torch.compile traces (the pruned
    path's host reads, ``torch.equal`` first, cannot be traced: fullgraph raised), as the other
    mappings' ``"auto"`` traces."""
    _fullgraph_compile_matches_eager(fn)
