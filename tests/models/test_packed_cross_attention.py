"""The decoder's cross-attention keys/values projected from the encoder's packed rows (the real source
tokens only, CPU) and scattered into the padded layout: the padded path's attention, forward and
backward. Checked in float64 against the padded path itself (``NMT_PACKED_ENCODER=0``), against the
packed encoder with the padded projection (the cross keys/values path alone, dropout on with the
same draws), against a Python loop over the mask, and incremental decoding against teacher forcing,
for every attention mapping (sparse and structured ones, learned alphas, combined continuous
attention), both norms and every position kind.
"""
import pytest
import torch

import nmt.models.transformer.packed_rows as packed_rows
from nmt.models.seq2seq import length_mask
from nmt.models.transformer.decoder import TransformerDecoder
from nmt.models.transformer.packed_rows import PackedMemory, PackedRows, packs
from test_transformer import MAPPINGS, incremental, make
from tiny_models import random_batch

LENGTHS = [7, 2, 5, 1, 7, 3]  # ragged: 17 of 42 positions padded
CROSS = ["softmax", "sparsemax", "entmax15", "entmax_bisect", "adaptive", "entmax15-warm", "fusedmax", "oscarmax",
         "continuous", "continuous-gaussian"]


def padded_cross(monkeypatch) -> None:
    """The packed encoder, but the cross keys/values projected from the padded memory (as before)."""
    original = TransformerDecoder.cross_keys_values
    monkeypatch.setattr(TransformerDecoder, "cross_keys_values",
                        lambda self, memory, packed=None: original(self, memory))


def loss_and_grads(model, src, src_lengths, tgt_in, seed: int | None = None) -> dict:
    """Teacher-forced logits, every layer's cross maps and every parameter's gradient of a loss."""
    if seed is not None:
        torch.manual_seed(seed)
    logits, _, maps = model(src, src_lengths, tgt_in, return_maps=True)
    (logits.logsumexp(-1).sum() + sum((m * m).sum() for m in maps["cross"])).backward()
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    out["logits"] = logits.detach()
    out.update({f"cross_map.{i}": m.detach() for i, m in enumerate(maps["cross"])})
    return out


def assert_same(got: dict, expected: dict, rtol: float, atol: float) -> None:
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, rtol=rtol, atol=atol, msg=key)


def test_unpack_heads_against_a_loop():
    """(N, heads * d) rows -> (B, heads, L, d), contiguous, zeros at padding; its gradient is the
    rows' entries of the grid's gradient."""
    g = torch.Generator().manual_seed(1)
    mask = torch.rand(4, 6, generator=g) < 0.6
    mask[:, 0] = True
    rows = PackedRows.of(mask)
    n, heads, d = int(mask.sum()), 3, 2
    x = torch.randn(n, heads * d, generator=g, dtype=torch.float64, requires_grad=True)
    grid = rows.unpack_heads(x, heads)
    assert grid.shape == (4, heads, 6, d) and grid.is_contiguous()
    expected = torch.zeros(4, heads, 6, d, dtype=torch.float64)
    i = 0
    for b in range(4):
        for t in range(6):
            if mask[b, t]:
                for h in range(heads):
                    expected[b, h, t] = x[i, h * d:(h + 1) * d].detach()
                i += 1
    assert torch.equal(grid, expected)
    assert torch.equal(rows.unpack_heads(x, heads), grid)  # again, from the index kept for these heads
    weight = torch.randn(4, heads, 6, d, generator=g, dtype=torch.float64)
    (grid * weight).sum().backward()
    expected_grad = torch.stack([weight[b, :, t].reshape(-1) for b in range(4) for t in range(6) if mask[b, t]])
    assert torch.equal(x.grad, expected_grad)


@pytest.mark.parametrize("name", ["softmax", "continuous"])
def test_packed_keys_values_equal_the_projection_at_real_positions(name, monkeypatch):
    """The encoder's packed rows projected = the padded memory projected, at every real position
    (float64); zeros at the padded ones."""
    monkeypatch.setattr(packed_rows, "PACKED_ENCODER", True)
    model = make(attention=MAPPINGS[name], scale=2.0)
    src, src_lengths, _ = random_batch(batch=len(LENGTHS), src_len=7, lengths=LENGTHS, seed=3)
    mask = length_mask(src_lengths, src.size(1), src.device)
    memory, _, packed = model.encoder.encode(model.src_embeddings(src), mask)
    assert isinstance(packed, PackedMemory) and torch.equal(packed.rows.unpack(packed.x), memory)
    for layer, (keys, values) in zip(model.decoder.layers, model.decoder.cross_keys_values(memory, packed)):
        k, v = layer.cross_attn.keys_values(memory)
        for got, expected in ((keys, k), (values, v)):
            assert got.is_contiguous()
            torch.testing.assert_close(got.transpose(1, 2)[mask], expected.transpose(1, 2)[mask],
                                       rtol=1e-13, atol=1e-13)
            assert torch.all(got.transpose(1, 2)[~mask] == 0)


@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "rotary", "relative", "alibi"])
@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("name", CROSS)
def test_packed_model_equals_padded_forward_and_backward(name, norm, positions, monkeypatch):
    """The whole model, packed (encoder rows and cross keys/values from them) against padded
    (``NMT_PACKED_ENCODER=0``): logits, every layer's cross probabilities (exact zeros where the
    padded path has them) and every parameter's gradient, encoder and learned alphas included."""
    results = {}
    for packed in (True, False):
        monkeypatch.setattr(packed_rows, "PACKED_ENCODER", packed)
        model = make(attention=MAPPINGS[name], transformer={"norm": norm, "positions": positions}, scale=3.0)
        src, src_lengths, tgt_in = random_batch(batch=len(LENGTHS), src_len=7, tgt_len=5, lengths=LENGTHS, seed=5)
        assert packs(length_mask(src_lengths, 7, src.device)) == packed
        results[packed] = loss_and_grads(model, src, src_lengths, tgt_in)
    assert_same(results[True], results[False], rtol=1e-10, atol=1e-12)
    for key in results[False]:
        if key.startswith("cross_map."):
            assert torch.equal(results[True][key] == 0, results[False][key] == 0), key


@pytest.mark.parametrize("name", CROSS)
def test_cross_keys_values_path_alone_with_dropout(name, monkeypatch):
    """Training mode with every dropout on, the packed encoder in both runs and the same seed (the same
    draws: the shapes after the encoder agree): cross keys/values from the packed rows against those
    of the padded memory. The cross-attention's own function, forward and backward."""
    monkeypatch.setattr(packed_rows, "PACKED_ENCODER", True)
    results = []
    for padded in (False, True):
        if padded:
            padded_cross(monkeypatch)
        model = make(attention=MAPPINGS[name], transformer={"dropout": 0.3, "attention_dropout": 0.2,
                                                           "activation_dropout": 0.1}, scale=3.0).train()
        src, src_lengths, tgt_in = random_batch(batch=len(LENGTHS), src_len=7, tgt_len=5, lengths=LENGTHS, seed=6)
        results.append(loss_and_grads(model, src, src_lengths, tgt_in, seed=11))
    assert_same(results[0], results[1], rtol=1e-12, atol=1e-12)
    for key in results[0]:
        if key.startswith("cross_map."):
            assert torch.equal(results[0][key] == 0, results[1][key] == 0), key


@pytest.mark.parametrize("lengths", [[5, 5, 5], [4], [6, 1], [1, 1, 1, 1, 8]], ids=["no-padding", "one", "two", "long"])
@pytest.mark.parametrize("name", ["softmax", "entmax15", "sparsemax"])
def test_batches_of_every_shape(name, lengths, monkeypatch):
    """A batch without padding (the padded path, nothing packed), a batch of one, ragged ones:
    packed against padded, forward and backward."""
    results = {}
    for packed in (True, False):
        monkeypatch.setattr(packed_rows, "PACKED_ENCODER", packed)
        model = make(attention=MAPPINGS[name], scale=3.0)
        src, src_lengths, tgt_in = random_batch(batch=len(lengths), src_len=max(lengths), tgt_len=4,
                                                lengths=lengths, seed=7)
        mask = length_mask(src_lengths, src.size(1), src.device)
        assert packs(mask) == (packed and not bool(mask.all()))
        results[packed] = loss_and_grads(model, src, src_lengths, tgt_in)
    assert_same(results[True], results[False], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", CROSS)
@pytest.mark.parametrize("positions", ["sinusoidal", "rotary", "alibi"])
def test_incremental_decoding_from_packed_encode_equals_teacher_forcing(name, positions, monkeypatch):
    """``encode`` on a ragged batch packs; its ``cross.{i}.k`` / ``.v`` are zeros at padding, and the
    steps (reordered after the first) give teacher forcing's log-probabilities and attention, and the
    padded path's."""
    monkeypatch.setattr(packed_rows, "PACKED_ENCODER", True)
    model = make(scale=3.0, attention=MAPPINGS[name], output={"mapping": "entmax15", "params": {}},
                 transformer={"positions": positions})
    src, src_lengths, tgt_in = random_batch(batch=len(LENGTHS), src_len=7, tgt_len=5, lengths=LENGTHS, seed=9)
    mask = length_mask(src_lengths, 7, src.device)
    assert packs(mask)
    with torch.no_grad():
        encoder_out, _ = model.encode(src, src_lengths)
        for i in range(len(model.decoder.layers)):
            assert torch.all(encoder_out[f"cross.{i}.k"].transpose(1, 2)[~mask] == 0)
            assert torch.all(encoder_out[f"cross.{i}.v"].transpose(1, 2)[~mask] == 0)
        logits, attention = model(src, src_lengths, tgt_in)
        expected = model.log_probs(logits)
        got, got_attention = incremental(model, src, src_lengths, tgt_in,
                                         permutation=torch.tensor([5, 2, 0, 4, 1, 3]))
        monkeypatch.setattr(packed_rows, "PACKED_ENCODER", False)
        padded, padded_attention = incremental(model, src, src_lengths, tgt_in)
    for other, other_attention in ((expected, attention), (padded, padded_attention)):
        assert torch.equal(torch.isinf(got), torch.isinf(other))  # the same exact zeros
        finite = torch.isfinite(other)
        assert (got[finite] - other[finite]).abs().max() <= 1e-10
        assert (got_attention - other_attention).abs().max() <= 1e-10
