"""The native Newton threshold of whole rows (``nmt/sparse/_newton_threshold.c`` through
``nmt.sparse._native.newton_threshold``): exact thresholds, checked against the sort-based solve,
on every vector path; rows it cannot verify are flagged, and the front door then sorts them."""
import pytest
import torch

from nmt.sparse import _native, entmax15, sparsemax
from nmt.sparse._threshold import sort_threshold

NEG_INF = float("-inf")


def broad_rows(n_rows: int, n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Rows with maximum 0: broad (near-uniform), peaked, tied, with -inf runs, one of only -inf."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n_rows, n, generator=g, dtype=dtype) * 0.05
    z[1] *= 40.0
    z[2] = (z[2] * 100).round() / 100  # ties
    z[3, : n // 2] = NEG_INF
    z[4] = NEG_INF  # no finite entry
    z[5, n // 2] += 3.0  # one dominant entry
    z = z - torch.where(z.isfinite(), z, NEG_INF).amax(dim=-1, keepdim=True).nan_to_num(neginf=0.0)
    return z


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-13)])
@pytest.mark.parametrize("q", [1.0, 2.0])
@pytest.mark.parametrize("n", [5, 130, 3963])
def test_native_newton_equals_the_sorted_threshold(native_build, monkeypatch, dtype, tol, q, n):
    monkeypatch.setitem(_native._state, "lib", native_build)
    z = broad_rows(8, n, dtype, seed=n + int(q))
    tau, ok = _native.newton_threshold(z, q, torch.full((8,), -1.0, dtype=dtype), 4 * n + 60)
    want = sort_threshold(z, q)[:, 0]
    finite = torch.ones(8, dtype=torch.bool)
    finite[4] = False  # no finite entry: the caller masks that row
    assert bool(ok[finite].all())
    assert torch.allclose(tau[finite], want[finite], rtol=0, atol=tol)
    # the mapping the threshold implies sums to one (entries tied at the threshold: p ~ 0 either way)
    p = (z - tau[:, None]).clamp(min=0).pow(q)[finite]
    assert torch.allclose(p, (z - want[:, None]).clamp(min=0).pow(q)[finite], atol=10 * tol)
    assert torch.allclose(p.sum(-1), torch.ones_like(p[:, 0]), atol=100 * tol)


@pytest.mark.skipif(not _native.available(), reason="native library not built")
def test_rows_at_the_step_cap_are_flagged_and_sorted_by_the_front_door():
    z = broad_rows(6, 500, torch.float64, seed=3)
    _, ok = _native.newton_threshold(z, 2.0, torch.full((6,), -1.0, dtype=torch.float64), 0)
    assert not bool(ok[:4].any())  # no step allowed: nothing verified (row 4 has no finite entry)
    x = torch.randn(40, 3000, dtype=torch.float64) * 0.01  # broad rows: the full-row Newton
    for mapping, q in ((entmax15, 2.0), (sparsemax, 1.0)):
        p = mapping(x)
        assert torch.allclose(p.sum(-1), torch.ones(40, dtype=torch.float64), atol=1e-12)
        p_static = mapping(x, impl="static")
        assert torch.allclose(p, p_static, atol=1e-13) and torch.equal(p > 0, p_static > 0)


@pytest.mark.skipif(not _native.available(), reason="native library not built")
def test_large_inputs_split_over_two_threads_give_the_same_thresholds(monkeypatch):
    z = broad_rows(64, 3000, torch.float32, seed=5)
    lo = torch.full((64,), -1.0)
    one = _native.newton_threshold(z, 2.0, lo, 10000)
    monkeypatch.setattr(_native, "NEWTON_SPLIT_MIN_NUMEL", 1)
    with_threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        two = _native.newton_threshold(z, 2.0, lo, 10000)
    finally:
        torch.set_num_threads(with_threads)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])
