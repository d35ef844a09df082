"""Every registered mapping plugs into attention and output; exact zeros; -inf log-probs; gradients."""
from __future__ import annotations

import pytest
import torch
from tiny_models import random_batch, sharpen_attention

MAPPINGS = [
    ("softmax", {}),
    ("sparsemax", {}),
    ("entmax15", {}),
    ("entmax_bisect", {"alpha": 1.5}),
    ("entmax_bisect", {"alpha": 1.25}),
]
SPARSE = {"sparsemax", "entmax15", "entmax_bisect"}
STRUCTURED = [("fusedmax", {"lam": 0.5}), ("oscarmax", {"lam": 0.5})]


def _ids(params):
    return [f"{name}{params}" if params else name for name, params in params]


@pytest.mark.parametrize(("mapping", "params"), MAPPINGS, ids=_ids(MAPPINGS))
def test_attention_mapping_plugs_in(make_model, mapping, params):
    model = make_model(attention={"mapping": mapping, "params": params})
    sharpen_attention(model)
    src, src_lengths, tgt_in = random_batch(batch=4, src_len=9, tgt_len=6, lengths=[9, 9, 7, 5], seed=5)
    _, attention = model(src, src_lengths, tgt_in)
    torch.testing.assert_close(attention.sum(-1), torch.ones(4, 6, dtype=attention.dtype))
    mask = (torch.arange(9)[None] < src_lengths[:, None])[:, None].expand_as(attention)
    real = attention[mask]
    assert torch.all(attention[~mask] == 0)
    if mapping in SPARSE:
        assert torch.any(real == 0), "sharp scores should give exact zeros on real tokens"
    else:
        assert torch.all(real > 0)


@pytest.mark.parametrize(("mapping", "params"), STRUCTURED, ids=_ids(STRUCTURED))
def test_structured_attention_plugs_in(make_model, mapping, params):
    model = make_model(attention={"mapping": mapping, "params": params})
    sharpen_attention(model)
    src, src_lengths, tgt_in = random_batch(batch=3, src_len=8, lengths=[8, 6, 3], seed=6)
    _, attention = model(src, src_lengths, tgt_in)
    torch.testing.assert_close(attention.sum(-1), torch.ones(attention.shape[:2], dtype=attention.dtype))
    mask = (torch.arange(8)[None] < src_lengths[:, None])[:, None].expand_as(attention)
    assert torch.all(attention[~mask] == 0)
    assert torch.all(attention >= 0)


@pytest.mark.parametrize(("mapping", "params"), MAPPINGS, ids=_ids(MAPPINGS))
def test_log_probs_minus_inf_exactly_at_zeros(make_model, mapping, params):
    model = make_model(output={"mapping": mapping, "params": params})
    logits = 4.0 * torch.randn(5, 7, 11, dtype=torch.float64)
    probs = model.output_mapping(logits, dim=-1)
    log_probs = model.log_probs(logits)
    assert log_probs.shape == logits.shape
    assert torch.equal(torch.isneginf(log_probs), probs == 0)
    assert not torch.any(torch.isnan(log_probs)) and not torch.any(log_probs == float("inf"))
    torch.testing.assert_close(log_probs.exp(), probs, rtol=1e-10, atol=0)
    if mapping == "softmax":
        torch.testing.assert_close(log_probs, torch.log_softmax(logits, -1), rtol=0, atol=1e-12)
    else:
        assert torch.any(probs == 0)


def test_log_probs_upcasts_half(make_model):
    model = make_model(output={"mapping": "entmax15"})
    logits = (3 * torch.randn(4, 11)).half()
    log_probs = model.log_probs(logits)
    assert log_probs.dtype == torch.float32
    assert torch.equal(torch.isneginf(log_probs), model.output_mapping(logits.float(), dim=-1) == 0)


def test_gradients_match_finite_differences(make_model):
    """Directional derivatives of a scalar of the logits, autograd vs central differences (float64)."""
    model = make_model(attention={"mapping": "entmax15"}, output={"mapping": "sparsemax"})
    sharpen_attention(model)  # both mappings in their sparse regime
    src, src_lengths, tgt_in = random_batch(batch=2, src_len=5, tgt_len=4, lengths=[5, 3], seed=7)
    params = [p for p in model.parameters() if p.requires_grad]
    weights = torch.randn(2, 4, 11, dtype=torch.float64)

    def objective() -> torch.Tensor:
        logits, attention = model(src, src_lengths, tgt_in)
        probs = model.output_mapping(logits, dim=-1)
        return (weights * probs).sum() + (attention * attention).sum()

    with torch.no_grad():
        logits, attention = model(src, src_lengths, tgt_in)
        assert torch.any(model.output_mapping(logits, dim=-1) == 0)
        assert torch.any(attention[0] == 0) and torch.any((attention[0] > 0).sum(-1) > 1)
    model.zero_grad()
    objective().backward()
    grads = [p.grad.clone() for p in params]
    g = torch.Generator().manual_seed(0)
    eps = 1e-6
    for _ in range(4):
        direction = [torch.randn(p.shape, generator=g, dtype=p.dtype) for p in params]
        with torch.no_grad():
            for p, d in zip(params, direction):
                p.add_(eps * d)
            plus = objective()
            for p, d in zip(params, direction):
                p.sub_(2 * eps * d)
            minus = objective()
            for p, d in zip(params, direction):
                p.add_(eps * d)
        numeric = (plus - minus) / (2 * eps)
        analytic = sum((gr * d).sum() for gr, d in zip(grads, direction))
        torch.testing.assert_close(analytic, numeric, rtol=1e-5, atol=1e-7)
