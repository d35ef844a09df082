"""Hypothesis property tests: random shapes, dims, masks, ties, magnitudes, dtypes."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nmt.sparse import entmax15, entmax_bisect, log_probs_of, softmax, sparsemax
from nmt.sparse._threshold import SORT_MAX_N

MAPPINGS = {
    "softmax": (softmax, 1.0),
    "sparsemax": (sparsemax, 2.0),
    "entmax15": (entmax15, 1.5),
    "bisect": (lambda x, **k: entmax_bisect(x, 1.8, **k), 1.8),
    # the static (sync-free) path: same properties, any shape, dim, mask, ties and magnitude
    "sparsemax_static": (lambda x, **k: sparsemax(x, impl="static", **k), 2.0),
    "entmax15_static": (lambda x, **k: entmax15(x, impl="static", **k), 1.5),
    "bisect_static": (lambda x, **k: entmax_bisect(x, 1.8, impl="static", **k), 1.8),
    "bisect_static_2.6": (lambda x, **k: entmax_bisect(x, 2.6, impl="static", **k), 2.6),
}
SETTINGS = settings(max_examples=25, deadline=None)


@st.composite
def problems(draw):
    """scores (float64), dim, mask (or None)."""
    ndim = draw(st.integers(1, 3))
    shape = [draw(st.integers(1, 5)) for _ in range(ndim)]
    dim = draw(st.integers(-ndim, ndim - 1))
    shape[dim] = draw(st.sampled_from([1, 2, 3, 8, SORT_MAX_N + 1, 100, 300]))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = np.random.default_rng(seed)
    scale = draw(st.sampled_from([1e-4, 1.0, 10.0, 1e4]))
    if draw(st.booleans()):  # ties: few distinct values
        x = gen.integers(-2, 3, size=shape).astype(np.float64) * scale
    else:
        x = gen.standard_normal(shape) * scale
    mask = None
    if draw(st.booleans()):
        mask = torch.from_numpy(gen.random(shape) > draw(st.sampled_from([0.2, 0.7, 1.1])))
    return torch.from_numpy(x), dim, mask


def _kept_rows(mask, x, dim):
    if mask is None:
        return torch.ones_like(x.sum(dim), dtype=torch.bool)
    return torch.broadcast_to(mask, x.shape).any(dim)


@pytest.mark.parametrize("name", list(MAPPINGS))
@SETTINGS
@given(prob=problems())
def test_simplex_zeros_and_optimality(name, prob, kkt):
    x, dim, mask = prob
    fn, alpha = MAPPINGS[name]
    p = fn(x, dim=dim, mask=mask)
    assert p.shape == x.shape and p.dtype == x.dtype and torch.isfinite(p).all()
    assert (p >= 0).all()
    kept = _kept_rows(mask, x, dim)
    sums = p.sum(dim)
    assert torch.allclose(sums[kept], torch.ones_like(sums[kept]), atol=1e-9)
    assert torch.all(sums[~kept] == 0)
    if mask is not None:
        assert torch.all(p[~torch.broadcast_to(mask, x.shape)] == 0)
    if alpha > 1 and kept.all():
        xm = x if mask is None else x.masked_fill(~mask, float("-inf"))
        assert kkt(p.movedim(dim, -1), xm.movedim(dim, -1), alpha) < 1e-8 * max(1.0, x.abs().max().item())
    # the order of scores is preserved, and shifting by a constant changes nothing
    assert torch.allclose(fn(x + 3.0, dim=dim, mask=mask), p, atol=1e-8)


@pytest.mark.parametrize("name", list(MAPPINGS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@SETTINGS
@given(prob=problems())
def test_half_precision_matches_float64(name, dtype, prob):
    x, dim, mask = prob
    fn, _ = MAPPINGS[name]
    xh = x.clamp(-6e4, 6e4).to(dtype)
    p = fn(xh, dim=dim, mask=mask)
    assert p.dtype == dtype and torch.isfinite(p).all()
    ref = fn(xh.double(), dim=dim, mask=mask)
    tol = 4e-3 if dtype == torch.float16 else 3e-2
    assert torch.allclose(p.double(), ref, atol=tol)


@pytest.mark.parametrize("name", list(MAPPINGS))
@SETTINGS
@given(prob=problems())
def test_backward_is_finite_and_zero_off_support(name, prob):
    x, dim, mask = prob
    fn, alpha = MAPPINGS[name]
    x = x.clone().requires_grad_()
    p = fn(x, dim=dim, mask=mask)
    g = torch.randn_like(p)
    (p * g).sum().backward()
    assert torch.isfinite(x.grad).all()
    if alpha > 1:
        assert torch.all(x.grad[p == 0] == 0)
    # J is symmetric with rows summing to zero: <1, J g> = 0 along dim
    row_sums = x.grad.sum(dim)
    assert torch.allclose(row_sums, torch.zeros_like(row_sums), atol=1e-6 * max(1.0, g.abs().max().item()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_log_probs_of_is_log_with_exact_minus_inf(dtype):
    tiny = torch.finfo(dtype).tiny
    probs = torch.tensor([[0.0, 0.25, 0.75, 0.0], [tiny / 8, 1.0 - tiny / 8, 0.0, 0.0]], dtype=dtype)
    out = log_probs_of(probs)
    assert out.dtype == dtype and out.shape == probs.shape
    assert torch.equal(torch.isinf(out), probs == 0)  # a subnormal probability stays finite
    assert torch.equal(out, torch.log(probs))
    p = entmax15(torch.randn(64, 500, dtype=dtype) * 4)
    assert torch.equal(log_probs_of(p), torch.log(p))
