"""The native taut string (``nmt/sparse/_taut_string.c`` through ``nmt.sparse._native.taut_string``):
the funnel scan one start at a time and pool-adjacent-violators for the isotonic fit, against the torch
funnel scan (``static``, an independent implementation) and a brute-force isotonic fit, on every build
of the library; ties, lengths, padding, threads; OSCAR's ordered fit (``_native.ordered_fit``) against
the torch one; the structured mappings' CPU path takes them."""
from __future__ import annotations

import math

import pytest
import torch

from nmt.sparse import _native
from nmt.sparse import _prox_oscar as oscar_module
from nmt.sparse import _taut_string as taut_module
from nmt.sparse._prox_oscar import ordered_fit
from nmt.sparse._taut_string import taut_string

WALLS = [(0.1, 0.1), (0.5, 0.5), (2.0, 2.0), (0.0, math.inf), (0.0, 0.3), (0.2, math.inf), (0.05, 2.0)]


def rows(n_rows: int, n: int, seed: int, dtype: torch.dtype, ties: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of varied spreads and prefix lengths (one full, one empty); ``ties``: values on a grid."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_rows, n, generator=g, dtype=torch.float64) * torch.linspace(0.1, 4.0, n_rows, dtype=torch.float64)[:, None]
    if ties:
        x = (x * 2).round() / 2
    lengths = torch.randint(0, n + 1, (n_rows,), generator=g)
    lengths[0], lengths[-1] = n, 0
    return x.to(dtype), lengths


def isotonic_brute_force(v: list[float]) -> list[float]:
    """Least-squares non-increasing fit by repeated pooling of the first violating pair of blocks."""
    blocks = [[x] for x in v]
    merged = True
    while merged:
        merged = False
        for i in range(len(blocks) - 1):
            if sum(blocks[i]) / len(blocks[i]) < sum(blocks[i + 1]) / len(blocks[i + 1]):
                blocks[i:i + 2] = [blocks[i] + blocks[i + 1]]
                merged = True
                break
    return [sum(b) / len(b) for b in blocks for _ in b]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [1, 2, 7, 50, 300])
def test_native_taut_string_equals_the_torch_funnel_scan(native_build, monkeypatch, dtype, n):
    """Slopes within rounding of the torch funnel scan for TV, asymmetric and one-sided walls and the
    isotonic fit, on every build; the groups equal on untied rows, the slopes on tied ones; past the
    length slope 0 and group m; an empty row all padding."""
    monkeypatch.setitem(_native._state, "lib", native_build)
    tol = 1e-5 if dtype is torch.float32 else 1e-11
    for ties in (False, True):
        x, lengths = rows(9, n, seed=n + ties, dtype=dtype, ties=ties)
        for lam_low, lam_up in WALLS:
            found = _native.taut_string(x, lengths, lam_low, lam_up)
            assert found is not None
            y, groups = found
            want_y, want_groups = taut_string(x, lengths, lam_low, lam_up, static=True)
            assert y.dtype is dtype and groups.dtype is torch.int64
            torch.testing.assert_close(y, want_y, rtol=tol, atol=tol * (1 + float(x.abs().max())))
            if not ties:
                assert torch.equal(groups, want_groups), (lam_low, lam_up)
            pad = torch.arange(n) >= lengths[:, None]
            assert bool((y[pad] == 0).all()) and torch.equal(groups[pad], lengths[:, None].expand(-1, n)[pad])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [1, 5, 16, 17, 33, 90])
def test_native_ordered_fit_equals_the_torch_one(native_build, monkeypatch, dtype, n):
    """OSCAR's ordered fit in one native call (stable sort by insertion in runs of 16 and merges, the
    sorted keys less lam (m - 1 - k), pool-adjacent-violators, back in place) against the torch
    operations around the torch funnel scan, on every build, keys of both signs (oscarmax_exact's)
    and magnitudes (oscarmax's), lambdas 0 to 0.3: fits within rounding, groups equal on untied
    float64 rows; past the length fit 0 and group m; a row holding NaN all NaN."""
    monkeypatch.setitem(_native._state, "lib", native_build)
    tol = 1e-5 if dtype is torch.float32 else 1e-11
    for ties in (False, True):
        x, lengths = rows(9, n, seed=2 * n + ties, dtype=dtype, ties=ties)
        for keys in (x, x.abs()):
            for lam in (0.0, 0.01, 0.3):
                fit, groups = _native.ordered_fit(keys, lengths, lam)
                want_fit, want_groups = ordered_fit(keys, lengths, lam, static=True)
                valid = torch.arange(n) < lengths[:, None]
                torch.testing.assert_close(fit[valid], want_fit[valid], rtol=tol, atol=tol * (1 + float(keys.abs().max())))
                if not ties and dtype is torch.float64:
                    assert torch.equal(groups[valid], want_groups[valid]), lam
                assert bool((fit[~valid] == 0).all())
                assert torch.equal(groups[~valid], lengths[:, None].expand(-1, n)[~valid])
    keys = torch.randn(2, n, dtype=dtype)
    keys[0, n // 2] = float("nan")
    fit = _native.ordered_fit(keys, torch.tensor([n, n]), 0.1)[0]
    assert bool(fit[0].isnan().all()) and not bool(fit[1].isnan().any())


def test_native_isotonic_fit_equals_brute_force_pooling():
    """The pool-adjacent-violators path against the definition (pool while a block's mean is below the
    next one's), float64, rows with ties."""
    if not _native.available():
        pytest.skip("native library not built")
    x, lengths = rows(12, 40, seed=3, dtype=torch.float64, ties=True)
    y, groups = _native.taut_string(x, lengths, 0.0, math.inf)
    for b in range(12):
        m = int(lengths[b])
        want = isotonic_brute_force(x[b, :m].tolist())
        torch.testing.assert_close(y[b, :m], torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-12)
        starts = groups[b, :m]
        assert bool((starts <= torch.arange(m)).all())  # a position's group starts at or before it
        assert bool((y[b, :m] == y[b, starts]).all())  # one value per group


def test_native_taut_string_over_two_threads_gives_the_same_bits(monkeypatch):
    if not _native.available():
        pytest.skip("native library not built")
    x, lengths = rows(401, 60, seed=8, dtype=torch.float32)
    one = _native.taut_string(x, lengths, 0.3, 0.3)
    threads = torch.get_num_threads()
    monkeypatch.setattr(_native, "POWER_SPLIT_MIN_NUMEL", 1)
    torch.set_num_threads(2)
    try:
        two = _native.taut_string(x, lengths, 0.3, 0.3)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])


def test_the_cpu_path_takes_the_native_scan_and_falls_back(monkeypatch):
    """CPU, eager, not ``static``: one native call each (fusedmax's prox the taut string, oscarmax's
    the ordered fit); half precision or no library: the torch paths, the same result."""
    from nmt.sparse.structured import fusedmax, oscarmax

    if not _native.available():
        pytest.skip("native library not built")
    calls = []
    real = _native.taut_string
    monkeypatch.setattr(taut_module, "native_taut_string", lambda *a: calls.append(a[2:]) or real(*a))
    real_fit = _native.ordered_fit
    monkeypatch.setattr(oscar_module, "native_ordered_fit", lambda *a: calls.append(a[2:]) or real_fit(*a))
    x = torch.randn(6, 15, dtype=torch.float64, requires_grad=True)
    p = fusedmax(x, lam=0.2)
    q = oscarmax(x, lam=0.05)
    assert calls == [(0.2, 0.2), (0.05,)]
    (gp,) = torch.autograd.grad(p, x, torch.randn(6, 15, dtype=torch.float64))
    with monkeypatch.context() as m:
        m.setitem(_native._state, "lib", None)
        torch.testing.assert_close(fusedmax(x, lam=0.2), p, rtol=0, atol=1e-12)
        torch.testing.assert_close(oscarmax(x, lam=0.05), q, rtol=0, atol=1e-12)
    assert _native.taut_string(x.detach().half(), torch.full((6,), 15), 0.1, 0.1) is None
    assert _native.ordered_fit(x.detach().half(), torch.full((6,), 15), 0.1) is None
    assert torch.isfinite(gp).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_native_group_average_equals_its_definition(native_build, monkeypatch, dtype):
    """The structured backward's group averaging in one native call (``_native.group_average``) on
    every build: each member entry gets the mean of the gradient over the members sharing its id
    (computed here row by row in Python, float64), other entries 0, groups with no member anywhere;
    the front door (``_groups.group_average``) takes it on the CPU and equals its torch form."""
    from nmt.sparse import _groups

    monkeypatch.setitem(_native._state, "lib", native_build)
    g = torch.Generator().manual_seed(11)
    for n, n_groups in ((1, 2), (7, 8), (50, 51), (300, 40)):
        grad = torch.randn(13, n, generator=g, dtype=torch.float64).to(dtype)
        groups = torch.randint(0, n_groups, (13, n), generator=g)
        member = torch.rand(13, n, generator=g) > 0.2
        member[0] = False
        out = _native.group_average(grad, groups, member, n_groups)
        assert out is not None and out.dtype is dtype
        want = torch.zeros(13, n, dtype=torch.float64)
        for b in range(13):
            for i in range(n):
                if member[b, i]:
                    same = member[b] & (groups[b] == groups[b, i])
                    want[b, i] = grad[b][same].double().mean()
        tol = 1e-6 if dtype is torch.float32 else 1e-12
        torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol)
        with monkeypatch.context() as m:
            m.setitem(_native._state, "lib", None)
            torch_form = _groups.group_average(grad, groups, member, n_groups)
        torch.testing.assert_close(_groups.group_average(grad, groups, member, n_groups), torch_form,
                                   rtol=tol, atol=tol)
