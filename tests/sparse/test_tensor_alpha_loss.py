"""tensor_alpha_entmax_loss: the alpha-entmax Fenchel-Young loss at one alpha per row, with its
alpha-gradient. Checked against the loss written out in numpy (bisection on the threshold, float64),
the fixed-alpha losses at each row's float alpha, finite differences in the scores and in alpha
(gradcheck: the analytic gradients hold p fixed, Danskin's theorem, the numeric ones do not), the
alpha-derivative of the regulariser in closed form, index targets, half precision, no host sync on
the static path, and torch.compile(fullgraph=True)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from nmt.sparse import entmax_bisect, entmax_bisect_loss
from nmt.sparse.tensor_alpha_loss import tensor_alpha_entmax_loss
from nmt.utils.sync_audit import SyncAudit
from numpy_mappings import entmax_np, tsallis_omega_np


def fy_np(s: np.ndarray, q: np.ndarray, alpha: float) -> float:
    """<s, p - q> - Omega(p) + Omega(q), p = alpha-entmax(s) (terms with p = q = 0 dropped)."""
    p = entmax_np(s, alpha)
    inner = sum(si * (pi - qi) for si, pi, qi in zip(s, p, q) if pi > 0 or qi > 0)
    return float(inner - tsallis_omega_np(p, alpha) + tsallis_omega_np(q, alpha))


def case(seed: int = 0, rows: int = 6, width: int = 7):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(rows, width, generator=g, dtype=torch.float64) * 2
    z[0, 3] = -math.inf  # a masked key
    q = torch.rand(rows, width, generator=g, dtype=torch.float64) * (torch.rand(rows, width, generator=g) < 0.6)
    q[:, 1] += 0.1  # no empty row
    q[0, 3] = 0.0
    q = q / q.sum(-1, keepdim=True)
    alpha = torch.tensor([1.01, 1.2, 1.5, 1.7, 2.0, 1.33], dtype=torch.float64)[:rows].unsqueeze(-1)
    return z, q, alpha


def test_the_loss_is_the_fenchel_young_loss_written_out():
    z, q, alpha = case()
    got = tensor_alpha_entmax_loss(z, q, alpha, reduction="none")
    expected = [fy_np(z[i].numpy(), q[i].numpy(), float(alpha[i])) for i in range(z.size(0))]
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-9, atol=1e-11)
    # the fixed-alpha loss (its threshold's conjugate formula) at each row's alpha, and the reductions
    fixed = torch.stack([entmax_bisect_loss(z[i:i + 1], q[i:i + 1], alpha=float(alpha[i]), reduction="none")[0]
                         for i in range(z.size(0))])
    torch.testing.assert_close(got, fixed, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(tensor_alpha_entmax_loss(z, q, alpha, reduction="sum"), got.sum())
    torch.testing.assert_close(tensor_alpha_entmax_loss(z, q, alpha), got.mean())
    # a reference on a masked key: an infinite loss
    bad = q.clone()
    bad[0] = 0.0
    bad[0, 3] = 1.0
    assert math.isinf(float(tensor_alpha_entmax_loss(z[:1], bad[:1], alpha[:1])))


def test_gradients_in_the_scores_and_in_alpha_by_finite_differences():
    z, q, alpha = case(1)
    z = z.clone().requires_grad_(True)
    a = alpha.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda z, a: tensor_alpha_entmax_loss(z, q, a, reduction="none"), (z, a),
                                    eps=1e-6, atol=1e-6)
    # one alpha broadcast over rows (a head's alpha), its gradient the rows' sum
    shared = torch.tensor([[1.4]], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: tensor_alpha_entmax_loss(z.detach(), q, a, reduction="sum"),
                                    (shared,), eps=1e-6, atol=1e-6)


def test_the_gradients_in_closed_form():
    """dL/dz = p - q; dL/dalpha = dOmega(q)/dalpha - dOmega(p)/dalpha with
    dOmega(y)/da = sum y^a log y / (a (a - 1)) - (sum y^a - 1) (2a - 1) / (a (a - 1))^2."""
    z, q, alpha = case(2)
    zz = z.clone().requires_grad_(True)
    a = alpha.clone().requires_grad_(True)
    tensor_alpha_entmax_loss(zz, q, a, reduction="sum").backward()
    p = torch.stack([torch.from_numpy(entmax_np(z[i].numpy(), float(alpha[i]))) for i in range(z.size(0))])
    torch.testing.assert_close(zz.grad, p - q, rtol=1e-9, atol=1e-12)

    def d_omega(y: np.ndarray, a: float) -> float:
        on = y > 0
        s = (y[on] ** a).sum()
        return float((y[on] ** a * np.log(y[on])).sum() / (a * (a - 1)) - (s - 1) * (2 * a - 1) / (a * (a - 1)) ** 2)

    expected = [d_omega(q[i].numpy(), float(alpha[i])) - d_omega(p[i].numpy(), float(alpha[i]))
                for i in range(z.size(0))]
    torch.testing.assert_close(a.grad.squeeze(-1), torch.tensor(expected, dtype=torch.float64), rtol=1e-8, atol=1e-10)


def test_index_targets_equal_one_hot_distributions_and_ignored_rows_add_nothing():
    z, _, alpha = case(3)
    target = torch.tensor([0, 2, -100, 6, 1, 5])
    got = tensor_alpha_entmax_loss(z, target, alpha, reduction="none")
    one_hot = torch.nn.functional.one_hot(target.clamp(min=0), 7).double()
    dist = tensor_alpha_entmax_loss(z, one_hot, alpha, reduction="none")
    assert float(got[2]) == 0.0
    keep = target != -100
    torch.testing.assert_close(got[keep], dist[keep], rtol=0, atol=0)
    torch.testing.assert_close(tensor_alpha_entmax_loss(z, target, alpha), got.sum() / 5)
    zz = z.clone().requires_grad_(True)
    tensor_alpha_entmax_loss(zz, target, alpha, reduction="sum").backward()
    assert float(zz.grad[2].abs().sum()) == 0.0
    with pytest.raises(ValueError, match="target class index out of range"):
        tensor_alpha_entmax_loss(z, torch.tensor([0, 2, 7, 6, 1, 5]), alpha)


def test_half_scores_compute_in_float32_and_alpha_keeps_its_precision():
    z, q, alpha = case(4)
    z = z.clone()
    z[0, 3] = 0.0
    half = z.bfloat16()
    got = tensor_alpha_entmax_loss(half, q.float(), alpha.float(), reduction="none")
    assert got.dtype == torch.bfloat16
    expected = tensor_alpha_entmax_loss(half.double(), q, alpha, reduction="none")
    torch.testing.assert_close(got.double(), expected, rtol=8e-3, atol=1e-3)


def test_errors():
    z, q, alpha = case()
    with pytest.raises(ValueError, match="alpha must be a floating point tensor"):
        tensor_alpha_entmax_loss(z, q, 1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="size 1 along the last dim"):
        tensor_alpha_entmax_loss(z, q, alpha.expand(6, 7))
    with pytest.raises(ValueError, match="must lie on the simplex"):
        tensor_alpha_entmax_loss(z, q * 2, alpha)
    with pytest.raises(ValueError, match="unknown reduction"):
        tensor_alpha_entmax_loss(z, q, alpha, reduction="avg")


def test_the_static_path_never_synchronises_forward_and_backward():
    z, q, alpha = case(5)
    z = z.float().clone()
    z[0, 3] = -math.inf
    z.requires_grad_(True)
    logit = torch.zeros(6, 1, requires_grad=True)
    with SyncAudit() as audit:
        a = (1 + torch.sigmoid(logit)).clamp(min=1.01)
        tensor_alpha_entmax_loss(z, q.float(), a, impl="static").backward()
    assert audit.total == 0, audit.report()
    assert torch.isfinite(z.grad).all() and torch.isfinite(logit.grad).all() and bool((logit.grad != 0).any())


def test_compiles_as_one_graph_and_equals_eager(monkeypatch):
    from nmt.sparse import _static

    for table in (_static.EXACT_STEPS, _static.NORM_STEPS, _static.SAFE_STEPS):
        for dtype in list(table):
            monkeypatch.setitem(table, dtype, 2)
    torch._dynamo.reset()
    z, q, alpha = case(6)
    z, q, alpha = z.float(), q.float(), alpha.float()

    def f(z, a):
        return tensor_alpha_entmax_loss(z, q, a, impl="static", reduction="sum")

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    ze, zc = z.clone().requires_grad_(), z.clone().requires_grad_()
    ae, ac = alpha.clone().requires_grad_(), alpha.clone().requires_grad_()
    le, lc = f(ze, ae), compiled(zc, ac)
    torch.testing.assert_close(lc, le, rtol=1e-5, atol=1e-5)
    le.backward()
    lc.backward()
    torch.testing.assert_close(zc.grad, ze.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ac.grad, ae.grad, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()


def test_its_score_gradient_is_the_mapping_the_heads_use():
    """The gradient in the scores is entmax_bisect at the same tensor alpha minus the target."""
    z, q, alpha = case(7)
    z = z.clone().requires_grad_(True)
    tensor_alpha_entmax_loss(z, q, alpha, reduction="sum").backward()
    torch.testing.assert_close(z.grad, entmax_bisect(z.detach(), alpha) - q, rtol=1e-10, atol=1e-12)
