"""Rotary positions (``model.transformer.positions: rotary``) against independent truths: complex
multiplication in float64, scores that depend on offsets only, the position-free model they rotate,
and the table's growth. Incremental decoding == teacher forcing for every mapping, the fused-kernel
agreement, the sync audit and the fullgraph compile run in test_transformer.py / test_fused_attention.py
(parametrised with rotary); beam search's certificates in tests/translate/test_certificate_bruteforce.py."""
from __future__ import annotations

import pytest
import torch
from tiny_models import PAD, SRC_VOCAB, TGT_VOCAB, assert_long_steps_equal_teacher_forcing, random_batch, transformer_cfg

import nmt.models.transformer.decoder as decoder_module
import nmt.models.transformer.encoder as encoder_module
from nmt.models.transformer import build_transformer
from nmt.models.transformer.multihead_attention import MultiHeadAttention
from nmt.models.transformer.rotary import RotaryPositions, rotate, stack_rotation

ENTMAX = {"mapping": "entmax15", "params": {}}


def make(positions: str = "rotary", attention=None, **transformer):
    torch.manual_seed(0)
    cfg = transformer_cfg(attention=attention or ENTMAX, transformer={"positions": positions, **transformer})
    return build_transformer(cfg, SRC_VOCAB, TGT_VOCAB, PAD).double().eval()


def complex_rotation(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """The reference: frequency i of a head vector is the complex ``x[i] + 1j x[i + d/2]``, turned by
    ``exp(1j p base^(-2i/d))`` -- one complex product per frequency. Returns (..., T, d/2) complex128."""
    d = x.size(-1)
    z = torch.complex(x[..., : d // 2], x[..., d // 2:])
    theta = torch.tensor([base ** (-2.0 * i / d) for i in range(d // 2)], dtype=torch.float64)
    return z * torch.polar(torch.ones(len(positions), d // 2, dtype=torch.float64), positions[:, None] * theta)


@pytest.mark.parametrize("d_head,offset,base", [(8, 0, 10000.0), (6, 5, 10000.0), (16, 300, 500.0)])
def test_rotation_is_the_complex_product(d_head, offset, base):
    torch.manual_seed(1)
    x = torch.randn(2, 3, 7, d_head, dtype=torch.float64)
    rotary = RotaryPositions(d_head, base)
    got = rotate(x, rotary.rotation(offset, 7, torch.float64))
    want = complex_rotation(x, torch.arange(offset, offset + 7, dtype=torch.float64), base)
    torch.testing.assert_close(torch.complex(got[..., : d_head // 2], got[..., d_head // 2:]), want,
                               rtol=0, atol=1e-12)
    assert rotary.cos.size(0) >= offset + 7  # grown past the initial 256 positions where asked


def test_self_attention_scores_are_q_m_conj_k_n_and_depend_on_offsets_only():
    """The scores the mapping receives are Re(sum_i q_i conj(k_i) exp(1j (m - n) theta_i)) of the
    unrotated projections (the complex reference), and shifting every position leaves them unchanged."""
    torch.manual_seed(2)
    attention = MultiHeadAttention(16, 2).double()
    x = torch.randn(3, 6, 16, dtype=torch.float64)
    rotary = RotaryPositions(8)
    q0, k0, _ = attention.self_projections(x)
    positions = torch.arange(6, dtype=torch.float64)
    zq, zk = complex_rotation(q0, positions), complex_rotation(k0, positions)
    want = (zq @ zk.conj().transpose(-1, -2)).real
    scores = {}
    for shift in (0, 1, 37, 1000):
        q, k, _ = attention.self_projections(x, rotary.rotation(shift, 6, torch.float64))
        scores[shift] = q @ k.transpose(-1, -2)
    torch.testing.assert_close(scores[0], want, rtol=0, atol=1e-12)
    for shift in (1, 37, 1000):
        torch.testing.assert_close(scores[shift], scores[0], rtol=0, atol=1e-10)
    assert not torch.allclose(scores[0], q0 @ k0.transpose(-1, -2), atol=1e-3)  # not vacuous: rotated


def test_the_encoder_sees_offsets_only(monkeypatch):
    """Every position of the encoder shifted by 37: the same memory (scores depend on n - m only)."""
    src, lengths, _ = random_batch(batch=3, src_len=7, seed=3)
    model = make()
    memory, _ = model.encoder(model.src_embeddings(src), torch.arange(7)[None] < lengths[:, None])
    monkeypatch.setattr(encoder_module, "stack_rotation",
                        lambda positions, offset, length, dtype: stack_rotation(positions, offset + 37, length, dtype))
    shifted, _ = model.encoder(model.src_embeddings(src), torch.arange(7)[None] < lengths[:, None])
    torch.testing.assert_close(shifted, memory, rtol=0, atol=1e-10)


def test_rotary_positions_order_the_tokens():
    """Without positions self-attention is permutation-equivariant; rotary breaks that (the encoder of
    a reversed sentence is not the reversed encoder), and adds nothing to the embeddings: with the
    rotations removed the model is the position-free one."""
    model = make()
    src = torch.tensor([[4, 5, 6, 7, 8]])
    mask = torch.ones(1, 5, dtype=torch.bool)
    memory, _ = model.encoder(model.src_embeddings(src), mask)
    reversed_memory, _ = model.encoder(model.src_embeddings(src.flip(1)), mask)
    assert not torch.allclose(reversed_memory.flip(1), memory, atol=1e-4)
    assert torch.equal(model.encoder.positions(memory), memory)  # nothing added to the embeddings
    encoder_module_rotation = encoder_module.stack_rotation
    try:
        encoder_module.stack_rotation = lambda *args: None
        plain, _ = model.encoder(model.src_embeddings(src), mask)
        plain_reversed, _ = model.encoder(model.src_embeddings(src.flip(1)), mask)
    finally:
        encoder_module.stack_rotation = encoder_module_rotation
    torch.testing.assert_close(plain_reversed.flip(1), plain, rtol=0, atol=1e-12)


def test_cross_attention_is_not_rotated(monkeypatch):
    """Shifting the decoder's positions alone (not the source's) leaves the logits and the cross-
    attention unchanged: the decoder's self-attention sees offsets only and its cross-attention no
    position (rotating its queries by target and keys by source positions would change them)."""
    model = make()
    src, lengths, tgt_in = random_batch(batch=2, src_len=5, tgt_len=4, seed=4)
    logits, attention = model(src, lengths, tgt_in)
    monkeypatch.setattr(decoder_module, "stack_rotation",
                        lambda positions, offset, length, dtype: stack_rotation(positions, offset + 11, length, dtype))
    shifted_logits, shifted_attention = model(src, lengths, tgt_in)
    torch.testing.assert_close(shifted_logits, logits, rtol=0, atol=1e-10)
    torch.testing.assert_close(shifted_attention, attention, rtol=0, atol=1e-10)


def test_long_sequences_need_no_table_and_keep_teacher_forcing_equal_to_steps():
    """No max_positions: a source and target past the initial 256-position table (and past
    max_positions) run, the table grows, and the incremental steps still equal teacher forcing."""
    model = make(max_positions=4)
    assert model.position_limits() == (None, None)  # translation keeps max_length as asked
    src, lengths, tgt_in = random_batch(batch=2, src_len=300, tgt_len=270, seed=5)
    logits, _ = model(src, lengths, tgt_in)
    assert model.decoder.positions.cos.size(0) >= 300 and model.encoder.positions.cos.size(0) >= 300
    assert_long_steps_equal_teacher_forcing(model, src, lengths, tgt_in, logits)


def test_the_cache_holds_keys_rotated_by_their_positions():
    """After t steps, the cached keys of layer 0 are the rotated projections of positions 0..t-1."""
    model = make()
    src, lengths, tgt_in = random_batch(batch=2, src_len=5, tgt_len=4, seed=6)
    with torch.no_grad():
        encoder_out, state = model.encode(src, lengths)
        for t in range(4):
            _, _, state = model.step(tgt_in[:, t], state, encoder_out)
        layer = model.decoder.layers[0]
        x = layer.self_block.inputs(model.tgt_embeddings(tgt_in) * model.decoder.scale)
        _, plain_keys, _ = layer.self_attn.self_projections(x)
    want = complex_rotation(plain_keys, torch.arange(4, dtype=torch.float64))
    got = state["self.0.k"]
    torch.testing.assert_close(torch.complex(got[..., :2], got[..., 2:]), want, rtol=0, atol=1e-12)


def test_a_rotary_model_trains_its_parameters_and_keeps_no_position_weights():
    model = make()
    names = [name for name, _ in model.named_parameters()]
    assert not any("positions" in name for name in names)
    assert not any("positions" in key for key in model.state_dict())  # nothing to save: non-persistent
    src, lengths, tgt_in = random_batch(batch=2, src_len=5, tgt_len=4, seed=7)
    model.train()
    logits, _ = model(src, lengths, tgt_in)
    logits.square().sum().backward()
    grad = model.encoder.layers[0].self_attn.k_proj.weight.grad
    assert grad is not None and bool(grad.abs().sum() > 0)


def test_under_autocast_the_rotation_keeps_the_projections_dtype():
    """bfloat16 autocast on the CPU: the queries / keys stay bfloat16 after the rotation (a float32
    table would promote them and the fused kernel's q, k, v would disagree)."""
    attention = MultiHeadAttention(16, 2)
    x = torch.randn(2, 5, 16)
    rotation = RotaryPositions(8).rotation(0, 5, torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q, k, v = attention.self_projections(x, rotation)
    assert q.dtype == k.dtype == v.dtype == torch.bfloat16


@pytest.mark.parametrize("transformer,message", [
    ({"positions": "rotory"}, "t.yaml: model.transformer.positions: unknown value 'rotory' (did you mean 'rotary'?)"),
    ({"positions": "rotary", "rotary_base": 0}, "t.yaml: model.transformer.rotary_base: must be > 1, got 0"),
    ({"positions": "relative", "max_relative_positions": 0},
     "t.yaml: model.transformer.max_relative_positions: must be in [1, 65536], got 0"),
])
def test_config_errors_are_one_line_naming_the_key(transformer, message):
    from nmt.config import ConfigError, resolve_config

    config = {"data": {"train": {"src": "a", "tgt": "b"}, "valid": {"src": "c", "tgt": "d"}},
              "model": {"type": "transformer", "transformer": transformer},
              "training": {"max_steps": 1, "save_dir": "r"}}
    with pytest.raises(ConfigError) as info:
        resolve_config(config, "t.yaml")
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


@pytest.mark.parametrize("positions", ["rotary", "relative"])
def test_max_positions_limits_only_learned_tables_at_load(positions):
    """data.src.max_length far above max_positions: refused with learned positions (the existing
    check), accepted with rotary / relative ones, which have no table of positions."""
    from nmt.config import ConfigError, resolve_config

    def config(kind):
        return {"data": {"train": {"src": "a", "tgt": "b"}, "valid": {"src": "c", "tgt": "d"},
                         "src": {"max_length": 500}},
                "model": {"type": "transformer", "transformer": {"positions": kind, "max_positions": 8}},
                "training": {"max_steps": 1, "save_dir": "r"}}

    with pytest.raises(ConfigError, match="data.src.max_length: 500 source tokens need more positions"):
        resolve_config(config("learned"), "t.yaml")
    assert resolve_config(config(positions), "t.yaml")["data"]["src"]["max_length"] == 500
