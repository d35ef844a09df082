"""Relative positions (``model.transformer.positions: relative``, Shaw et al. 2018 as OpenNMT-py)
against independent truths: OpenNMT-py's formulas written as loops over queries and keys in float64,
the clipped offset matrix written out, offsets only (not absolute positions), and the table being
the only positional parameter. Incremental decoding == teacher forcing for every mapping, the fused
agreement, the sync audit and the fullgraph compile run in test_transformer.py /
test_fused_attention.py (parametrised with relative); certificates in
tests/translate/test_certificate_bruteforce.py."""
from __future__ import annotations

import math

import pytest
import torch
from tiny_models import PAD, SRC_VOCAB, TGT_VOCAB, assert_offset_invariant, random_batch, transformer_cfg

from nmt.models.transformer import build_transformer
from nmt.models.transformer.multihead_attention import MultiHeadAttention
from nmt.models.transformer.positions import ScoreBiasPositions
from nmt.models.transformer.relative import relative_buckets


def make(attention=None, **transformer):
    torch.manual_seed(0)
    cfg = transformer_cfg(attention=attention or {"mapping": "entmax15", "params": {}},
                          transformer={"positions": "relative", "max_relative_positions": 2, **transformer})
    return build_transformer(cfg, SRC_VOCAB, TGT_VOCAB, PAD).double().eval()


def test_buckets_are_the_clipped_offsets():
    got = relative_buckets(3, 7, 2, 2, torch.device("cpu"))
    want = [[min(max(n - m, -2), 2) + 2 for n in range(7)] for m in range(2, 5)]
    assert got.tolist() == want


@pytest.mark.parametrize("offset", [0, 3])
def test_attention_is_opennmt_pys_formula_in_loops(offset):
    """scores_mn = q_m . k_n + q_m . A[clip(n - m)] (q scaled by 1/sqrt(d_head)), p = softmax over the
    unmasked keys, context_m = sum_n p_mn (v_n + A[clip(n - m)]), then W_o: OpenNMT-py's
    ``MultiHeadedAttention`` with ``max_relative_positions`` K, here one query / key pair at a time."""
    torch.manual_seed(3)
    d_model, heads, K = 12, 3, 2
    attention = MultiHeadAttention(d_model, heads, max_relative=K).double()
    torch.nn.init.normal_(attention.relative.embeddings.weight)
    B, T, S = 2, 3, offset + 3
    query = torch.randn(B, T, d_model, dtype=torch.float64)
    memory = torch.randn(B, S, d_model, dtype=torch.float64)
    mask = torch.ones(B, 1, T, S, dtype=torch.bool)
    mask[1, :, :, S - 1] = False
    keys, values = attention.keys_values(memory)
    out, probs = attention.attend(attention.queries(query), keys, values, mask, query_offset=offset)

    d = d_model // heads
    A = attention.relative.embeddings.weight
    Wq, bq = attention.q_proj.weight, attention.q_proj.bias
    want = torch.zeros(B, T, d_model, dtype=torch.float64)
    for b in range(B):
        heads_out = []
        for h in range(heads):
            rows = slice(h * d, (h + 1) * d)
            context = torch.zeros(T, d, dtype=torch.float64)
            for i in range(T):
                m = offset + i
                q = (query[b, i] @ Wq[rows].T + bq[rows]) / math.sqrt(d)
                scores = []
                for n in range(S):
                    a = A[min(max(n - m, -K), K) + K]
                    scores.append(q @ keys[b, h, n] + q @ a if mask[b, 0, i, n] else -math.inf)
                p = torch.softmax(torch.stack([torch.as_tensor(s, dtype=torch.float64) for s in scores]), 0)
                assert torch.allclose(probs[b, h, i], p, rtol=0, atol=1e-12)
                for n in range(S):
                    context[i] += p[n] * (values[b, h, n] + A[min(max(n - m, -K), K) + K])
            heads_out.append(context)
        want[b] = attention.out_proj(torch.cat(heads_out, dim=-1))
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)


def test_scores_depend_on_offsets_only():
    """The same queries and keys with every position shifted (query_offset and keys moved together,
    by padding keys in front that are masked) give the same probabilities on the shared keys."""
    torch.manual_seed(4)
    attention = MultiHeadAttention(8, 2, mapping="sparsemax", max_relative=3).double()
    assert_offset_invariant(attention)


def test_the_model_has_tables_in_self_attentions_only_and_nothing_on_the_embeddings():
    model = make()
    src = torch.tensor([[4, 5, 6, 7, 8]])
    emb = model.src_embeddings(src)
    assert isinstance(model.encoder.positions, ScoreBiasPositions) and torch.equal(model.encoder.positions(emb), emb)
    assert repr(model.encoder.positions) == "ScoreBiasPositions(kind=relative, max_relative=2)"
    tables = sorted(name for name, _ in model.named_parameters() if "relative" in name)
    layers = len(model.encoder.layers) + len(model.decoder.layers)
    assert len(tables) == layers and all(".self_attn.relative.embeddings.weight" in name for name in tables)
    assert all(layer.cross_attn.relative is None for layer in model.decoder.layers)
    assert model.position_limits() == (None, None)
    assert model.encoder.layers[0].self_attn.relative.embeddings.weight.shape == (5, 4)  # 2K + 1, d_head


def test_offsets_beyond_k_share_the_clipped_vector_and_long_inputs_run():
    """Sequences longer than 2K + 1 and max_positions run (no limit), and the tables get gradients
    on every row (each offset in -K..K occurs)."""
    model = make(max_positions=4).train()
    src, lengths, tgt_in = random_batch(batch=2, src_len=9, tgt_len=8, seed=8)
    logits, _ = model(src, lengths, tgt_in)
    logits.square().sum().backward()
    grad = model.encoder.layers[0].self_attn.relative.embeddings.weight.grad
    assert bool((grad.abs().sum(1) > 0).all())
    decoder_grad = model.decoder.layers[0].self_attn.relative.embeddings.weight.grad
    assert bool((decoder_grad[:2].abs().sum(1) > 0).all())  # causal: keys at offsets <= 0 only
    assert torch.equal(decoder_grad[3:], torch.zeros_like(decoder_grad[3:]))
