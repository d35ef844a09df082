"""The Fenchel-Young loss of a set of correct classes (nmt.sparse.set_target): the loss at the
mapping restricted to the set is the minimum of the loss over every distribution on the set
(a generic solver and random distributions as the truth), -log of the set's softmax mass for
softmax (closed form), zero exactly where the prediction's support lies inside the set, and its
gradient with the target held fixed is the gradient of that minimum (finite differences)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from nmt.sparse import get_loss, get_mapping, set_target
from nmt.utils.sync_audit import SyncAudit

MAPPINGS = [("softmax", {}), ("sparsemax", {}), ("entmax15", {}), ("entmax_bisect", {"alpha": 1.3})]
IDS = [name + "".join(f"-{v}" for v in params.values()) for name, params in MAPPINGS]


def rows(seed: int, n: int = 6, classes: int = 7) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, classes, generator=g, dtype=torch.float64) * 2
    allowed = torch.rand(n, classes, generator=g) < 0.4
    allowed[torch.arange(n), torch.randint(0, classes, (n,), generator=g)] = True  # at least one class
    return z, allowed


def set_loss(name: str, params: dict, z: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    q = set_target(get_mapping(name, **params), z, allowed)
    return get_loss(name, **params)(z, q, reduction="none")


@pytest.mark.parametrize("name,params", MAPPINGS, ids=IDS)
def test_the_set_loss_is_the_smallest_loss_over_the_sets_distributions(name, params):
    z, allowed = rows(0)
    loss = set_loss(name, params, z, allowed)
    fy = get_loss(name, **params)
    torch.manual_seed(1)
    for i in range(z.size(0)):
        where = allowed[i].nonzero().flatten()
        k = where.numel()

        def value(x: np.ndarray) -> float:
            q = torch.zeros(z.size(1), dtype=torch.float64)
            q[where] = torch.as_tensor(np.clip(x, 0, None), dtype=torch.float64)
            q = q / q.sum()
            return float(fy(z[i:i + 1], q[None], reduction="sum"))

        if k > 1:  # a generic solver over the face of the simplex
            best = minimize(value, np.full(k, 1 / k), method="SLSQP", bounds=[(0, 1)] * k,
                            constraints=[{"type": "eq", "fun": lambda x: x.sum() - 1}], options={"ftol": 1e-12})
            assert float(loss[i]) <= best.fun + 1e-7
            assert float(loss[i]) == pytest.approx(best.fun, abs=1e-5)
        for _ in range(200):  # no distribution on the set does better
            q = torch.zeros(z.size(1), dtype=torch.float64)
            q[where] = torch.distributions.Dirichlet(torch.full((k,), 0.5, dtype=torch.float64)).sample()
            assert float(loss[i]) <= float(fy(z[i:i + 1], q[None], reduction="sum")) + 1e-10


def test_softmax_set_loss_is_minus_log_of_the_sets_mass():
    z, allowed = rows(2)
    loss = set_loss("softmax", {}, z, allowed)
    mass = (torch.softmax(z, -1) * allowed).sum(-1)
    torch.testing.assert_close(loss, -mass.log(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name,params", MAPPINGS[1:], ids=IDS[1:])
def test_zero_exactly_where_the_support_lies_inside_the_set(name, params):
    z, allowed = rows(3)
    p = get_mapping(name, **params)(z, dim=-1)
    inside = allowed | (p > 0)  # the set grown to hold the support: loss 0
    assert torch.all(set_loss(name, params, z, inside) <= 1e-12)
    outside = (p > 0) & ~allowed  # some support outside the set: loss > 0
    strict = set_loss(name, params, z, allowed)
    assert torch.all((strict > 1e-9) == outside.any(-1))


@pytest.mark.parametrize("name,params", MAPPINGS, ids=IDS)
def test_gradient_with_the_target_held_is_the_minimums_gradient(name, params):
    """Danskin: d/dz min_q L(z; q) = p - q*; the minimum recomputed at each shifted point."""
    z, allowed = rows(4, n=3, classes=6)
    z = z.clone().requires_grad_(True)
    set_loss(name, params, z, allowed).sum().backward()
    h = 1e-6
    numeric = torch.zeros_like(z)
    for idx in np.ndindex(*z.shape):
        plus, minus = z.detach().clone(), z.detach().clone()
        plus[idx] += h
        minus[idx] -= h
        numeric[idx] = (set_loss(name, params, plus, allowed).sum() - set_loss(name, params, minus, allowed).sum()) / (2 * h)
    torch.testing.assert_close(z.grad, numeric, rtol=1e-4, atol=1e-6)


def test_the_target_is_detached_half_scores_map_in_float32_and_nothing_syncs():
    z, allowed = rows(5)
    z16 = z.to(torch.bfloat16).requires_grad_(True)
    mapping = get_mapping("entmax15")
    with SyncAudit() as audit:
        q = set_target(mapping, z16, allowed)
    assert audit.total == 0, audit.report()
    assert q.dtype == torch.float32 and not q.requires_grad
    assert torch.all(q[~allowed] == 0)
    torch.testing.assert_close(q.sum(-1), torch.ones(z.size(0)), rtol=0, atol=1e-6)
