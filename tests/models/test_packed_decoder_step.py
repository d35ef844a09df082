"""The input-feeding LSTM decoder's CPU inference step (nmt.models.packed_decoder_step) against the
module path: bit for bit against the packed cells it replaces, up to rounding against nn.LSTMCell
and F.linear (torch's own modules, outside any packed region)."""
from __future__ import annotations

import pytest
import torch
from tiny_models import random_batch, sharpen_attention

from nmt.models import packed_decoder_step
from nmt.utils import packed_linear

pytestmark = pytest.mark.skipif(not packed_linear._BUILT, reason="torch without oneDNN (or NMT_ONEDNN=0)")

SERVED = [
    pytest.param({}, id="general-feed-softmax"),
    pytest.param({"decoder": {"input_feeding": False, "layers": 1}}, id="nofeed-1layer"),
    pytest.param({"decoder": {"layers": 3, "hidden_size": 8}, "attention": {"score": "dot"}}, id="dot-3layers"),
    pytest.param({"attention": {"mapping": "entmax15"}}, id="entmax15"),
    pytest.param({"attention": {"mapping": "sparsemax"}, "output": {"mapping": "sparsemax"}}, id="sparsemax"),
]


def _steps(model, src, lengths, tokens, slots=1):
    """Three steps from the encoder's state, with ``slots`` rows per sentence sharing its encoder
    output (as beam search runs them): [(log_probs, attention, state)] per step."""
    enc, state = model.encode(src, lengths)
    state = {k: v.repeat_interleave(slots, dim=0) for k, v in state.items()}
    out = []
    for t in range(tokens.size(1)):
        lp, att, state = model.step(tokens[:, t].repeat_interleave(slots), state, enc)
        out.append((lp, att, state))
    return out


def _run(model, src, lengths, tokens, *, packed_step: bool, slots: int = 1):
    with torch.no_grad(), packed_linear.frozen_weights():
        if not packed_step:  # the module path, still through the packed cells and products
            serve = packed_decoder_step.servable
            packed_decoder_step.servable = lambda decoder, emb: False
            try:
                return _steps(model, src, lengths, tokens, slots)
            finally:
                packed_decoder_step.servable = serve
        return _steps(model, src, lengths, tokens, slots)


@pytest.mark.parametrize("sections", SERVED)
@pytest.mark.parametrize("slots", [1, 3])
@pytest.mark.parametrize("token_products", [False, True])
@pytest.mark.parametrize("min_rows", [1, 10**9])  # the products on oneDNN, on MKL
def test_the_step_equals_the_packed_module_path(make_model, monkeypatch, sections, slots, token_products, min_rows):
    """Bit for bit with the embeddings in the first layer's product; up to rounding with that
    product split at the embeddings (token_products), whose part is then gathered per token."""
    monkeypatch.setattr(packed_decoder_step, "TOKEN_PRODUCTS", token_products)
    monkeypatch.setattr(packed_linear, "DECODE_MIN_ROWS", min_rows)
    monkeypatch.setattr(packed_linear, "DECODE_MIN_MACS", 0)  # the rows alone decide
    torch.manual_seed(5)
    model = make_model(dtype=torch.float32, **sections)
    if hasattr(model.decoder.attention, "key_proj"):  # (dot scores have none)
        sharpen_attention(model)
    src, lengths, tokens = random_batch(batch=4, src_len=7, tgt_len=3, lengths=[7, 3, 1, 5], seed=6)
    with torch.no_grad():
        emb = model.tgt_embeddings(tokens[:, 0])
        assert packed_decoder_step.servable(model.decoder, emb) is False  # outside a region
        with packed_linear.frozen_weights():
            assert packed_decoder_step.servable(model.decoder, emb)
    fast = _run(model, src, lengths, tokens, packed_step=True, slots=slots)
    ref = _run(model, src, lengths, tokens, packed_step=False, slots=slots)
    same = (lambda a, b: torch.testing.assert_close(a, b, rtol=1e-5, atol=2e-6)) if token_products else (
        lambda a, b: torch.testing.assert_close(a, b, rtol=0, atol=0))
    for (lp, att, state), (lp_ref, att_ref, state_ref) in zip(fast, ref):
        same(lp, lp_ref)
        same(att, att_ref)
        assert state.keys() == state_ref.keys()
        for name in state:
            same(state[name], state_ref[name])
    if sections.get("attention", {}).get("mapping") in ("entmax15", "sparsemax"):
        assert (fast[-1][1] == 0).any()  # the sparse mapping's exact zeros came through


@pytest.mark.parametrize("cell", ["native", "torch"])
@pytest.mark.parametrize("sections", SERVED[:2])
@pytest.mark.parametrize("min_rows", [1, 10**9])  # the products on oneDNN, on MKL
def test_the_step_equals_torch_modules_up_to_rounding(make_model, monkeypatch, sections, cell, min_rows):
    """Against nn.LSTMCell, F.linear and the attention module with no packed weights at all; the
    cell update native (where built) or torch's operations (its fallback)."""
    from nmt.models import native_lstm_cell
    monkeypatch.setattr(packed_linear, "DECODE_MIN_ROWS", min_rows)
    monkeypatch.setattr(packed_linear, "DECODE_MIN_MACS", 0)  # the rows alone decide
    if cell == "torch":
        monkeypatch.setitem(native_lstm_cell._state, "lib", None)
    torch.manual_seed(7)
    model = make_model(dtype=torch.float32, **sections)
    src, lengths, tokens = random_batch(batch=3, src_len=6, tgt_len=4, seed=8)
    fast = _run(model, src, lengths, tokens, packed_step=True)
    with torch.no_grad():  # no frozen region: every product is F.linear, every cell nn.LSTMCell
        ref = _steps(model, src, lengths, tokens)
    for (lp, att, state), (lp_ref, att_ref, state_ref) in zip(fast, ref):
        torch.testing.assert_close(lp, lp_ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(att, att_ref, rtol=1e-5, atol=1e-6)
        for name in state:
            torch.testing.assert_close(state[name], state_ref[name], rtol=1e-5, atol=1e-6)


def test_a_source_without_tokens_gets_no_attention(make_model):
    """An all-padding source row: zero attention and a zero context (the mapping's empty row), as
    the module path gives, while the other sentences take torch's softmax."""
    torch.manual_seed(9)
    model = make_model(dtype=torch.float32)
    src, lengths, tokens = random_batch(batch=3, src_len=5, tgt_len=2, lengths=[5, 2, 4], seed=10)
    with torch.no_grad(), packed_linear.frozen_weights():
        enc, state = model.encode(src, lengths)
        enc = dict(enc, src_mask=enc["src_mask"].clone())
        enc["src_mask"][1] = False
        lp, att, _ = model.step(tokens[:, 0], state, enc)
        packed_decoder_step.servable, serve = (lambda decoder, emb: False), packed_decoder_step.servable
        try:
            lp_ref, att_ref, _ = model.step(tokens[:, 0], state, enc)
        finally:
            packed_decoder_step.servable = serve
    assert torch.equal(att[1], torch.zeros_like(att[1])) and torch.isfinite(lp).all()
    assert torch.equal(att, att_ref) and torch.equal(lp, lp_ref)


@pytest.mark.parametrize("sections", [
    pytest.param({"attention": {"score": "mlp"}}, id="mlp"),
    pytest.param({"decoder": {"type": "gru"}, "encoder": {"type": "gru"}}, id="gru"),
    pytest.param({"attention": {"mapping": "entmax15", "continuous": {"num_basis_mu": 4}}}, id="continuous"),
])
def test_other_decoders_keep_the_module_path(make_model, sections):
    model = make_model(dtype=torch.float32, **sections)
    with torch.no_grad(), packed_linear.frozen_weights():
        assert not packed_decoder_step.servable(model.decoder, torch.zeros(2, 6))


def test_float64_and_gradients_keep_the_module_path(make_model):
    model = make_model(dtype=torch.float64)
    with torch.no_grad(), packed_linear.frozen_weights():
        assert not packed_decoder_step.servable(model.decoder, torch.zeros(2, 6, dtype=torch.float64))
    model = make_model(dtype=torch.float32)
    with packed_linear.frozen_weights():  # gradients wanted
        assert not packed_decoder_step.servable(model.decoder, torch.zeros(2, 6))


def test_the_model_step_serves_eval_mode_only(make_model, monkeypatch):
    """Seq2Seq.step takes the packed step in eval mode; in training mode (dropout active in the
    embeddings, between the layers and after the combining layer) it keeps the modules."""
    model = make_model(dtype=torch.float32, embeddings={"dropout": 0.3}, decoder={"dropout": 0.3})
    calls = []
    real = packed_decoder_step.packed_step
    monkeypatch.setattr(packed_decoder_step, "packed_step", lambda *a, **k: calls.append(True) or real(*a, **k))
    src, lengths, tokens = random_batch(batch=2, src_len=5, tgt_len=1, seed=11)
    with torch.no_grad(), packed_linear.frozen_weights():
        enc, state = model.encode(src, lengths)
        model.step(tokens[:, 0], state, enc)
        assert calls == [True]
        model.train()
        model.step(tokens[:, 0], state, enc)
        assert calls == [True]


def test_the_decoder_keeps_one_product_where_the_token_buffer_would_not_fit(make_model, monkeypatch):
    """A target vocabulary whose products would exceed token_products.MAX_BYTES: the model step
    takes the embeddings in the first layer's one product, bit for bit the module path."""
    from nmt.models import token_products
    monkeypatch.setattr(token_products, "MAX_BYTES", 0)
    torch.manual_seed(12)
    model = make_model(dtype=torch.float32)
    src, lengths, tokens = random_batch(batch=3, src_len=5, tgt_len=2, seed=13)
    fast = _run(model, src, lengths, tokens, packed_step=True)
    ref = _run(model, src, lengths, tokens, packed_step=False)
    for (lp, att, _), (lp_ref, att_ref, _) in zip(fast, ref):
        assert torch.equal(lp, lp_ref) and torch.equal(att, att_ref)
