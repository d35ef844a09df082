"""The native threshold of long rows from the maximum's bound (``nmt.sparse._native.bound_threshold``,
``bound_entmax15`` and ``bound_sparsemax``, ``nmt/sparse/_newton_threshold.c``): exact thresholds
against a float64 sort on every vector path and with one or two threads; 1.5-entmax's and
sparsemax's outputs bit for bit the torch formula on the same threshold; rows it leaves unverified
solved by sorting; the mappings and their losses on long rows against the torch pruning path they
replace."""
import pytest
import torch

from nmt.sparse import _native, entmax15, sparsemax
from nmt.sparse._threshold import native_long_entmax15, native_long_sparsemax, sort_threshold
from nmt.sparse.losses import entmax15_loss, sparsemax_loss

NEG_INF = float("-inf")

needs_library = pytest.mark.skipif(not _native.available(), reason="native library not built")


def long_rows(n_rows: int, n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Raw scores of every kind: broad (near-uniform), random, peaked, one-hot, tied, offset by
    1e3, with -inf runs, of only -inf, with a NaN, with +inf."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.tensor([0.01, 0.3, 1.0, 3.0, 30.0]).repeat(n_rows // 5 + 1)[:n_rows, None]
    x = (torch.randn(n_rows, n, generator=g, dtype=torch.float64) * scale).to(dtype)
    x[1, 7] += 50.0  # one-hot: threshold -1 exactly
    x[2] = (x[2] * 4).round() / 4  # ties
    x[3] += 1e3
    x[4, : n // 2] = NEG_INF
    x[5] = NEG_INF
    x[6, 3] = float("nan")
    x[7, n // 3] = float("inf")
    return x


def _reference(x: torch.Tensor, q: float, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(tau, zmax) by the float64 sort of the shifted rows, relative to the maximum."""
    zmax = x.double().amax(dim=-1, keepdim=True)
    zmax = torch.where(zmax == NEG_INF, 0, zmax)
    return sort_threshold((x.double() - zmax) * scale, q)[:, 0], zmax[:, 0]


@needs_library
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.float64, 1e-13)])
@pytest.mark.parametrize("q,scale", [(2.0, 0.5), (1.0, 1.0), (2.0, 0.3)])
@pytest.mark.parametrize("n", [256, 1000, 3963])
def test_bound_threshold_equals_the_sorted_threshold(native_build, monkeypatch, dtype, tol, q, scale, n):
    monkeypatch.setitem(_native._state, "lib", native_build)
    x = long_rows(40, n, dtype, seed=n)
    exact_scale = scale in (0.5, 1.0)
    tau, zmax, ok = _native.bound_threshold(x, q, scale, exact_scale, 4 * n + 60)
    want_tau, want_zmax = _reference(x, q, scale)
    bad = torch.zeros(40, dtype=torch.bool)
    bad[6] = bad[7] = True  # NaN, +inf: zmax NaN (an all-NaN output)
    assert bool(zmax[bad].isnan().all()) and bool(ok.all())
    assert torch.equal(zmax[~bad].double(), want_zmax[~bad])
    assert tau[5] == float("inf") and zmax[5] == 0  # no finite entry: all zeros
    live = ~bad
    live[5] = False
    assert torch.allclose(tau[live].double(), want_tau[live], rtol=0, atol=tol)
    # the same supports as the exact threshold (entries tied at it within rounding aside)
    v = (x[live].double() - want_zmax[live, None]) * scale
    margin = (v - want_tau[live, None]).abs() > 10 * tol
    assert torch.equal((v > tau[live, None].double()) & margin, (v > want_tau[live, None]) & margin)


def pruned_rows(n_rows: int, n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Rows that test the bound from the segments' maxima: broad ones (standard normal scores
    times 0.003 to 0.3: output layers early in training, thousands of entries within 1 of the
    maximum), equal ones (every entry in the support), rows whose support is one entry a segment
    (the maxima's threshold is then the row's: the cut must stay below it), rows with a support
    entry in the tail after the last whole vector, and ordinary ones."""
    g = torch.Generator().manual_seed(seed)
    spreads = torch.tensor([0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0], dtype=torch.float64)
    x = torch.randn(n_rows, n, generator=g, dtype=torch.float64) * spreads.repeat(n_rows // 7 + 1)[:n_rows, None]
    x[0] = 0.25  # all equal
    x[1] = torch.linspace(0.0, 1e-4, n, dtype=torch.float64)  # equal within rounding of float32
    for r, step in ((2, 64), (3, 61), (4, 257)):  # the support spread over the segments
        x[r] = -5.0
        x[r, ::step] = torch.rand(len(range(0, n, step)), generator=g, dtype=torch.float64) * 0.05
    x[5] = -5.0
    x[5, -1], x[5, -2], x[5, 0] = 0.3, 0.2, 0.25  # in the tail
    return x.to(dtype)


@needs_library
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.float64, 1e-13)])
@pytest.mark.parametrize("q,scale", [(2.0, 0.5), (1.0, 1.0), (2.0, 0.3)])
@pytest.mark.parametrize("n", [1000, 4099, 8000])
def test_rows_pruned_by_the_segment_maxima_are_exact_and_verified(native_build, monkeypatch, dtype, tol, q, scale, n):
    """Thresholds from the candidates above the segments' maxima's threshold (and, on broad rows,
    from the candidates' mean bound) equal the float64 sort's, every row verified (no fallback to
    sorting), the supports the same."""
    monkeypatch.setitem(_native._state, "lib", native_build)
    x = pruned_rows(42, n, dtype, seed=n)
    tau, zmax, ok = _native.bound_threshold(x, q, scale, scale in (0.5, 1.0), 4 * n + 60)
    want_tau, want_zmax = _reference(x, q, scale)
    v = (x.double() - want_zmax[:, None]) * scale
    # verified wherever no entry is within a few ulps of the threshold (such ties are left to sorting)
    tied = ((v - want_tau[:, None]).abs() <= 8 * torch.finfo(dtype).eps).any(dim=-1)
    assert bool(ok[~tied].all())
    assert torch.equal(zmax.double(), want_zmax)
    assert torch.allclose(tau[ok].double(), want_tau[ok], rtol=0, atol=tol)
    margin = (v - want_tau[:, None]).abs() > 10 * tol
    assert torch.equal(((v > tau[:, None].double()) & margin)[ok], ((v > want_tau[:, None]) & margin)[ok])
    if q == 1.0:  # all equal: 1 / n below the maximum
        assert abs(float(tau[0]) + 1.0 / n) <= tol


@needs_library
@pytest.mark.parametrize("mapping", ["entmax15", "sparsemax"])
def test_one_and_two_threads_give_the_same_results(monkeypatch, mapping):
    x = long_rows(64, 3000, torch.float32, seed=5)

    def run():
        if mapping == "entmax15":
            return _native.bound_entmax15(x, 20000, True, True)
        return _native.bound_sparsemax(x, 20000, True)

    one = run()
    monkeypatch.setattr(_native, "NEWTON_SPLIT_MIN_NUMEL", 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        two = run()
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(one, two):
        assert torch.equal(a.nan_to_num(-7.0), b.nan_to_num(-7.0))


@needs_library
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_entmax15_outputs_are_the_torch_formula_bit_for_bit(native_build, monkeypatch, dtype):
    """p and r written by the native pass equal ``[x/2 - zmax/2 - tau]_+`` and its square as the
    torch forward rounds them, on the native threshold; the row sums of p^1.5 agree."""
    monkeypatch.setitem(_native._state, "lib", native_build)
    x = long_rows(30, 1003, dtype, seed=11)  # a tail after the vector chunks
    tau, zmax, ok, p, r, cube = _native.bound_entmax15(x, 20000, True, True)
    assert bool(ok.all())
    want_r = torch.add(-0.5 * zmax[:, None], x, alpha=0.5).sub_(tau[:, None]).clamp_(min=0)
    assert torch.equal(r.nan_to_num(-7.0), want_r.nan_to_num(-7.0))
    assert torch.equal(p.nan_to_num(-7.0), (want_r * want_r).nan_to_num(-7.0))
    fine = ~torch.isnan(zmax)
    assert torch.allclose(cube[fine].double(), (want_r * want_r * want_r).double().sum(-1)[fine], rtol=1e-5)
    assert torch.allclose(p[fine].sum(-1).double()[torch.arange(30)[fine] != 5],
                          torch.ones(int(fine.sum()) - 1, dtype=torch.float64), atol=1e-5)


@needs_library
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sparsemax_outputs_are_the_torch_formula_bit_for_bit(native_build, monkeypatch, dtype):
    """p written by the native pass equals ``[(x - zmax) - tau]_+`` as the torch forward rounds it,
    on the native threshold (sparsemax's, against a float64 sort); the row sums of p^2 agree."""
    monkeypatch.setitem(_native._state, "lib", native_build)
    x = long_rows(30, 1003, dtype, seed=11)  # a tail after the vector chunks
    tau, zmax, ok, p, squares = _native.bound_sparsemax(x, 20000, True)
    assert bool(ok.all())
    want = torch.sub(x, zmax[:, None]).sub_(tau[:, None]).clamp_(min=0)
    assert torch.equal(p.nan_to_num(-7.0), want.nan_to_num(-7.0))
    fine = ~torch.isnan(zmax)
    assert bool(p[~fine].isnan().all())  # NaN / +inf rows: all NaN
    assert torch.allclose(squares[fine].double(), (want * want).double().sum(-1)[fine], rtol=1e-5)
    live = fine & (torch.arange(30) != 5)  # row 5 has no finite entry: all zeros
    assert torch.equal(p[5], torch.zeros(1003, dtype=dtype))
    assert torch.allclose(p[live].sum(-1).double(), torch.ones(int(live.sum()), dtype=torch.float64), atol=1e-5)
    want_tau, _ = _reference(x, 1.0, 1.0)
    assert torch.allclose(tau[live].double(), want_tau[live], atol=2e-6 if dtype == torch.float32 else 1e-13)
    assert _native.bound_sparsemax(x, 20000, False)[4] is None


@needs_library
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("q,scale", [(2.0, 0.5), (1.0, 1.0)])
def test_unverified_rows_carry_a_lower_bound_and_sort_to_the_threshold(native_build, monkeypatch, dtype, q, scale):
    """A row left unverified (here: the Newton loop capped at one step; in use, entries within
    rounding of the threshold) returns a lower bound in tau: no support entry at or below it, so
    the sort of the entries above it alone gives the float64 sort's threshold of the whole row
    (what the callers do)."""
    monkeypatch.setitem(_native._state, "lib", native_build)
    x = pruned_rows(42, 3000, dtype, seed=5)[6:]  # broad to peaked rows
    tau, zmax, ok = _native.bound_threshold(x, q, scale, True, 1)
    want_tau, want_zmax = _reference(x, q, scale)
    bad = ~ok
    assert int(bad.sum()) >= 10
    assert bool((tau[bad].double() < want_tau[bad]).all())
    v = (x.double() - want_zmax[:, None]) * scale
    assert bool(((v > want_tau[:, None]) <= (v > tau[:, None].double()))[bad].all())  # the support above it
    shifted = torch.add(-scale * zmax[:, None], x, alpha=scale)
    masked = shifted[bad].masked_fill(shifted[bad] <= tau[bad, None], float("-inf"))
    assert torch.allclose(sort_threshold(masked, q)[:, 0].double(), want_tau[bad],
                          rtol=0, atol=2e-6 if dtype == torch.float32 else 1e-13)


@needs_library
@pytest.mark.parametrize("mapping", ["entmax15", "sparsemax"])
def test_unverified_rows_are_solved_by_sorting(monkeypatch, mapping):
    """Rows the native loop flags (here: forced, with the native pass's lower bound -1 - 2^-10 left
    in tau, or a tighter one just below the threshold) get the sorted threshold and the torch formula."""
    x = long_rows(20, 700, torch.float64, seed=2)[8:]  # finite rows
    real = getattr(_native, f"bound_{mapping}")

    def flag_some(*args):
        tau, zmax, ok, p, *rest = real(*args)
        ok[::3] = False
        p[::3] = float("nan")  # what the native pass left unwritten; tau: a lower bound there
        tau[::3] = torch.where(torch.arange(len(tau))[::3] % 2 == 0, -1.0 - 2.0 ** -10, tau[::3] - 1e-3)
        for t in rest:
            if t is not None:
                t[::3] = float("nan")
        return (tau, zmax, ok, p, *rest)

    monkeypatch.setattr(f"nmt.sparse._threshold.bound_{mapping}", flag_some)
    if mapping == "entmax15":
        p, r, cube, tau, zmax = native_long_entmax15(x, root=True, cube=True)
        want_tau, _ = _reference(x, 2.0, 0.5)
        want_r = torch.add(-0.5 * zmax[:, None], x, alpha=0.5).sub_(tau[:, None]).clamp_(min=0)
        assert torch.equal(r, want_r) and torch.equal(p, want_r * want_r)
        assert torch.allclose(cube, (want_r ** 3).sum(-1), rtol=1e-12)
    else:
        p, squares, tau, zmax = native_long_sparsemax(x, squares=True)
        want_tau, _ = _reference(x, 1.0, 1.0)
        want_p = torch.sub(x, zmax[:, None]).sub_(tau[:, None]).clamp_(min=0)
        assert torch.equal(p, want_p)
        assert torch.allclose(squares, (want_p ** 2).sum(-1), rtol=1e-12)
    assert torch.allclose(tau, want_tau, atol=1e-13)


@needs_library
@pytest.mark.parametrize("mapping", ["entmax15", "sparsemax"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
def test_mapping_and_loss_on_long_rows_equal_the_torch_pruning_path(monkeypatch, count_calls, dtype, tol, mapping):
    """The mapping (forward, gradient) and its loss (value, gradient) on long rows by the native
    pass against the torch pruning path they replace (the native long-row path switched off); the
    native pass is the one taken."""
    import nmt.sparse._threshold as T
    import nmt.sparse.entmax as E
    import nmt.sparse.losses as L
    import nmt.sparse.sparsemax as S

    f, loss_f = (entmax15, entmax15_loss) if mapping == "entmax15" else (sparsemax, sparsemax_loss)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 3963, generator=g, dtype=dtype) * torch.tensor([0.05, 1.0, 6.0], dtype=dtype).repeat(16)[:, None]
    target = torch.randint(0, 3963, (48,), generator=g)
    w = torch.randn(48, 3963, generator=g, dtype=dtype)

    def run():
        xs = x.clone().requires_grad_()
        p = f(xs)
        (p * w).sum().backward()
        xl = x.clone().requires_grad_()
        loss = loss_f(xl, target, reduction="none")
        loss.sum().backward()
        with torch.no_grad():
            p_inf = f(x)
        return p.detach(), xs.grad, loss.detach(), xl.grad, p_inf

    calls = count_calls(T, f"bound_{mapping}")
    native = run()
    assert len(calls) == 3  # training forward, loss, inference forward
    for module in (E, L, S):
        for name in ("native_long_entmax15", "native_long_sparsemax"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, lambda *args, **kwargs: None)
    monkeypatch.setattr(T, "bound_threshold", lambda *args, **kwargs: None)
    torch_path = run()
    for a, b in zip(native, torch_path):
        assert torch.allclose(a, b, rtol=1e-4, atol=tol)
    assert torch.equal(native[0] > 0, torch_path[0] > 0)


@needs_library
def test_a_compiler_without_openmp_builds_the_library_for_one_thread(monkeypatch, tmp_path):
    """The OpenMP flags refused (here: a flag the compiler does not know): the library is built
    without them, and its long-row threshold gives the same results on one thread."""
    monkeypatch.setattr(_native, "OPENMP_FLAGS", ("-fno-such-option-for-nmt",))
    lib = _native.load(_native.build(tmp_path))
    x = long_rows(24, 2000, torch.float32, seed=9)
    want = _native.bound_entmax15(x, 20000, True, True)
    monkeypatch.setitem(_native._state, "lib", lib)
    monkeypatch.setattr(_native, "NEWTON_SPLIT_MIN_NUMEL", 1)
    got = _native.bound_entmax15(x, 20000, True, True)
    for a, b in zip(got, want):
        assert torch.equal(a.nan_to_num(-7.0), b.nan_to_num(-7.0))


def _numpy_threshold(v, q: float) -> float:
    """The exact threshold of one row ``v`` (float64 NumPy, ``-inf`` allowed) by sorting, written
    here from the definition: the largest support size ``k`` whose closed form ``t_k`` keeps the
    k-th largest entry above it (q = 1: ``sum_{i<=k} (v_i - t) = 1``; q = 2: ``sum (v_i - t)^2 =
    1``, the smaller root), that closed form then taken again about the support's mean (``t = c -
    sqrt((1 - sum (v_i - c)^2) / k)``: the prefix sums' form cancels on rows of many equal scores)."""
    import numpy as np

    z = np.sort(v[np.isfinite(v)])[::-1]
    k = np.arange(1, len(z) + 1, dtype=np.float64)
    s1 = np.cumsum(z)
    if q == 1.0:
        t = (s1 - 1.0) / k
        good = z > t
    else:
        disc = s1 * s1 - k * (np.cumsum(z * z) - 1.0)
        t = (s1 - np.sqrt(np.maximum(disc, 0.0))) / k
        good = (disc >= 0) & (z > t)
    size = int(np.nonzero(good)[0][-1]) + 1
    support = z[:size]
    c = support.mean()
    if q == 1.0:
        return float(c - 1.0 / size)
    return float(c - np.sqrt((1.0 - ((support - c) ** 2).sum()) / size))


def narrow_rows(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Broad and dense rows (most or all entries in the support): normal scores of deviation 1e-6
    to 0.05 (an output layer at initialisation), uniform, Gumbel and reflected-Gumbel (one-sided
    tails: the normal guess above the threshold on these), Student-t (3) and bimodal ones; all equal;
    one outlier above an equal rest; two levels; an offset of 2^20 (float32 rounds the scores to
    ties); half the row -inf (a mask); entries exactly at the threshold (4,096 zeros and the others
    at 2 tau, tau = -1/64 for 1.5-entmax, which halves the scores; at tau = -1/4096 for sparsemax)."""
    g = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    rows = []
    for spread in (1e-6, 1e-4, 1e-3, 3e-3, 0.01, 0.02, 0.05):
        rows.append(torch.randn(n, generator=g, dtype=f64) * spread)
    u = torch.rand(6, n, generator=g, dtype=f64).clamp_(1e-12, 1 - 1e-12)
    gumbel = -torch.log(-torch.log(u))
    for spread in (0.003, 0.01, 0.03):
        rows.append((u[0] * 2 - 1) * spread * 1.7)
        rows.append(gumbel[1] * spread)
        rows.append(-gumbel[2] * spread)
    t3 = torch.distributions.StudentT(3.0).sample((n,)).to(f64)  # global RNG: seeded by pytest's fixtures
    rows.append(t3 * 0.003)
    rows.append(torch.cat([torch.randn(n // 2, generator=g, dtype=f64), torch.randn(n - n // 2, generator=g, dtype=f64) + 3]) * 0.003)
    rows.append(torch.full((n,), 0.25, dtype=f64))  # all equal
    one = torch.full((n,), -0.5, dtype=f64)
    one[n // 3] = 0.4  # one outlier above an equal rest
    rows.append(one)
    two = torch.zeros(n, dtype=f64)
    two[::2] = -1e-3  # two levels
    rows.append(two)
    rows.append(torch.randn(n, generator=g, dtype=f64) * 0.01 + 2.0 ** 20)
    masked = torch.randn(n, generator=g, dtype=f64) * 0.003
    masked[: n // 2] = NEG_INF
    rows.append(masked)
    tie = torch.full((n,), -2.0 / 64, dtype=f64)
    tie[:4096] = 0.0
    rows.append(tie)
    tie = torch.full((n,), -1.0 / 4096, dtype=f64)  # sparsemax's: tau = -1/4096
    tie[:4096] = 0.0
    rows.append(tie)
    return torch.stack(rows).to(dtype)


@needs_library
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.float64, 1e-13)])
@pytest.mark.parametrize("q,scale", [(2.0, 0.5), (1.0, 1.0)])
@pytest.mark.parametrize("n", [8000, 32003])
def test_dense_and_narrow_rows_are_exact_and_verified(native_build, monkeypatch, dtype, tol, q, scale, n):
    """Rows whose support is most or all of the row (the dense rows' closed form from the
    candidates' moments, verified by their minimum; the Newton loop from the normal guess, above
    the threshold or below it; its stricter stop where the first closed form failed): thresholds
    equal to a float64 sort written from the definition, every row verified where no entry lies
    within a few ulps of the threshold, the supports the same; the mapping's output (the caller
    sorts what is left unverified) equal to the formula on that threshold."""
    import numpy as np

    monkeypatch.setitem(_native._state, "lib", native_build)
    x = narrow_rows(n, dtype, seed=n)
    tau, zmax, ok = _native.bound_threshold(x, q, scale, True, 4 * n + 60)
    xd = x.double()
    want_zmax = xd.amax(dim=-1)
    v = (xd - want_zmax[:, None]) * scale
    want_tau = torch.tensor([_numpy_threshold(row.numpy(), q) for row in v], dtype=torch.float64)
    tied = ((v - want_tau[:, None]).abs() <= 8 * torch.finfo(dtype).eps * want_tau.abs().clamp(min=1.0)[:, None]).any(-1)
    assert bool(tied[-2 if q == 2.0 else -1])  # entries at the threshold
    assert bool(ok[~tied].all()), (~ok).nonzero()[:, 0].tolist()
    assert torch.equal(zmax.double(), want_zmax)
    assert torch.allclose(tau[ok].double(), want_tau[ok], rtol=0, atol=tol)
    margin = (v - want_tau[:, None]).abs() > 10 * tol
    assert torch.equal(((v > tau[:, None].double()) & margin)[ok], ((v > want_tau[:, None]) & margin)[ok])
    if q == 2.0:  # the mapping, unverified rows sorted: p = [v - tau]_+^2 summing to 1
        p, r, cube, tau_m, _ = native_long_entmax15(x, root=True, cube=True)
        want_p = (v - want_tau[:, None]).clamp(min=0) ** 2
        assert torch.allclose(p.double(), want_p, rtol=0, atol=20 * tol)
        assert torch.allclose(p.double().sum(-1), torch.ones(len(x), dtype=torch.float64), atol=1e-4)


@needs_library
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_narrow_rows_compute_in_float32(dtype):
    """Half-precision broad rows: 1.5-entmax of the float32 values of the half scores (the native
    pass on them), against the float64 sort of those values."""
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(12, 8000, generator=g) * torch.tensor([0.003, 0.01, 0.03]).repeat(4)[:, None]).to(dtype)
    p = entmax15(x)
    assert p.dtype == dtype
    v = (x.double() - x.double().amax(-1, keepdim=True)) * 0.5
    want_tau = torch.tensor([_numpy_threshold(row.numpy(), 2.0) for row in v], dtype=torch.float64)
    want = ((v - want_tau[:, None]).clamp(min=0) ** 2).to(dtype)
    assert torch.allclose(p.double(), want.double(), rtol=2e-2, atol=1e-5)
    assert torch.equal(p > 0, want > 0) or int(((p > 0) != (want > 0)).sum()) <= 12  # rounding at the edge
