"""The native Newton threshold for any power q > 1 (alpha-entmax, alpha in (1, 2);
``nmt/sparse/_power_threshold.c`` through ``nmt.sparse._native.power_threshold``, the fused
mapping ``power_probs`` and its backward ``power_backward``): thresholds checked against a float64
bisection on every vector path, short rows by blocks equal to row by row, long rows pruned, the step
cap, NaN and empty rows, threads; the front door and the Tsallis loss take it for float32 rows."""
import pytest
import torch

from nmt.sparse import _native, _threshold, entmax_bisect
from nmt.sparse import entmax as entmax_module
from nmt.sparse.entmax import entmax_bisect_above_one
from tests.sparse.test_power_series_start import bisection

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
    float32, forward and backward: short rows take the fused native call (by blocks), longer ones
    the fused call too (pruned row by row), and the result satisfies alpha-entmax's optimality conditions,
    equals the reference package's bisection and, with the library disabled, the torch loop's
    result, gradients included."""
    if not _native.available():
        pytest.skip("native library not built")
    calls = []
    real_threshold, real_probs = _native.power_threshold, _native.power_probs
    monkeypatch.setattr(_threshold, "power_threshold",
                        lambda *a, **k: calls.append("threshold") or real_threshold(*a, **k))
    monkeypatch.setattr(entmax_module, "power_probs", lambda *a, **k: calls.append("probs") or real_probs(*a, **k))
    g = torch.Generator().manual_seed(4)
    for n, kind in ((20, "probs"), (300, "probs"), (3000, "probs")):
        x = torch.randn(64, n, generator=g) * 2
        for alpha in (1.2, 1.7):
            calls.clear()
            p = entmax_bisect(x, alpha)
            assert kind in calls, (n, alpha, calls)
            assert kkt(p, x, alpha) < 1e-5
            want = ref.entmax_bisect(x.double(), alpha, n_iter=100).float()
            assert torch.allclose(p, want, atol=2e-6)
    # gradients through the native calls, then the same through the torch loop (library disabled)
    x = torch.randn(64, 20, generator=g) * 2
    long_x = torch.randn(16, 700, generator=g) * 2
    heads = torch.randn(3, 4, 5, 9, generator=g) * 2
    grad, grad_heads = torch.randn(64, 20, generator=g), torch.randn(3, 4, 5, 9, generator=g)
    grad_long = torch.randn(16, 700, generator=g)
    alphas = torch.tensor([1.1, 1.35, 1.6, 1.95]).view(1, 4, 1, 1)
    out = {}
    for native in (True, False):
        if not native:
            monkeypatch.setitem(_native._state, "lib", None)
        calls.clear()
        xi, hi, ai = x.clone().requires_grad_(), heads.clone().requires_grad_(), alphas.clone().requires_grad_()
        li = long_x.clone().requires_grad_()
        p, ph, pl = entmax_bisect(xi, 1.3), entmax_bisect_above_one(hi, ai), entmax_bisect(li, 1.3)
        torch.autograd.backward((p, ph, pl), (grad, grad_heads, grad_long))
        assert (calls == ["probs", "probs", "probs"]) == native, calls
        out[native] = (p, ph, pl, xi.grad, hi.grad, ai.grad, li.grad)
    for i, (a, b) in enumerate(zip(out[True], out[False])):  # alpha's gradient (5): the torch loop's is 4e-5 off
        assert torch.allclose(a, b, atol=1e-4 if i == 5 else 2e-5), (i, (a - b).abs().max())
    hd, ad = heads.double().requires_grad_(), alphas.double().requires_grad_()
    torch.autograd.backward(entmax_bisect_above_one(hd, ad), grad_heads.double())
    assert torch.allclose(out[True][5].double(), ad.grad, rtol=0, atol=1e-6)  # the native one: within 2e-7
    assert torch.allclose(out[True][4].double(), hd.grad, rtol=0, atol=1e-6)


@pytest.mark.parametrize("n", [1, 3, 20, 256, 257, 1000, 4103])
def test_power_probs_equal_the_static_mapping(native_build, monkeypatch, n):
    """The fused call (maximum, shift, threshold, r and p) on every vector path, float and per-row
    alphas, short rows (by blocks) and long ones (pruned, row by row; a partial last chunk), against
    the static torch path (fixed bisection steps, float32) and a float64 bisection: NaN / +inf rows
    all NaN, rows without a finite entry all zeros, partly masked rows; r = [z - tau]_+ with
    p = r^q / sum r^q; the stats (threshold, maximum, sum r^q) against their definitions."""
    monkeypatch.setitem(_native._state, "lib", native_build)
    g = torch.Generator().manual_seed(n)
    x = torch.randn(13, n, generator=g) * 3
    x[2] = NEG_INF
    x[4, n // 2] = float("nan")
    x[5, n - 1] = float("inf")
    if n > 2:
        x[6, : n // 2] = NEG_INF
    bad = torch.zeros(13, dtype=torch.bool)
    bad[4] = bad[5] = True
    alphas = torch.linspace(1.05, 1.95, 13)
    for am1 in (0.3, alphas - 1):
        found = _native.power_probs(x, am1, 200, EPS, root=True)
        if native_build is None or found is None:
            assert found is None or native_build is None
            continue
        p, r = found
        alpha = am1 + 1 if isinstance(am1, float) else alphas[:, None]
        want = entmax_bisect(x, alpha, impl="static")
        assert torch.equal(p.isnan(), want.isnan()) and bool(p[bad].isnan().all()) and bool(r[bad].isnan().all())
        assert torch.equal(p[2], torch.zeros(n)) and torch.equal(r[2], torch.zeros(n))
        ok = ~bad
        assert torch.allclose(p[ok], want[ok], atol=4e-7), (p[ok] - want[ok]).abs().max()
        q = 1 / (am1 if isinstance(am1, float) else am1[:, None])
        rq = r[ok].double().pow(q if isinstance(q, float) else q[ok].double())
        assert torch.allclose(p[ok].double(), rq / rq.sum(dim=-1, keepdim=True).clamp(min=1e-300), atol=1e-7)
        p2, r2, tau, zmax, total, p_sum, pr = _native.power_probs(x, am1, 200, EPS, root=True, stats=True)
        p3 = _native.power_probs(x, am1, 200, EPS, root=False, stats=True)[0]
        assert all(torch.equal(u.nan_to_num(7.0), v.nan_to_num(7.0)) for u, v in ((p2, p), (r2, r), (p3, p)))
        am1_rows = torch.full((13,), am1, dtype=torch.float64) if isinstance(am1, float) else am1.double()
        live = ok.clone()
        live[2] = False  # no finite entry
        z = (x.double() - x.double().amax(dim=-1, keepdim=True)) * am1_rows[:, None]
        want_tau = bisection(z[live], 1 / am1_rows[live])
        assert torch.allclose(tau[live].double(), want_tau, rtol=0, atol=8 * EPS)
        assert torch.equal(zmax[live], x[live].amax(dim=-1))
        assert torch.allclose(total[live].double(), rq[live[ok]].sum(dim=-1), rtol=1e-5)
        assert torch.allclose(p_sum[live].double(), p[live].double().sum(dim=-1), rtol=0, atol=1e-6)
        assert torch.allclose(pr[live].double(), (p[live].double() * r[live].double()).sum(dim=-1), rtol=1e-6, atol=1e-9)
        assert [float(v[2]) for v in (tau, zmax, total, p_sum, pr)] == [float("inf"), 0.0, 0.0, 0.0, 0.0]
        assert bool((tau[bad] == -1).all()) and all(bool(v[bad].isnan().all()) for v in (zmax, total, p_sum, pr))


@pytest.mark.parametrize("n", [1, 2, 17, 50, 256, 300, 1003, 4099])
def test_coarse_float_steps_stay_below_the_root(native_build, monkeypatch, n):
    """Short rows (blocks) at the uncapped loop start from the power mean's bound where it beats -1,
    take Newton steps with float sums, each shortened by a margin, then the double loop on the entries above the coarse threshold alone, the output
    written at their places; long rows (more than 256 entries) take such steps on their candidates
    (from the segment maxima's bound or the candidates' mean bound) before their double loop: on every vector path, alphas 1.02 to 1.98 per row (those below 1.111
    take no coarse step), spreads from near-flat (long coarse steps from -1) to peaked (the root at
    -1: none), ties, -inf runs and odd lengths, the threshold is the float64 root's from below
    (above it by at most float32's eps: a block's float step after the coarse ones, the AVX-512
    functions', may settle from above within the loop's tolerance; and the float's rounding), the
    support is the root's entry for entry away
    from its boundary, and p, r and s = r^(q - 1) are the float64 mapping's at the root. A cap of 19
    steps (no coarse steps: the double loop's own iterates) gives the same within the loop's
    tolerance; s is r's power (r, near the boundary, as exact as tau's float rounding lets it be)."""
    monkeypatch.setitem(_native._state, "lib", native_build)
    rows = 96
    g = torch.Generator().manual_seed(7 * n + 1)
    alphas = 1.02 + 0.96 * torch.rand(rows, generator=g, dtype=torch.float64)
    spread = torch.logspace(-2.5, 1.5, rows, dtype=torch.float64)[torch.randperm(rows, generator=g)]
    x = (torch.randn(rows, n, generator=g, dtype=torch.float64) * spread[:, None]).float()
    if n > 3:
        x[1, : n // 2] = NEG_INF
        x[2] = (x[2] * 4).round() / 4
        x[3, :2] = x[3].max()  # two maxima
    found = _native.power_probs(x, alphas - 1, 200, EPS, root=True, stats=True, weights=True)
    if native_build is None or found is None:
        assert found is None or native_build is None
        return
    p, r, s, tau = found[:4]
    z = (x.double() - x.double().amax(dim=-1, keepdim=True)) * (alphas - 1)[:, None]
    q = 1 / (alphas - 1)
    want = bisection(z, q)
    assert bool((tau.double() <= want + EPS).all()), (tau.double() - want).max()
    assert torch.allclose(tau.double(), want, rtol=0, atol=8 * EPS), (tau.double() - want).abs().max()
    d = z - want[:, None]
    rq = d.clamp(min=0).pow(q[:, None])
    want_p = rq / rq.sum(dim=-1, keepdim=True)
    # away from the boundary, and not below float32's range (alpha near 1: r^25 of r = 0.01)
    clear = (d.abs() > 1e-5) & ((d < 0) | (want_p > 1e-30))
    assert torch.equal((p > 0)[clear], (d > 0)[clear]) and torch.equal((s > 0)[clear], (d > 0)[clear])
    assert torch.allclose(p.double(), want_p, rtol=0, atol=4e-7)
    assert torch.allclose(r.double(), d.clamp(min=0), rtol=0, atol=4e-6)
    want_s = r.double().pow(q[:, None] - 1)  # r's float rounding moves it by (q - 1) ulps
    assert bool(((s.double() - want_s).abs() <= (1e-6 + 2e-7 * q[:, None]) * want_s + 1e-30).all())
    p19, _, _, tau19 = _native.power_probs(x, alphas - 1, 19, EPS, root=True, stats=True, weights=True)[:4]
    assert torch.allclose(tau19.double(), want, rtol=0, atol=8 * EPS)
    assert torch.allclose(p19, p, rtol=0, atol=4e-7)
    sizes = (p > 0).sum(dim=-1)
    if n >= 50:
        assert int(sizes.min()) == 1 and int(sizes.max()) >= n // 2  # peaked and broad rows both met


@pytest.mark.parametrize("n", [257, 1003, 8000])
def test_long_rows_write_the_output_at_their_candidates_places(native_build, monkeypatch, n):
    """Long rows take their output from the Newton loop's last pass at the candidates it kept (their
    places carried through every drop), not from a pass over the row: on every vector path, rows
    from peaked (one entry in the support) to broad (every entry in it), tied and -inf runs, the
    support is the float64 bisection's entry for entry (away from its boundary), and p and r match
    the float64 mapping at that threshold."""
    monkeypatch.setitem(_native._state, "lib", native_build)
    rows = 9
    alphas = torch.linspace(1.1, 1.9, rows, dtype=torch.float64)
    x = shifted_rows(rows, n, torch.ones(rows, dtype=torch.float64), seed=3 * n) / 0.3  # spreads 0.17 to 20
    found = _native.power_probs(x, alphas - 1, 200, EPS, root=True)
    if native_build is None or found is None:
        assert found is None or native_build is None
        return
    p, r = found
    z = (x.double() - x.double().amax(dim=-1, keepdim=True)) * (alphas - 1)[:, None]
    q = 1 / (alphas - 1)
    tau = bisection(z, q)[:, None]
    d = z - tau
    clear = d.abs() > 1e-5  # entries whose side of the threshold float32 rounding cannot change
    assert torch.equal((p > 0)[clear], (d > 0)[clear]) and torch.equal((r > 0)[clear], (d > 0)[clear])
    rq = d.clamp(min=0).pow(q[:, None])
    assert torch.allclose(p.double(), rq / rq.sum(dim=-1, keepdim=True), rtol=0, atol=4e-7)
    assert torch.allclose(r.double(), d.clamp(min=0), rtol=0, atol=4e-6)
    assert bool((p[:, : n // 2][1] == 0).all())  # the -inf run
    sizes = (p > 0).sum(dim=-1)
    assert int(sizes.min()) <= 3 and int(sizes.max()) >= n // 2  # peaked and broad rows both met


def test_power_probs_leave_other_dtypes_and_a_missing_library_to_the_torch_path(monkeypatch):
    if not _native.available():
        pytest.skip("native library not built")
    for n in (20, 256, 257, 3000):
        assert _native.power_probs(torch.randn(3, n), 0.3, 200, EPS, root=False) is not None
        assert _native.power_probs(torch.randn(3, n).double(), 0.3, 200, EPS, root=False) is None
        assert _native.power_backward(torch.rand(3, n), torch.randn(3, n), 1.5) is not None
        assert _native.power_backward(torch.rand(3, n).double(), torch.randn(3, n), 1.5) is None
    monkeypatch.setitem(_native._state, "lib", None)
    assert _native.power_probs(torch.randn(3, 20), 0.3, 200, EPS, root=False) is None
    assert _native.power_backward(torch.rand(3, 20), torch.randn(3, 20), 1.5) is None


def test_power_probs_over_two_threads_and_with_a_step_cap_match(monkeypatch):
    """The fused call's rows split over two threads give the same bits; with ``n_iter`` (a cap on
    the Newton steps, the output renormalised) the front door's native result equals the torch
    loop's at the same cap."""
    if not _native.available():
        pytest.skip("native library not built")
    g = torch.Generator().manual_seed(9)
    for n in (30, 900):
        x = torch.randn(203, n, generator=g) * 2
        grad = torch.randn(203, n, generator=g)
        one = _native.power_probs(x, 0.3, 200, EPS, root=True)
        back_one = _native.power_backward(one[1], grad, 7 / 3)[0]
        with monkeypatch.context() as m:
            m.setattr(_native, "POWER_SPLIT_MIN_NUMEL", 1)
            threads = torch.get_num_threads()
            torch.set_num_threads(2)
            try:
                two = _native.power_probs(x, 0.3, 200, EPS, root=True)
                back_two = _native.power_backward(one[1], grad, 7 / 3)[0]
            finally:
                torch.set_num_threads(threads)
        assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1]) and torch.equal(back_one, back_two)
        for n_iter in (1, 2):
            native = entmax_bisect(x, 1.3, n_iter=n_iter)
            with monkeypatch.context() as m:
                m.setitem(_native._state, "lib", None)
                torch_loop = entmax_bisect(x, 1.3, n_iter=n_iter)
            # long rows: both loops start from a lower bound of block maxima (not the same blocks)
            if n < 256:
                assert torch.allclose(native, torch_loop, atol=1e-6), (n_iter, (native - torch_loop).abs().max())
            assert torch.allclose(native.sum(-1), torch.ones(203), atol=1e-6)


@pytest.mark.parametrize("n", [30, 600])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_the_tsallis_loss_takes_the_fused_call(monkeypatch, smoothing, n, ref):
    """entmax_bisect_loss at alpha 1.3 / 1.8 on float32 rows, short and long (index and distribution targets,
    rows with -inf scores, ignored targets): the fused native call serves it, and the losses and
    gradients equal those of the torch loop (library disabled) and the reference package's loss."""
    if not _native.available():
        pytest.skip("native library not built")
    from nmt.sparse import entmax_bisect_loss, losses

    calls = []
    real = _native.power_probs

    def served(*a, **k):  # records whether the native call served the loss
        found = real(*a, **k)
        calls.append(k.get("stats") and found is not None)
        return found

    monkeypatch.setattr(losses, "power_probs", served)
    g = torch.Generator().manual_seed(12)
    x = torch.randn(40, n, generator=g) * 2
    x[3, :10] = NEG_INF
    target = torch.randint(10, n, (40,), generator=g)
    target[5] = -100
    dist = torch.softmax(torch.randn(40, n, generator=g), dim=-1)
    for alpha in (1.3, 1.8):
        out = {}
        for native in (True, False):
            if not native:
                monkeypatch.setitem(_native._state, "lib", None)
            calls.clear()
            xi, xd = x.clone().requires_grad_(), x.clone().requires_grad_()
            li = entmax_bisect_loss(xi, target, alpha=alpha, label_smoothing=smoothing, reduction="none")
            ld = entmax_bisect_loss(xd, dist, alpha=alpha, reduction="none")
            (li.sum() + ld.sum()).backward()
            assert calls == [native, native], calls
            out[native] = (li, ld, xi.grad, xd.grad)
            monkeypatch.undo()
            monkeypatch.setattr(losses, "power_probs", served)
        for a, b in zip(out[True], out[False]):
            assert torch.allclose(a, b, atol=3e-6), (alpha, (a - b).abs().max())
        if smoothing == 0.0:
            keep = target != -100
            keep[3] = False  # the package's loss is NaN on a row with -inf scores
            want = ref.EntmaxBisectLoss(alpha, n_iter=100, reduction="none")(x[keep].double(), target[keep])
            assert torch.allclose(out[True][0][keep].double(), want, atol=2e-5)


def backward_case(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float64 scores and gradients ``(9, n)`` and nine alphas from 1.1 to 1.9 (seeded by ``n``)."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(9, n, generator=g, dtype=torch.float64) * 2
    grad = torch.randn(9, n, generator=g, dtype=torch.float64)
    return x, grad, torch.linspace(1.1, 1.9, 9, dtype=torch.float64)


def jacobian_product(s: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """``J^T grad = s (grad - <s, grad> / sum s)`` per row, for ``s`` proportional to ``p^(2 - alpha)``."""
    return s * (grad - (s * grad).sum(-1, keepdim=True) / s.sum(-1, keepdim=True))


def autograd_of_the_torch_mapping(x: torch.Tensor, alpha, grad: torch.Tensor) -> torch.Tensor:
    """The gradient of the static torch mapping by autograd (float64): an independent route."""
    xs = x.clone().requires_grad_()
    (auto,) = torch.autograd.grad(entmax_bisect(xs, alpha, impl="static"), xs, grad)
    return auto


@pytest.mark.parametrize("n", [5, 20, 300, 2001])
def test_power_backward_equals_the_jacobian_product(native_build, monkeypatch, n):
    """The native backward on every vector path, a float exponent and one per row: from the forward's
    r, ``J^T g`` equals the float64 formula ``s (g - <s, g> / sum s)``, ``s = r^e`` (e = (2 - alpha) /
    (alpha - 1)), and the float64 autograd gradient of the torch mapping (an independent route); a NaN
    row gives NaN, a row without support zeros."""
    monkeypatch.setitem(_native._state, "lib", native_build)
    x, grad, alphas = backward_case(n)
    for alpha in (1.3, alphas):
        am1 = alpha - 1
        e = (2 - alpha) / am1
        found = _native.power_probs(x.float(), am1, 200, EPS, root=True)
        gx = _native.power_backward(found[1], grad.float(), e)[0] if found is not None else None
        if native_build is None or gx is None:
            assert gx is None or native_build is None
            continue
        r = found[1].double()
        want = jacobian_product(r.pow(e if isinstance(e, float) else e[:, None]), grad)
        assert torch.allclose(gx.double(), want, atol=2e-6), (gx.double() - want).abs().max()
        auto = autograd_of_the_torch_mapping(x, alpha if isinstance(alpha, float) else alpha[:, None], grad)
        assert torch.allclose(gx.double(), auto, atol=2e-5), (gx.double() - auto).abs().max()
    r = torch.rand(3, n)
    r[0, n // 2] = float("nan")
    r[1] = 0.0
    out = _native.power_backward(r, torch.randn(3, n), 7 / 3)
    if out is not None:
        out = out[0]
        assert bool(out[0].isnan().all()) and torch.equal(out[1], torch.zeros(n))


@pytest.mark.parametrize("n", [5, 20, 256, 300, 4103])
def test_the_forward_weights_give_the_backward_without_powers(native_build, monkeypatch, n):
    """``power_probs(weights=True)`` returns the Newton loop's last powers ``s = r^(q - 1)``: on every
    vector path, short rows (blocks) and long ones (pruned), float and per-row alphas, s equals the
    float64 power of the returned r, 0 off the support, NaN rows NaN, rows without a finite entry
    zeros; ``power_backward(s, grad, 1.0)`` (no power) equals the float64 formula and the float64
    autograd gradient of the torch mapping; the front door's float-alpha backward takes it."""
    monkeypatch.setitem(_native._state, "lib", native_build)
    x, grad, alphas = backward_case(n)
    for alpha in (1.3, alphas):
        am1 = alpha - 1
        xf = x.float()
        xf[7] = NEG_INF
        xf[8, n // 2] = float("nan")
        found = _native.power_probs(xf, am1, 200, EPS, root=True, weights=True)
        if native_build is None or found is None:
            assert found is None or native_build is None
            continue
        p, r, s = found
        e = 1 / am1 - 1 if isinstance(am1, float) else (1 / am1 - 1)[:7, None]
        assert torch.allclose(s[:7].double(), r[:7].double().pow(e), rtol=2e-6, atol=1e-30)
        rs = r[:7].double().pow(e)  # (s of a support entry can underflow float32: r^e below 1e-45)
        assert bool((r[:7] > 0)[s[:7] > 0].all()) and bool((s[:7] > 0)[rs > 1e-30].all())
        assert torch.equal(s[7], torch.zeros(n)) and bool(s[8].isnan().all())
        gx = _native.power_backward(s, grad.float(), 1.0)[0]
        want = jacobian_product(s[:7].double(), grad[:7])
        assert torch.allclose(gx[:7].double(), want, atol=2e-6), (gx[:7].double() - want).abs().max()
        assert torch.equal(gx[7], torch.zeros(n)) and bool(gx[8].isnan().all())
        auto = autograd_of_the_torch_mapping(x[:7], alpha if isinstance(alpha, float) else alpha[:7, None], grad[:7])
        assert torch.allclose(gx[:7].double(), auto, atol=2e-5), (gx[:7].double() - auto).abs().max()
    calls = []
    real = _native.power_backward
    monkeypatch.setattr(entmax_module, "power_backward", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    xs = x.float().requires_grad_()
    entmax_bisect(xs, 1.3).backward(grad.float())
    if _native.power_probs(x[:1].float(), 0.3, 200, EPS, root=False) is not None:  # (not in a build without vectors)
        assert calls == [1.0]
    want = autograd_of_the_torch_mapping(x, 1.3, grad)
    assert torch.allclose(xs.grad.double(), want, atol=2e-5), (xs.grad.double() - want).abs().max()


@pytest.mark.parametrize("n", [5, 23, 64, 300, 4103])
def test_sparsemax_and_entmax15_backward_without_powers(native_build, monkeypatch, n):
    """``support_backward`` of float32 rows is ``power_backward`` at ``e = 1`` (1.5-entmax, from ``r =
    sqrt(p)``) and ``e = 0`` (sparsemax, from ``p``: its support's indicator): on every vector path,
    short rows (a last partial chunk taken entry by entry) and long ones, equal to torch's backward
    passes, NaN rows NaN (sparsemax: zeros, as torch's ``sign`` of NaN), rows without support zeros;
    the front doors' float32 backward of long rows takes it and equals torch's float64 autograd."""
    from nmt.sparse import entmax15, sparsemax
    from nmt.sparse.entmax import _entmax_backward
    from nmt.sparse.sparsemax import sparsemax_backward
    import sys
    sparsemax_module = sys.modules["nmt.sparse.sparsemax"]  # (the package's name is the function)

    monkeypatch.setitem(_native._state, "lib", native_build)
    x, grad, _ = backward_case(n)
    x[1] = NEG_INF
    x[2, n // 2] = float("nan")
    xf, gf = x.float(), grad.float()
    with torch.no_grad():
        r = entmax15(xf, impl="static").sqrt()
        p = sparsemax(xf, impl="static")
    served = _native.power_backward(r, gf, 1.0) is not None
    for got, want in ((_native.support_backward(r, gf, indicator=False), _entmax_backward(r, gf)),
                      (_native.support_backward(p, gf, indicator=True), sparsemax_backward(p, gf))):
        assert torch.equal(got.isnan(), want.isnan())
        torch.testing.assert_close(got.nan_to_num(0.0), want.nan_to_num(0.0), rtol=1e-5, atol=2e-6)
        assert torch.equal(got[1], torch.zeros(n))
    calls = []
    real = _native.support_backward
    for module in (entmax_module, sparsemax_module):
        monkeypatch.setattr(module, "support_backward", lambda *a, **k: calls.append(k["indicator"]) or real(*a, **k))
    for mapping in (entmax15, sparsemax):
        xs = xf[3:].clone().requires_grad_()
        mapping(xs).backward(gf[3:])
        xd = x[3:].clone().requires_grad_()
        mapping(xd, impl="static").backward(grad[3:])
        torch.testing.assert_close(xs.grad.double(), xd.grad, rtol=1e-4, atol=2e-5)
    if served:  # short rows take the one-call native path anyway; long float32 rows now too
        assert calls == [False, True]


@pytest.mark.parametrize("n", [5, 20, 300])
def test_power_backward_of_a_learned_alpha_equals_its_formulas(native_build, monkeypatch, n):
    """From the output p (e = 2 - alpha) with alpha - 1 given, the native backward's two gradients on
    every vector path: the scores' against the float64 formula, alpha's against the float64 torch
    formula (``_alpha_grad``) and against central differences of the float64 mapping in alpha (an
    independent route); a NaN row gives NaN."""
    from nmt.sparse.entmax import _alpha_grad

    monkeypatch.setitem(_native._state, "lib", native_build)
    g = torch.Generator().manual_seed(n)
    x = torch.randn(9, n, generator=g, dtype=torch.float64) * 2
    grad = torch.randn(9, n, generator=g, dtype=torch.float64)
    alphas = torch.linspace(1.1, 1.9, 9, dtype=torch.float64)[:, None]
    p = entmax_bisect(x, alphas, impl="static")
    found = _native.power_backward(p.float(), grad.float(), (2 - alphas).reshape(-1), (alphas - 1).reshape(-1))
    if native_build is None or found is None:
        assert found is None or native_build is None
        return
    gx, ga = found
    s = torch.where(p > 0, p, 0.0).pow(2 - alphas) * (p > 0)
    want_gx = s * (grad - (s * grad).sum(-1, keepdim=True) / s.sum(-1, keepdim=True))
    assert torch.allclose(gx.double(), want_gx, atol=2e-6), (gx.double() - want_gx).abs().max()
    want_ga = _alpha_grad(p, alphas, grad)[:, 0]
    assert torch.allclose(ga.double(), want_ga, rtol=1e-4, atol=2e-5), (ga.double() - want_ga).abs().max()
    h = 1e-6
    numeric = ((entmax_bisect(x, alphas + h, impl="static") - entmax_bisect(x, alphas - h, impl="static"))
               * grad).sum(-1) / (2 * h)
    assert torch.allclose(ga.double(), numeric, rtol=1e-3, atol=1e-4), (ga.double() - numeric).abs().max()
    bad = p.float().clone()
    bad[2, 0] = float("nan")
    gx_bad, ga_bad = _native.power_backward(bad, grad.float(), (2 - alphas).reshape(-1), (alphas - 1).reshape(-1))
    assert bool(gx_bad[2].isnan().all()) and bool(ga_bad[2].isnan()) and not bool(ga_bad[3].isnan())


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", [53, 20])
def test_rows_of_mixed_alphas_go_in_blocks_ordered_by_alpha(native_build, monkeypatch, threads, n):
    """One alpha a row in random order (a block's lanes run until its slowest settles, and the
    passes grow as alpha nears 1): rows of 48 entries or more go in blocks ordered by 64 buckets of
    alpha - 1 within windows of 256 rows of each thread's share (stable), so the outputs are bit for
    bit those of the same rows ordered so beforehand (each share and window called on its own),
    written at the rows' own places, and the float64 mapping's; shorter rows (their scattered reads
    and writes cost more) and rows of one alpha a head (no block mixing buckets) keep their order:
    bit for bit each block of eight called alone."""
    monkeypatch.setitem(_native._state, "lib", native_build)
    monkeypatch.setattr(_native, "_threads", lambda numel, split_min=None: threads)
    g = torch.Generator().manual_seed(11 + threads)
    rows = 603
    x = torch.randn(rows, n, generator=g) * 2
    x[7] = NEG_INF
    x[9, 3] = float("nan")
    alphas = 1.03 + 0.94 * torch.rand(rows, generator=g, dtype=torch.float64)
    found = _native.power_probs(x, alphas - 1, 200, EPS, root=True, stats=True, weights=True, dalpha=True)
    if native_build is None or found is None:
        assert found is None or native_build is None
        return
    blocks = (rows + 7) // 8
    if n >= 48:  # each thread's share in windows of 256 rows, ordered by bucket (stable)
        bucket = ((alphas - 1) * 64).floor()
        groups = []
        for t in range(threads):
            lo, hi = 8 * (blocks * t // threads), min(rows, 8 * (blocks * (t + 1) // threads))
            groups += [w + torch.sort(bucket[w:min(hi, w + 256)], stable=True).indices for w in range(lo, hi, 256)]
    else:  # in order: each block as if alone
        groups = [torch.arange(b, min(rows, b + 8)) for b in range(0, rows, 8)]
    for share in groups:
        want = _native.power_probs(x[share], alphas[share] - 1, 200, EPS, root=True, stats=True, weights=True,
                                   dalpha=True)
        for got, w in zip(found, want):
            assert torch.equal(got[share].nan_to_num(7.0), w.nan_to_num(7.0))
    p = found[0]
    ok = torch.ones(rows, dtype=torch.bool)
    ok[7] = ok[9] = False
    z = (x[ok].double() - x[ok].double().amax(dim=-1, keepdim=True)) * (alphas[ok] - 1)[:, None]
    tau = bisection(z, 1 / (alphas[ok] - 1))
    rq = (z - tau[:, None]).clamp(min=0).pow(1 / (alphas[ok] - 1)[:, None])
    assert torch.allclose(p[ok].double(), rq / rq.sum(dim=-1, keepdim=True), rtol=0, atol=4e-7)
    assert bool(p[9].isnan().all()) and torch.equal(p[7], torch.zeros(n))
    heads = (alphas[::29] - 1).repeat_interleave(32)[:rows]  # one alpha a head of 32 rows: in order
    by_head = _native.power_probs(x, heads, 200, EPS, root=False)[0]
    for h in range(0, rows, 32):
        alone = _native.power_probs(x[h:h + 32], heads[h:h + 32], 200, EPS, root=False)[0]
        assert torch.equal(by_head[h:h + 32].nan_to_num(7.0), alone.nan_to_num(7.0))
