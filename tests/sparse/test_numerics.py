"""Numerics of the mappings on hostile inputs (issue 17), on the CPU (pruned) and static paths alike:
large row offsets in float32, alpha > 2 in float32, NaN / +inf scores, scores near the float
maximum, NaN alpha, zero-width inputs."""
import pytest
import torch

from nmt.sparse import entmax15, entmax_bisect, softmax, sparsemax

IMPLS = ["pruned", "static"]
MAPS = {
    "sparsemax": lambda x, impl: sparsemax(x, impl=impl),
    "entmax15": lambda x, impl: entmax15(x, impl=impl),
    "bisect1.5": lambda x, impl: entmax_bisect(x, 1.5, impl=impl),
    "bisect1.3": lambda x, impl: entmax_bisect(x, 1.3, impl=impl),
    "bisect2.5": lambda x, impl: entmax_bisect(x, 2.5, impl=impl),
}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("name", list(MAPS))
@pytest.mark.parametrize("offset", [1e2, 1e3, 1e4])
@pytest.mark.parametrize("n", [20, 3000])
def test_float32_rows_with_a_large_offset(impl, name, offset, n):
    """randn + c in float32: sums to one and matches float64 within ~1e-6 (computed relative to
    the row maximum; before, c = 1e4 gave errors of ~1e-3)."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(8, n, generator=g) + offset
    f = MAPS[name]
    p = f(x, impl)
    want = f(x.double(), impl)
    assert (p.double().sum(-1) - 1).abs().max() < 1e-6
    assert (p.double() - want).abs().max() < 2e-6


@pytest.mark.parametrize("impl", IMPLS)
def test_bisect_alpha_above_two_in_float32(impl):
    x = torch.tensor([[1.9895422, 1.3246843]])
    want = entmax_bisect(x.double(), 2.5, impl=impl)
    assert torch.allclose(want, torch.tensor([[0.9982398, 0.0017602]], dtype=torch.float64), atol=1e-6)
    assert (entmax_bisect(x, 2.5, impl=impl).double() - want).abs().max() < 1e-6
    y = torch.randn(50, 40, generator=torch.Generator().manual_seed(0)) * 3
    for alpha in (2.2, 2.5, 3.0):
        assert (entmax_bisect(y, alpha, impl=impl).double() - entmax_bisect(y.double(), alpha, impl=impl)).abs().max() < 2e-5


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_and_plus_inf_scores_give_nan_rows(impl, bad):
    """A row holding NaN or +inf is all NaN in every mapping (softmax used to give all zeros,
    which reads as a masked row); the other rows are untouched."""
    x = torch.randn(3, 6)
    x[1, 2] = bad
    maps = dict(MAPS, softmax=lambda t, impl: softmax(t))
    for name, f in maps.items():
        p = f(x, impl)
        assert torch.isnan(p[1]).all(), name
        assert torch.allclose(p[[0, 2]], f(x[[0, 2]], impl)), name


@pytest.mark.parametrize("impl", IMPLS)
def test_scores_near_the_float_maximum_give_finite_rows(impl):
    big = torch.finfo(torch.float32).max
    x = torch.tensor([[big, big * 0.5, -big, 0.0], [big, big, 1.0, -1.0]])
    maps = dict(MAPS, softmax=lambda t, impl: softmax(t))
    for name, f in maps.items():
        p = f(x, impl)
        assert torch.isfinite(p).all(), name
        assert torch.allclose(p.sum(-1), torch.ones(2)), name
        assert p[0, 0] == 1 and torch.allclose(p[1, :2], torch.full((2,), 0.5)), name


def test_tensor_alpha_nan_or_below_one():
    x = torch.randn(3, 5)
    for a in (float("nan"), 0.5):
        alpha = torch.tensor([[1.5], [a], [2.0]])
        with pytest.raises(ValueError, match="alpha >= 1 in every row"):
            entmax_bisect(x, alpha, impl="pruned")
        p = entmax_bisect(x, alpha, impl="static")  # no host read: the row is NaN instead
        assert torch.isnan(p[1]).all() and torch.isfinite(p[[0, 2]]).all()
    with pytest.raises(ValueError, match="alpha >= 1"):
        entmax_bisect(x, float("nan"))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape,dim", [((3, 0), -1), ((0, 5), -1), ((0, 5), 0), ((2, 0, 4), 1)])
def test_zero_width_inputs_give_empty_results(impl, shape, dim):
    x = torch.randn(*shape, requires_grad=True)
    maps = {"softmax": lambda t, impl, **k: softmax(t, **k),
            "sparsemax": lambda t, impl, **k: sparsemax(t, impl=impl, **k),
            "entmax15": lambda t, impl, **k: entmax15(t, impl=impl, **k),
            "bisect": lambda t, impl, **k: entmax_bisect(t, 1.7, impl=impl, **k),
            "bisect_tensor": lambda t, impl, **k: entmax_bisect(t, torch.tensor(1.7), impl=impl, **k)}
    for name, f in maps.items():
        p = f(x, impl, dim=dim)
        assert p.shape == x.shape and p.dtype == x.dtype, name
        p.sum().backward()


@pytest.mark.parametrize("n", [640, 1000, 4096])  # whole blocks, a short last block
def test_candidates_by_entries_equal_candidates_by_blocks(n):
    """Selecting the pruning's candidates from the entries' mask (rows broad by their blocks)
    gives the same candidates as reading the kept blocks, in the same order within each row,
    and both are exactly the entries above the bound (brute force)."""
    from nmt.sparse._threshold import _block_max, _gather_candidates, _mask_candidates

    g = torch.Generator().manual_seed(n)
    z = torch.randn(9, n, generator=g)
    z[2, n // 3:] = float("-inf")
    z[4] = (z[4] * 2).round()  # ties at the bound
    block = 32
    lo = torch.quantile(z.clamp(min=-10), 0.9, dim=-1, keepdim=True)
    by_blocks, cand_b = _gather_candidates(z, _block_max(z, block), lo, block)
    by_entries, cand_e = _mask_candidates(z, z > lo)
    assert torch.equal(by_blocks, by_entries)  # what the threshold is solved on: the same bits
    order = cand_b.index.argsort()  # the flat lists: the short last block's after the others
    for a, b in zip(cand_b, cand_e):
        assert torch.equal(a[order], b)
    rows, cols = (z > lo).nonzero().unbind(1)
    assert torch.equal(cand_e.index, rows * n + cols) and torch.equal(cand_e.values, z[rows, cols])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_softmax_without_autograd_equals_the_recorded_path(dtype):
    """Softmax outside autograd's recording (decoding) skips the autograd Function: the same bits
    as the recorded path, for plain, masked, all-masked (zeros), -inf-only (zeros) and NaN / +inf
    rows (NaN)."""
    x = torch.randn(6, 2, 7, dtype=torch.float64).to(dtype)
    x[1, 0] = float("-inf")
    x[2, 1, 3] = float("nan")
    x[3, 0, 0] = float("inf")
    mask = torch.rand(6, 1, 7) > 0.3
    mask[4] = False
    mask[2, 0, 3] = mask[3, 0, 0] = True  # a masked NaN or +inf would be a masked entry (-inf)
    for m in (None, mask):
        with torch.no_grad():
            plain = softmax(x, mask=m)
        recorded = softmax(x.clone().requires_grad_(), mask=m)
        assert recorded.requires_grad and not plain.requires_grad
        assert torch.equal(plain.isnan(), recorded.detach().isnan())
        assert torch.equal(plain.nan_to_num(), recorded.detach().nan_to_num())
    assert (plain[4] == 0).all() and (plain[1, 0] == 0).all()
    assert plain[2, 1].isnan().all() and plain[3, 0].isnan().all()
