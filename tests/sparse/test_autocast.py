"""The mappings and losses under autocast: they compute in the dtype they chose (float32 for half
scores), not autocast's. Autocast lowers matrix and vector products (``matmul``,
``linalg.vecdot``) to half precision; inside the thresholds' solvers and the losses' conjugates
that cost 1.5-entmax its exactness (rows summing to 1 +- 8e-3 under bfloat16). Checked on the
CPU's autocast, which lowers the same operations as CUDA's; the reference is the same call
without autocast."""
from __future__ import annotations

import pytest
import torch

from nmt.sparse import entmax15, entmax_bisect, get_loss, sparsemax

BF16 = dict(device_type="cpu", dtype=torch.bfloat16)
MAPPINGS = {
    "entmax15": lambda x, impl: entmax15(x, impl=impl),
    "bisect, per-row alphas": lambda x, impl: entmax_bisect(x, torch.tensor([1.1, 1.3, 1.6, 1.9]).view(4, 1, 1),
                                                            impl=impl),
    "bisect, alpha 1.3": lambda x, impl: entmax_bisect(x, 1.3, impl=impl),
    "sparsemax": lambda x, impl: sparsemax(x, impl=impl),
}


@pytest.mark.parametrize("impl", ["static", "pruned"])
@pytest.mark.parametrize("name", list(MAPPINGS))
def test_mappings_compute_in_their_own_precision_under_autocast(name, impl):
    x = torch.randn(4, 16, 40, generator=torch.Generator().manual_seed(0)) * 3
    fn = MAPPINGS[name]
    with torch.autocast(**BF16):
        p = fn(x, impl)
    assert p.dtype == torch.float32
    torch.testing.assert_close(p, fn(x, impl), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(p.sum(-1), torch.ones(4, 16), rtol=0, atol=1e-5)


@pytest.mark.parametrize("name", ["entmax15", "sparsemax", "cross_entropy"])
def test_losses_compute_in_their_own_precision_under_autocast(name):
    """The static sparse losses' conjugates (and cross-entropy's) under bfloat16 autocast: the
    loss of each row as without it (4e-3 off per token before)."""
    g = torch.Generator().manual_seed(1)
    z, t = torch.randn(64, 300, generator=g) * 4, torch.randint(0, 300, (64,), generator=g)
    fn = get_loss(name, impl="static") if name != "cross_entropy" else get_loss("softmax")
    with torch.autocast(**BF16):
        got = fn(z, t, reduction="none")
    torch.testing.assert_close(got, fn(z, t, reduction="none"), rtol=1e-5, atol=1e-6)


def test_continuous_expectation_gradients_under_autocast():
    """Continuous attention's expectations of narrow densities (the quadrature branch): their
    gradients under autocast as without it (3 orders of magnitude less precise before)."""
    from nmt.models.continuous_attention import ContinuousAttention
    from nmt.sparse._continuous_kernels import rbf_expectations_scaled

    attention = ContinuousAttention(alpha=1.5)
    basis_mu, basis_sigma = attention.basis("cpu")
    g = torch.Generator().manual_seed(0)
    mu, scale = torch.rand(64, 10, generator=g), torch.rand(64, 10, generator=g) * 0.05 + 0.005
    weights = torch.randn(64, 10, basis_mu.numel(), generator=g)

    def grads(autocast: bool):
        m, s = mu.clone().requires_grad_(), scale.clone().requires_grad_()
        with torch.autocast(**BF16, enabled=autocast):
            r = rbf_expectations_scaled(m, s, basis_mu, basis_sigma, attention.beta)
        (r * weights).sum().backward()
        return r.detach(), m.grad, s.grad

    for got, want in zip(grads(True), grads(False)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
