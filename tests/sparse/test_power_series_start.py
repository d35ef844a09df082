"""The long rows' start from the moments' binomial series (``power_series_root`` in
``nmt/sparse/_power_threshold.c``): broad rows whose every candidate is in the support start the
Newton loop half its tolerance below the series' root, so that one pass of powers settles them. The
start is not trusted: the thresholds, supports and outputs are checked against a float64 bisection
written here from the definition, on every native build, on rows made to strain the series (an
entry near the threshold's distance below the rest, two levels, ties, a huge offset, -inf runs);
a diagnostic build counts the passes on the rows the series serves."""
import ctypes
import math

import pytest
import torch

from nmt.sparse import _native

EPS = torch.finfo(torch.float32).eps


def bisection(z: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The root of ``sum [z - t]_+^q = 1`` per row of ``z`` (max 0) for the powers ``q (R,)``, by 200
    float64 bisection steps over ``[-1, 0]``: the independent truth (``(R,)`` float64)."""
    z, q = z.double(), q.double()[:, None]
    lo = torch.full((z.shape[0],), -1.0, dtype=torch.float64)
    hi = torch.zeros_like(lo)
    for _ in range(200):
        mid = (lo + hi) / 2
        f = (z - mid[:, None]).clamp(min=0).pow(q).sum(dim=-1) - 1
        lo, hi = torch.where(f >= 0, mid, lo), torch.where(f >= 0, hi, mid)
    return lo


def strained_rows(n: int, alphas: torch.Tensor, seed: int) -> torch.Tensor:
    """float32 rows, one per alpha: broad rows (every entry in the support, or nearly) of normal,
    uniform and two-level scores, an outlier below the rest near the threshold's distance (its term
    of the series converges slowly), one above an equal rest, all equal, rounded ties, a 2^20 offset,
    a half -inf row."""
    g = torch.Generator().manual_seed(seed)
    rows = alphas.numel()
    q = 1 / (alphas - 1)
    gap = (n ** (-1 / q)) / (alphas - 1)  # k^(-1/q) in x units: u where every entry is equal
    kind = torch.arange(rows) % 10
    x = torch.randn(rows, n, generator=g, dtype=torch.float64)
    spread = torch.tensor([1e-6, 1e-3, 0.01, 0.03, 0.1])[torch.randint(0, 5, (rows,), generator=g)]
    x = x * spread[:, None].double()
    for i in range(rows):
        k = int(kind[i])
        if k == 1:  # uniform
            x[i] = torch.rand(n, generator=g, dtype=torch.float64) * float(spread[i]) * 3
        elif k == 2:  # two levels, the lower some way to the threshold
            x[i] = 0.0
            x[i, ::2] = -0.4 * float(gap[i])
        elif k == 3:  # one entry below an equal rest, near the threshold's distance
            x[i] = 0.0
            x[i, n // 2] = -0.97 * float(gap[i])
        elif k == 4:  # one above an equal rest
            x[i] = 0.0
            x[i, 1] = 0.3 * float(gap[i])
        elif k == 5:  # all equal
            x[i] = 0.25
        elif k == 6:  # ties from rounding
            x[i] = (x[i] / (float(spread[i]) / 4)).round() * (float(spread[i]) / 4)
        elif k == 7:  # a huge offset (float32 rounds the scores to steps of 1/8)
            x[i] = 2.0 ** 20 + x[i] * 100
        elif k == 8:  # half -inf
            x[i, : n // 2] = float("-inf")
    return x.float()


def check_rows(x: torch.Tensor, alphas: torch.Tensor, p: torch.Tensor, r: torch.Tensor, tau: torch.Tensor,
               p_rtol: float = 0.0) -> None:
    """tau within 8 eps of the bisection's root (above it by at most eps), the support its entry for
    entry away from the boundary, p and r the float64 mapping's at the root (p to 4e-7 absolute,
    plus ``p_rtol`` relative)."""
    z = (x.double() - x.double().amax(dim=-1, keepdim=True)) * (alphas - 1)[:, None]
    q = 1 / (alphas - 1)
    want = bisection(z, q)
    assert bool((tau.double() <= want + EPS).all()), (tau.double() - want).max()
    assert torch.allclose(tau.double(), want, rtol=0, atol=8 * EPS), (tau.double() - want).abs().max()
    d = z - want[:, None]
    clear = d.abs() > 1e-5
    assert torch.equal((p > 0)[clear], (d > 0)[clear])
    rq = d.clamp(min=0).pow(q[:, None])
    assert torch.allclose(p.double(), rq / rq.sum(dim=-1, keepdim=True), rtol=p_rtol, atol=4e-7)
    assert torch.allclose(r.double(), d.clamp(min=0), rtol=0, atol=4e-6)
    assert torch.allclose(p.double().sum(dim=-1), torch.ones(len(p), dtype=torch.float64), atol=1e-5)


def counted_power_probs(library, x: torch.Tensor, a: float | torch.Tensor,
                        stats: bool = True) -> tuple[tuple, list[float]]:
    """``(power_probs(x, a, 200, EPS, root=True, stats=stats), counts)`` of the diagnostic ``library``
    (``NMT_POWER_COUNTS``) on one thread, its counters zeroed first (summed over rows: [0] rows,
    [3] coarse passes, [5] double passes, [7] entries in the support, [15] float steps, [16] float
    settling passes, [17] rows they settled); skips the
    test on a build without vectors."""
    counts = (ctypes.c_double * 18).in_dll(library, "nmt_power_counts")
    for i in range(18):
        counts[i] = 0.0
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(_native._state, "lib", library)
        mp.setattr(_native, "_threads", lambda *a, **k: 1)
        found = _native.power_probs(x, a, 200, EPS, root=True, stats=stats)
    if found is None or counts[0] == 0:
        pytest.skip("a build without vectors")
    return found, list(counts)


def settling_passes(counts: list[float]) -> float:
    """The passes of powers over the candidates in a diagnostic build's ``counts``: the double ones
    ([5]) and the float settling passes that settled their row ([17]; ``LONG_SETTLE``, the AVX-512
    functions: each takes a double pass's place)."""
    return counts[5] + counts[17]


def check_root_and_capped_loop(native_build, x: torch.Tensor, alphas: torch.Tensor,
                               p_rtol: float = 0.0) -> tuple | None:
    """The rows ``x`` at ``alphas`` on ``native_build`` (already the state's library) against the
    float64 bisection (:func:`check_rows`), and the loop capped at 19 steps (no start, no coarse or
    float step) with the same threshold (8 eps) and output (4e-7 absolute, ``p_rtol`` relative);
    ``(p, r, tau)``, or None where no native library serves."""
    found = _native.power_probs(x, alphas - 1, 200, EPS, root=True, stats=True)
    if native_build is None or found is None:
        assert found is None or native_build is None
        return None
    p, r, tau = found[:3]
    check_rows(x, alphas, p, r, tau, p_rtol=p_rtol)
    p19, _, tau19 = _native.power_probs(x, alphas - 1, 19, EPS, root=True, stats=True)[:3]
    assert torch.allclose(tau19.double(), tau.double(), rtol=0, atol=8 * EPS)
    assert torch.allclose(p19, p, rtol=p_rtol, atol=4e-7)
    return p, r, tau


@pytest.mark.parametrize("n", [257, 300, 1003, 8000, 32003])
def test_broad_rows_from_the_series_start_equal_the_bisection(native_build, monkeypatch, n):
    """On every vector path, at alphas 1.1 to 1.6 (q = 4 at 1.25 makes the series exact; those
    above 1.5 have few broad rows), the rows of :func:`strained_rows` get the float64 root's
    threshold, support and output; the uncapped loop and a cap of 19 steps (no coarse steps) agree."""
    monkeypatch.setitem(_native._state, "lib", native_build)
    alphas = torch.tensor([1.1, 1.2, 1.25, 1.3, 1.35, 1.4, 1.45, 1.5, 1.6, 1.3] * (2 if n < 32003 else 1),
                          dtype=torch.float64)
    x = strained_rows(n, alphas, seed=n)
    checked = check_root_and_capped_loop(native_build, x, alphas)
    if checked is None:
        return
    p = checked[0]
    assert int((p > 0).sum(dim=-1).max()) == n  # rows all in the support were met


def test_the_series_start_settles_normal_output_rows_in_one_pass(native_variant):
    """The diagnostic build (``NMT_POWER_COUNTS``) counts the long rows' passes: normal scores of
    deviation 0.01 and 0.03 (8,000 entries) and 0.01 (32,000) at alpha 1.25 and 1.3, every entry
    in the support, take one pass of powers a row (a double one, or the float settling pass where it
    serves: 1.3 at 8,000 and 32,000, 1.25 at 32,000) and no coarse pass (the loop from the power
    mean's bound took two of each), with the same outputs as the default build."""
    if not _native.available():
        pytest.skip("native library not built")
    lib = native_variant("NMT_POWER_COUNTS")
    g = torch.Generator().manual_seed(5)
    for n, spreads in ((8000, (0.01, 0.03)), (32000, (0.01,))):
        for spread in spreads:
            x = torch.randn(16, n, generator=g) * spread
            for alpha in (1.25, 1.3):
                (p, r), counts = counted_power_probs(lib, x, alpha - 1, stats=False)
                assert counts[0] == 16 and counts[7] == 16 * n  # every entry in the support
                assert settling_passes(counts) == 16 and counts[3] == 0, (n, spread, alpha, counts[5], counts[3])
                assert counts[16] == counts[17]  # (no float settling pass lost)
                want = _native.power_probs(x, alpha - 1, 200, EPS, root=True)
                if want is not None:
                    assert torch.allclose(p, want[0], rtol=0, atol=4e-7)
                check_rows(x, torch.full((16,), alpha, dtype=torch.float64), p, r,
                           _native.power_probs(x, alpha - 1, 200, EPS, root=False, stats=True)[2])
                assert math.isfinite(float(p.sum()))


@pytest.mark.parametrize("defines", [[], ["NMT_NO_AVX512"]])
def test_the_moments_taken_with_the_candidates_serve_as_the_moments_passes(tmp_path, defines):
    """The AVX-512 functions take the broad rows' moments while converting the candidates
    (``LONG_CONVERT_MOMENTS``: the centre from the first 256 converted first, the rest fused, the
    last ones one by one), the narrower ones in passes of their own: on normal rows of deviation 0.01
    at alpha 1.3 whose finite entries (the candidates) number just above a quarter of the row to all
    of it (rows of 8,000, and of 1,003: fewer than 256, not whole vectors), both diagnostic builds
    count one pass of powers a row (wrong moments miss the series' tolerance: two), and the outputs are the bisection's."""
    if not _native.available():
        pytest.skip("native library not built")
    lib = _native.load(_native.build(tmp_path, defines=["NMT_POWER_COUNTS", *defines]))
    counts = (ctypes.c_double * 18).in_dll(lib, "nmt_power_counts")
    g = torch.Generator().manual_seed(11)
    alphas = torch.full((16,), 1.3, dtype=torch.float64)
    for n, kept in ((8000, [2001, 2003, 2047, 3000, 4999, 6007, 7999, 8000] * 2),
                    (1003, [251, 255, 257, 263, 300, 511, 999, 1003] * 2)):
        x = torch.randn(16, n, generator=g) * 0.01
        for i, k in enumerate(kept):
            x[i, k:] = float("-inf")
            x[i] = x[i, torch.randperm(n, generator=g)]
        for i in range(18):
            counts[i] = 0.0
        with pytest.MonkeyPatch.context() as mp:
            mp.setitem(_native._state, "lib", lib)
            mp.setattr(_native, "_threads", lambda *a, **k: 1)
            found = _native.power_probs(x, 0.3, 200, EPS, root=True, stats=True)
        if found is None or counts[0] == 0:
            pytest.skip("a build without vectors")
        p, r, tau = found[:3]
        check_rows(x, alphas, p, r, tau)
        assert counts[0] == 16 and counts[7] == sum(kept)  # every finite entry in the support
        assert settling_passes(counts) == 16 and counts[16] == counts[17] and counts[3] == 0, counts
