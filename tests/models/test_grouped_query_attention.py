"""Grouped-query attention (``model.transformer.kv_heads``; Ainslie et al. 2023, multi-query at 1):
checked against full multi-head attention whose key/value projections repeat each key/value head's
weights for its group of query heads (the definition), for every kind of mapping and position
term, the fused kernel's path, the model's incremental decoding against teacher forcing, the
caches' sizes, the one-line configuration error. Elsewhere with grouped heads: decoding's frozen
region (``test_transformer``), the sync audit (``test_transformer``), a compiled step
(``test_fused_attention``), a run that trains and translates (``test_transformer_training``)."""
from __future__ import annotations

import pytest
import torch
from test_transformer import MAPPINGS, incremental, make
from tiny_models import positions_cfg, random_batch

from nmt.models.errors import ModelConfigError
from nmt.models.transformer import multihead_attention as mha
from nmt.models.transformer.multihead_attention import MultiHeadAttention


def _pair(heads: int, kv_heads: int, **kwargs) -> tuple[MultiHeadAttention, MultiHeadAttention]:
    """(grouped, full): a module with ``kv_heads`` key/value heads and a full multi-head one with its
    query, output and mapping parameters and key/value projections whose head h is the grouped
    module's key/value head h // (heads / kv_heads); float64."""
    torch.manual_seed(0)
    d_model = 4 * heads
    grouped = MultiHeadAttention(d_model, heads, kv_heads=kv_heads, **kwargs).double()
    with torch.no_grad():  # (biases start at zero: give them values)
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            getattr(grouped, name).bias.normal_()
    full = MultiHeadAttention(d_model, heads, **kwargs).double()
    state = dict(grouped.state_dict())
    repeat = heads // kv_heads
    for name in ("k_proj", "v_proj"):
        weight, bias = state[f"{name}.weight"], state[f"{name}.bias"]  # (kv_heads d_head, D), (kv_heads d_head,)
        state[f"{name}.weight"] = weight.view(kv_heads, 4, d_model).repeat_interleave(repeat, 0).reshape(d_model, d_model)
        state[f"{name}.bias"] = bias.view(kv_heads, 4).repeat_interleave(repeat, 0).reshape(d_model)
    full.load_state_dict(state)
    return grouped, full


ATTENTIONS = {
    "softmax": {"mapping": "softmax"},
    "entmax15": {"mapping": "entmax15"},
    "sparsemax": {"mapping": "sparsemax"},
    "learned-alpha": {"mapping": "entmax_bisect", "params": {"alpha": "learned"}},
    "relative": {"mapping": "entmax15", "max_relative": 3},
    "alibi": {"mapping": "softmax", "alibi": True},
    "continuous": {"mapping": "entmax15", "continuous": {"alpha": 2, "num_basis_mu": 4}},
}


@pytest.mark.parametrize("name", list(ATTENTIONS))
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 1), (6, 3)])
def test_grouped_attention_is_full_attention_with_repeated_key_value_heads(name, heads, kv_heads):
    """Output, probabilities and the gradients of the inputs and of the shared parameters: those of
    the full module (float64, to rounding; sparse zeros the same), with masks that hide keys (the
    continuous attention: the source's padding); the caches (keys, values) have kv_heads heads."""
    grouped, full = _pair(heads, kv_heads, **ATTENTIONS[name])
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 4 * heads, generator=g, dtype=torch.float64) * 2
    memory = torch.randn(3, 7, 4 * heads, generator=g, dtype=torch.float64) * 2
    lengths = torch.tensor([7, 4, 2])
    mask = (torch.arange(7)[None, :] < lengths[:, None]).view(3, 1, 1, 7)
    outs = []
    for module in (grouped, full):
        q, m = x.clone().requires_grad_(), memory.clone().requires_grad_()
        keys, values = module.keys_values(m)
        assert keys.shape == values.shape == (3, module.kv_heads, 7, 4)
        out, probs = module(q, keys, values, mask)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        outs.append((out, probs, q.grad, m.grad, module.q_proj.weight.grad, module.out_proj.weight.grad))
    assert torch.equal(outs[0][1] > 0, outs[1][1] > 0)
    for got, want in zip(*outs):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    assert grouped.k_proj.weight.shape == (4 * kv_heads, 4 * heads)


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_the_fused_kernel_takes_the_groups_as_the_products_do(kv_heads, monkeypatch):
    """Softmax heads whose probabilities nobody reads run as torch's fused attention with
    ``enable_gqa`` (on CUDA; forced here on the CPU): the unfused products' output."""
    grouped, _ = _pair(4, kv_heads, mapping="softmax")
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    keys, values = grouped.keys_values(torch.randn(2, 6, 16, dtype=torch.float64))
    mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    mask[1, ..., 4:] = False
    want, _ = grouped(x, keys, values, mask, need_probs=True)
    monkeypatch.setattr(mha, "fused_attention_serves", lambda t: True)
    got, probs = grouped(x, keys, values, mask, need_probs=False)
    assert probs is None
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["softmax", "entmax15", "adaptive", "continuous"])
@pytest.mark.parametrize("positions", ["sinusoidal", "rotary", "relative", "alibi"])
@pytest.mark.parametrize("kv_heads", [1, 2])
def test_incremental_steps_equal_teacher_forcing_with_grouped_heads(name, positions, kv_heads):
    """A Transformer of 4 heads with 1 or 2 key/value heads: each decoding step with the key/value
    cache (reordered after the first step) gives teacher forcing's log-probabilities and attention;
    the self-attention cache and the cross-attention keys hold kv_heads heads."""
    model = make(scale=3.0, attention=MAPPINGS[name], output={"mapping": "entmax15", "params": {}},
                 transformer={"heads": 4, "kv_heads": kv_heads, "d_model": 16, **positions_cfg(positions)})
    src, src_lengths, tgt_in = random_batch(batch=3, src_len=7, tgt_len=6, seed=1)
    logits, attention = model(src, src_lengths, tgt_in)
    expected = model.log_probs(logits)
    got, got_attention = incremental(model, src, src_lengths, tgt_in, permutation=torch.tensor([2, 0, 1]))
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    finite = torch.isfinite(expected)
    assert (got[finite] - expected[finite]).abs().max() <= 1e-10
    assert (got_attention - attention).abs().max() <= 1e-10
    encoder_out, state = model.encode(src, src_lengths)
    _, _, state = model.step(tgt_in[:, 0], state, encoder_out)
    caches = [value for key, value in state.items() if key.startswith("self.")]
    assert caches and all(c.shape == (3, kv_heads, 1, 4) for c in caches), [tuple(c.shape) for c in caches]


def test_the_default_is_full_attention_and_other_groups_name_the_key():
    """kv_heads 0 (the default) and kv_heads = heads build the same parameters as before the option;
    heads not a multiple of kv_heads is a one-line error naming ``model.transformer.kv_heads``."""
    default = make(transformer={"heads": 4, "d_model": 16})
    same = make(transformer={"heads": 4, "kv_heads": 4, "d_model": 16})
    assert {k: v.shape for k, v in default.state_dict().items()} == {k: v.shape for k, v in same.state_dict().items()}
    for a, b in zip(default.state_dict().values(), same.state_dict().values()):
        assert torch.equal(a, b)
    grouped = make(transformer={"heads": 4, "kv_heads": 1, "d_model": 16})
    saved = sum(p.numel() for p in default.parameters()) - sum(p.numel() for p in grouped.parameters())
    layers = 2 + 2 * 2  # encoder self, decoder self and cross attentions
    assert saved == layers * 2 * (16 * 12 + 12)  # keys and values: 16 x 16 -> 16 x 4, biases 16 -> 4
    with pytest.raises(ModelConfigError, match=r"model\.transformer\.kv_heads.*heads \(4\) must be a multiple "
                                               r"of kv_heads \(3\)"):
        make(transformer={"heads": 4, "kv_heads": 3, "d_model": 16})
