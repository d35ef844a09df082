"""ALiBi (``model.transformer.positions: alibi``, Press, Smith & Lewis 2022) against independent truths:
the paper's slopes written out as numbers (and the direction-aware encoder's, ``alibi_encoder: split``),
the biased scores of a layer recomputed in float64 loops (one query / key pair at a time) for every
mapping and both encoder forms, scores that depend on offsets only (a sentence's encoder output
unchanged when its positions shift), the symmetric encoder's mirror blindness and the split one's
sight of directions, sources longer than anything a table could hold, and no saved state.
Incremental decoding == teacher forcing for every mapping, the fused agreement, the sync audit and
the fullgraph compile run in test_transformer.py / test_fused_attention.py (parametrised with alibi
and alibi-split), the packed encoder in test_packed_encoder.py; certificates in
tests/translate/test_certificate_bruteforce.py; checkpoints in tests/train/test_transformer_training.py."""
from __future__ import annotations

import math

import pytest
import torch
from test_transformer import MAPPINGS
from tiny_models import (PAD, SRC_VOCAB, TGT_VOCAB, assert_long_steps_equal_teacher_forcing, assert_offset_invariant,
                         random_batch, transformer_cfg)

from nmt.models.transformer import build_transformer
from nmt.models.errors import ModelConfigError
from nmt.models.transformer.alibi import AlibiBias, alibi_direction_slopes, alibi_slopes
from nmt.models.transformer.multihead_attention import MultiHeadAttention
from nmt.models.transformer.positions import ScoreBiasPositions
from nmt.sparse.registry import get_mapping

# The paper's slopes, written out: n a power of two: 2^(-8/n), 2^(-16/n), ..., 2^(-8).
# Otherwise (n = 3, 6, 12) the n' = 2, 4, 8 slopes of the closest lower power of two, then the
# 1st, 3rd, 5th ... slopes of 2n' heads (2^(-8h/2n'), h odd), n - n' of them.
R = math.sqrt(0.5)  # 2^(-1/2)
EXPECTED_SLOPES = {
    1: [1 / 256],
    2: [1 / 16, 1 / 256],
    4: [1 / 4, 1 / 16, 1 / 64, 1 / 256],
    8: [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256],
    16: [R, 1 / 2, R / 2, 1 / 4, R / 4, 1 / 8, R / 8, 1 / 16, R / 16, 1 / 32, R / 32, 1 / 64, R / 64, 1 / 128,
         R / 128, 1 / 256],
    3: [1 / 16, 1 / 256, 1 / 4],  # n' = 2: 2^-4, 2^-8; then of 4 heads: 2^-2
    6: [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8],  # n' = 4; then of 8 heads: 2^-1, 2^-3
    12: [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256, R, R / 2, R / 4, R / 8],  # of 16: h=1,3,5,7
}


# The split encoder's (left, right) slopes, written out: the 1st, 3rd, ... heads (the paper's order) keep
# m_h for keys on the left and take 2 m_h on the right; the 2nd, 4th, ... the reverse.
SPLIT_SLOPES = {
    1: ([1 / 256], [1 / 128]),
    2: ([1 / 16, 1 / 128], [1 / 8, 1 / 256]),
    3: ([1 / 16, 1 / 128, 1 / 4], [1 / 8, 1 / 256, 1 / 2]),  # paper: 1/16, 1/256, 1/4
    4: ([1 / 4, 1 / 8, 1 / 64, 1 / 128], [1 / 2, 1 / 16, 1 / 32, 1 / 256]),
    6: ([1 / 4, 1 / 8, 1 / 64, 1 / 128, 1 / 2, 1 / 4], [1 / 2, 1 / 16, 1 / 32, 1 / 256, 1, 1 / 8]),
}


def direction_slopes(heads: int, form: str) -> tuple[list[float], list[float]]:
    """The written-out (left, right) slopes of ``form``."""
    return (EXPECTED_SLOPES[heads], EXPECTED_SLOPES[heads]) if form == "symmetric" else SPLIT_SLOPES[heads]


def make(attention=None, **transformer):
    torch.manual_seed(0)
    cfg = transformer_cfg(attention=attention or MAPPINGS["entmax15"], transformer={"positions": "alibi",
                                                                                  **transformer})
    return build_transformer(cfg, SRC_VOCAB, TGT_VOCAB, PAD).double().eval()


@pytest.mark.parametrize("heads", sorted(EXPECTED_SLOPES))
def test_slopes_are_the_papers(heads):
    got = alibi_slopes(heads)
    assert len(got) == heads
    assert got == pytest.approx(EXPECTED_SLOPES[heads], rel=1e-15, abs=0)
    if heads & (heads - 1) == 0:  # the closed form m_h = 2^(-8h/n)
        assert got == pytest.approx([2 ** (-8 * h / heads) for h in range(1, heads + 1)], rel=1e-15, abs=0)
    assert torch.equal(AlibiBias(heads).slopes, torch.tensor(EXPECTED_SLOPES[heads], dtype=torch.float64))


@pytest.mark.parametrize("heads", sorted(SPLIT_SLOPES))
def test_split_slopes_favour_each_side_in_turn(heads):
    left, right = alibi_direction_slopes(heads, "split")
    assert (left, right) == SPLIT_SLOPES[heads]
    assert alibi_direction_slopes(heads, "symmetric") == (EXPECTED_SLOPES[heads], EXPECTED_SLOPES[heads])
    with pytest.raises(ValueError, match="unknown ALiBi encoder form 'splt'; valid: symmetric, split"):
        alibi_direction_slopes(heads, "splt")


@pytest.mark.parametrize("form", ["symmetric", "split"])
def test_bias_is_minus_slope_times_distance(form):
    """``-left_h (i - j)`` for keys j <= i, ``-right_h (j - i)`` for keys on the right (symmetric:
    ``-m_h |i - j|``), queries at offset 2.."""
    bias = AlibiBias(4, form).bias(3, 7, 2, torch.float64)
    left, right = direction_slopes(4, form)
    want = [[[-left[h] * (i - j) if j <= i else -right[h] * (j - i) for j in range(7)] for i in range(2, 5)]
            for h in range(4)]
    assert bias.tolist() == want
    if form == "symmetric":
        assert bias.tolist() == [[[-EXPECTED_SLOPES[4][h] * abs(i - j) for j in range(7)] for i in range(2, 5)]
                                 for h in range(4)]


ALL_MAPPINGS = ["softmax", "sparsemax", "entmax15", "entmax_bisect", "adaptive", "entmax15-warm", "fusedmax",
                "oscarmax"]


@pytest.mark.parametrize("name", ALL_MAPPINGS)
@pytest.mark.parametrize("causal,offset,form", [(False, 0, "symmetric"), (True, 0, "symmetric"), (True, 4, "symmetric"),
                                                (False, 0, "split"), (False, 2, "split")])
def test_attention_is_the_biased_scores_in_loops(name, causal, offset, form):
    """scores_ij = q_i . k_j / sqrt(d_head) - m_h |i - j| (symmetric encoder), or with the causal mask
    keys j <= i only, the bias then -m_h (i - j); split: -left_h (i - j) for j <= i, -right_h (j - i)
    for j > i (the slopes written out); queries at positions offset.., keys at 0..; probabilities =
    the mapping (from the registry, at the head's temperature / alpha) of that row, masked keys left
    out; output = W_o concat_h sum_j p_ij v_j: one query / key pair at a time, float64."""
    section = MAPPINGS[name]
    torch.manual_seed(3)
    d_model, heads = 12, 3
    attention = MultiHeadAttention(d_model, heads, section["mapping"], section["params"], alibi=True,
                                   alibi_form=form).double()
    with torch.no_grad():  # sharper scores: sparse mappings leave exact zeros inside rows
        attention.q_proj.weight.mul_(3.0)
    B, T = 2, 4
    S = offset + T
    query = torch.randn(B, T, d_model, dtype=torch.float64)
    memory = torch.randn(B, S, d_model, dtype=torch.float64)
    if causal:
        mask = torch.tensor([[j <= offset + i for j in range(S)] for i in range(T)])
    else:
        mask = torch.ones(B, 1, T, S, dtype=torch.bool)
        mask[1, :, :, S - 2:] = False
    keys, values = attention.keys_values(memory)
    out, probs = attention.attend(attention.queries(query), keys, values, mask, query_offset=offset)

    d = d_model // heads
    left, right = direction_slopes(heads, form)
    Wq, bq = attention.q_proj.weight, attention.q_proj.bias
    temperature = section["params"].get("temperature", 1.0)
    alphas = attention.mapping.alpha().tolist() if name == "adaptive" else None
    want = torch.zeros(B, T, d_model, dtype=torch.float64)
    for b in range(B):
        heads_out = []
        for h in range(heads):
            rows = slice(h * d, (h + 1) * d)
            context = torch.zeros(T, d, dtype=torch.float64)
            for t in range(T):
                i = offset + t
                q = (query[b, t] @ Wq[rows].T + bq[rows]) / math.sqrt(d)
                allowed = [j for j in range(S) if (mask[t, j] if causal else mask[b, 0, t, j])]
                scores = torch.stack([q @ keys[b, h, j] - (left[h] * (i - j) if j <= i else right[h] * (j - i))
                                      for j in allowed]) / temperature
                params = {k: v for k, v in section["params"].items() if k != "temperature"}
                if alphas is not None:
                    params = {"alpha": alphas[h]}
                p_allowed = get_mapping(section["mapping"], **params)(scores, dim=-1)
                p = torch.zeros(S, dtype=torch.float64)
                p[allowed] = p_allowed
                torch.testing.assert_close(probs[b, h, t], p, rtol=0, atol=1e-10)
                for j in range(S):
                    context[t] += p[j] * values[b, h, j]
            heads_out.append(context)
        want[b] = attention.out_proj(torch.cat(heads_out, dim=-1))
    torch.testing.assert_close(out, want, rtol=0, atol=1e-10)
    if name in ("sparsemax", "entmax15", "fusedmax"):  # not vacuous: zeros at allowed keys
        allowed_mask = mask if causal else mask[:, 0].unsqueeze(1)
        assert bool(((probs == 0) & allowed_mask).any())


def test_sparse_heads_attend_locally():
    """With equal raw scores (keys all alike) a steep ALiBi head's sparse row keeps only the keys
    nearest its query: sparsemax of -m |i - j| with m = 1/2 leaves |i - j| <= 1 (sorted: 0, -1/2, -1/2,
    -1, ...: the support is the keys within 1), where softmax keeps every key."""
    attention = MultiHeadAttention(8, 8, "sparsemax", alibi=True).double()
    q = torch.zeros(1, 8, 9, 1, dtype=torch.float64)
    keys, values = torch.zeros(1, 8, 9, 1, dtype=torch.float64), torch.randn(1, 8, 9, 1, dtype=torch.float64)
    _, probs = attention.attend(q, keys, values)
    head = probs[0, 0]  # m = 1/2
    for i in range(9):
        support = [j for j in range(9) if head[i, j] > 0]
        assert support == [j for j in range(9) if abs(i - j) <= 1]
    softmax = MultiHeadAttention(8, 8, "softmax", alibi=True).double()
    assert bool((softmax.attend(q, keys, values)[1] > 0).all())


@pytest.mark.parametrize("form", ["symmetric", "split"])
def test_the_encoder_output_is_unchanged_when_positions_shift(form, monkeypatch):
    """Every position of the encoder shifted by 37 (the queries and keys together): the same memory,
    since the bias depends on i - j only."""
    src, lengths, _ = random_batch(batch=3, src_len=7, seed=3)
    model = make(alibi_encoder=form)
    mask = torch.arange(7)[None] < lengths[:, None]
    memory, _ = model.encoder(model.src_embeddings(src), mask)
    for layer in model.encoder.layers:
        real = layer.self_attn.alibi.bias
        monkeypatch.setattr(layer.self_attn.alibi, "bias",
                            lambda queries, keys, offset, dtype, real=real: real_shifted(real, queries, keys,
                                                                                          offset, dtype, 37))
    shifted, _ = model.encoder(model.src_embeddings(src), mask)
    torch.testing.assert_close(shifted, memory, rtol=0, atol=1e-12)


def real_shifted(bias, queries, keys, offset, dtype, shift):
    """The bias of queries and keys all moved by ``shift`` positions: keys at shift.., queries at
    shift + offset..: the columns of keys shift.. of a wider bias."""
    return bias(queries, keys + shift, offset + shift, dtype)[..., shift:]


@pytest.mark.parametrize("form", ["symmetric", "split"])
def test_a_sentence_inside_a_longer_one_sees_only_offsets(form):
    """A sentence placed after a masked prefix (its tokens at positions 5.. instead of 0..) gets the
    same self-attention outputs: positions enter only as i - j."""
    torch.manual_seed(5)
    attention = MultiHeadAttention(8, 2, "entmax15", alibi=True, alibi_form=form).double()
    assert_offset_invariant(attention)


def test_biases_order_the_tokens_up_to_mirroring_and_only_self_attentions_hold_them():
    """Without positions self-attention is permutation-equivariant; ALiBi breaks that (swapping two
    tokens does not swap their encodings), while adding nothing to the embeddings. The encoder's
    symmetric bias is unchanged by mirroring the positions (|i - j| = |(L-1-i) - (L-1-j)|), so the
    encoder of a reversed sentence is exactly the reversed encoder: it sees distances, not
    directions. Every self-attention biases, no cross-attention does, and nothing is a parameter
    or saved."""
    model = make()
    src = torch.tensor([[4, 5, 6, 7, 8]])
    mask = torch.ones(1, 5, dtype=torch.bool)
    memory, _ = model.encoder(model.src_embeddings(src), mask)
    swapped = src[:, [1, 0, 2, 3, 4]]
    swapped_memory, _ = model.encoder(model.src_embeddings(swapped), mask)
    assert not torch.allclose(swapped_memory[:, [1, 0, 2, 3, 4]], memory, atol=1e-4)
    reversed_memory, _ = model.encoder(model.src_embeddings(src.flip(1)), mask)
    torch.testing.assert_close(reversed_memory.flip(1), memory, rtol=0, atol=1e-12)
    emb = model.src_embeddings(src)
    assert isinstance(model.encoder.positions, ScoreBiasPositions) and torch.equal(model.encoder.positions(emb), emb)
    assert repr(model.encoder.positions) == "ScoreBiasPositions(kind=alibi, heads=2)"
    assert all(layer.self_attn.alibi is not None for layer in [*model.encoder.layers, *model.decoder.layers])
    assert all(layer.cross_attn.alibi is None for layer in model.decoder.layers)
    assert not any("alibi" in name or "slopes" in name for name, _ in model.named_parameters())
    assert not any("alibi" in key or "slopes" in key for key in model.state_dict())
    assert model.position_limits() == (None, None)
    plain = make(positions="sinusoidal")  # the same parameters: nothing added
    assert plain.state_dict().keys() == model.state_dict().keys()


def test_a_mirrored_source_gets_the_same_output_distribution_but_the_decoder_is_directional():
    """The consequence of the symmetric encoder bias and the unbiased cross-attention (documented in
    the README): the decoder's log-probabilities for a source and for its real tokens reversed are
    the same (padding stays at the end). The decoder's causal bias does tell directions: its outputs
    for a reversed target prefix differ."""
    model = make()
    src, lengths, tgt_in = random_batch(batch=3, src_len=6, tgt_len=5, lengths=[6, 4, 2], seed=9)
    mirrored = src.clone()
    for b, n in enumerate(lengths.tolist()):
        mirrored[b, :n] = src[b, :n].flip(0)
    assert not torch.equal(mirrored, src)
    logits, attention = model(src, lengths, tgt_in)
    mirrored_logits, mirrored_attention = model(mirrored, lengths, tgt_in)
    torch.testing.assert_close(mirrored_logits, logits, rtol=0, atol=1e-10)
    for b, n in enumerate(lengths.tolist()):  # the attention follows the tokens
        torch.testing.assert_close(mirrored_attention[b, :, :n].flip(-1), attention[b, :, :n], rtol=0, atol=1e-10)
    reversed_target = torch.cat([tgt_in[:, :1], tgt_in[:, 1:].flip(1)], dim=1)
    reversed_logits, _ = model(src, lengths, reversed_target)
    assert not torch.allclose(reversed_logits[:, -1], logits[:, -1], atol=1e-4)


def test_the_split_encoder_tells_directions():
    """alibi_encoder: split. A sentence of distinct tokens and its reversal: no encoding of the
    reversed sentence equals any encoding of the original (so the two are not permutations of one
    another: the encoder sees directions), where the symmetric encoder's are the same rows in
    reverse order. The same parameters as the symmetric model (nothing learned or saved); the
    decoder's self-attentions keep the paper's causal form, the encoder's favour left and right in turn."""
    model, symmetric = make(alibi_encoder="split"), make()
    assert model.state_dict().keys() == symmetric.state_dict().keys()
    model.load_state_dict(symmetric.state_dict())  # the same weights: only the bias differs
    src = torch.tensor([[4, 5, 6, 7, 8, 9]])
    mask = torch.ones(1, 6, dtype=torch.bool)
    for encoder, blind in ((symmetric, True), (model, False)):
        memory, _ = encoder.encoder(encoder.src_embeddings(src), mask)
        reversed_memory, _ = encoder.encoder(encoder.src_embeddings(src.flip(1)), mask)
        distances = torch.cdist(reversed_memory[0], memory[0])  # (6, 6): every reversed row to every row
        if blind:
            torch.testing.assert_close(reversed_memory.flip(1), memory, rtol=0, atol=1e-12)
        else:
            assert bool(distances.min() > 1e-3), distances.min()
    assert all(layer.self_attn.alibi.form == "split" for layer in model.encoder.layers)
    assert all(layer.self_attn.alibi.form == "symmetric" for layer in model.decoder.layers)
    assert "form=split" in repr(model.encoder.layers[0].self_attn.alibi)
    assert not any("alibi" in key or "slopes" in key for key in model.state_dict())


def test_a_mirrored_source_gets_another_output_distribution_with_the_split_encoder():
    """The symmetric encoder's mirrored source gives the same log-probabilities (above); the split
    encoder's does not."""
    model = make(alibi_encoder="split")
    src, lengths, tgt_in = random_batch(batch=3, src_len=6, tgt_len=5, lengths=[6, 4, 3], seed=9)
    mirrored = src.clone()
    for b, n in enumerate(lengths.tolist()):
        mirrored[b, :n] = src[b, :n].flip(0)
    logits, _ = model(src, lengths, tgt_in)
    mirrored_logits, _ = model(mirrored, lengths, tgt_in)
    for b in range(3):
        assert not torch.allclose(mirrored_logits[b], logits[b], atol=1e-6)


def test_cross_attention_has_no_bias():
    """The cross-attention's probabilities are the mapping of q . k / sqrt(d) alone (recomputed from
    the layer's own queries and keys), though its queries and keys have positions."""
    model = make()
    src, lengths, tgt_in = random_batch(batch=2, src_len=6, tgt_len=5, seed=4)
    _, _, maps = model(src, lengths, tgt_in, return_maps=True)
    layer = model.decoder.layers[-1]
    captured = {}
    hook = layer.cross_attn.register_forward_hook(lambda module, args, out: captured.update(query=args[0]))
    try:
        model(src, lengths, tgt_in)
    finally:
        hook.remove()
    memory, _ = model.encoder(model.src_embeddings(src), torch.arange(6)[None] < lengths[:, None])
    keys, _ = layer.cross_attn.keys_values(memory)
    scores = layer.cross_attn.queries(captured["query"]) @ keys.transpose(-1, -2)
    key_mask = (torch.arange(6)[None] < lengths[:, None])[:, None, None, :]
    want = get_mapping("entmax15")(scores, dim=-1, mask=key_mask)
    torch.testing.assert_close(maps["cross"][-1], want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("form", ["symmetric", "split"])
def test_sources_longer_than_training_run_and_steps_equal_teacher_forcing(form):
    """No table: a source and target far past max_positions (and anything a tiny model saw) run, and
    the incremental steps still equal teacher forcing at the far positions."""
    model = make(max_positions=4, alibi_encoder=form)
    src, lengths, tgt_in = random_batch(batch=2, src_len=300, tgt_len=270, seed=5)
    logits, _ = model(src, lengths, tgt_in)
    assert bool(torch.isfinite(logits).all())
    assert_long_steps_equal_teacher_forcing(model, src, lengths, tgt_in, logits)


def test_an_alibi_model_trains_its_parameters():
    model = make().train()
    src, lengths, tgt_in = random_batch(batch=2, src_len=5, tgt_len=4, seed=7)
    logits, _ = model(src, lengths, tgt_in)
    logits.square().sum().backward()
    grad = model.encoder.layers[0].self_attn.k_proj.weight.grad
    assert grad is not None and bool(grad.abs().sum() > 0)


def test_under_autocast_the_bias_keeps_the_scores_dtype():
    """bfloat16 autocast on the CPU: the float64 slopes do not promote the scores."""
    attention = MultiHeadAttention(16, 2, alibi=True)
    x = torch.randn(2, 5, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q, k, v = attention.self_projections(x)
        out, probs = attention.attend(q, k, v)
    assert q.dtype == torch.bfloat16 and out.dtype == torch.bfloat16


def test_config_accepts_alibi_and_a_misspelling_names_the_key():
    from nmt.config import ConfigError, resolve_config

    def config(positions):
        return {"data": {"train": {"src": "a", "tgt": "b"}, "valid": {"src": "c", "tgt": "d"},
                         "src": {"max_length": 500}},
                "model": {"type": "transformer", "transformer": {"positions": positions, "max_positions": 8}},
                "training": {"max_steps": 1, "save_dir": "r"}}

    resolved = resolve_config(config("alibi"), "t.yaml")  # no table: max_positions does not limit
    assert resolved["model"]["transformer"]["positions"] == "alibi"
    assert resolved["model"]["transformer"]["alibi_encoder"] == "symmetric"  # the default
    with pytest.raises(ConfigError) as info:
        resolve_config(config("alibii"), "t.yaml")
    message = str(info.value)
    assert message.startswith("t.yaml: model.transformer.positions: unknown value 'alibii' (did you mean 'alibi'?)")
    assert "\n" not in message
    split = config("alibi")
    split["model"]["transformer"]["alibi_encoder"] = "split"
    assert resolve_config(split, "t.yaml")["model"]["transformer"]["alibi_encoder"] == "split"
    split["model"]["transformer"]["alibi_encoder"] = "splitt"
    with pytest.raises(ConfigError) as info:
        resolve_config(split, "t.yaml")
    message = str(info.value)
    assert message.startswith("t.yaml: model.transformer.alibi_encoder: unknown value 'splitt' (did you mean 'split'?)")
    assert "\n" not in message


def test_the_builder_names_the_key_of_an_unknown_form_and_reads_a_missing_one_as_symmetric():
    """A model section that skipped validation (a checkpoint's config) with a bad form is one line
    naming the key; one without the key (written before the option) builds the symmetric encoder."""
    cfg = transformer_cfg(attention=MAPPINGS["entmax15"], transformer={"positions": "alibi", "alibi_encoder": "left"})
    with pytest.raises(ModelConfigError, match=r"^model\.transformer\.alibi_encoder: unknown value 'left'; "
                                               r"valid: symmetric, split$"):
        build_transformer(cfg, SRC_VOCAB, TGT_VOCAB, PAD)
    cfg = transformer_cfg(attention=MAPPINGS["entmax15"], transformer={"positions": "alibi"})
    assert "alibi_encoder" not in cfg["transformer"]
    model = build_transformer(cfg, SRC_VOCAB, TGT_VOCAB, PAD)
    assert all(layer.self_attn.alibi.form == "symmetric" for layer in model.encoder.layers)
