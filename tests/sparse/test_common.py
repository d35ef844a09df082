"""log_probs_of: log 0 = -inf exactly, no host sync, fullgraph compile, finite gradients."""
import pytest
import torch

from nmt.sparse import entmax15, log_probs_of
from nmt.utils.sync_audit import SyncAudit


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_log_probs_of_values(dtype):
    p = torch.tensor([[0.0, 0.25, 0.75], [1.0, 0.0, float("nan")]], dtype=dtype)
    out = log_probs_of(p)
    assert out.dtype == dtype and out.shape == p.shape
    assert out[0, 0] == float("-inf") and out[1, 1] == float("-inf") and out[1, 0] == 0
    assert torch.isnan(out[1, 2])  # NaN is never taken for an exact zero
    assert torch.equal(out[0, 1:], torch.log(p[0, 1:]))


def test_log_probs_of_never_synchronises_and_compiles():
    p = entmax15(torch.randn(5, 30) * 3)
    with SyncAudit() as audit:
        out = log_probs_of(p)
    assert audit.total == 0, audit.report()
    compiled = torch.compile(log_probs_of, fullgraph=True, dynamic=False, backend="aot_eager")
    assert torch.equal(compiled(p), out)


def test_log_probs_of_gradient():
    p = torch.tensor([0.0, 0.2, 0.8], dtype=torch.float64, requires_grad=True)
    log_probs_of(p).sum().backward()
    assert torch.equal(p.grad, torch.tensor([0.0, 5.0, 1.25], dtype=torch.float64))


def test_row_exponent_expands_for_short_cpu_rows_only():
    """``row_exponent``: a per-row exponent expanded to the rows' shape (contiguous) for rows
    shorter than 64 entries on the CPU (torch's pow leaves its vectorised loop for an exponent
    broadcast along short rows), the same tensor otherwise; the powers agree with float64 ones
    within rounding either way, and nothing synchronises."""
    from nmt.sparse._common import row_exponent

    g = torch.Generator().manual_seed(0)
    for n, expanded in ((1, True), (20, True), (63, True), (64, False), (300, False)):
        d = torch.rand(40, n, generator=g) + 0.01
        e = torch.rand(40, 1, generator=g) * 3
        with SyncAudit() as audit:
            full = row_exponent(e, d)
        assert audit.total == 0, audit.report()
        if expanded:
            assert full.shape == d.shape and full.is_contiguous() and torch.equal(full, e.expand_as(d))
        else:
            assert full is e
        truth = torch.pow(d.double(), e.double())
        assert torch.allclose(torch.pow(d, full).double(), truth, rtol=2.5e-7, atol=0)
    same = torch.rand(3, 5)
    assert row_exponent(same, same) is same  # already full: no copy


def test_learned_alpha_attention_unchanged_by_the_expanded_exponent():
    """Per-row alphas on attention-sized rows (the learned heads' case, which takes the expanded
    exponent) against float64 on the same path: the outputs, and the gradients of scores and alphas."""
    from nmt.sparse.entmax import entmax_bisect_above_one

    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 4, 7, 20, generator=g) * 2
    alpha = (1.05 + 0.9 * torch.rand(1, 4, 1, 1, generator=g))
    out = []
    for dtype in (torch.float32, torch.float64):
        xg, ag = x.to(dtype, copy=True).requires_grad_(), alpha.to(dtype, copy=True).requires_grad_()
        p = entmax_bisect_above_one(xg, ag)
        p.backward(torch.arange(20, dtype=dtype).expand_as(p))
        out.append((p.detach().double(), xg.grad.double(), ag.grad.double()))
    (p32, gx32, ga32), (p64, gx64, ga64) = out
    assert torch.allclose(p32, p64, atol=2e-6) and torch.allclose(p32.sum(-1), torch.ones(6, 4, 7, dtype=torch.float64))
    assert torch.allclose(gx32, gx64, atol=5e-5) and torch.allclose(ga32, ga64, rtol=1e-3, atol=1e-3)
