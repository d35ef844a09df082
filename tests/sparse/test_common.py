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
