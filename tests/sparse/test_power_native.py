"""The native Newton threshold for any power q > 1 (alpha-entmax, alpha in (1, 2);
``nmt/sparse/_power_threshold.c`` through ``nmt.sparse._native.power_threshold``): thresholds
checked against a float64 bisection on every vector path, short rows by blocks equal to row by row,
the step cap, NaN and empty rows, threads; the front door takes it for float32 rows."""
import pytest
import torch

from nmt.sparse import _native, _threshold, entmax_bisect
from nmt.sparse.entmax import entmax_bisect_above_one

NEG_INF = float("-inf")
EPS = torch.finfo(torch.float32).eps


def shifted_rows(n_rows: int, n: int, am1: torch.Tensor, seed: int) -> torch.Tensor:
    """float32 rows ``(alpha - 1) (x - max x)`` of varied spreads, one with -inf runs, one tied,
    one with a single dominant entry."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_rows, n, generator=g) * torch.linspace(0.05, 6.0, n_rows)[:, None]
    if n_rows > 3 and n > 3:
        x[1, : n // 2] = NEG_INF
        x[2] = (x[2] * 4).round() / 4
        x[3, n // 3] += 8.0
    return ((x - x.amax(dim=-1, keepdim=True)) * am1.reshape(-1, 1)).float()


def bisection(z: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The threshold of each row of ``z`` (max 0) for the powers ``q (R,)``, by 200 float64
    bisection steps on ``sum [z - t]_+^q = 1`` over ``[-1, 0]``: the independent truth."""
    z, q = z.double(), q.double()[:, None]
    lo = torch.full((z.shape[0],), -1.0, dtype=torch.float64)
    hi = torch.zeros_like(lo)
    for _ in range(200):
        mid = (lo + hi) / 2
        f = (z - mid[:, None]).clamp(min=0).pow(q).sum(dim=-1) - 1
        lo, hi = torch.where(f >= 0, mid, lo), torch.where(f >= 0, hi, mid)
    return lo


@pytest.mark.parametrize("n", [1, 7, 20, 50, 256, 300, 2000])
@pytest.mark.parametrize("per_row", [False, True])
def test_power_threshold_matches_float64_bisection(native_build, monkeypatch, n, per_row):
    """Every vector path (the build's own, without AVX-512, without AVX2, without vectors), short
    rows by blocks and by rows, longer rows (> 256 entries) by rows: the threshold within a few
    float32 roundings of the float64 root, for alphas 1.05 to 1.95."""
    monkeypatch.setitem(_native._state, "lib", native_build)
    rows = 11
    alphas = torch.linspace(1.05, 1.95, rows, dtype=torch.float64)
    if not per_row:
        alphas = torch.full((rows,), 1.3, dtype=torch.float64)
    z = shifted_rows(rows, n, alphas - 1, seed=n)
    q = 1 / (alphas - 1)
    want = bisection(z, q)
    lo = torch.full((rows,), -1.0)
    for blocks in (True, False):
        tau = _native.power_threshold(z, q if per_row else 1 / 0.3, lo, 200, EPS, blocks=blocks)
        assert tau is not None and tau.dtype == torch.float32
        assert torch.allclose(tau.double(), want, rtol=0, atol=8 * EPS), (blocks, (tau.double() - want).abs().max())
        p = (z.double() - tau.double()[:, None]).clamp(min=0).pow(q.reshape(-1, 1))
        assert torch.allclose(p.sum(dim=-1), torch.ones(rows, dtype=torch.float64), atol=2e-5)


@pytest.mark.parametrize("max_iter", [0, 1, 2, 200])
def test_blocks_stop_each_row_where_the_row_loop_stops(native_build, monkeypatch, max_iter):
    """A block's lanes stop one by one, as the rows do alone: the same thresholds at every step cap
    (rows of 2 to 40 entries: blocks of every width with lanes past the last row)."""
    monkeypatch.setitem(_native._state, "lib", native_build)
    for n_rows, n in ((1, 2), (3, 5), (13, 40)):
        alphas = torch.linspace(1.1, 1.9, n_rows, dtype=torch.float64)
        z = shifted_rows(n_rows, n, alphas - 1, seed=n_rows)
        lo = torch.full((n_rows,), -1.0)
        by_block = _native.power_threshold(z, 1 / (alphas - 1), lo, max_iter, EPS, blocks=True)
        by_row = _native.power_threshold(z, 1 / (alphas - 1), lo, max_iter, EPS, blocks=False)
        assert torch.allclose(by_block, by_row, rtol=2 * EPS, atol=0), (by_block - by_row).abs().max()
        if max_iter == 0:
            assert torch.equal(by_block, lo)


def test_nan_and_empty_rows_keep_the_lower_bound_and_spare_the_others():
    if not _native.available():
        pytest.skip("native library not built")
    z = shifted_rows(6, 30, torch.full((6,), 0.4, dtype=torch.float64), seed=1)
    z[0] = NEG_INF
    z[4, 3] = float("nan")
    lo = torch.full((6,), -1.0)
    tau = _native.power_threshold(z, 2.5, lo, 200, EPS)
    assert tau[0] == -1 and tau[4] == -1
    clean = torch.tensor([1, 2, 3, 5])
    want = bisection(z[clean], torch.full((4,), 2.5, dtype=torch.float64))
    assert torch.allclose(tau[clean].double(), want, atol=8 * EPS)


def test_rows_split_over_two_threads_give_the_same_thresholds(monkeypatch):
    if not _native.available():
        pytest.skip("native library not built")
    z = shifted_rows(37, 24, torch.full((37,), 0.3, dtype=torch.float64), seed=2)
    lo = torch.full((37,), -1.0)
    one = _native.power_threshold(z, 1 / 0.3, lo, 200, EPS)
    monkeypatch.setattr(_native, "POWER_SPLIT_MIN_NUMEL", 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        two = _native.power_threshold(z, 1 / 0.3, lo, 200, EPS)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


def test_float64_rows_and_a_missing_library_keep_the_torch_loop(monkeypatch):
    z = shifted_rows(4, 10, torch.full((4,), 0.3, dtype=torch.float64), seed=3)
    lo = torch.full((4,), -1.0)
    assert _native.power_threshold(z.double(), 1 / 0.3, lo.double(), 200, EPS) is None
    monkeypatch.setitem(_native._state, "lib", None)
    assert _native.power_threshold(z, 1 / 0.3, lo, 200, EPS) is None


def test_the_front_door_takes_the_native_loop_for_float32_rows(monkeypatch, kkt, ref):
    """entmax_bisect with a float alpha outside {1.5, 2} and with learned per-head alphas, CPU
    float32, forward and backward: the native loop serves the threshold (and not the torch loop),
    and the result satisfies alpha-entmax's optimality conditions, equals the reference package's
    bisection and, with the library disabled, the torch loop's result."""
    if not _native.available():
        pytest.skip("native library not built")
    calls = []
    real = _native.power_threshold
    monkeypatch.setattr(_threshold, "power_threshold", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    g = torch.Generator().manual_seed(4)
    x = torch.randn(64, 20, generator=g) * 2
    for alpha in (1.2, 1.7):
        p = entmax_bisect(x, alpha)
        assert calls, alpha
        assert kkt(p, x, alpha) < 1e-5
        want = ref.entmax_bisect(x.double(), alpha, n_iter=100).float()
        assert torch.allclose(p, want, atol=2e-6)
        calls.clear()
    heads = torch.randn(3, 4, 5, 9, generator=g) * 2
    alphas = torch.tensor([1.1, 1.35, 1.6, 1.95]).view(1, 4, 1, 1).requires_grad_()
    xh = heads.clone().requires_grad_()
    p = entmax_bisect_above_one(xh, alphas)
    assert calls
    grad = torch.randn(p.shape, generator=g)
    p.backward(grad)
    monkeypatch.setitem(_native._state, "lib", None)  # the torch loop
    calls.clear()
    alphas_t = alphas.detach().clone().requires_grad_()
    xt = heads.clone().requires_grad_()
    pt = entmax_bisect_above_one(xt, alphas_t)
    pt.backward(grad)
    assert torch.allclose(p, pt, atol=2e-6)
    assert torch.allclose(xh.grad, xt.grad, atol=1e-5) and torch.allclose(alphas.grad, alphas_t.grad, atol=1e-4)
