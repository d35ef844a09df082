"""The long rows' normal-model start (``POWER_NORMAL_Q`` in ``nmt/sparse/_power_threshold.c``):
broad rows that the moments' series cannot serve (entries partly out of the support) and whose
candidates are nearly the whole row start the Newton loop from the threshold of k normal scores of
their mean and deviation, without coarse float steps. The start is a model, not a bound: rows made
to break the model (skewed, bimodal, heavy-tailed, an outlier above a broad rest, plateaus) must
still get the float64 bisection's threshold, support and output on every native build, and equal the
loop that never takes the start (a cap of 19 steps turns the coarse steps and this start off). A
diagnostic build counts the passes the start saves on normal rows."""
import pytest
import torch

from nmt.sparse import _native
from tests.sparse.test_power_series_start import (EPS, check_root_and_capped_loop, check_rows, counted_power_probs,
                                                  settling_passes)


def model_breaking_rows(n: int, alphas: torch.Tensor, seed: int) -> torch.Tensor:
    """float32 rows, one per alpha, with most entries near the maximum but partly out of the
    support: normal of deviation 0.05-0.3, Gumbel both ways, two clusters (the lower a tenth of the
    row, or half of it), Student-t with 2 degrees of freedom, uniform, one entry far above a broad
    rest, three plateaus, normal with a -inf tenth (nearly every entry still a candidate)."""
    g = torch.Generator().manual_seed(seed)
    rows = alphas.numel()
    spread = torch.tensor([0.05, 0.1, 0.2, 0.3])[torch.randint(0, 4, (rows,), generator=g)].double()
    x = torch.randn(rows, n, generator=g, dtype=torch.float64) * spread[:, None]
    for i in range(rows):
        s = float(spread[i])
        kind = i % 10
        u = torch.rand(n, generator=g, dtype=torch.float64).clamp(1e-12, 1 - 1e-12)
        if kind == 1:  # Gumbel, long upper tail
            x[i] = -s * torch.log(-torch.log(u))
        elif kind == 2:  # Gumbel, long lower tail
            x[i] = s * torch.log(-torch.log(u))
        elif kind == 3:  # two clusters, the lower a tenth of the row, far below
            x[i, : n // 10] -= 4 * s
        elif kind == 4:  # two clusters of half the row each
            x[i, ::2] -= 2 * s
        elif kind == 5:  # Student-t, 2 degrees of freedom (heavy tails both ways)
            chi = torch.randn(2, n, generator=g, dtype=torch.float64).pow(2).sum(dim=0)
            x[i] = x[i] / (chi / 2).sqrt() / 4
        elif kind == 6:  # uniform
            x[i] = u * 3 * s
        elif kind == 7:  # one entry far above a broad rest
            x[i, n // 3] = 1.5 * s / float(alphas[i] - 1) + x[i].max()
        elif kind == 8:  # three plateaus
            x[i] = (torch.arange(n) % 3).double() * s
        elif kind == 9:  # a tenth -inf
            x[i, -(n // 10):] = float("-inf")
    return x.float()


@pytest.mark.parametrize("n", [1003, 8000, 32003])
def test_rows_that_break_the_normal_model_equal_the_bisection(native_build, monkeypatch, n):
    """On every native build, at alphas 1.15 to 1.9, the rows of :func:`model_breaking_rows` get the
    float64 root's threshold, support and output, and the loop that never takes the start (19 steps
    at most: no coarse steps, no normal start) gives the same threshold and output."""
    monkeypatch.setitem(_native._state, "lib", native_build)
    alphas = torch.tensor([1.15, 1.2, 1.25, 1.3, 1.35, 1.4, 1.5, 1.6, 1.7, 1.9] * (3 if n < 32003 else 1),
                          dtype=torch.float64)
    x = model_breaking_rows(n, alphas, seed=n)
    # p to 1e-5 relative besides 4e-7 absolute: a threshold within its 8 eps moves a p near 1 (one
    # entry far above the rest) by more than 4e-7 (the code before the normal start did so too: 4.4e-7
    # on such a row at alpha 1.6)
    checked = check_root_and_capped_loop(native_build, x, alphas, p_rtol=1e-5)
    if checked is None:
        return
    p = checked[0]
    support = (p > 0).sum(dim=-1)
    assert bool(((support < n) & (support > n // 2)).any())  # rows partly out of the support were met


def test_the_normal_start_drops_the_coarse_passes_on_normal_rows(native_variant):
    """The diagnostic build (``NMT_POWER_COUNTS``): normal scores of deviation 0.1 (8,000 entries)
    at alphas 1.25 and 1.3, some 4% of them out of the support at 1.3, take no coarse pass and at
    most 2.25 passes of powers a row on average (double ones, or float settling passes) (from the power mean's bound: up to two coarse and two
    double passes), with the default build's outputs and the bisection's thresholds."""
    if not _native.available():
        pytest.skip("native library not built")
    lib = native_variant("NMT_POWER_COUNTS")
    g = torch.Generator().manual_seed(7)
    x = torch.randn(16, 8000, generator=g) * 0.1
    for alpha in (1.25, 1.3):
        (p, r), counts = counted_power_probs(lib, x, alpha - 1, stats=False)
        assert counts[0] == 16
        assert counts[3] == 0 and settling_passes(counts) <= 2.25 * 16, (alpha, counts[3], counts[5])
        want = _native.power_probs(x, alpha - 1, 200, EPS, root=True)
        if want is not None:
            assert torch.allclose(p, want[0], rtol=0, atol=4e-7)
        check_rows(x, torch.full((16,), alpha, dtype=torch.float64), p, r,
                   _native.power_probs(x, alpha - 1, 200, EPS, root=False, stats=True)[2])
