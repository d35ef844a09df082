"""The long rows' candidates of rows the bound keeps whole (``LONG_WHOLE_W512`` in
``nmt/sparse/_power_threshold.c``, the AVX-512 functions): converted straight from the scores with
the moments' sums, their places left unwritten (the identity, written by the first drop's moves),
and, where an entry at or below the cut turns up, the compaction going on from that vector with the
entries before it kept. Checked on every native build against a float64 bisection written from the
definition (``test_power_series_start.bisection`` / ``check_rows``), with rows whose only low
entries sit at every boundary of the shortcut (the first vector, the centre's 256, the vectors of
sixteen and eight, the last ones one by one); the diagnostic build counts the candidates (exactly
the entries not made low) and the passes (one a row: the moments of the kept prefix and the rest
reach the series' tolerance)."""

import pytest
import torch

from nmt.sparse import _native

from tests.sparse.test_power_fine_step import _has_avx512
from tests.sparse.test_power_series_start import EPS, check_rows, counted_power_probs, settling_passes


def _low_places(n: int) -> list:
    """Places of a row's one low entry: none, and each side of every boundary of the shortcut."""
    places = [0, 1, 15, 16, 17, 255, 256, 257, 271, 272, 300, n // 2, n - 24, n - 17, n - 16, n - 9, n - 8, n - 1]
    return [None] + sorted({j for j in places if 0 <= j < n})


def _rows(n: int, spread: float, seed: int) -> tuple:
    """Normal rows of ``spread`` (every entry far above the cut at 0.01), row i with its low entry
    (-inf, or a finite -50) at ``_low_places(n)[i]``, a last row with two (one past the centre's
    256, one near the end); returns ``(x, low entries a row)``."""
    g = torch.Generator().manual_seed(seed)
    places = _low_places(n)
    x = torch.randn(len(places) + 1, n, generator=g) * spread
    lows = []
    for i, j in enumerate(places):
        if j is not None:
            x[i, j] = float("-inf") if i % 2 else -50.0
        lows.append(0 if j is None else 1)
    x[-1, min(300, n - 2)] = -50.0
    x[-1, n - 1] = float("-inf")
    lows.append(2)
    return x, lows


@pytest.mark.parametrize("n", [257, 300, 1003, 8000, 8007])
def test_rows_kept_whole_or_stopped_at_any_vector_equal_the_bisection(native_build, monkeypatch, n):
    """Rows of deviation 0.01 (every entry but the low ones in the support) and 0.1 (all
    candidates, not all in the support: the loop drops some after its first step, moving the places
    the shortcut left unwritten), alphas 1.25 and 1.3: the threshold, support, output and r of the
    float64 root on every build, and ``p_sum`` of the stats the written output's sum."""
    monkeypatch.setitem(_native._state, "lib", native_build)
    for spread, seed in ((0.01, n), (0.1, n + 1)):
        x, _ = _rows(n, spread, seed)
        for alpha in (1.25, 1.3):
            alphas = torch.full((x.shape[0],), alpha, dtype=torch.float64)
            found = _native.power_probs(x, alpha - 1, 200, EPS, root=True, stats=True)
            if native_build is None or found is None:
                assert found is None or native_build is None
                return
            p, r, tau, _, _, p_sum, _ = found
            check_rows(x, alphas, p, r, tau)
            assert torch.allclose(p_sum.double(), p.double().sum(dim=-1), rtol=0, atol=1e-6)
            assert bool((p[x == float("-inf")] == 0).all()) and bool((p[x == -50.0] == 0).all())


def test_the_shortcut_keeps_exactly_the_candidates_and_their_moments(native_variant, tmp_path):
    """The diagnostic build (``NMT_POWER_COUNTS``, the AVX-512 functions where the processor has
    them) beside the same build without the shortcut (``NMT_POWER_NO_WHOLE``: every row compacted,
    its moments taken as the compacted candidates are converted), row by row, on rows of deviation
    0.01 and 0.1 at alpha 1.3 (rows of 32,000 at 0.1: their normal tail stops the shortcut late, or
    leaves a few entries below the bound): where both count the same candidates, the outputs, r and
    thresholds are equal bit for bit (the same doubles, the same sums in the same order: a vector's
    entries lost or taken twice at a stop, or a prefix's sums, change them); where the shortcut kept
    a row whole with some entries below the bound (at most n / 256 + n / 16, ``POWER_WHOLE_LOWS``), its
    candidates are the whole row, and its threshold and outputs those of the compaction within the
    loop's tolerance; at 0.01 the candidates are exactly the entries not made low, all in the
    support, and every row takes one pass of powers (double, or float settling); every row has the
    outputs of the bisection."""
    if not _native.available():
        pytest.skip("native library not built")
    lib = native_variant("NMT_POWER_COUNTS")
    compacted = _native.load(_native.build(tmp_path, defines=["NMT_POWER_COUNTS", "NMT_POWER_NO_WHOLE"]))

    def run(library, x):
        return counted_power_probs(library, x, 0.3)

    kept_whole = 0
    for n in (257, 300, 1003, 8000, 8007, 32000):
        for spread in (0.01, 0.1):
            x, lows = _rows(n, spread, seed=n + 7)
            rows = x.shape[0]
            found, counts = run(lib, x)
            check_rows(x, torch.full((rows,), 1.3, dtype=torch.float64), found[0], found[1], found[2])
            assert counts[0] == rows
            for i in range(rows):
                row = x[i:i + 1]
                got, c = run(lib, row)
                want, w = run(compacted, row)
                if c[2] == w[2]:
                    assert c[5:7] == w[5:7] and c[16:18] == w[16:18], (n, spread, i)
                    for a, b in zip(got, want):
                        assert torch.equal(a, b), (n, spread, i)
                else:  # kept whole (or whole up to a stop) with a few entries below the bound
                    kept_whole += 1
                    assert 0 < c[2] - w[2] <= n // 256 + n // 16, (n, spread, i, c[2], w[2])
                    assert torch.allclose(got[2].double(), want[2].double(), rtol=0, atol=8 * EPS)
                    assert torch.allclose(got[0], want[0], rtol=0, atol=4e-7)
            if spread == 0.01:
                assert counts[2] == counts[7] == rows * n - sum(lows)  # all candidates, all in the support
                assert settling_passes(counts) == rows and counts[3] == 0, (n, counts[5], counts[3])
    if _has_avx512():
        assert kept_whole > 0  # (the rows of 32,000 at 0.1)


def test_a_few_entries_below_the_bound_keep_a_row_whole_and_more_do_not(native_variant):
    """Normal rows of 8,000 and 32,000 scores at deviation 0.1, alpha 1.3, with m entries moved
    to z = -0.5 (below the block maxima's bound, above the floor -0.9). The allowance
    (``POWER_WHOLE_LOWS``) is n / 256 plus a sixteenth of the entries read: m of them at random
    places, 1, n / 512, n / 256 + 17 and n / 20 (a twentieth, under the sixteenth) keep the row whole
    (its candidates are all n entries); n / 8 (twice the rate) stop it where the count outgrows the
    allowance, having kept at most some n / 128 of them (the rest compacted); n / 256 + 17 at the
    row's start stop it within the first 256, where the compaction runs from the row's start (none of
    them a candidate); one entry at -inf, or one far below (z = -5), compacted from there as before;
    the bisection's outputs throughout."""
    if not _native.available():
        pytest.skip("native library not built")
    lib = native_variant("NMT_POWER_COUNTS")
    g = torch.Generator().manual_seed(3)
    for n in (8000, 32000):
        allow = n // 256
        for m, far, first in ((1, None, False), (allow // 2, None, False), (allow + 17, None, False),
                              (n // 20, None, False), (n // 8, None, False), (allow + 17, None, True),
                              (2, float("-inf"), False), (2, -5.0, False)):
            x = torch.randn(1, n, generator=g) * 0.1
            top = float(x.max())
            pick = torch.arange(m) if first else torch.randperm(n, generator=g)[:m]
            x[0, pick] = top - 0.5 / 0.3
            if far is not None:
                x[0, pick[0]] = far if far == float("-inf") else top + far / 0.3
            found, counts = counted_power_probs(lib, x, 0.3)
            check_rows(x, torch.full((1,), 1.3, dtype=torch.float64), found[0], found[1], found[2])
            if not _has_avx512():
                continue
            whole = m <= n // 20 and far is None and not first
            assert (counts[2] == n) == whole, (n, m, far, first, counts[2])
            if first:  # stopped within the centre's 256: compacted from the start
                assert counts[2] <= n - m + 5, (n, m, counts[2])  # (the row's own tail: a few)
            elif not whole:  # (entries below the bound kept before the stop)
                assert counts[2] <= n - m + n // 128 + (n // 256 if far is None else 0), (n, m, counts[2])
