"""The Transformer encoder on packed rows (the real tokens only, CPU) computes the padded stack's
function: checked against the padded path itself and against each sentence encoded alone, without
padding (float64), for every attention mapping, both norms and every position kind, with gradients.
"""
import pytest
import torch

import nmt.models.transformer.packed_rows as packed_rows
from nmt.models.seq2seq import length_mask
from nmt.models.transformer.packed_rows import PackedRows, packs
from test_transformer import MAPPINGS, make
from tiny_models import positions_cfg, random_batch

LENGTHS = [7, 2, 5, 1, 7, 3]


def encode(model, src, src_lengths, packed: bool, monkeypatch):
    monkeypatch.setattr(packed_rows, "PACKED_ENCODER", packed)
    mask = length_mask(src_lengths, src.size(1), src.device)
    assert packs(mask) == packed
    return model.encoder(model.src_embeddings(src), mask)[0], mask


@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "rotary", "relative", "alibi", "alibi-split"])
@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("name", ["softmax", "entmax15", "entmax_bisect", "adaptive", "sparsemax", "fusedmax"])
def test_packed_encoder_equals_padded_and_sentences_alone(name, norm, positions, monkeypatch):
    model = make(attention=MAPPINGS[name], transformer={"norm": norm, **positions_cfg(positions)}, scale=3.0)
    src, src_lengths, _ = random_batch(batch=len(LENGTHS), src_len=7, lengths=LENGTHS, seed=3)
    packed, mask = encode(model, src, src_lengths, True, monkeypatch)
    padded, _ = encode(model, src, src_lengths, False, monkeypatch)
    torch.testing.assert_close(packed[mask], padded[mask], rtol=1e-12, atol=1e-12)
    assert torch.all(packed[~mask] == 0)  # nothing downstream reads them; packed leaves zeros
    for b, n in enumerate(LENGTHS):  # each sentence alone, no padding at all (the padded path)
        alone, _ = encode(model, src[b:b + 1, :n], src_lengths[b:b + 1], False, monkeypatch)
        torch.testing.assert_close(packed[b, :n], alone[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("positions", ["sinusoidal", "rotary", "alibi", "alibi-split"])
@pytest.mark.parametrize("name", ["softmax", "entmax15", "adaptive", "continuous"])
def test_packed_encoder_gives_the_same_loss_and_gradients(name, positions, monkeypatch):
    """The whole model's teacher-forced loss and every parameter's gradient (learned alphas and
    continuous cross-attention included), eval mode (no dropout draws)."""
    grads = {}
    for packed in (True, False):
        monkeypatch.setattr(packed_rows, "PACKED_ENCODER", packed)
        model = make(attention=MAPPINGS[name], transformer=positions_cfg(positions), scale=2.0)
        src, src_lengths, tgt_in = random_batch(batch=len(LENGTHS), src_len=7, tgt_len=4, lengths=LENGTHS, seed=5)
        logits, _ = model(src, src_lengths, tgt_in)
        logits.logsumexp(-1).sum().backward()
        grads[packed] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        grads[packed]["logits"] = logits.detach()
    assert grads[True].keys() == grads[False].keys()
    for key, value in grads[False].items():
        torch.testing.assert_close(grads[True][key], value, rtol=1e-10, atol=1e-12, msg=key)


def test_packing_rule(monkeypatch):
    """Packs on the CPU from MIN_PADDING of padded positions; never on other devices (the index
    reads the mask: a host sync there), under torch.compile, or with NMT_PACKED_ENCODER=0."""
    monkeypatch.setattr(packed_rows, "PACKED_ENCODER", True)
    full = torch.ones(4, 10, dtype=torch.bool)
    assert not packs(full)
    some = full.clone()
    some[0, 6:] = False  # 4 of 40 padded: exactly MIN_PADDING
    assert packs(some)
    some[0, 6] = True  # 3 of 40
    assert not packs(some)
    assert not packs(torch.ones(4, 10, dtype=torch.bool, device="meta").tril())
    monkeypatch.setattr(packed_rows, "PACKED_ENCODER", False)
    assert not packs(torch.zeros(4, 10, dtype=torch.bool))


def test_packed_rows_round_trip():
    """pack / unpack against a Python loop over the mask, and unpack's gradient."""
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(5, 6, generator=g) < 0.6
    x = torch.randn(5, 6, 3, generator=g, dtype=torch.float64)
    rows = PackedRows.of(mask)
    expected = torch.stack([x[b, t] for b in range(5) for t in range(6) if mask[b, t]])
    assert torch.equal(rows.pack(x), expected)
    y = expected.clone().requires_grad_()
    grid = rows.unpack(y)
    for b in range(5):
        for t in range(6):
            assert torch.equal(grid[b, t], x[b, t] if mask[b, t] else torch.zeros(3, dtype=torch.float64))
    weight = torch.randn(5, 6, 3, generator=g, dtype=torch.float64)
    (grid * weight).sum().backward()
    assert torch.equal(y.grad, rows.pack(weight))


def test_training_with_dropout_is_deterministic_and_finite(monkeypatch):
    """Dropout draws on the packed rows: two runs from one seed give the same gradients."""
    monkeypatch.setattr(packed_rows, "PACKED_ENCODER", True)
    out = []
    for _ in range(2):
        model = make(attention=MAPPINGS["entmax15"], transformer={"dropout": 0.3, "attention_dropout": 0.2}).train()
        src, src_lengths, tgt_in = random_batch(batch=len(LENGTHS), src_len=7, tgt_len=4, lengths=LENGTHS, seed=5)
        torch.manual_seed(11)
        logits, _ = model(src, src_lengths, tgt_in)
        logits.logsumexp(-1).sum().backward()
        out.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert torch.isfinite(out[0]).all() and torch.equal(out[0], out[1])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", ["softmax", "entmax15"])
def test_packed_encode_in_a_frozen_region(name, dtype, monkeypatch):
    """Decoding's encode (no grad, frozen weights: one fused query/key/value product, oneDNN in
    float32) on packed rows: the padded path's memory and cross keys/values at the real positions."""
    from nmt.utils import packed_linear

    model = make(dtype=dtype, attention=MAPPINGS[name], scale=2.0)
    src, src_lengths, _ = random_batch(batch=len(LENGTHS), src_len=7, lengths=LENGTHS, seed=8)
    mask = length_mask(src_lengths, src.size(1), src.device)
    outs = {}
    for packed in (True, False):
        monkeypatch.setattr(packed_rows, "PACKED_ENCODER", packed)
        with torch.no_grad(), packed_linear.frozen_weights():
            outs[packed] = model.encode(src, src_lengths)[0]
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs[True]["memory"][mask], outs[False]["memory"][mask], **tol)
    for key in outs[False]:
        if key.startswith("cross."):  # (B, heads, L, d_head): the real source positions
            torch.testing.assert_close(outs[True][key].transpose(1, 2)[mask], outs[False][key].transpose(1, 2)[mask], **tol)
