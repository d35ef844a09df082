"""RecurrentWeight: the deferred weight gradient equals plain autograd's (float64)."""
from __future__ import annotations

import torch

from nmt.models.recurrent_product import RecurrentWeight, deferred_enabled


def _recurrence(w: torch.Tensor, u: torch.Tensor, xs: torch.Tensor, deferred: bool) -> torch.Tensor:
    """h_t = tanh([x_t; h_{t-1}] W^T) + a second use of W outside the recurrence."""
    product = RecurrentWeight(w).product if deferred else (lambda x: x.mm(w.t()))
    h = torch.zeros(xs.size(1), w.size(0), dtype=w.dtype)
    total = 0
    for x in xs.unbind(0):
        h = torch.tanh(product(torch.cat([x, h], dim=1)))
        total = total + (h * u).sum()
    return total + w.square().sum()  # a plain use too: its gradient adds to the deferred one


def test_deferred_weight_gradient_equals_autograd() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(5, 3 + 5, generator=g, dtype=torch.float64, requires_grad=True)
    u = torch.randn(4, 5, generator=g, dtype=torch.float64)
    xs = torch.randn(6, 4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    grads = []
    for deferred in (False, True):
        w.grad = xs.grad = None
        _recurrence(w, u, xs, deferred).backward()
        grads.append((w.grad.clone(), xs.grad.clone()))
    torch.testing.assert_close(grads[1][0], grads[0][0], rtol=0, atol=1e-12)
    torch.testing.assert_close(grads[1][1], grads[0][1], rtol=0, atol=1e-12)


def test_second_backward_and_frozen_weight() -> None:
    g = torch.Generator().manual_seed(1)
    w = torch.randn(4, 2 + 4, generator=g, dtype=torch.float64, requires_grad=True)
    u = torch.randn(3, 4, generator=g, dtype=torch.float64)
    xs = torch.randn(5, 3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    loss = _recurrence(w, u, xs, deferred=True)
    first = torch.autograd.grad(loss, w, retain_graph=True)[0]
    second = torch.autograd.grad(loss, w)[0]  # the records of the first pass were used up
    w.grad = None
    _recurrence(w, u, xs, deferred=False).backward()
    torch.testing.assert_close(first, w.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(second, w.grad, rtol=0, atol=1e-12)
    frozen = w.detach()
    xs.grad = None
    _recurrence(frozen, u, xs, deferred=True).backward()
    reference = xs.grad.clone()
    xs.grad = None
    _recurrence(frozen, u, xs, deferred=False).backward()
    torch.testing.assert_close(reference, xs.grad, rtol=0, atol=1e-12)


def test_enabled_only_for_eager_full_precision_training() -> None:
    x = torch.zeros(2)
    assert deferred_enabled(x)
    with torch.no_grad():
        assert not deferred_enabled(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not deferred_enabled(x)


def test_batched_operand_gradient_equals_autograd() -> None:
    """A batch of weights (N, out, in), each step's product ``bmm(x_t, W^T)`` with x_t (N, S, in)
    (attention's keys and transposed memory): the operand's gradient, one bmm after the last
    step, and the inputs' equal plain autograd's (float64), with a plain use of W beside."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(3, 5, 4, generator=g, dtype=torch.float64, requires_grad=True)  # (N, out, in)
    xs = torch.randn(6, 3, 2, 4, generator=g, dtype=torch.float64, requires_grad=True)  # T steps of (N, S, in)
    u = torch.randn(3, 2, 5, generator=g, dtype=torch.float64)
    grads = []
    for deferred in (False, True):
        w.grad = xs.grad = None
        product = RecurrentWeight(w).product if deferred else (lambda x: torch.bmm(x, w.transpose(1, 2)))
        total = w.square().sum()
        for x in xs.unbind(0):
            total = total + (torch.tanh(product(x)) * u).sum()
        total.backward()
        grads.append((w.grad.clone(), xs.grad.clone()))
    torch.testing.assert_close(grads[1][0], grads[0][0], rtol=0, atol=1e-12)
    torch.testing.assert_close(grads[1][1], grads[0][1], rtol=0, atol=1e-12)
