"""sparsemax: exactness against KKT certificates, a generic solver and the reference package."""
import pytest
import torch

from nmt.sparse import Sparsemax, sparsemax
from nmt.sparse._threshold import root_threshold, sort_threshold



@pytest.mark.parametrize("n", [1, 2, 7, 50, 300, 2000])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 30.0, 1e4])
def test_kkt_exact(n, scale, kkt):
    x = torch.randn(6, n, dtype=torch.float64) * scale
    p = sparsemax(x)
    assert kkt(p, x, 2.0) < 1e-12 * max(1.0, scale)
    assert torch.allclose(p.sum(-1), torch.ones(6, dtype=torch.float64), atol=1e-12)


def test_matches_generic_solver(generic_solver):
    for _ in range(5):
        x = torch.randn(6, dtype=torch.float64) * 2
        ref = torch.from_numpy(generic_solver(x.numpy(), 2.0))
        assert torch.allclose(sparsemax(x), ref, atol=1e-6)


@pytest.mark.parametrize("n", [5, 200, 3000])
def test_matches_reference_package(n, ref):
    x = torch.randn(4, n, dtype=torch.float64) * 3
    assert torch.allclose(sparsemax(x), ref.sparsemax(x, dim=-1), atol=1e-12)


@pytest.mark.parametrize("n", [9, 64, 257, 1000, 4099])
def test_sort_and_root_paths_agree(n):
    x = torch.randn(5, n, dtype=torch.float64)
    x[0] = 0.0  # all tied
    x[1, : n // 2] = 1.0  # half tied at the top
    assert torch.allclose(sort_threshold(x, 1.0), root_threshold(x, 1.0), atol=1e-12)


def _enumerated_threshold(row: list, q: float) -> float:
    """The threshold by trying every support size on the sorted row (float64, plain Python):
    the closed form on the top ``k`` that lies below its ``k``-th entry and not below the next."""
    z = sorted((v for v in row if v > float("-inf")), reverse=True)
    if not z:
        return float("inf")
    for k in range(1, len(z) + 1):
        top = z[:k]
        if q == 1.0:
            tau = (sum(top) - 1) / k
        else:
            mean = sum(top) / k
            tau = mean - max(0.0, (1 - sum((v - mean) ** 2 for v in top)) / k) ** 0.5
        if top[-1] > tau and (k == len(z) or z[k] <= tau):
            return tau
    raise AssertionError("no support size fits")


@pytest.mark.parametrize("host", [True, False], ids=["numpy", "torch"])
@pytest.mark.parametrize("q", [1.0, 2.0])
@pytest.mark.parametrize("n", [1, 3, 16, 50, 200])
def test_sort_threshold_matches_enumeration(q, n, host):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(8, n, dtype=torch.float64, generator=g) * 2
    x[1] = 0.5                                    # all tied
    x[2, : (n + 1) // 2] = 1.0                    # tied at the top
    x[3, ::2] = float("-inf")                     # masked entries
    x[4] = x[4] * 1e-4 + 1e6                      # a large common offset
    x[5] = float("-inf")                          # nothing kept
    got = sort_threshold(x, q, host=host)[:, 0]
    for r in range(8):
        want = _enumerated_threshold(x[r].tolist(), q)
        assert got[r].item() == pytest.approx(want, rel=1e-12, abs=1e-9), (r, q)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("q,scale", [(1.0, 1.0), (2.0, 0.5), (2.0, 0.3)])
@pytest.mark.parametrize("native", [True, False], ids=["native", "numpy"])
def test_host_solve_agrees_with_the_torch_solve(q, scale, dtype, native, monkeypatch):
    """The CPU's host solve (the native loop, or NumPy where it is not built) and the torch path
    (graphs, autograd) of the sorted threshold: the same support everywhere, thresholds within two
    units in the last place, the same flags for rows without finite entries (+inf) and rows
    holding NaN or +inf (zmax NaN); any layout."""
    from nmt.sparse import _native
    from nmt.sparse._threshold import NUMPY_SOLVE_MAX_NUMEL, _host_solves, sorted_shifted_threshold
    if not native:
        monkeypatch.setattr(_native, "_state", {"lib": None})
    elif _native.library() is None:
        pytest.skip("no C compiler: the NumPy path serves")
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(150, 24, generator=g) * 3).to(dtype)                # solved wholly in NumPy
    x[0, 3], x[1], x[2, 1], x[3, 2], x[4] = float("-inf"), float("-inf"), float("nan"), float("inf"), 1.0
    x[5, ::3] = x[5, 0]                                  # ties
    x[6] = x[6] * 1e-5 + 1e4                             # a large offset
    for z in (x, x.t().contiguous().t(), x[:, ::2]):    # strided layouts reach NumPy as views
        assert _host_solves(z) and z.numel() <= NUMPY_SOLVE_MAX_NUMEL
        got = sorted_shifted_threshold(z, q, scale)
        want = sorted_shifted_threshold(z, q, scale, host=False)
        assert got[0].dtype == want[0].dtype == dtype and got[0].shape == want[0].shape == (150, 1)
        assert torch.equal(got[1].isnan(), want[1].isnan())
        assert torch.equal(got[1].nan_to_num(), want[1].nan_to_num())
        assert torch.equal(got[0].isinf(), want[0].isinf())
        fin = want[0].isfinite()
        assert torch.equal(fin, got[0].isfinite())
        ulp = torch.finfo(dtype).eps * want[0][fin].abs().clamp(min=1)
        assert ((got[0][fin] - want[0][fin]).abs() <= 2 * ulp).all()
        zs = scale * (z - want[1].nan_to_num())           # the same support on the rows
        assert torch.equal(zs > got[0], zs > want[0])
    assert not _host_solves(x.clone().requires_grad_())  # autograd records: the torch path


@pytest.mark.parametrize("host", [True, False], ids=["numpy", "torch"])
def test_sorted_threshold_flags_bad_rows(host):
    from nmt.sparse._threshold import sorted_shifted_threshold
    x = torch.randn(6, 40)
    x[1, 7] = float("nan")
    x[2, 3] = float("inf")
    x[3, 5:] = float("-inf")
    tau, zmax = sorted_shifted_threshold(x, 1.0, host=host)
    assert zmax[1].isnan() and zmax[2].isnan() and zmax[[0, 3, 4, 5]].isfinite().all()
    assert torch.allclose(tau[[0, 3]] + zmax[[0, 3]], root_threshold(x[[0, 3]], 1.0), atol=1e-6)


def test_known_values_and_exact_zeros():
    x = torch.tensor([[0.0, -1.0, 5.0, 4.5], [1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    p = sparsemax(x)
    assert torch.equal(p[0], torch.tensor([0.0, 0.0, 0.75, 0.25], dtype=torch.float64))
    assert torch.equal(p[1], torch.full((4,), 0.25, dtype=torch.float64))


@pytest.mark.parametrize("dim", [0, 1, -1, 2])
def test_dim_and_shift_invariance(dim):
    x = torch.randn(3, 4, 5, dtype=torch.float64)
    p = sparsemax(x, dim=dim)
    ref = sparsemax(x.movedim(dim, -1)).movedim(-1, dim)
    assert torch.allclose(p, ref, atol=1e-14)
    assert torch.allclose(sparsemax(x + 7.25, dim=dim), p, atol=1e-12)


@pytest.mark.parametrize("n", [10, 600])
def test_mask_and_neg_inf(n):
    x = torch.randn(4, n, dtype=torch.float64)
    mask = torch.rand(4, n) > 0.3
    mask[:, 0] = True
    mask[3] = False  # an all-masked row
    p = sparsemax(x, mask=mask)
    assert torch.all(p[~mask] == 0)
    assert torch.all(p[3] == 0) and torch.allclose(p[:3].sum(-1), torch.ones(3, dtype=torch.float64))
    q = sparsemax(x.masked_fill(~mask, float("-inf")))
    assert torch.equal(p, q)
    # padding with -inf equals the unpadded result
    pad = torch.cat([x, torch.full((4, 5), float("-inf"), dtype=torch.float64)], dim=-1)
    assert torch.allclose(sparsemax(pad)[:, :n], sparsemax(x), atol=1e-14)


def test_all_masked_row_zero_gradient():
    x = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True] * 5, [False] * 5])
    p = sparsemax(x, mask=mask)
    (p * torch.randn(2, 5, dtype=torch.float64)).sum().backward()
    assert torch.isfinite(x.grad).all() and torch.all(x.grad[1] == 0)
    y = torch.full((1, 700), float("-inf"), dtype=torch.float64, requires_grad=True)
    out = sparsemax(y)
    out.sum().backward()
    assert torch.all(out == 0) and torch.all(y.grad == 0)


@pytest.mark.parametrize("n,fast", [(6, False), (400, True)])
def test_gradcheck(n, fast):
    x = torch.randn(3, n, dtype=torch.float64) * 2
    x = x.requires_grad_()
    assert torch.autograd.gradcheck(lambda t: sparsemax(t), (x,), eps=1e-7, atol=1e-6, fast_mode=fast)
    y = torch.randn(4, 3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: sparsemax(t, dim=1), (y,), eps=1e-7, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_dtypes(dtype):
    x = torch.randn(3, 300).to(dtype)
    p = sparsemax(x)
    assert p.dtype == dtype
    ref = sparsemax(x.double())
    tol = {torch.float16: 2e-3, torch.bfloat16: 1e-2}.get(dtype, 1e-6)
    assert torch.allclose(p.double(), ref, atol=tol)
    x.requires_grad_()
    sparsemax(x).sum().backward()
    assert x.grad.dtype == dtype


def test_module_and_errors():
    m = Sparsemax(dim=0)
    x = torch.randn(4, 3)
    assert torch.equal(m(x), sparsemax(x, dim=0))
    with pytest.raises(ValueError, match="mask"):
        sparsemax(x, mask=torch.ones(4, 3))
    with pytest.raises(ValueError, match="broadcast"):
        sparsemax(x, mask=torch.ones(5, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="dim"):
        sparsemax(x, dim=2)
    with pytest.raises(ValueError, match="floating"):
        sparsemax(torch.ones(3, dtype=torch.long))


def test_broadcasts_to_matches_torch():
    from nmt.sparse._common import broadcasts_to

    target = (4, 1, 5)
    for shape in [(), (5,), (1,), (1, 5), (4, 1, 5), (4, 1, 1), (3, 5), (2, 4, 1, 5), (4, 2, 5), (1, 1, 1, 5)]:
        try:
            ok = torch.broadcast_shapes(shape, target) == torch.Size(target)
        except RuntimeError:
            ok = False
        assert broadcasts_to(shape, target) == ok, shape
