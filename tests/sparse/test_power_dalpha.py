"""alpha-entmax's derivative in alpha from the forward call (``power_probs(dalpha=True)``,
``nmt/sparse/_power_threshold.c``'s blocks): ``dp/dalpha`` checked against central finite
differences of a float64 bisection on every vector path, the backward that takes it
(``power_backward(s, g, 1.0, da=dp)``: no power, no logarithm) against the float64 formulas, and
the front door's learnable alpha taking both, with the torch formulas as its fallback."""
import pytest
import torch

from nmt.sparse import _native, entmax_bisect
from nmt.sparse import entmax as entmax_module
from tests.sparse.test_power_series_start import bisection

NEG_INF = float("-inf")
EPS = torch.finfo(torch.float32).eps


def float64_entmax(x: torch.Tensor, alphas: torch.Tensor) -> torch.Tensor:
    """alpha-entmax of the rows ``x`` (finite maxima) for ``alphas (R,)`` in float64, at the
    bisection's root: ``[(alpha - 1)(x - max) - tau]_+^(1 / (alpha - 1))``."""
    am1 = alphas.double()[:, None] - 1
    z = (x.double() - x.double().amax(dim=-1, keepdim=True)) * am1
    tau = bisection(z, 1 / am1[:, 0])
    return (z - tau[:, None]).clamp(min=0).pow(1 / am1)


def blocks(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """19 float32 rows of ``n`` entries (spreads 0.05 to 6, a -inf run, ties, a dominant entry, a
    NaN row, a row without a finite entry) and one alpha a row in (1.02, 1.98)."""
    g = torch.Generator().manual_seed(seed)
    rows = 19
    x = torch.randn(rows, n, generator=g) * torch.logspace(-1.3, 0.8, rows)[torch.randperm(rows, generator=g)][:, None]
    if n > 3:
        x[1, : n // 2] = NEG_INF
        x[2] = (x[2] * 4).round() / 4
        x[3, n // 3] += 8.0
    x[4, n // 2] = float("nan")
    x[5] = NEG_INF
    alphas = 1.02 + 0.96 * torch.rand(rows, generator=g, dtype=torch.float64)
    return x, alphas


@pytest.mark.parametrize("n", [1, 3, 20, 50, 256])
def test_dalpha_is_the_derivative_in_alpha(native_build, monkeypatch, n):
    """On every vector path, rows of at most 256 entries: dp/dalpha within float32's rounding of
    the central difference of the float64 mapping (h = 1e-6; as close as the float64 formula at the
    float32 output comes), 0 off the support, NaN on NaN rows,
    0 on rows without a finite entry; p and s as without it; and alpha's gradient from it by
    power_backward (s given: no power, no logarithm) equals <g, dp/dalpha> of the float64 mapping,
    its x-gradient J^T g of the float64 mapping. Longer rows are refused (None)."""
    monkeypatch.setitem(_native._state, "lib", native_build)
    x, alphas = blocks(n, seed=n)
    found = _native.power_probs(x, alphas - 1, 200, EPS, False, weights=True, dalpha=True)
    if native_build is None or found is None:
        assert found is None or native_build is None
        return
    p, _, s, dp = found
    plain = _native.power_probs(x, alphas - 1, 200, EPS, False, weights=True)
    assert torch.equal(p.nan_to_num(7.0), plain[0].nan_to_num(7.0))
    assert torch.equal(s.nan_to_num(7.0), plain[2].nan_to_num(7.0))
    assert bool(dp[4].isnan().all()) and torch.equal(dp[5], torch.zeros(n))
    ok = torch.ones(x.shape[0], dtype=torch.bool)
    ok[4] = ok[5] = False
    h = 1e-6
    want = (float64_entmax(x[ok], alphas[ok] + h) - float64_entmax(x[ok], alphas[ok] - h)) / (2 * h)
    scale = want.abs().amax(dim=-1, keepdim=True).clamp(min=1e-3)
    # (float32's p itself: the float64 formula at the float32 output is off by as much, 7.6e-6 of
    # a row's largest derivative at worst here)
    assert bool(((dp[ok].double() - want).abs() <= 1e-5 * scale).all()), ((dp[ok].double() - want).abs() / scale).max()
    assert bool((dp[ok][p[ok] == 0] == 0).all())
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(n + 1))
    gx, ga = _native.power_backward(s, g, 1.0, da=dp)
    assert bool(ga[4].isnan()) and float(ga[5]) == 0.0
    want_ga = (g[ok].double() * want).sum(dim=-1)
    assert torch.allclose(ga[ok].double(), want_ga, rtol=0, atol=4e-6 * float(scale.max())), \
        (ga[ok].double() - want_ga).abs().max()
    pd = float64_entmax(x[ok], alphas[ok])
    sd = torch.where(pd > 0, pd.pow(2 - alphas[ok][:, None]), 0.0)
    want_gx = sd * (g[ok].double() - (sd * g[ok].double()).sum(dim=-1, keepdim=True) / sd.sum(dim=-1, keepdim=True))
    assert torch.allclose(gx[ok].double(), want_gx, rtol=0, atol=1e-5)  # (the float32 output's: 5.8e-6 here)
    # the backward that takes p's powers and logarithms itself (long rows' path): the same
    gx2, ga2 = _native.power_backward(p, g, 1 - (alphas - 1), alphas - 1)
    assert torch.allclose(gx2[ok], gx[ok], rtol=0, atol=2e-6)
    assert torch.allclose(ga2[ok], ga[ok], rtol=0, atol=4e-6 * float(scale.max()))
    long_x = torch.randn(3, 300)
    assert _native.power_probs(long_x, 0.3, 200, EPS, False, weights=True, dalpha=True) is None
    assert _native.power_probs(long_x, 0.3, 200, EPS, False, weights=True) is not None


def test_a_learnable_alpha_takes_dalpha_from_the_forward(monkeypatch):
    """entmax_bisect with a learnable alpha per row (CPU float32): rows of at most 256 entries save
    s and dp/dalpha from the forward and the backward reads them (da given), longer rows keep p
    (the backward takes its powers and logarithms); a fixed tensor alpha saves s alone. The
    gradients equal the float64 torch path's, and equal the torch formulas' on the saved tensors
    where the native backward is unavailable."""
    if not _native.available():
        pytest.skip("native library not built")
    seen = []
    real = _native.power_backward
    monkeypatch.setattr(entmax_module, "power_backward",
                        lambda r, g, e, am1=None, da=None: seen.append((e, am1 is not None, da is not None))
                        or real(r, g, e, am1, da))
    gen = torch.Generator().manual_seed(5)
    for n, learn, want_call in ((40, True, (1.0, False, True)), (300, True, None), (40, False, (1.0, False, False))):
        x = torch.randn(3, 4, n, generator=gen) * 2
        alphas = (1.05 + 0.9 * torch.rand(3, 4, 1, generator=gen))
        grad = torch.randn(3, 4, n, generator=gen)
        xi, ai = x.clone().requires_grad_(), alphas.clone().requires_grad_(learn)
        seen.clear()
        torch.autograd.backward(entmax_bisect(xi, ai), grad)
        if want_call is not None:
            assert seen == [want_call], seen
        else:  # long rows with a learnable alpha: p, e = 2 - alpha, alpha - 1
            assert len(seen) == 1 and seen[0][1] and not seen[0][2], seen
        xd, ad = x.double().requires_grad_(), alphas.double().requires_grad_(learn)
        torch.autograd.backward(entmax_bisect(xd, ad), grad.double())
        assert torch.allclose(xi.grad.double(), xd.grad, rtol=0, atol=1e-6)
        if learn:
            assert torch.allclose(ai.grad.double(), ad.grad, rtol=0, atol=1e-5 * float(ad.grad.abs().max())), \
                (ai.grad.double() - ad.grad).abs().max()
        # the torch formulas on the saved s and dp/dalpha (the native backward unavailable)
        monkeypatch.setattr(entmax_module, "power_backward", lambda *a, **k: None)
        xt, at = x.clone().requires_grad_(), alphas.clone().requires_grad_(learn)
        torch.autograd.backward(entmax_bisect(xt, at), grad)
        assert torch.allclose(xt.grad, xi.grad, rtol=0, atol=1e-6)
        if learn:
            assert torch.allclose(at.grad, ai.grad, rtol=0, atol=1e-5 * float(ai.grad.abs().max()))
        monkeypatch.setattr(entmax_module, "power_backward",
                            lambda r, g, e, am1=None, da=None: seen.append((e, am1 is not None, da is not None))
                            or real(r, g, e, am1, da))
