"""The custom operators of compiled graphs (nmt.sparse._compiled_ops) on the CPU: impl="auto"
keeps the CPU algorithm while torch.compile traces, as one ``nmt::pruned_shifted_threshold``
operator per threshold, with eager's values and gradients. (The Triton kernels' operators are
tested in test_triton.py, in the interpreter.)"""
from __future__ import annotations

import pytest
import torch

from nmt.sparse import (
    entmax15,
    entmax15_loss,
    entmax_bisect,
    entmax_bisect_loss,
    sparsemax,
    sparsemax_loss,
)
from nmt.sparse._compiled_ops import pruned_shifted_threshold
from nmt.sparse._threshold import pruned_shifted_threshold as eager_threshold

F64 = torch.float64


def _scores(n_rows: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n_rows, n, generator=g, dtype=F64) * 2
    x[1] = x[1].round()  # ties
    x[2, n // 3:] = float("-inf")
    x[3] = x[3] * 1e-3  # near-uniform: a broad row
    return x


@pytest.mark.parametrize("n", [12, 3000])  # sorted rows; pruned Newton on long rows
def test_compiled_cpu_mappings_and_losses_use_the_cpu_algorithm(n, compiled_vs_eager):
    """fullgraph compile (aot_eager) of every exact mapping, a per-row (learnable) alpha and the
    sparse losses: one graph whose thresholds are the pruned operator (none of the static path's
    solver steps traced), values and gradients equal to eager mode's (float64, 1e-12)."""
    x = _scores(6, n)
    t = torch.tensor([0, 1, -100, 5, 2, 7])
    alpha = torch.tensor([[1.1], [1.3], [1.5], [1.7], [1.9], [1.25]], dtype=F64, requires_grad=True)
    w = torch.randn(x.shape, dtype=F64)

    def total(s):
        maps = sparsemax(s) + entmax15(s) + entmax_bisect(s, 1.2) + entmax_bisect(s, alpha)
        losses = (sparsemax_loss(s, t) + entmax15_loss(s, t, label_smoothing=0.1)
                  + entmax_bisect_loss(s, t, alpha=1.3))
        return (maps * w).sum() + losses

    ops, losses, x_grads, alpha_grads = compiled_vs_eager(total, x, alpha)
    assert ops and set(ops) == {"nmt.pruned_shifted_threshold.default"}, ops
    assert len(ops) == 7  # four mappings, three losses
    for compiled, eager in (losses, x_grads, alpha_grads):
        torch.testing.assert_close(compiled, eager, rtol=1e-12, atol=1e-12)


def test_static_impl_traces_no_operator(compiled_vs_eager):
    """impl="static" is traced op by op (no custom operator): the sync-free path of accelerators."""
    alpha = torch.tensor([[1.4]], requires_grad=True)
    ops, losses, x_grads, _ = compiled_vs_eager(
        lambda s: (entmax15(s, impl="static") + entmax_bisect(s, alpha, impl="static")).pow(2).sum(),
        torch.randn(3, 20), alpha)
    assert ops == []
    for compiled, eager in (losses, x_grads):
        torch.testing.assert_close(compiled, eager, rtol=1e-6, atol=1e-7)


def test_pruned_operator_equals_the_function_and_passes_opcheck():
    """The operator returns the CPU algorithm's ``(tau_rel, zmax)`` (bit for bit) for float and
    per-row powers; its schema and fake implementation agree with it (``torch.library.opcheck``)."""
    x = _scores(5, 700)
    x[4, 0] = float("nan")
    q_rows = torch.tensor([[2.0], [1.5], [3.0], [2.5], [1.2]], dtype=F64)
    for q, tol in ((2.0, None), (1.0, None), (q_rows, 1e-12), (10 / 3, 1e-12)):
        tau, zmax = pruned_shifted_threshold(x, q, 0.5, tol, None)
        tau2, zmax2 = eager_threshold(x, q, 0.5, tol, None)
        assert tau.shape == zmax.shape == (5, 1)
        assert torch.equal(tau, tau2) and torch.equal(zmax.isnan(), zmax2.isnan())
        assert torch.equal(zmax.nan_to_num(), zmax2.nan_to_num())
    op = torch.ops.nmt.pruned_shifted_threshold.default
    torch.library.opcheck(op, (x, None, 2.0, 0.5, None, None), test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(op, (x, q_rows, 0.0, 1.0, 1e-12, 50), test_utils=("test_schema", "test_faketensor"))
