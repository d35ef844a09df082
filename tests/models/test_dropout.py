"""The CPU dropout, by the native counter-based mask (float32, where the library is built) and by
torch.rand (elsewhere; here with the library off): Bernoulli(1 - p) masks, the usual scaling and
gradient, nn.Dropout in eval mode and where it is not used."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from nmt.models import native_dropout
from nmt.models.dropout import Dropout


@pytest.fixture(params=["native", "torch.rand"], autouse=True)
def mask_path(request, monkeypatch):
    """Each test on both mask paths: the native one (skipped where the library is not built) and
    torch.rand's (the library off)."""
    if request.param == "native":
        if native_dropout.library() is None:
            pytest.skip("native dropout library not built")
    else:
        monkeypatch.setitem(native_dropout._state, "lib", None)
    return request.param


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_mask_rate_scale_and_gradient(p):
    torch.manual_seed(0)
    drop = Dropout(p).train()
    x = torch.ones(400, 1000, requires_grad=True)
    y = drop(x)
    kept = y != 0
    rate = kept.float().mean().item()
    n = x.numel()
    assert abs(rate - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)  # five standard deviations
    assert torch.allclose(y[kept], torch.full_like(y[kept], 1 / (1 - p)))
    g = torch.randn(400, 1000)
    y.backward(g)
    assert torch.allclose(x.grad, g * kept / (1 - p))


def test_independent_entries_and_seeded():
    torch.manual_seed(1)
    a = Dropout(0.5).train()(torch.ones(200, 500)) != 0
    torch.manual_seed(1)
    b = Dropout(0.5).train()(torch.ones(200, 500)) != 0
    assert torch.equal(a, b)
    # neighbouring entries are not correlated (a 2x2 table of pairs)
    both = (a[:, :-1] & a[:, 1:]).float().mean().item()
    assert abs(both - 0.25) < 0.01


def test_eval_identity_edge_rates_and_state():
    x = torch.randn(5, 7)
    assert torch.equal(Dropout(0.3).eval()(x), x)
    assert torch.equal(Dropout(0.0).train()(x), x)
    assert torch.equal(Dropout(1.0).train()(x), torch.zeros_like(x))
    d = Dropout(0.2)
    assert isinstance(d, nn.Dropout) and d.state_dict() == {} and "p=0.2" in repr(d)
    half = torch.randn(50, 50, dtype=torch.bfloat16)
    out = Dropout(0.4).train()(half)
    assert out.dtype == torch.bfloat16


def test_applied_skips_only_the_identity_calls():
    """``applied``: the very input where ``nn.Dropout`` is the identity (eval, p = 0), the module's
    own draw in training (same seed, same mask)."""
    from nmt.models.dropout import Dropout, applied

    x = torch.randn(4, 6)
    for module in (Dropout(0.3).eval(), Dropout(0.0).train()):
        assert applied(module, x) is x and torch.equal(module(x), x)
    module = Dropout(0.3).train()
    torch.manual_seed(5)
    want = module(x)
    torch.manual_seed(5)
    assert torch.equal(applied(module, x), want)
    assert not torch.equal(want, x)
