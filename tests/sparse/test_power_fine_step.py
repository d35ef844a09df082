"""The float Halley step after the normal model's start (``LONG_FINE`` in
``nmt/sparse/_power_threshold.c``, the AVX-512 and AVX2 functions): broad long rows partly out of the support
take one pass of float powers from the normal start and then the Newton loop, whose first double
pass settles where it took a step and a settling pass before. The step is no bound either way (the
loop starts from it as from above), so rows made to mislead it (entries crossing the support's edge
between the start and the root, plateaus, ties at the maximum, an offset, one entry far above a
broad rest) must get the float64 bisection's threshold, support and output on every native build,
and equal the loop that never takes the start (a cap of 19 steps); the diagnostic build counts the
float pass and the double passes, and shows the narrower builds without it."""
from pathlib import Path

import pytest
import torch

from nmt.sparse import _native
from tests.sparse.test_power_series_start import (bisection, check_root_and_capped_loop, check_rows,
                                                  counted_power_probs, settling_passes)


def _cpu_flags() -> list[str]:
    """This processor's feature flags from /proc/cpuinfo (none elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    return next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])


def _has_avx512() -> bool:
    """Whether this processor has the instructions the AVX-512 functions are built for
    (``CPU_HAS_AVX512`` in ``_cpu_dispatch.h``)."""
    return all(f in _cpu_flags() for f in ("avx512f", "avx512dq", "avx512bw", "avx512vl", "popcnt"))


def _has_avx2() -> bool:
    """Whether this processor has the instructions the AVX2 functions are built for
    (``CPU_HAS_AVX2`` in ``_cpu_dispatch.h``)."""
    return all(f in _cpu_flags() for f in ("avx2", "fma", "popcnt"))


def float_pass_width(narrow: str = "") -> int:
    """The vector width (512, 256; 0: none) of the float passes of alpha-entmax's long rows (the float
    step, the settling pass) that this processor runs in the native build without ``narrow`` (``""``:
    the full build; ``"NMT_NO_AVX512"``, ``"NMT_NO_AVX2"``)."""
    if narrow == "" and _has_avx512():
        return 512
    return 256 if narrow != "NMT_NO_AVX2" and _has_avx2() else 0


FLOAT_PASS_BUILDS = ["", "NMT_NO_AVX512"]
"""The builds whose float passes the tests below count: the AVX-512 functions' and the AVX2 ones'
(each skipped, or its counts left unchecked, where the processor lacks them)."""


def fine_step_rows(n: int, alphas: torch.Tensor, seed: int) -> torch.Tensor:
    """float32 rows, one per alpha, nearly all candidates but partly out of the support (where the
    normal start, then the float step, serve): scores of deviation s = c n^(1 - alpha) / (alpha - 1)
    (c = 0.45, 0.7 and 0.28 for ten rows each in turn: the threshold's distance from the mean is some
    1-2 s; at 0.28 the spread is about that distance, where the series cannot serve and Newton's step
    from the mean bound is short: the float step from there), ten kinds: normal; normal of twice that deviation; normal with a tenth of its entries moved onto the
    root's level (1e-6 above or below it: they cross the support's edge between the start and the
    root); with a fifth 1e-3 s above the root's level and a fifth 1e-3 s below it; with a 64th tied at
    the maximum; offset by 1000; one entry 2 s above the rest; two halves s apart; a skewed row
    (exponential below the maximum); a row whose lowest twentieth is -inf."""
    g = torch.Generator().manual_seed(seed)
    rows = alphas.numel()
    x = torch.randn(rows, n, generator=g, dtype=torch.float64)
    for i in range(rows):
        a = float(alphas[i]) - 1
        kind = i % 10
        s = (0.45, 0.7, 0.28)[(i // 10) % 3] * n ** -a / a
        x[i] *= s * (2 if kind == 1 else 1)
        if kind in (2, 3):  # entries moved to the root's level (of the row before the move)
            z = ((x[i] - x[i].max()) * a)[None]
            t = float(bisection(z, torch.tensor([1 / a], dtype=torch.float64))[0])
            level = float(x[i].max()) + t / a
            pick = torch.randperm(n, generator=g)
            if kind == 2:
                x[i, pick[: n // 10]] = level + (1e-6 if i % 20 < 10 else -1e-6)
            else:
                x[i, pick[: n // 5]] = level + 1e-3 * s
                x[i, pick[n // 5: 2 * n // 5]] = level - 1e-3 * s
        elif kind == 4:  # a 64th tied at the maximum
            x[i, : n // 64] = x[i].max()
        elif kind == 5:
            x[i] += 1000.0
        elif kind == 6:  # one entry above the rest
            x[i, n // 2] = float(x[i].max()) + 2 * s
        elif kind == 7:  # two halves
            x[i, ::2] -= s
        elif kind == 8:  # skewed: exponential below the maximum
            x[i] = -torch.empty(n, dtype=torch.float64).exponential_(generator=g) * s
        elif kind == 9:
            x[i, x[i].argsort()[: n // 20]] = float("-inf")
    return x.float()


ALPHAS = [1.12, 1.2, 1.25, 1.3, 1.35, 1.4, 1.45, 1.5, 1.3, 1.6]
ALPHAS_ABOVE = [1.55, 1.6, 1.65, 1.7, 1.55, 1.6, 1.65, 1.7, 1.8, 1.6]
"""Alphas above 1.5 (q < 2: Newton's float step alone) for every kind of :func:`fine_step_rows`."""


@pytest.mark.parametrize("n", [50, 200, 1003, 8000, 32003])
@pytest.mark.parametrize("above", [False, True])
def test_rows_that_mislead_the_float_step_equal_the_bisection(native_build, monkeypatch, n, above):
    """On every native build, the rows of :func:`fine_step_rows` (alphas 1.12-1.6: Halley's float
    step; and 1.55-1.8 for every kind of row: Newton's, where q < 2) get the float64 root's
    threshold, support and output, and the loop capped at 19 steps (no normal start, no float step)
    gives the same threshold and output. Rows of 50 and 200 go a block of eight at a time (the
    AVX-512 functions take the float step after the block's coarse steps: ``BLOCK_FINE``)."""
    monkeypatch.setitem(_native._state, "lib", native_build)
    alphas = torch.tensor((ALPHAS_ABOVE if above else ALPHAS) * 3, dtype=torch.float64)
    x = fine_step_rows(n, alphas, seed=n + 3)
    check_root_and_capped_loop(native_build, x, alphas, p_rtol=1e-5)


def _counted(library, x: torch.Tensor, alphas: torch.Tensor) -> tuple:
    """``(p, r, tau, counts)`` of the diagnostic ``library`` on one thread (counts summed over rows:
    [0] rows, [3] coarse passes, [5] double passes, [15] float steps)."""
    found, counts = counted_power_probs(library, x, alphas - 1)
    return found[0], found[1], found[2], counts


@pytest.mark.parametrize("narrow", FLOAT_PASS_BUILDS)
def test_normal_rows_take_one_float_step_and_one_double_pass(native_variant, narrow):
    """The diagnostic build (``NMT_POWER_COUNTS``), with the AVX-512 functions and with the AVX2 ones
    alone (``narrow``; each where the processor has their instructions), on normal rows
    (with the bisection's outputs): at deviation 0.1 and alpha 1.3 (8,000 and 32,000 scores; some 4%
    and 22% out of the support) and 0.3 at 1.15, one float step and then one double pass a row (two
    to three double passes before it) and no coarse pass; at 1.25 and 0.1 the same for the rows that
    do not start from the moments' series; at 1.25 and 0.3 (8,000 scores, some 7,600 above the
    bound, kept whole, 5,500 in the support) one or two float steps and about one pass settling
    (three double passes before the float steps); none at 1.5 and 0.03 with 32,000 scores (a quarter in the support: the float
    pass would not pay) nor at 1.7 (q < 2: d^(q - 2) unbounded near the support's edge); at deviation
    0.01, alpha 1.45 (8,000 and 32,000) and 1.4 (32,000), where the series cannot serve (the spread
    reaches the threshold's distance) and Newton's step from the mean bound is short, one float step
    from that bound and one double pass (three double passes before at 1.4 and 32,000). The
    build without either (the vector extensions alone) takes no float step (its loop as before: at most 2.25 double
    passes a row at 8,000 and 1.3). And on the misleading rows of :func:`fine_step_rows` at 8,000
    the step is taken on most rows (the path the exactness test above is about)."""
    if not _native.available():
        pytest.skip("native library not built")
    lib = native_variant("NMT_POWER_COUNTS", narrow)
    g = torch.Generator().manual_seed(11)
    wide = float_pass_width(narrow) > 0
    for n, rows in ((8000, 16), (32000, 4)):
        base = torch.randn(rows, n, generator=g)
        for alpha, spread in ((1.25, 0.1), (1.3, 0.1), (1.15, 0.3), (1.25, 0.3), (1.5, 0.03), (1.7, 0.01),
                              (1.4, 0.01), (1.45, 0.01)):
            x = base * spread
            alphas = torch.full((rows,), alpha, dtype=torch.float64)
            p, r, tau, counts = _counted(lib, x, alphas)
            check_rows(x, alphas, p, r, tau)
            assert counts[0] == rows
            if not wide or alpha > 1.5:  # (1.7: q < 2)
                assert counts[15] == 0, (n, alpha, counts[15])
            elif alpha == 1.5:  # at 32,000 a quarter in the support: the float pass would not pay
                assert n == 8000 or counts[15] == 0, counts[15]
            elif spread == 0.3 and alpha == 1.25:  # kept whole, 5% below the bound: one or two steps
                if n == 8000:
                    assert rows <= counts[15] <= 2 * rows and settling_passes(counts) <= 1.25 * rows, (counts[15], counts[5])
            elif spread == 0.01:  # from the mean bound (1.4 at 8,000: from the series, one pass)
                assert settling_passes(counts) == rows and counts[16] == counts[17], (n, alpha, counts)
                assert counts[15] == (0 if (n, alpha) == (8000, 1.4) else rows), (n, alpha, counts[15])
            else:  # (at 1.25, q = 4, rows wholly in the support start from the series)
                assert counts[3] == 0 and settling_passes(counts) == rows, (n, alpha, spread, counts[3], counts[5])
                assert counts[16] == counts[17], (n, alpha, spread, counts[16], counts[17])
                assert counts[15] == rows or (alpha == 1.25 and counts[15] >= 1), (n, alpha, counts[15])
    generic = native_variant("NMT_POWER_COUNTS", "NMT_NO_AVX2")
    x = torch.randn(16, 8000, generator=g) * 0.1
    alphas = torch.full((16,), 1.3, dtype=torch.float64)
    p, r, tau, counts = _counted(generic, x, alphas)
    check_rows(x, alphas, p, r, tau)
    assert counts[15] == 0 and counts[3] == 0 and counts[5] <= 2.25 * 16, (counts[15], counts[5])
    if wide:
        alphas = torch.tensor(ALPHAS * 3, dtype=torch.float64)
        x = fine_step_rows(8000, alphas, seed=5)
        p, r, tau, counts = _counted(lib, x, alphas)
        check_rows(x, alphas, p, r, tau, p_rtol=1e-5)
        assert counts[15] >= 0.5 * len(alphas), counts[15]
