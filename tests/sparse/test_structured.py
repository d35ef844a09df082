"""fusedmax / oscarmax and their exact proxes, checked against independent truths.

Truths: the KKT conditions of the TV prox, a generic convex solver (scipy SLSQP on the
smooth reformulations with auxiliary variables), a textbook pool-adjacent-violators fit,
the `entmax` reference package's sparsemax, finite differences (gradcheck) and brute force.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from nmt.sparse import get_mapping
from nmt.sparse._prox_oscar import OrderedFitFunction, ProxOscarFunction, isotonic_nonincreasing, prox_oscar
from nmt.sparse._prox_tv import ProxTVFunction, prox_tv
from nmt.sparse._taut_string import taut_string
from nmt.sparse.sparsemax import sparsemax
from nmt.sparse.structured import Fusedmax, Oscarmax, OscarmaxExact, fusedmax, oscarmax, oscarmax_exact

MAPS = [fusedmax, oscarmax, oscarmax_exact]


def _rows(seed: int, batch: int, n: int, scale: float = 1.0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, n, generator=g, dtype=dtype) * scale
    lengths = torch.randint(0, n + 1, (batch,), generator=g)
    lengths[0] = n
    return x, lengths


# ---------------------------------------------------------------- independent references

def _slsqp(x0: np.ndarray, objective_grad, A_ineq: np.ndarray, A_eq=None, b_eq=None) -> np.ndarray:
    cons = [{"type": "ineq", "fun": lambda z: A_ineq @ z, "jac": lambda z: A_ineq}]
    if A_eq is not None:
        cons.append({"type": "eq", "fun": lambda z: A_eq @ z - b_eq, "jac": lambda z: A_eq})
    res = minimize(lambda z: objective_grad(z)[0], x0, jac=lambda z: objective_grad(z)[1],
                   constraints=cons, method="SLSQP", options={"ftol": 1e-15, "maxiter": 3000})
    return res.x


def _tv_problem(q: np.ndarray, lam: float, simplex: bool) -> np.ndarray:
    """argmin 1/2||y - q||^2 + lam TV(y) [over the simplex], via t_i >= |y_{i+1} - y_i|."""
    m = len(q)
    rows = []
    for i in range(m - 1):
        for s in (1.0, -1.0):
            row = np.zeros(2 * m - 1)
            row[m + i], row[i + 1], row[i] = 1.0, -s, s
            rows.append(row)
    if simplex:
        rows += [np.eye(2 * m - 1)[i] for i in range(m)]

    def fg(z):
        y, t = z[:m], z[m:]
        grad = np.concatenate([y - q, np.full(m - 1, lam)])
        return 0.5 * np.sum((y - q) ** 2) + lam * t.sum(), grad

    A = np.array(rows) if rows else np.zeros((0, 2 * m - 1))
    start = np.concatenate([np.full(m, 1.0 / m) if simplex else q, np.abs(np.diff(q))])
    eq = (np.concatenate([np.ones(m), np.zeros(m - 1)])[None], np.ones(1)) if simplex else (None, None)
    return _slsqp(start, fg, A, *eq)[:m]


def _oscar_prox_ref(q: np.ndarray, lam: float) -> np.ndarray:
    """argmin 1/2||y - q||^2 + lam sum_{i<j} max(|y_i|, |y_j|), via t_ij >= +-y_i, +-y_j."""
    m = len(q)
    pairs = [(i, j) for i in range(m) for j in range(i + 1, m)]
    size = m + len(pairs)
    rows = []
    for p, (i, j) in enumerate(pairs):
        for k in (i, j):
            for s in (1.0, -1.0):
                row = np.zeros(size)
                row[m + p], row[k] = 1.0, -s
                rows.append(row)

    def fg(z):
        y, t = z[:m], z[m:]
        return 0.5 * np.sum((y - q) ** 2) + lam * t.sum(), np.concatenate([y - q, np.full(len(pairs), lam)])

    if not pairs:
        return q.copy()
    start = np.concatenate([q, [max(abs(q[i]), abs(q[j])) for i, j in pairs]])
    return _slsqp(start, fg, np.array(rows))[:m]


def _oscar_simplex_ref(q: np.ndarray, lam: float) -> np.ndarray:
    """argmin_{p in simplex} 1/2||p - q||^2 + lam sum_{i<j} max(p_i, p_j), via t_ij >= p_i, p_j."""
    m = len(q)
    pairs = [(i, j) for i in range(m) for j in range(i + 1, m)]
    size = m + len(pairs)
    rows = [np.eye(size)[i] for i in range(m)]
    for p, (i, j) in enumerate(pairs):
        for k in (i, j):
            row = np.zeros(size)
            row[m + p], row[k] = 1.0, -1.0
            rows.append(row)

    def fg(z):
        y, t = z[:m], z[m:]
        return 0.5 * np.sum((y - q) ** 2) + lam * t.sum(), np.concatenate([y - q, np.full(len(pairs), lam)])

    eq = np.concatenate([np.ones(m), np.zeros(len(pairs))])[None]
    return _slsqp(np.full(size, 1.0 / m), fg, np.array(rows), eq, np.ones(1))[:m]


def _pav_nonincreasing(v: list[float]) -> list[float]:
    """Textbook pool-adjacent-violators (non-increasing)."""
    blocks: list[list[float]] = []  # [sum, count]
    for value in v:
        blocks.append([value, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    return [s / c for s, c in blocks for _ in range(int(c))]


# ---------------------------------------------------------------- the proxes

@pytest.mark.parametrize("lam,scale", [(0.05, 1.0), (0.3, 1.0), (1.0, 3.0), (10.0, 1.0), (0.2, 1e-3)])
def test_prox_tv_satisfies_kkt(lam, scale):
    x, lengths = _rows(0, 64, 40, scale)
    y, groups = prox_tv(x, lengths, lam)
    u = torch.cumsum(y - x, dim=-1)                    # u_k = s_k - r_k, the dual variable
    for b in range(x.shape[0]):
        m = int(lengths[b])
        assert torch.all(y[b, m:] == 0)
        if m == 0:
            continue
        ub, yb = u[b, :m], y[b, :m]
        tol = 1e-10 * (1 + x[b, :m].abs().sum())
        assert abs(ub[-1]) < tol                         # s_m = r_m
        assert torch.all(ub[:-1].abs() <= lam + tol)     # |u| <= lam
        jump = yb[1:] - yb[:-1]
        assert torch.all((ub[:-1] - lam).abs()[jump > tol] < tol)   # jumps up touch the upper wall
        assert torch.all((ub[:-1] + lam).abs()[jump < -tol] < tol)
        expected, start = [], 0                          # groups are the runs of equal values
        for i in range(m):
            if i > 0 and abs(jump[i - 1]) > tol:
                start = i
            expected.append(start)
        assert groups[b, :m].tolist() == expected


def test_prox_tv_matches_generic_solver():
    x, lengths = _rows(1, 12, 8, 2.0)
    for lam in (0.1, 0.7):
        y, _ = prox_tv(x, lengths, lam)
        for b in range(x.shape[0]):
            m = int(lengths[b])
            if m:
                ref = _tv_problem(x[b, :m].numpy(), lam, simplex=False)
                np.testing.assert_allclose(y[b, :m].numpy(), ref, atol=1e-6)


def test_prox_oscar_matches_generic_solver():
    x, lengths = _rows(2, 12, 6, 1.5)
    for lam in (0.05, 0.4):
        y, groups, coef = prox_oscar(x, lengths, lam)
        for b in range(x.shape[0]):
            m = int(lengths[b])
            assert torch.all(y[b, m:] == 0)
            if m:
                np.testing.assert_allclose(y[b, :m].numpy(), _oscar_prox_ref(x[b, :m].numpy(), lam),
                                           atol=1e-6)
        # groups are exactly the entries of equal nonzero |y|
        same = groups[:, :, None] == groups[:, None, :]
        nz = coef != 0
        both = nz[:, :, None] & nz[:, None, :]
        close = (y.abs()[:, :, None] - y.abs()[:, None, :]).abs() < 1e-12
        assert torch.equal(same & both, close & both)


def test_isotonic_matches_pool_adjacent_violators():
    v, lengths = _rows(3, 40, 30, 2.0)
    fit, blocks = isotonic_nonincreasing(v, lengths)
    for b in range(v.shape[0]):
        m = int(lengths[b])
        ref = _pav_nonincreasing(v[b, :m].tolist())
        np.testing.assert_allclose(fit[b, :m].numpy(), ref, atol=1e-12)


@pytest.mark.parametrize("lams", [(0.3, 0.3), (0.0, math.inf), (0.05, 2.0), (4.0, 4.0)])
def test_active_set_agrees_with_funnel_scan(lams):
    """The exact knot finders agree: the torch active set; the torch funnel scan after 0 / 2 rounds
    and on every row (``static``); the native scan (pool-adjacent-violators for the isotonic fit)."""
    x, lengths = _rows(4, 50, 25, 2.0)
    y, groups = taut_string(x, lengths, *lams, native=False)
    for rounds in (0, 2):
        y2, groups2 = taut_string(x, lengths, *lams, max_iter=rounds, native=False)
        torch.testing.assert_close(y2, y, rtol=0, atol=1e-12)
        assert torch.equal(groups2, groups)
    for kw in ({"static": True}, {}):  # {}: the native scan where the library is built
        y2, groups2 = taut_string(x, lengths, *lams, **kw)
        torch.testing.assert_close(y2, y, rtol=0, atol=1e-12)
        assert torch.equal(groups2, groups)


def test_prox_jacobians_by_finite_differences():
    x, lengths = _rows(5, 6, 9, 2.0)
    for fn in (ProxTVFunction.apply, ProxOscarFunction.apply, OrderedFitFunction.apply):
        assert torch.autograd.gradcheck(lambda z: fn(z, lengths, 0.3), (x.clone().requires_grad_(),))


# ---------------------------------------------------------------- the maps

def test_fusedmax_is_the_regularized_map():
    """Prop. 2: sparsemax(prox_TV(x / gamma)) solves the TV-regularized problem over the simplex."""
    x, lengths = _rows(6, 10, 8, 2.0)
    mask = torch.arange(8) < lengths[:, None]
    for lam, gamma in ((0.2, 1.0), (0.6, 0.5)):
        p = fusedmax(x, lam, gamma, mask=mask)
        for b in range(x.shape[0]):
            m = int(lengths[b])
            if m:
                ref = _tv_problem(x[b, :m].numpy() / gamma, lam, simplex=True)
                np.testing.assert_allclose(p[b, :m].numpy(), ref, atol=1e-6)


def test_oscarmax_is_prox_then_projection():
    entmax = pytest.importorskip("entmax")
    x, _ = _rows(7, 4, 5, 1.5)
    lam, gamma = 0.1, 0.8
    prox = torch.tensor(np.stack([_oscar_prox_ref(row.numpy() / gamma, lam) for row in x]))
    torch.testing.assert_close(oscarmax(x, lam, gamma), entmax.sparsemax(prox, dim=-1), atol=1e-6, rtol=0)


def test_oscarmax_exact_is_the_regularized_map():
    """Mixed-sign scores, where the paper's composition (oscarmax) is only an approximation."""
    x, _ = _rows(14, 5, 5, 1.5)
    lam, gamma = 0.15, 0.7
    exact = oscarmax_exact(x, lam, gamma)
    for b in range(x.shape[0]):
        np.testing.assert_allclose(exact[b].numpy(), _oscar_simplex_ref(x[b].numpy() / gamma, lam), atol=1e-6)
    assert (oscarmax(x, lam, gamma) - exact).abs().max() > 1e-3       # the approximation differs
    pos = x.abs() + 0.5                                                 # on positive scores they agree
    torch.testing.assert_close(oscarmax(pos, lam, gamma), oscarmax_exact(pos, lam, gamma))


@pytest.mark.parametrize("fn", MAPS)
def test_lam_zero_is_sparsemax(fn):
    x = torch.randn(3, 5, 7, dtype=torch.float64)
    assert torch.equal(fn(x, 0.0, 2.0, dim=1), sparsemax(x / 2.0, dim=1))
    entmax = pytest.importorskip("entmax")
    torch.testing.assert_close(fn(x, 0.0), entmax.sparsemax(x, dim=-1))


@pytest.mark.parametrize("fn", MAPS)
@pytest.mark.parametrize("scale", [1e-4, 1.0, 1e3])
def test_outputs_are_distributions(fn, scale):
    x, lengths = _rows(8, 30, 20, scale)
    mask = torch.arange(20) < lengths[:, None]
    p = fn(x, 0.3, mask=mask)
    assert torch.all(p >= 0)
    assert torch.all(p[~mask] == 0)
    sums = p.sum(-1)
    torch.testing.assert_close(sums[lengths > 0], torch.ones_like(sums[lengths > 0]))
    assert torch.all(sums[lengths == 0] == 0)


def test_fusedmax_is_piecewise_constant_over_fused_groups():
    x, lengths = _rows(9, 30, 30, 1.0)
    lam = 0.5
    _, groups = prox_tv(x, lengths, lam)
    p = fusedmax(x, lam, mask=torch.arange(30) < lengths[:, None])
    first = p.gather(1, groups.clamp(max=29))
    valid = torch.arange(30) < lengths[:, None]
    assert torch.equal(p[valid], first[valid])
    # groups are contiguous runs and strong fusion leaves fewer distinct values than sparsemax
    assert torch.all(groups[:, 1:] >= groups[:, :-1])
    distinct = lambda q: sum(len(torch.unique(r[r > 0])) for r in q)  # noqa: E731
    assert distinct(p) < distinct(sparsemax(x, mask=valid))


def test_oscarmax_ties_equal_magnitudes():
    x = torch.tensor([[2.0, 0.3, 1.9, -0.1, 1.95, 0.25]], dtype=torch.float64)
    p = oscarmax(x, lam=0.1)
    assert p[0, 0] == p[0, 2] == p[0, 4] > 0     # 2, 1.9, 1.95 are pooled, wherever they are
    assert p[0, 1] == p[0, 3] == p[0, 5] == 0
    y, groups, coef = prox_oscar(-x, torch.tensor([6]), 0.1)   # groups pool magnitudes, signed
    assert groups[0, 0] == groups[0, 2] == groups[0, 4] and torch.all(coef[0, [0, 2, 4]] == -1)
    torch.testing.assert_close(y[0, [0, 2, 4]], torch.full((3,), -1.55, dtype=torch.float64))


@pytest.mark.parametrize("fn", MAPS)
def test_gradients_by_finite_differences(fn):
    x, lengths = _rows(10, 5, 8, 2.0)
    mask = torch.arange(8) < lengths[:, None]
    assert torch.autograd.gradcheck(lambda z: fn(z, 0.25, 1.3, mask=mask), (x.clone().requires_grad_(),))


@pytest.mark.parametrize("fn", MAPS)
def test_mask_equals_truncation_and_compaction(fn):
    x, lengths = _rows(11, 20, 12, 1.0)
    prefix = torch.arange(12) < lengths[:, None]
    p = fn(x, 0.3, mask=prefix)
    for b in range(20):
        m = int(lengths[b])
        if m:
            torch.testing.assert_close(p[b, :m], fn(x[b, :m], 0.3), rtol=0, atol=1e-12)
    # an arbitrary mask acts like deleting the masked entries; -inf scores are masked entries
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(20, 12, generator=g) > 0.4
    p = fn(x, 0.3, mask=mask)
    p_inf = fn(x.masked_fill(~mask, float("-inf")), 0.3)
    assert torch.equal(p, p_inf)
    for b in range(20):
        if mask[b].any():
            torch.testing.assert_close(p[b][mask[b]], fn(x[b][mask[b]], 0.3), rtol=0, atol=1e-12)
        assert torch.all(p[b][~mask[b]] == 0)


@pytest.mark.parametrize("fn", MAPS)
def test_fully_masked_row_is_zero_with_zero_gradient(fn):
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[1] = False
    p = fn(x, 0.2, mask=mask)
    assert torch.all(p[1] == 0)
    (p * torch.randn(3, 6, dtype=torch.float64)).sum().backward()
    assert torch.all(x.grad[1] == 0) and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("fn", MAPS)
def test_dim_batch_shapes_and_half_precision(fn):
    x = torch.randn(4, 9, 3, dtype=torch.float64)
    expected = fn(x.transpose(1, 2), 0.2).transpose(1, 2)
    torch.testing.assert_close(fn(x, 0.2, dim=1), expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(fn(x, 0.2, dim=-2), expected, rtol=0, atol=1e-12)
    mask = torch.rand(4, 9, 1) > 0.3
    mask[:, 0] = True
    torch.testing.assert_close(fn(x, 0.2, dim=1, mask=mask),
                               fn(x.transpose(1, 2), 0.2, mask=mask.transpose(1, 2)).transpose(1, 2))
    # a row computed inside a batch equals the row alone
    for b in range(4):
        torch.testing.assert_close(fn(x, 0.2, dim=1)[b], fn(x[b], 0.2, dim=0), rtol=0, atol=1e-12)
    half = fn(x.half(), 0.2, dim=1)
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.double(), fn(x.half().double(), 0.2, dim=1), atol=2e-3, rtol=0)
    single = fn(x.float(), 0.2, dim=1)
    assert single.dtype == torch.float32
    torch.testing.assert_close(single.double(), expected, atol=1e-5, rtol=0)


def test_modules_registry_and_validation():
    x = torch.randn(2, 7)
    assert torch.equal(Fusedmax(lam=0.3, gamma=2.0)(x), fusedmax(x, 0.3, 2.0))
    assert torch.equal(Oscarmax(lam=0.05, dim=0)(x), oscarmax(x, 0.05, dim=0))
    assert torch.equal(OscarmaxExact(lam=0.05)(x), oscarmax_exact(x, 0.05))
    assert torch.equal(get_mapping("fusedmax", lam=0.3)(x), fusedmax(x, 0.3))
    assert torch.equal(get_mapping("oscarmax", lam=0.05, gamma=0.5)(x), oscarmax(x, 0.05, 0.5))
    assert "lam=0.3" in repr(Fusedmax(0.3))
    for bad in (dict(lam=-0.1), dict(gamma=0.0), dict(lam=float("nan")), dict(lam="0.1"),
                dict(lam=float("inf")), dict(gamma=True)):
        with pytest.raises(ValueError, match="lam|gamma"):
            fusedmax(x, **bad)
        with pytest.raises(ValueError, match="lam|gamma"):
            oscarmax(x, **bad)
    with pytest.raises(ValueError, match="lam"):
        Fusedmax(lam=-1)
    with pytest.raises(ValueError, match="mask"):
        fusedmax(x, mask=torch.ones(2, 7))
    assert fusedmax(torch.zeros(3, 0)).shape == (3, 0) and oscarmax(torch.zeros(0, 4)).shape == (0, 4)


def test_long_rows_are_chunked_and_exact(monkeypatch):
    """Wide rows with many knots: the active set agrees with the funnel scan run one row per chunk."""
    from nmt.sparse import _taut_string

    x, lengths = _rows(12, 4, 300, 1.0)
    y, groups = prox_tv(x, lengths, 0.05)
    monkeypatch.setattr(_taut_string, "MAX_SCAN_ENTRIES", 2 * 301 * 301)
    y2, groups2 = taut_string(x, lengths, 0.05, 0.05, max_iter=0)
    torch.testing.assert_close(y, y2, rtol=0, atol=1e-10)
    assert torch.equal(groups, groups2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fn", MAPS)
def test_cuda_matches_cpu(fn):
    x, lengths = _rows(13, 16, 20, 1.0)
    mask = torch.arange(20) < lengths[:, None]
    torch.testing.assert_close(fn(x.cuda(), 0.3, mask=mask.cuda()).cpu(), fn(x, 0.3, mask=mask))


# ---------------------------------------------------------------- the one-node fast path

def _reference_map(name: str, row: torch.Tensor, lam: float, gamma: float) -> torch.Tensor:
    """The map on one compact float64 row, from independent pieces: the funnel-scan taut string
    (no active set) for TV, textbook PAV for the OSCAR proxes, and a plain sort-based sparsemax."""
    z = row.double() / gamma
    m = z.numel()
    if m == 0:
        return z
    lengths = torch.tensor([m])
    if lam > 0 and name == "fusedmax":
        z = taut_string(z[None], lengths, lam, lam, max_iter=0)[0][0]
    elif lam > 0:
        keys = z.abs() if name == "oscarmax" else z
        order = torch.sort(keys, descending=True, stable=True).indices
        w = lam * (m - 1 - torch.arange(m, dtype=torch.float64))
        fit = torch.tensor(_pav_nonincreasing((keys[order] - w).tolist()), dtype=torch.float64)
        fit = torch.empty_like(fit).scatter_(0, order, fit)
        z = torch.sign(z) * fit.clamp(min=0) if name == "oscarmax" else fit
    zs = torch.sort(z, descending=True).values
    ks = torch.arange(1, m + 1, dtype=torch.float64)
    k = int(((1 + ks * zs) > zs.cumsum(0)).sum())
    return (z - (zs[:k].sum() - 1) / k).clamp(min=0)


@pytest.mark.parametrize("fn", MAPS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("lam", [0.0, 0.04, 0.3, 3.0])
def test_map_matches_independent_composition(fn, dtype, lam):
    """Prefix masks (random lengths, empty rows included) and arbitrary masks, n on both sides of
    the sort/Newton threshold switches, against the per-row composition of independent pieces."""
    for n, seed in ((9, 20), (45, 21), (150, 22)):
        x, lengths = _rows(seed, 12, n, 1.5, dtype)
        lengths[1] = 0
        gamma = 0.7
        g = torch.Generator().manual_seed(seed)
        for mask in (torch.arange(n) < lengths[:, None], torch.rand(12, n, generator=g) > 0.3):
            p = fn(x, lam, gamma, mask=mask)
            assert p.dtype == dtype and torch.all(p[~mask] == 0)
            for b in range(12):
                ref = _reference_map(fn.__name__, x[b][mask[b]], lam, gamma)
                tol = 1e-12 if dtype == torch.float64 else 2e-5
                torch.testing.assert_close(p[b][mask[b]].double(), ref, rtol=0, atol=tol)


@pytest.mark.parametrize("fn", MAPS)
def test_map_gradient_is_the_composed_jacobian(fn):
    """Backward = sparsemax Jacobian after the prox's group averaging, checked against the
    explicit Jacobian matrices built from the forward's groups (arbitrary mask, gamma != 1)."""
    x, lengths = _rows(23, 6, 40, 1.5)
    g = torch.Generator().manual_seed(23)
    mask = torch.rand(6, 40, generator=g) > 0.25
    lam, gamma = 0.2, 1.3
    xg = x.clone().requires_grad_()
    p = fn(xg, lam, gamma, mask=mask)
    v = torch.randn(6, 40, generator=g, dtype=torch.float64)
    (p * v).sum().backward()
    for b in range(6):
        row = x[b][mask[b]] / gamma
        m = row.numel()
        if fn is fusedmax:
            y, groups = prox_tv(row[None], torch.tensor([m]), lam)
            sign = torch.ones(m, dtype=torch.float64)
        elif fn is oscarmax:
            y, groups, sign = prox_oscar(row[None], torch.tensor([m]), lam)
            sign = sign[0]
        else:
            from nmt.sparse._prox_oscar import ordered_fit
            y, groups = ordered_fit(row[None], torch.tensor([m]), lam)
            sign = torch.ones(m, dtype=torch.float64)
        same = (groups[0][:, None] == groups[0][None, :]).double() * (sign[:, None] * sign[None, :])
        J_prox = same / same.abs().sum(1, keepdim=True).clamp(min=1)
        q = sparsemax(y[0])
        s = (q > 0).double()
        J_sm = torch.diag(s) - s[:, None] * s[None, :] / s.sum()
        expected = (J_sm @ J_prox).T @ v[b][mask[b]] / gamma
        torch.testing.assert_close(xg.grad[b][mask[b]], expected, rtol=0, atol=1e-12)
        assert torch.all(xg.grad[b][~mask[b]] == 0)


def test_sort_threshold_matches_newton_on_prox_rows():
    """The sort threshold used after the prox agrees with the Newton solver on masked rows."""
    from nmt.sparse._threshold import root_threshold, sort_threshold
    for n in (1, 7, 33, 128):
        for dtype, tol in ((torch.float64, 1e-13), (torch.float32, 1e-6)):
            x, lengths = _rows(24 + n, 20, n, 100.0, dtype)
            lengths[3] = 0
            z = x.masked_fill(torch.arange(n) >= lengths[:, None], float("-inf"))
            p = (z - sort_threshold(z, 1.0)).clamp(min=0)
            ref = (z - root_threshold(z, 1.0)).clamp(min=0)
            assert torch.isfinite(p).all() and torch.all(p[3] == 0)
            torch.testing.assert_close(p, ref, rtol=0, atol=tol * 100)


@pytest.mark.parametrize("scale", [1e-3, 1.0, 30.0])
def test_tv_start_rule_does_not_change_the_prox(scale):
    """Starting the active set with gates |x_{i+1} - x_i| <= 2 lam free: same prox as the funnel
    scan, also on rows with many differences of exactly 2 lam (there a zero jump may count as a
    group boundary or not, before and after this start rule: only the values are compared)."""
    x, lengths = _rows(25, 40, 30, scale)
    x[:5] = torch.round(x[:5] / (0.2 * scale)) * (0.2 * scale)        # differences of exactly 2 lam
    lam = 0.1 * scale
    y, groups = prox_tv(x, lengths, lam)
    y2, groups2 = taut_string(x, lengths, lam, lam, max_iter=0)
    torch.testing.assert_close(y, y2, rtol=0, atol=1e-12 * max(1.0, scale))
    assert torch.equal(groups[5:], groups2[5:])


@pytest.mark.parametrize("impl", ["pruned", "static"])
def test_large_scores_keep_their_precision(impl):
    """fusedmax and oscarmax_exact are shift-invariant (both proxes are shift-equivariant, as is
    the simplex projection): a common offset of 2^20 (exact in float32) leaves them unchanged up to
    float32 rounding of the output; they were computed on the shifted values (TV prox, ordered fit
    and threshold at magnitude 1e6: errors up to 0.27). Scores of magnitude 1e30 still give a
    distribution, for oscarmax too (the projection subtracted tau + zmax, rounded to zmax: all 0)."""
    g = torch.Generator().manual_seed(31)
    x = torch.randint(-16, 17, (6, 20), generator=g).float() / 8
    mask = torch.rand(6, 20, generator=g) > 0.3
    for fn in (fusedmax, oscarmax_exact):
        for n in (20, 200):  # sort and Newton projections
            xn = x.repeat(1, n // 20)
            mn = mask.repeat(1, n // 20)
            ref = fn(xn.double(), 0.1, mask=mn, impl=impl)
            p = fn(xn + 2.0 ** 20, 0.1, mask=mn, impl=impl)
            torch.testing.assert_close(p.double(), ref, rtol=0, atol=1e-6)
    big = torch.tensor([[1e30, -1e30, 3e30], [-2e30, 5e29, -3e30]])
    for fn in MAPS:
        p = fn(big, 0.1, impl=impl)
        torch.testing.assert_close(p, torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]]), rtol=0, atol=0)


@pytest.mark.parametrize("fn", MAPS)
def test_empty_input_is_differentiable(fn):
    """An empty batch (or rows of no entries) maps to an empty result that backpropagates, as
    the other mappings' (it was a new tensor outside the graph: backward raised)."""
    for shape in ((0, 5), (3, 0)):
        x = torch.randn(*shape, requires_grad=True)
        p = fn(x, 0.1)
        assert p.shape == x.shape
        p.sum().backward()
        assert x.grad is not None and x.grad.shape == x.shape
