"""entmax15 and entmax_bisect: KKT certificates, limits, reference package, gradients (alpha too)."""
import pytest
import torch

from nmt.sparse import Entmax15, EntmaxBisect, entmax15, entmax_bisect, softmax, sparsemax
from nmt.sparse._threshold import root_threshold, sort_threshold

F64 = torch.float64


@pytest.mark.parametrize("n", [1, 3, 40, 300, 3000])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 50.0, 1e4])
def test_entmax15_kkt_exact(n, scale, kkt):
    x = torch.randn(5, n, dtype=F64) * scale
    p = entmax15(x)
    assert kkt(p, x, 1.5) < 1e-10 * max(1.0, scale)


@pytest.mark.parametrize("alpha", [1.2, 1.5, 2.0, 2.5, 4.0])
@pytest.mark.parametrize("n", [4, 300])
def test_bisect_kkt(alpha, n, kkt):
    x = torch.randn(4, n, dtype=F64) * 3
    assert kkt(entmax_bisect(x, alpha), x, alpha) < 1e-9


@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0, 3.0])
def test_generic_solver(alpha, generic_solver):
    x = torch.randn(6, dtype=F64) * 2
    ref = torch.from_numpy(generic_solver(x.numpy(), alpha))
    assert torch.allclose(entmax_bisect(x, alpha), ref, atol=1e-5)


@pytest.mark.parametrize("n", [7, 500])
def test_limits(n):
    x = torch.randn(4, n, dtype=F64) * 4
    assert torch.allclose(entmax_bisect(x, 1.0), torch.softmax(x, -1), atol=1e-12)
    assert torch.allclose(entmax_bisect(x, 2.0), sparsemax(x), atol=1e-6)
    assert torch.allclose(entmax_bisect(x, 1.5), entmax15(x), atol=1e-6)
    a = torch.tensor([1.0, 1.5, 2.0, 1.5], dtype=F64)[:, None]
    p = entmax_bisect(x, a)
    assert torch.allclose(p[0], torch.softmax(x[0], -1), atol=1e-12)
    assert torch.allclose(p[1], entmax15(x[1]), atol=1e-6)
    assert torch.allclose(p[2], sparsemax(x[2]), atol=1e-6)


@pytest.mark.parametrize("n", [9, 64, 257, 1000, 5000])
def test_sort_and_root_paths_agree(n):
    z = torch.randn(5, n, dtype=F64)
    z[0] = 0.0
    z[1, : n // 2] = 1.0
    z[2] *= 1e3
    assert torch.allclose(sort_threshold(z, 2.0), root_threshold(z, 2.0), atol=1e-12)


def test_reference_package(ref):
    for n in (6, 100, 2000):
        x = torch.randn(3, n, dtype=F64) * 2
        assert torch.allclose(entmax15(x), ref.entmax15(x, dim=-1), atol=1e-12)
        for alpha in (1.25, 1.5, 3.0):
            assert torch.allclose(entmax_bisect(x, alpha), ref.entmax_bisect(x, alpha, n_iter=200),
                                  atol=1e-10)


def test_known_value():
    # [0, -inf] -> [1, 0]; two ties -> 1/2 each
    x = torch.tensor([[0.0, float("-inf")], [3.0, 3.0]], dtype=F64)
    assert torch.allclose(entmax15(x), torch.tensor([[1.0, 0.0], [0.5, 0.5]], dtype=F64), atol=1e-15, rtol=0)


@pytest.mark.parametrize("fn", [entmax15, lambda x, **k: entmax_bisect(x, 1.7, **k)])
@pytest.mark.parametrize("n", [8, 700])
def test_mask_inf_shift_dims(fn, n):
    x = torch.randn(3, n, dtype=F64)
    mask = torch.rand(3, n) > 0.4
    mask[:, 1] = True
    mask[2] = False
    p = fn(x, mask=mask)
    assert torch.all(p[~mask] == 0) and torch.all(p[2] == 0)
    assert torch.allclose(p, fn(x.masked_fill(~mask, float("-inf"))), atol=1e-14)
    assert torch.allclose(fn(x + 3.5), fn(x), atol=1e-10)
    y = torch.randn(2, 3, 4, dtype=F64)
    assert torch.allclose(fn(y, dim=1), fn(y.transpose(1, 2)).transpose(1, 2), atol=1e-14)


def test_empty_rows_zero_gradient():
    for fn in (entmax15, lambda t, **k: entmax_bisect(t, 1.3, **k), softmax):
        x = torch.randn(2, 6, dtype=F64, requires_grad=True)
        mask = torch.tensor([[True] * 6, [False] * 6])
        p = fn(x, mask=mask)
        (p * torch.randn_like(p)).sum().backward()
        assert torch.all(p[1] == 0) and torch.isfinite(x.grad).all() and torch.all(x.grad[1] == 0)


@pytest.mark.parametrize("n,fast", [(6, False), (300, True)])
def test_gradcheck_entmax15(n, fast):
    x = (torch.randn(3, n, dtype=F64) * 2).requires_grad_()
    assert torch.autograd.gradcheck(entmax15, (x,), eps=1e-7, atol=1e-6, fast_mode=fast)


@pytest.mark.parametrize("alpha", [1.3, 1.5, 2.4])
def test_gradcheck_bisect_scores_and_alpha(alpha):
    x = (torch.randn(3, 6, dtype=F64) * 2).requires_grad_()
    a = torch.full((3, 1), alpha, dtype=F64).add_(torch.rand(3, 1, dtype=F64) * 0.1).requires_grad_()
    assert torch.autograd.gradcheck(lambda t, al: entmax_bisect(t, al), (x, a), eps=1e-7, atol=1e-6)
    # alpha broadcast over leading dims, dim=0 normalisation
    y = (torch.randn(5, 2, 3, dtype=F64)).requires_grad_()
    b = torch.tensor([[1.6, 1.9, 1.4]], dtype=F64).requires_grad_()
    assert torch.autograd.gradcheck(lambda t, al: entmax_bisect(t, al, dim=0), (y, b), eps=1e-7, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_dtypes(dtype):
    x = torch.randn(3, 400).to(dtype)
    for fn, tol in ((entmax15, 1e-6), (lambda t: entmax_bisect(t, 1.5), 1e-5)):
        p = fn(x)
        assert p.dtype == dtype
        ref = fn(x.double())
        t = {torch.float16: 2e-3, torch.bfloat16: 1e-2}.get(dtype, tol)
        assert torch.allclose(p.double(), ref, atol=t)


def test_n_iter_caps_steps():
    x = torch.randn(4, 50, dtype=F64)
    coarse = entmax_bisect(x, 1.5, n_iter=1)
    assert torch.allclose(coarse.sum(-1), torch.ones(4, dtype=F64))
    assert torch.allclose(entmax_bisect(x, 1.5, n_iter=100), entmax15(x), atol=1e-12)


def test_modules_and_errors():
    x = torch.randn(4, 3)
    assert torch.equal(Entmax15(dim=0)(x), entmax15(x, dim=0))
    alpha = torch.nn.Parameter(torch.tensor([[1.5]]))
    m = EntmaxBisect(alpha=alpha)
    m(x).sum().backward()
    assert alpha.grad is not None
    with pytest.raises(ValueError, match="alpha >= 1"):
        entmax_bisect(x, 0.5)
    with pytest.raises(ValueError, match="alpha >= 1"):
        entmax_bisect(x, torch.tensor([[0.9], [1.5], [1.5], [1.5]]))
    with pytest.raises(ValueError, match="size 1 along dim"):
        entmax_bisect(x, torch.full((4, 3), 1.5))
    inf_row = torch.tensor([[float("inf")], [1.5], [1.5], [1.5]])  # gave a uniform row
    with pytest.raises(ValueError, match="finite alpha >= 1 in every row"):
        entmax_bisect(x, inf_row, impl="pruned")  # the host path: refused where alpha is read anyway
    p = entmax_bisect(x, inf_row, impl="static")  # no host read: the row is NaN, as for NaN / < 1
    assert bool(p[0].isnan().all()) and not bool(p[1:].isnan().any())
    with pytest.raises(ValueError, match="n_iter"):
        entmax_bisect(x, 1.5, n_iter=0)


@pytest.mark.parametrize("scale", [1e-3, 0.03, 0.1, 0.3])
@pytest.mark.parametrize("q", [1.0, 2.0])
def test_near_uniform_long_rows_match_sort(scale, q):
    """Near-uniform output-layer rows (as at initialisation) take the full-row Newton path;
    its verified closed-form finish must equal the sort-based threshold."""
    z = torch.randn(6, 5000, dtype=torch.float64) * scale
    assert torch.allclose(root_threshold(z, q), sort_threshold(z, q), rtol=0, atol=1e-12)


def _mixed_rows(dtype: torch.dtype, n: int = 3963) -> torch.Tensor:
    """Output-layer-like rows of a length that is not a multiple of the pruning block: broad
    (near-uniform, as early in training: full-row path), peaked (pruned path, sort or Newton),
    the maximum in the shorter last block, ``-inf`` entries, an empty row, exact ties at the
    threshold."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(10, n, generator=g, dtype=dtype)
    z[0] *= 0.05
    z[1] *= 0.02
    z[2] *= 0.3
    z[3] *= 20.0
    z[4, -1] = 30.0  # the maximum in the shorter last block
    z[5, ::3] = float("-inf")
    z[6] = float("-inf")  # empty row
    z[7] = 0.0
    z[7, :2] = 4.0  # two winners, the rest exactly at the threshold (q = 2: tau = 2 - 1/sqrt(2) ...)
    z[8] = 0.0
    z[8, 5] = 2.0  # 1.5-entmax of z / 2 = [1, 0, ...]: threshold exactly 0, all ties
    z[9, :2000] *= 0.01  # half broad, half peaked
    return z


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("q", [1.0, 2.0])
def test_root_matches_sort_on_broad_and_pruned_rows(dtype, q):
    """Broad rows (full-row Newton) and narrow rows (pruned) in one call, split per row: the
    verified closed form equals the sort-based threshold; -inf entries and empty rows."""
    z = _mixed_rows(dtype)
    for rows in (z, z[[0, 1, 9]], z[[2, 3, 4, 6]]):  # mixed, all broad, all narrow
        got, want = root_threshold(rows, q), sort_threshold(rows, q)
        assert torch.equal(torch.isinf(got), torch.isinf(want))
        fin = torch.isfinite(want)
        atol = 1e-12 if dtype == F64 else 2e-6
        assert torch.allclose(got[fin], want[fin], rtol=0, atol=atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_entmax15_long_rows_match_reference(dtype, ref):
    x = _mixed_rows(dtype)
    x = x[torch.isfinite(x).any(-1)]  # the reference package returns NaN on empty rows
    atol = 1e-10 if dtype == F64 else 1e-4  # float32: scores up to 60, tau to ~1e-6 relative
    assert torch.allclose(entmax15(x), ref.entmax15(x, dim=-1), atol=atol)
    assert torch.allclose(entmax_bisect(x, 1.5), ref.entmax15(x, dim=-1), atol=atol)
    assert torch.allclose(entmax_bisect(x, 1.3), ref.entmax_bisect(x, 1.3, dim=-1, n_iter=100), atol=10 * atol)
    p = entmax15(x)
    assert torch.allclose(p.sum(-1), torch.ones(len(x), dtype=dtype), atol=10 * atol)


@pytest.mark.parametrize("alpha", [1.25, 1.3])
def test_rows_broad_by_blocks_but_sparse_by_entries_are_pruned(alpha, kkt):
    """Random output-sized rows at alpha 1.25 / 1.3: most blocks' maxima lie above the block-maxima
    bound of the threshold, yet only a few percent of the entries do. Such rows are pruned to
    those entries (candidates returned for every row) instead of solved on the full row, with
    the static path's result (another algorithm: fixed Newton steps on the full row) and the
    optimality conditions."""
    from nmt.sparse._threshold import BLOCK, _block_max, _newton_lower_bound
    x = torch.randn(6, 8000, generator=torch.Generator().manual_seed(3), dtype=F64)
    am1 = alpha - 1
    zs = (x - x.amax(dim=-1, keepdim=True)) * am1
    bmax = _block_max(zs, BLOCK // 2)
    lo = _newton_lower_bound(bmax, 1 / am1, 3)
    assert (bmax > lo).double().mean() > 0.5 and (zs > lo).double().mean() < 0.25  # the premise
    tau, zmax, cand = root_threshold(x, 1 / am1, tol=torch.finfo(F64).eps, scale=am1, candidates=True)
    assert cand is not None and cand.index.numel() < 0.25 * x.numel()
    p = entmax_bisect(x, alpha)
    assert torch.allclose(p, entmax_bisect(x, alpha, impl="static"), rtol=0, atol=1e-12)
    assert kkt(p, x, alpha) < 1e-9


@pytest.mark.parametrize("alpha", [1.2, 1.3, 1.7])
def test_bisect_long_rows_kkt(alpha, kkt):
    """General alpha on long broad / narrow rows (the in-place Newton on ||d||_q - 1)."""
    x = _mixed_rows(F64)[[0, 1, 2, 3, 4, 5, 9]]
    assert kkt(entmax_bisect(x, alpha), x, alpha) < 1e-9


@pytest.mark.parametrize("n", [12, 50, 3000])
@pytest.mark.parametrize("top", [1.95, 2.6])  # all alphas in (1, 2): the norm Newton; one >= 2: the safeguarded loop
def test_per_row_alpha_equals_each_row_alone(n, top, kkt):
    """A tensor alpha (one per row, as learned per head) gives each row its own float-alpha result
    and satisfies that alpha's optimality conditions, on short and pruned long rows, with -inf
    entries and a row without finite entries."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(6, n, generator=g, dtype=F64) * 3
    x[1, ::2] = -torch.inf
    x[4] = -torch.inf
    alphas = [1.01, 1.3, 1.5, 1.75, 1.6, top]
    a = torch.tensor(alphas, dtype=F64)[:, None]
    p = entmax_bisect(x, a)
    assert torch.all(p[4] == 0)
    for r, alpha in enumerate(alphas):
        if r == 4:
            continue
        alone = entmax_bisect(x[r:r + 1], alpha)
        assert torch.allclose(p[r:r + 1], alone, atol=1e-10, rtol=0), (r, alpha)
        assert kkt(p[r:r + 1], x[r:r + 1], alpha) < 1e-9
    p32 = entmax_bisect(x.float(), a.float())
    assert torch.allclose(p32.double(), p, atol=2e-6)


@pytest.mark.parametrize("alpha,exact", [(1.5, entmax15), (2.0, sparsemax)])
def test_bisect_at_the_closed_form_alphas_is_the_closed_form(alpha, exact):
    """A float alpha of 1.5 or 2 (n_iter None) is served by entmax15 / sparsemax: bit-identical
    values and gradients, masks and half precision included; with n_iter it stays the bisection."""
    x = (torch.randn(5, 30) * 3).requires_grad_()
    mask = torch.rand(5, 30) > 0.3
    g = torch.randn(5, 30)
    p = entmax_bisect(x, alpha, mask=mask)
    (gx,) = torch.autograd.grad(p, x, g)
    q = exact(x, mask=mask)
    (gq,) = torch.autograd.grad(q, x, g)
    assert torch.equal(p, q) and torch.equal(gx, gq)
    assert torch.equal(entmax_bisect(x.detach().half(), alpha), exact(x.detach().half()))
    assert torch.allclose(entmax_bisect(x.detach(), alpha, mask=mask, n_iter=60), q.detach(), atol=1e-5)


def _by_output_share(monkeypatch, shares, calls: list, fn, scores, w) -> list:
    """For each ``nmt.sparse.entmax.SPARSE_OUTPUT_SHARE`` in ``shares``: ``fn(scores)`` in
    inference, in training, the gradient of ``<fn(scores), w>`` and how many ``calls`` the two
    calls added (a :func:`count_calls` list)."""
    import nmt.sparse.entmax as E

    results = []
    for share in shares:
        monkeypatch.setattr(E, "SPARSE_OUTPUT_SHARE", share)
        calls.clear()
        with torch.no_grad():
            p_inf = fn(scores)
        xs = scores.clone().requires_grad_()
        p = fn(xs)
        (p * w).nan_to_num().sum().backward()
        results.append((p_inf, p.detach(), xs.grad, len(calls)))
    return results


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [1000, 3963, 8192])  # short last blocks; whole blocks of 64
def test_entmax15_output_at_the_candidates_equals_the_dense_output(monkeypatch, count_calls, dtype, n):
    """Where every row is pruned by the torch pruning (CPU without the native library's long-row
    path), 1.5-entmax writes its output at the pruning's candidates
    only (zeros elsewhere): the same values, bit for bit, as the formula over every entry, in
    inference and training (gradients too); rows tied within rounding, shifted by 1e3, with -inf
    runs, a few dominant entries; with a near-uniform row (broad: the dense output for the batch)
    or a NaN row (all NaN)."""
    import nmt.sparse._threshold as T
    import nmt.sparse.entmax as E

    monkeypatch.setattr(E, "native_long_entmax15", lambda *args, **kwargs: None)
    monkeypatch.setattr(T, "bound_threshold", lambda *args, **kwargs: None)

    sparse_calls = count_calls(E, "_sqrt_probs_at")
    g = torch.Generator().manual_seed(n)
    x = torch.randn(7, n, generator=g, dtype=dtype) * 3
    x[1] = (x[1] * 4).round() / 4  # many ties, some at the threshold's neighbourhood
    x[2] += 1e3
    x[3, n // 3: n // 2] = float("-inf")
    x[4, :40:3] += 6.0  # a few dominant entries
    cases = {"pruned": x, "broad": torch.cat([x, torch.randn(1, n, generator=g, dtype=dtype) * 1e-3]),
             "nan": torch.cat([x, torch.full((1, n), float("nan"), dtype=dtype)])}
    shares = (E.SPARSE_OUTPUT_SHARE, -1.0)  # -1: never sparse (the dense formula)
    for name, scores in cases.items():
        w = torch.randn(scores.shape, generator=g, dtype=dtype)
        (a_inf, a, ga, calls), (b_inf, b, gb, dense_calls) = _by_output_share(
            monkeypatch, shares, sparse_calls, entmax15, scores, w)
        assert dense_calls == 0
        assert calls == (2 if name == "pruned" else 0), (name, calls)  # inference, training
        for u, v in ((a_inf, b_inf), (a, b), (ga, gb)):
            assert torch.equal(u.nan_to_num(-7.0), v.nan_to_num(-7.0)), name
        if name == "nan":
            assert bool(a[-1].isnan().all())
        assert torch.allclose(a[:7].sum(-1), torch.ones(7, dtype=dtype))


@pytest.mark.parametrize("impl", ["pruned", "static"])
@pytest.mark.parametrize("fn", [sparsemax, entmax15, lambda t, impl: entmax_bisect(t, 1.3, impl=impl)])
def test_long_rows_with_one_nan_or_inf_score_are_all_nan(fn, impl):
    """The contract of short rows holds for long (pruned) rows too: one NaN or +inf score makes
    the whole row NaN (the candidates skip that block, the block maxima do not); other rows
    are untouched."""
    x = torch.randn(4, 3000)
    x[1, 5], x[2, 2999], x[3, 700] = float("nan"), float("inf"), float("nan")
    x[3, 701] = float("inf")
    p = fn(x, impl=impl)
    assert bool(p[1:].isnan().all())
    assert not bool(p[0].isnan().any()) and abs(float(p[0].sum()) - 1) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("alpha", [1.25, 1.3, 1.7, 3.0])
def test_bisect_output_at_the_candidates_equals_the_dense_output(monkeypatch, count_calls, kkt, dtype, alpha):
    """Where every row is pruned (CPU), alpha-entmax at a float alpha (not 1.5 / 2) takes the
    power at the pruning's candidates only and renormalises over them: the same support (exact
    zeros at the same places) and values within rounding of the formula over every entry, in
    inference and training (gradients too); an n_iter cap too; a NaN row keeps the dense formula
    (all NaN). KKT conditions hold independently. The torch pruning is what float64 rows and
    machines without the native library take: float32 rows take it here with the fused native
    call off."""
    import nmt.sparse.entmax as E

    monkeypatch.setattr(E, "power_probs", lambda *args, **kwargs: None)
    calls = count_calls(E, "entmax_at_candidates")
    g = torch.Generator().manual_seed(int(alpha * 100))
    n = 3963  # a short last block
    x = torch.randn(6, n, generator=g, dtype=dtype) * 3
    x[1] += 1e3
    x[2, n // 3: n // 2] = float("-inf")
    x[3, :40:3] += 6.0
    tol = dict(rtol=1e-5, atol=1e-7) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-15)
    shares = (E.SPARSE_OUTPUT_SHARE, -1.0)  # -1: never sparse (the dense formula)
    for scores, n_iter, sparse in ((x, None, True), (x, 30, True),
                                   (torch.cat([x, torch.full((1, n), float("nan"), dtype=dtype)]), None, False)):
        w = torch.randn(scores.shape, generator=g, dtype=dtype)
        (a_inf, a, ga, n_sparse), (b_inf, b, gb, n_dense) = _by_output_share(
            monkeypatch, shares, calls, lambda t: entmax_bisect(t, alpha, n_iter=n_iter), scores, w)
        assert (n_sparse, n_dense) == ((2, 0) if sparse else (0, 0))
        for u, v in ((a_inf, b_inf), (a, b), (ga, gb)):
            assert torch.equal(u == 0, v == 0)
            assert torch.allclose(u.nan_to_num(-7.0), v.nan_to_num(-7.0), **tol)
        assert torch.equal(a_inf.nan_to_num(-7.0), a.nan_to_num(-7.0))  # inference == training
        if not sparse:
            assert bool(a[-1].isnan().all())
        elif n_iter is None:  # converged (a cap of 30 steps need not be)
            assert kkt(a, scores, alpha) < (1e-5 if dtype == torch.float32 else 1e-12)
