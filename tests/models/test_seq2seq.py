"""Seq2Seq: shapes, teacher forcing == step-by-step decoding, padding invariance, protocol."""
from __future__ import annotations

import pytest
import torch
from tiny_models import PAD, TGT_VOCAB, random_batch, sharpen_attention

from nmt.models import StepDecoder, select_state, tile_state

VARIANTS = [
    pytest.param({}, id="lstm-bi-general-feed-linear"),
    pytest.param({"encoder": {"type": "gru"}, "decoder": {"type": "gru"}}, id="gru-gru"),
    pytest.param({"encoder": {"type": "gru"}, "decoder": {"bridge": "copy", "hidden_size": 8}}, id="gru-lstm-copy"),
    pytest.param({"encoder": {"bidirectional": False, "layers": 1}, "decoder": {"bridge": "none", "layers": 1}},
                 id="uni-none"),
    pytest.param({"decoder": {"input_feeding": False}, "attention": {"score": "mlp"}}, id="nofeed-mlp"),
    pytest.param({"decoder": {"hidden_size": 8}, "attention": {"score": "dot"}}, id="dot"),
    pytest.param({"decoder": {"type": "gru", "layers": 3}, "encoder": {"layers": 1}}, id="lstm-gru-layers"),
    pytest.param({"attention": {"mapping": "entmax15", "continuous": {"num_basis_mu": 4}}}, id="continuous"),
]


def _step_through(model, src, src_lengths, tgt_in):
    encoder_out, state = model.encode(src, src_lengths)
    log_probs, attention = [], []
    for t in range(tgt_in.size(1)):
        lp, att, state = model.step(tgt_in[:, t], state, encoder_out)
        log_probs.append(lp)
        attention.append(att)
    return torch.stack(log_probs, 1), torch.stack(attention, 1)


@pytest.mark.parametrize("sections", VARIANTS)
def test_shapes_and_states(make_model, sections):
    model = make_model(**sections)
    src, src_lengths, tgt_in = random_batch(batch=3, src_len=7, tgt_len=5)
    logits, attention = model(src, src_lengths, tgt_in)
    assert logits.shape == (3, 5, TGT_VOCAB)
    assert attention.shape == (3, 5, 7)
    encoder_out, state = model.encode(src, src_lengths)
    assert encoder_out["memory"].shape == (3, 7, 8)
    assert encoder_out["src_mask"].dtype == torch.bool
    assert torch.equal(encoder_out["src_mask"].sum(1), src_lengths)
    dec = model.decoder
    assert state["h"].shape == (3, dec.layers, dec.hidden_size)
    assert ("c" in state) == (dec.rnn_type == "lstm")
    assert ("input_feed" in state) == dec.input_feeding
    assert all(v.size(0) == 3 for v in list(state.values()) + list(encoder_out.values()))
    torch.testing.assert_close(attention.sum(-1), torch.ones(3, 5, dtype=attention.dtype))
    assert isinstance(model, StepDecoder)


@pytest.mark.parametrize("sections", VARIANTS)
def test_forward_equals_step_by_step(make_model, sections):
    model = make_model(**sections)
    src, src_lengths, tgt_in = random_batch(batch=4, src_len=6, tgt_len=5, seed=1)
    logits, attention = model(src, src_lengths, tgt_in)
    step_log_probs, step_attention = _step_through(model, src, src_lengths, tgt_in)
    torch.testing.assert_close(step_log_probs, model.log_probs(logits), rtol=0, atol=1e-12)
    torch.testing.assert_close(step_attention, attention, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("mapping", "continuous"), [
    ("softmax", None), ("sparsemax", None), ("entmax15", None), ("entmax15", {"alpha": 2.0})])
def test_padding_invariance(make_model, mapping, continuous):
    """A sentence alone == the same sentence inside a padded batch; zero attention on padding."""
    model = make_model(attention={"mapping": mapping, "continuous": continuous}, output={"mapping": mapping})
    src, src_lengths, tgt_in = random_batch(batch=4, src_len=8, tgt_len=6, lengths=[3, 8, 5, 1], seed=2)
    src = torch.cat([src, src.new_full((4, 2), PAD)], dim=1)  # extra padding columns
    logits, attention = model(src, src_lengths, tgt_in)
    mask = torch.arange(src.size(1))[None, None] < src_lengths[:, None, None]
    assert torch.all(attention.masked_select(~mask) == 0)
    for b, n in enumerate(src_lengths.tolist()):
        alone_logits, alone_attention = model(src[b : b + 1, :n], src_lengths[b : b + 1], tgt_in[b : b + 1])
        torch.testing.assert_close(logits[b : b + 1], alone_logits, rtol=0, atol=1e-12)
        torch.testing.assert_close(attention[b : b + 1, :, :n], alone_attention, rtol=0, atol=1e-12)
    # target padding: earlier positions never see later ones
    short_logits, _ = model(src, src_lengths, tgt_in[:, :3])
    torch.testing.assert_close(short_logits, logits[:, :3], rtol=0, atol=1e-12)


def test_encoder_final_states_match_memory(make_model):
    """Per layer [forward; backward]: forward ends at the last real token, backward at the first."""
    model = make_model(encoder={"layers": 1}, decoder={"bridge": "copy", "layers": 1, "hidden_size": 8})
    src, src_lengths, _ = random_batch(batch=4, src_len=6, lengths=[6, 2, 4, 1], seed=3)
    memory, (h, c) = model.encoder(model.src_embeddings(src), src_lengths)
    half = memory.size(-1) // 2
    last = memory[torch.arange(4), src_lengths - 1]
    torch.testing.assert_close(h[0, :, :half], last[:, :half], rtol=0, atol=0)
    torch.testing.assert_close(h[0, :, half:], memory[:, 0, half:], rtol=0, atol=0)
    assert torch.all(memory[torch.arange(6)[None] >= src_lengths[:, None]] == 0)
    _, state = model.encode(src, src_lengths)  # copy bridge: decoder starts where the encoder ended
    torch.testing.assert_close(state["h"][:, 0], h[0], rtol=0, atol=0)
    torch.testing.assert_close(state["c"][:, 0], c[0], rtol=0, atol=0)


def test_bridge_none_starts_from_zeros(make_model):
    model = make_model(decoder={"bridge": "none"})
    src, src_lengths, _ = random_batch()
    _, state = model.encode(src, src_lengths)
    assert all(torch.all(v == 0) for v in state.values())


def test_tiled_and_reordered_states_step_like_the_original(make_model):
    """What beam search does: tile every state by k, reorder rows, step -> same rows as untiled."""
    model = make_model(attention={"score": "mlp"})
    src, src_lengths, tgt_in = random_batch(batch=3, seed=4)
    encoder_out, state = model.encode(src, src_lengths)
    lp, att, state1 = model.step(tgt_in[:, 0], state, encoder_out)
    k = 2
    enc_k, state_k = tile_state(encoder_out, k), tile_state(state, k)
    lp_k, att_k, state1_k = model.step(tgt_in[:, 0].repeat_interleave(k), state_k, enc_k)
    torch.testing.assert_close(lp_k, lp.repeat_interleave(k, 0), rtol=0, atol=1e-12)
    order = torch.tensor([5, 0, 3, 2, 1, 4])
    picked = select_state(state1_k, order)
    lp2, _, _ = model.step(tgt_in[:, 1].repeat_interleave(k)[order], picked, select_state(enc_k, order))
    ref, _, _ = model.step(tgt_in[:, 1], state1, encoder_out)
    torch.testing.assert_close(lp2, ref.repeat_interleave(k, 0)[order], rtol=0, atol=1e-12)


@pytest.mark.parametrize("sections", VARIANTS)
def test_step_rows_share_their_sentence_encoder_out(make_model, sections):
    """``shares_encoder_out``: a step of k rows per sentence with the untiled encoder output (one
    row per sentence) gives what the tiled one gives, to rounding (the attention's products have
    other shapes)."""
    model = make_model(**sections)
    assert model.shares_encoder_out
    src, src_lengths, tgt_in = random_batch(batch=3, seed=5)
    with torch.no_grad():
        encoder_out, state = model.encode(src, src_lengths)
        k = 3
        state_k, tokens = tile_state(state, k), tgt_in[:, 0].repeat_interleave(k)
        shared = model.step(tokens, state_k, encoder_out)
        tiled = model.step(tokens, state_k, tile_state(encoder_out, k))
    torch.testing.assert_close(shared[0], tiled[0])
    torch.testing.assert_close(shared[1], tiled[1])
    for name in tiled[2]:
        torch.testing.assert_close(shared[2][name], tiled[2][name])


def test_bad_source_lengths_are_clear_errors(make_model):
    model = make_model()
    src, _, tgt_in = random_batch(batch=2)
    with pytest.raises(ValueError, match="src_lengths: every source sentence"):
        model(src, torch.tensor([3, 0]), tgt_in[:2])
    with pytest.raises(ValueError, match="src_lengths: a length exceeds the padded source length 7"):
        model(src, torch.tensor([3, 8]), tgt_in[:2])


def test_padding_embedding_gets_no_gradient(make_model):
    model = make_model().train()
    src, src_lengths, tgt_in = random_batch(batch=3, lengths=[7, 2, 4])
    logits, _ = model(src, src_lengths, tgt_in)
    logits.sum().backward()
    assert torch.all(model.src_embeddings.weight.grad[PAD] == 0)
    assert torch.all(model.src_embeddings.weight[PAD] == 0)


@pytest.mark.parametrize("sections", [
    pytest.param({"decoder": {"layers": 3, "dropout": 0.3}}, id="lstm-3-layers-dropout"),
    pytest.param({"decoder": {"input_feeding": False, "dropout": 0.3}}, id="lstm-nofeed-dropout"),
    pytest.param({"encoder": {"bidirectional": False, "layers": 1}, "decoder": {"bridge": "none", "layers": 1}},
                 id="lstm-1-layer"),
])
def test_lstm_teacher_forcing_equals_cell_loop_with_dropout_and_gradients(make_model, sections):
    """The LSTM's batched teacher-forced path == the cells' step function applied T times, in training
    mode: the same dropout masks (same RNG order), outputs and parameter gradients."""
    model = make_model(**sections)
    model.train()
    dec = model.decoder
    src, src_lengths, tgt_in = random_batch(batch=4, src_len=6, tgt_len=5, seed=3)
    encoder_out, state = model.encode(src, src_lengths)
    emb = model.tgt_embeddings(tgt_in)

    def run(loop: bool):
        torch.manual_seed(11)
        keys = dec.attention.keys(encoder_out["memory"])
        if not loop:
            return dec(emb, state, encoder_out["memory"], encoder_out["src_mask"], keys)
        hidden, feed = dec._from_state(state)
        outs, attns = [], []
        for t in range(emb.size(1)):
            feed, probs, hidden = dec._step(emb[:, t], hidden, feed, encoder_out["memory"], encoder_out["src_mask"],
                                            keys)
            outs.append(feed)
            attns.append(probs)
        return torch.stack(outs, 1), torch.stack(attns, 1)

    grads = []
    for loop in (False, True):
        model.zero_grad()
        out, attention = run(loop)
        (out.square().sum() + attention[..., 0].sum()).backward(retain_graph=True)
        grads.append(({n: p.grad.clone() for n, p in dec.named_parameters() if p.grad is not None}, out, attention))
    (fast, out_fast, att_fast), (ref, out_ref, att_ref) = grads
    torch.testing.assert_close(out_fast, out_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(att_fast, att_ref, rtol=0, atol=1e-12)
    assert fast.keys() == ref.keys() and any("weight_ih" in n for n in fast)
    for name in ref:
        torch.testing.assert_close(fast[name], ref[name], rtol=0, atol=1e-10, msg=name)


def _training_pass(model, src, src_lengths, tgt_in):
    """One teacher-forced forward and backward of a fixed loss of the logits and the attention
    (seed 11, gradients zeroed first): ``(logits, attention, {name: gradient})`` on the host."""
    torch.manual_seed(11)
    model.zero_grad()
    logits, attention = model(src, src_lengths, tgt_in)
    (logits.square().sum() + attention[..., 0].sum()).backward()
    return (logits.detach().cpu(), attention.detach().cpu(),
            {n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.grad is not None})


@pytest.mark.parametrize("sections", [
    pytest.param({}, id="general"),
    pytest.param({"attention": {"score": "dot"}, "decoder": {"hidden_size": 8}}, id="dot"),
    pytest.param({"attention": {"score": "mlp"}}, id="mlp"),
    pytest.param({"attention": {"mapping": "entmax15", "continuous": {"num_basis_mu": 4}}}, id="continuous"),
])
def test_teacher_forcing_with_the_attention_step_products(make_model, monkeypatch, sections):
    """The teacher-forced loop's attention products with the keys' and memory's gradients made
    once after the last step (GlobalAttention.step_products) give the loss and every parameter
    gradient (encoder included) of plain products (float64)."""
    model = make_model(**sections)
    model.train()

    _assert_step_products_equal_plain(model, monkeypatch, *random_batch(batch=4, src_len=6, tgt_len=5, seed=3))


def _assert_step_products_equal_plain(model, monkeypatch, src, src_lengths, tgt_in):
    """A training pass with GlobalAttention.step_products (made once, with the padding bias)
    against one with plain products and the mask given to the mapping: the same logits,
    attention and parameter gradients (float64)."""
    from nmt.models.attention import GlobalAttention

    assert (src_lengths < src.size(1)).any()  # padding present
    calls = []
    step_products = GlobalAttention.step_products

    def counted(self, memory, keys, mask=None):
        calls.append(mask is not None)
        return step_products(self, memory, keys, mask)

    monkeypatch.setattr(GlobalAttention, "step_products", counted)
    logits, attention, grads = _training_pass(model, src, src_lengths, tgt_in)
    assert calls == [True]
    monkeypatch.setattr(GlobalAttention, "step_products", lambda self, memory, keys, mask=None: None)
    ref_logits, ref_attention, ref_grads = _training_pass(model, src, src_lengths, tgt_in)
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-12)
    torch.testing.assert_close(attention, ref_attention, rtol=0, atol=1e-12)
    assert grads.keys() == ref_grads.keys() and any(n.startswith("encoder") for n in grads)
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=0, atol=1e-10, msg=name)
    return attention


@pytest.mark.parametrize("mapping,params", [
    ("softmax", {}), ("sparsemax", {}), ("entmax15", {}), ("entmax_bisect", {"alpha": 1.3}),
    ("entmax_bisect", {"alpha": 2.5}), ("fusedmax", {}), ("oscarmax", {}),
])
def test_padding_bias_of_the_step_products_for_every_mapping(make_model, monkeypatch, mapping, params):
    """The padding as an additive -inf bias (made once per pass) instead of the mask given to the
    mapping at every step: for every mapping, with scores sharp enough that the sparse mappings
    give exact zeros besides the padding, the same attention (exact zeros on padding) and every
    parameter gradient: each mapping's gradient is zero at -inf scores, as the mask's fill made
    it."""
    from nmt.sparse.registry import MAPPING_NAMES

    assert {m for m, _ in _BIAS_MAPPINGS} == set(MAPPING_NAMES)
    model = make_model(attention={"mapping": mapping, "params": params})
    sharpen_attention(model)
    model.train()
    batch = random_batch(batch=4, src_len=6, tgt_len=5, lengths=[6, 2, 4, 1], seed=5)
    attention = _assert_step_products_equal_plain(model, monkeypatch, *batch)
    padding = torch.arange(6)[None] >= batch[1][:, None]
    assert torch.all(attention.masked_select(padding[:, None].expand_as(attention)) == 0)
    if mapping != "softmax" and params.get("alpha", 2.0) >= 1.5:  # sparse besides the padding
        assert (attention.masked_select(~padding[:, None].expand_as(attention)) == 0).any()


_BIAS_MAPPINGS = [("softmax", {}), ("sparsemax", {}), ("entmax15", {}), ("entmax_bisect", {"alpha": 1.3}),
                  ("fusedmax", {}), ("oscarmax", {})]


def _fused_cell_by_definition(input_gates, hidden_gates, c, input_bias, hidden_bias):
    """aten::_thnn_fused_lstm_cell's function (CUDA only) from the LSTM's definition: gates
    (i, f, g, o) = input_gates + hidden_gates (+ input_bias + hidden_bias); returns (h', c').
    Refuses what the CUDA kernel refuses (its checkSizes): gates of other shapes, biases that are
    not both given (of 4H entries each) or both None."""
    assert input_gates.dim() == 2 and input_gates.shape == hidden_gates.shape
    assert (input_bias is None) == (hidden_bias is None), "the kernel takes both biases or neither"
    if input_bias is not None:
        assert input_bias.shape == hidden_bias.shape == (input_gates.size(1),)
    assert c.shape == (input_gates.size(0), input_gates.size(1) // 4)
    bias = 0 if input_bias is None else input_bias + hidden_bias
    gates = input_gates + hidden_gates + bias
    i, f, g, o = gates.chunk(4, dim=-1)
    c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c_new), c_new


@pytest.mark.parametrize("sections", [
    pytest.param({"decoder": {"dropout": 0.3}}, id="lstm-2-layers-dropout"),
    pytest.param({"decoder": {"layers": 3, "input_feeding": False}}, id="lstm-3-layers-nofeed"),
    pytest.param({"encoder": {"bidirectional": False, "layers": 1}, "decoder": {"bridge": "none", "layers": 1}},
                 id="lstm-1-layer"),
])
def test_lstm_teacher_forcing_with_the_fused_cuda_cell(make_model, monkeypatch, sections):
    """The teacher-forced LSTM loop's CUDA route (one fused cell call per layer and step, fed the
    gates and biases as torch's fused kernel takes them), checked on the CPU with the kernel's
    function written from the definition: the outputs and parameter gradients of the plain loop."""
    from nmt.models import decoder

    model = make_model(**sections)
    model.train()
    dec = model.decoder
    src, src_lengths, tgt_in = random_batch(batch=4, src_len=6, tgt_len=5, seed=3)
    calls = []

    def fused(*args):
        calls.append(args[1].shape)
        return _fused_cell_by_definition(*args)

    def run(use_fused: bool):
        monkeypatch.setattr(decoder, "fused_cell_usable", lambda like, tensors: use_fused)
        monkeypatch.setattr(decoder, "fused_lstm_cell", fused)
        return _training_pass(model, src, src_lengths, tgt_in)

    logits, attention, grads = run(True)
    assert len(calls) == dec.layers * tgt_in.size(1)
    ref_logits, ref_attention, ref_grads = run(False)
    assert len(calls) == dec.layers * tgt_in.size(1)  # the plain loop calls none
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-12)
    torch.testing.assert_close(attention, ref_attention, rtol=0, atol=1e-12)
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=0, atol=1e-10, msg=name)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_cuda_cell_equals_the_definition():
    """torch's fused CUDA cell, called as the teacher-forced loop calls it (with and without a
    bias), equals the LSTM's definition in float64 on the CPU, forward and backward."""
    from nmt.models.decoder import fused_cell_usable, fused_lstm_cell

    g = torch.Generator().manual_seed(0)
    n, hidden = 5, 7
    for with_bias in (False, True):
        cpu = [torch.randn(n, 4 * hidden, generator=g, dtype=torch.float64), torch.randn(n, 4 * hidden, generator=g,
               dtype=torch.float64), torch.randn(n, hidden, generator=g, dtype=torch.float64),
               *([torch.randn(4 * hidden, generator=g, dtype=torch.float64) for _ in range(2)] if with_bias
                 else [None, None])]
        cuda = [None if t is None else t.float().cuda().requires_grad_() for t in cpu]
        cpu = [None if t is None else t.requires_grad_() for t in cpu]
        assert fused_cell_usable(cuda[0], [t for t in cuda[1:] if t is not None])
        h, c = fused_lstm_cell(*cuda)
        h_ref, c_ref = _fused_cell_by_definition(*cpu)
        torch.testing.assert_close(h.double().cpu(), h_ref.detach(), rtol=0, atol=2e-6)
        torch.testing.assert_close(c.double().cpu(), c_ref.detach(), rtol=0, atol=2e-6)
        w_h, w_c = torch.randn(n, hidden, generator=g, dtype=torch.float64), torch.randn(n, hidden, generator=g,
                                                                                        dtype=torch.float64)
        ((h * w_h.float().cuda()).sum() + (c * w_c.float().cuda()).sum()).backward()
        ((h_ref * w_h).sum() + (c_ref * w_c).sum()).backward()
        for ours, ref in zip(cuda, cpu):
            if ref is not None:
                torch.testing.assert_close(ours.grad.double().cpu(), ref.grad, rtol=0, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("sections", [
    pytest.param({}, id="lstm-2-layers-feed"),
    pytest.param({"decoder": {"layers": 3, "input_feeding": False}, "attention": {"score": "dot", "mapping": "entmax15"},
                  "encoder": {"hidden_size": 6}}, id="lstm-3-layers-dot-entmax15"),
])
def test_teacher_forced_training_pass_on_cuda_equals_the_cpu(make_model, sections):
    """The eager teacher-forced forward and backward on CUDA (the fused cell kernel, the attention
    products, the Triton or static mappings) equal the CPU's in float64: logits and every
    parameter gradient."""
    cpu = make_model(**sections).train()
    cuda = make_model(**sections).train().cuda()
    cuda.load_state_dict(cpu.state_dict())
    src, src_lengths, tgt_in = random_batch(batch=4, src_len=6, tgt_len=5, seed=5)
    ref, _, ref_grads = _training_pass(cpu, src, src_lengths, tgt_in)
    ours, _, grads = _training_pass(cuda, src.cuda(), src_lengths, tgt_in.cuda())
    assert grads.keys() == ref_grads.keys() == {n for n, _ in cpu.named_parameters()}
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-9)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=0, atol=1e-8, msg=name)


def test_packed_cpu_inference_matches_the_plain_path(make_model, monkeypatch):
    """float32 decoding (no gradients) through packed oneDNN weights (nmt.utils.packed_linear: the
    generator, the combining layer and the decoder's LSTM cells) gives the log-probabilities and
    attention of F.linear and nn.LSTMCell, up to rounding."""
    from nmt.utils import packed_linear
    if not packed_linear._BUILT:
        pytest.skip("torch without oneDNN (or NMT_ONEDNN=0)")
    torch.manual_seed(3)
    model = make_model(dtype=torch.float32)
    src, lengths, tgt_in = random_batch(batch=3, src_len=7, tgt_len=5, seed=4)

    def run():
        with torch.no_grad(), packed_linear.frozen_weights():
            enc, state = model.encode(src, lengths)
            lp, att, state = model.step(tgt_in[:, 0], state, enc)
            lp2, att2, _ = model.step(tgt_in[:, 1], state, enc)
            logits, _ = model(src, lengths, tgt_in)
        return lp, att, lp2, att2, logits

    packed = run()
    monkeypatch.setattr(packed_linear, "_BUILT", False)
    for a, b in zip(packed, run()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_packed_training_products_give_the_plain_gradients(monkeypatch):
    """One float32 training step of a small RNN model: the packed products (generator, the
    decoder's recurrent step products) give the loss and every parameter gradient of the plain
    products, up to rounding."""
    import torch.nn.functional as F
    from tiny_models import SRC_VOCAB, model_cfg

    from nmt.models import build_model
    from nmt.utils import packed_linear
    if not packed_linear._BUILT:
        pytest.skip("torch without oneDNN (or NMT_ONEDNN=0)")
    monkeypatch.setattr(packed_linear, "TRAIN_PACKING", True)  # whatever this processor's default
    torch.manual_seed(5)
    model = build_model(model_cfg(), SRC_VOCAB, TGT_VOCAB, PAD).train()
    src, lengths, tgt_in = random_batch(batch=4, src_len=7, tgt_len=6, seed=7)

    def grads():
        model.zero_grad()
        logits, _ = model(src, lengths, tgt_in)
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt_in.roll(-1, 1).reshape(-1))
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    loss_p, g_p = grads()
    monkeypatch.setattr(packed_linear, "_BUILT", False)
    loss_q, g_q = grads()
    torch.testing.assert_close(loss_p, loss_q, rtol=1e-5, atol=1e-6)
    assert g_p.keys() == g_q.keys()
    for name in g_p:
        torch.testing.assert_close(g_p[name], g_q[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("sections", VARIANTS)
@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_encoder_by_length_equals_the_packed_run(make_model, sections, dtype, atol):
    """Without gradients on the CPU the encoder runs one source length at a time (oneDNN's RNN in
    float32); memory and final states equal the packed run with gradients, also when more lengths
    than MAX_LENGTH_GROUPS send the batch back to the packed run."""
    from nmt.models import encoder as encoder_module

    model = make_model(dtype=dtype, **sections)
    for lengths, seed in (([7, 2, 7, 4, 2, 1], 5), ([7, 6, 5, 4, 3, 2, 1, 7, 6, 5, 4, 3, 2, 1], 6)):
        src, src_lengths, _ = random_batch(batch=len(lengths), lengths=lengths, seed=seed)
        emb = model.src_embeddings(src)
        memory, states = model.encoder(emb, src_lengths)  # gradients on: packed
        with torch.no_grad():
            groups = model.encoder._length_groups(emb, src_lengths)
            assert (groups is None) == (len(set(lengths)) > encoder_module.MAX_LENGTH_GROUPS)
            memory2, states2 = model.encoder(emb, src_lengths)
        torch.testing.assert_close(memory2, memory.detach(), rtol=0, atol=atol)
        assert len(states2) == len(states)
        for s2, s in zip(states2, states):
            torch.testing.assert_close(s2, s.detach(), rtol=0, atol=atol)
        assert torch.all(memory2[torch.arange(7)[None] >= src_lengths[:, None]] == 0)


def test_bad_source_lengths_are_clear_errors_without_gradients(make_model):
    model = make_model()
    src, _, _ = random_batch(batch=2)
    with torch.no_grad(), pytest.raises(ValueError, match="src_lengths: every source sentence"):
        model.encode(src, torch.tensor([3, 0]))


@pytest.mark.parametrize("supported", [True, False])
def test_encoder_under_cpu_autocast_where_the_processor_has_no_half_lstm(make_model, monkeypatch, supported):
    """CPU autocast to bfloat16 with equal source lengths (oneDNN's fused LSTM, which AVX2-only
    processors refuse in bfloat16): where the probe says the processor cannot, the encoder runs
    in float32 and gives the float32 result exactly; where it can, the RNN runs under autocast."""
    from nmt.models import encoder as encoder_module

    assert isinstance(encoder_module.cpu_autocast_rnn_supported("lstm", torch.bfloat16), bool)
    model = make_model(dtype=torch.float32)
    src, src_lengths, _ = random_batch(batch=4, lengths=[5, 5, 5, 5], seed=3)
    emb = model.src_embeddings(src)
    # the reference takes the route the autocast call takes (torch's RNN on the packed batch), not
    # the CPU runs of training and decoding, whose float32 rounding may differ from torch's kernel
    # on another processor (1 ulp on the H200 machine's host, 2026-11-26)
    monkeypatch.setattr(encoder_module, "CPU_RUNS", False)
    memory, _ = model.encoder(emb, src_lengths)
    calls = []

    def probe(rnn_type, dtype):
        calls.append((rnn_type, dtype))
        return supported

    monkeypatch.setattr(encoder_module, "cpu_autocast_rnn_supported", probe)
    seen = []
    if supported:  # the RNN is called under autocast (recorded; then run in float32, as any CPU can)
        forward = model.encoder.rnn.forward

        def recording(x, *args):
            seen.append(torch.is_autocast_enabled("cpu"))
            with torch.autocast("cpu", enabled=False):
                return forward(x, *args)

        monkeypatch.setattr(model.encoder.rnn, "forward", recording)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        memory_ac, _ = model.encoder(emb, src_lengths)
    assert calls == [(model.encoder.rnn_type, torch.bfloat16)]
    if supported:
        assert seen == [True]
    else:
        assert memory_ac.dtype == torch.float32
        torch.testing.assert_close(memory_ac, memory, rtol=0, atol=0)
