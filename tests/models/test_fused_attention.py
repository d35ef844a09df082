"""Softmax heads through torch's fused ``scaled_dot_product_attention`` where nobody reads their
probabilities (``nmt.models.transformer.multihead_attention.fused_attention_serves``: CUDA only).

Forced on here so that the CPU checks it against the unfused path, our own softmax and products
(the independent truth): teacher forcing, gradients, incremental decoding and beam search give the
same values up to rounding; the attention a caller reads (the last layer's cross-attention, every
map with ``return_maps``) is never fused; sparse, learned-alpha, structured and continuous heads
never are; rows with every key masked give what our softmax gives (zeros); no host sync
(test_transformer.py's sync audit, "softmax-fused"). On the CPU, by default, it never serves
(measured no faster there).
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import nmt.models.transformer.multihead_attention as mha
from nmt.models.transformer import build_transformer
from nmt.models.transformer.multihead_attention import MultiHeadAttention
from nmt.translate.beam_search import beam_search

from tiny_models import PAD, SRC_VOCAB, TGT_VOCAB, positions_cfg, random_batch, transformer_cfg

SOFTMAX = {"mapping": "softmax", "params": {}}
NOT_FUSABLE = {
    "entmax15": {"mapping": "entmax15", "params": {}},
    "adaptive": {"mapping": "entmax_bisect", "params": {"alpha": "learned"}},
    "fusedmax": {"mapping": "fusedmax", "params": {"lam": 0.2}},
}


@pytest.fixture
def fused_calls(monkeypatch):
    """The fused path forced on for CPU tensors; yields the list of its calls' query shapes."""
    calls = []
    real = F.scaled_dot_product_attention

    def counted(q, *args, **kwargs):
        calls.append(tuple(q.shape))
        return real(q, *args, **kwargs)

    monkeypatch.setattr(mha, "fused_attention_serves", lambda x: True)
    monkeypatch.setattr(mha.F, "scaled_dot_product_attention", counted)
    return calls


def make(attention=SOFTMAX, seed: int = 0, **transformer):
    torch.manual_seed(seed)
    cfg = transformer_cfg(attention=attention, transformer=transformer) if transformer else \
        transformer_cfg(attention=attention)
    return build_transformer(cfg, SRC_VOCAB, TGT_VOCAB, PAD).double()


def test_the_cpu_never_takes_the_fused_path_by_default():
    x = torch.zeros(2, 3)
    assert not mha.fused_attention_serves(x)
    assert mha.fused_attention_serves(torch.zeros(2, 3, device="meta")) is False


@pytest.mark.parametrize("temperature", [1.0, 2.5])
@pytest.mark.parametrize("norm,positions", [("pre", "sinusoidal"), ("post", "sinusoidal"), ("pre", "rotary"),
                                            ("pre", "relative"), ("pre", "alibi"), ("post", "alibi"),
                                            ("pre", "alibi-split")])
def test_teacher_forcing_and_gradients_equal_the_unfused_path(norm, positions, temperature, monkeypatch):
    """Rotary positions rotate the queries and keys before either path (the kernel sees them rotated);
    relative positions keep their self-attentions on the unfused path (the cross-attentions fuse);
    ALiBi self-attentions fuse with the bias / temperature as the kernel's float mask (-inf where
    masked: the source padding, the causal future)."""
    attention = {"mapping": "softmax", "params": {"temperature": temperature} if temperature != 1.0 else {}}
    src, lengths, tgt_in = random_batch(batch=4, src_len=7, tgt_len=6, seed=3)
    outputs = {}
    for fused in (False, True):
        model = make(attention, norm=norm, dropout=0.0, attention_dropout=0.0, **positions_cfg(positions)).train()
        monkeypatch.setattr(mha, "fused_attention_serves", lambda x, on=fused: on)
        logits, attention_map = model(src, lengths, tgt_in)
        (logits.square().sum() + attention_map.sum()).backward()
        outputs[fused] = (logits.detach(), attention_map.detach(),
                          {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    (l0, a0, g0), (l1, a1, g1) = outputs[False], outputs[True]
    torch.testing.assert_close(l1, l0, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(a1, a0, rtol=1e-10, atol=1e-10)
    assert g0.keys() == g1.keys()
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=1e-8, atol=1e-10, msg=name)


# The encoder's slopes of keys left / right of the query for 2 heads (paper's slopes 1/16, 1/256), written
# out: symmetric; split (head 1 favours the left, head 2 the right, the other side doubled).
ENCODER_SLOPES = {"symmetric": ([1 / 16, 1 / 256], [1 / 16, 1 / 256]), "split": ([1 / 16, 1 / 128], [1 / 8, 1 / 256])}


@pytest.mark.parametrize("form", ["symmetric", "split"])
def test_alibi_self_attentions_fuse_with_the_bias_as_a_float_mask(form, monkeypatch):
    """ALiBi softmax heads take the fused kernel in every self-attention (as sinusoidal ones do), the
    mask they pass being the bias written out: in the encoder ``-left_h (i - j)`` / ``-right_h (j - i)``
    at allowed keys (symmetric: ``-m_h |i - j|``), ``-inf`` at the source padding; in the decoder
    ``-m_h (i - j)`` (whatever the encoder's form), ``-inf`` at the future; the cross-attentions keep
    their boolean source mask."""
    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kwargs):
        seen.append(attn_mask)
        return real(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(mha, "fused_attention_serves", lambda x: True)
    monkeypatch.setattr(mha.F, "scaled_dot_product_attention", spy)
    model = make(positions="alibi", alibi_encoder=form).eval()
    src, lengths, tgt_in = random_batch(batch=3, src_len=6, tgt_len=4, lengths=[6, 2, 4], seed=1)
    with torch.no_grad():
        model(src, lengths, tgt_in)
    encoders, decoders = len(model.encoder.layers), len(model.decoder.layers)
    assert len(seen) == encoders + decoders + decoders - 1
    slopes, (left, right) = [1 / 16, 1 / 256], ENCODER_SLOPES[form]
    encoder_mask, decoder_mask = seen[0], seen[encoders]
    want = torch.tensor([[[[(-left[h] * (i - j) if j <= i else -right[h] * (j - i)) if j < n else -math.inf
                            for j in range(6)] for i in range(6)] for h in range(2)] for n in lengths.tolist()],
                        dtype=torch.float64)
    assert torch.equal(encoder_mask.expand(3, 2, 6, 6), want)
    want = torch.tensor([[[-slopes[h] * (i - j) if j <= i else -math.inf for j in range(4)] for i in range(4)]
                         for h in range(2)], dtype=torch.float64)
    assert torch.equal(decoder_mask, want)
    assert seen[encoders + 1].dtype == torch.bool  # the first cross-attention


def test_which_heads_are_fused(fused_calls):
    """Training's forward: every self-attention and the cross-attention of all layers but the
    last; ``return_maps``: none (every map is read); a decoding step: the self-attentions and all
    cross-attentions but the last layer's."""
    model = make().eval()
    layers = len(model.decoder.layers)
    src, lengths, tgt_in = random_batch(batch=3, src_len=6, tgt_len=4, seed=1)
    with torch.no_grad():
        model(src, lengths, tgt_in)
        assert len(fused_calls) == len(model.encoder.layers) + layers + layers - 1
        fused_calls.clear()
        _, _, maps = model(src, lengths, tgt_in, return_maps=True)
        assert fused_calls == []
        assert all(m is not None for kind in maps.values() for m in kind)
        encoder_out, state = model.encode(src, lengths)
        assert len(fused_calls) == len(model.encoder.layers)
        fused_calls.clear()
        model.step(torch.full((3,), 2), state, encoder_out)
        assert len(fused_calls) == 2 * layers - 1


def test_a_step_without_attention_fuses_the_last_cross_attention_too(fused_calls):
    model = make().eval()
    layers = len(model.decoder.layers)
    src, lengths, _ = random_batch(batch=3, src_len=6, seed=1)
    with torch.no_grad():
        encoder_out, state = model.encode(src, lengths)
        fused_calls.clear()
        with_attention = model.step(torch.full((3,), 2), state, encoder_out)
        assert len(fused_calls) == 2 * layers - 1 and with_attention[1].shape == (3, 6)
        fused_calls.clear()
        without = model.step(torch.full((3,), 2), state, encoder_out, need_attention=False)
        assert len(fused_calls) == 2 * layers and without[1] is None
    torch.testing.assert_close(without[0], with_attention[0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_searches_ask_for_the_attention_only_where_they_record_it(mode, monkeypatch):
    """Without ``return_attention`` a search steps the Transformer with ``need_attention=False``
    (its attention None), with it as before; the same hypotheses, scores and certificates."""
    from nmt.models.transformer.model import TransformerSeq2Seq

    asked = []
    real = TransformerSeq2Seq.step

    def spy(self, *args, **kwargs):
        asked.append(kwargs.get("need_attention", True))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(TransformerSeq2Seq, "step", spy)
    model = make(seed=2).eval()
    with torch.no_grad():
        model.generator.proj.weight.mul_(4.0)
    src, lengths, _ = random_batch(batch=5, src_len=8, seed=4)
    kw = dict(bos=2, eos=3, pad=PAD, beam_size=3, n_best=2, max_length=9, mode=mode)
    plain = beam_search(model, src, lengths, **kw)
    assert asked and not any(asked)
    asked.clear()
    recorded = beam_search(model, src, lengths, return_attention=True, **kw)
    assert asked and all(asked) and plain.attention is None and recorded.attention is not None
    for name in ("tokens", "lengths", "complete", "exact", "reason", "n_nonzero"):
        assert torch.equal(getattr(plain, name), getattr(recorded, name)), name
    torch.testing.assert_close(plain.scores, recorded.scores, rtol=0, atol=0)


@pytest.mark.parametrize("name", NOT_FUSABLE)
def test_other_heads_never_take_the_fused_kernel(name, fused_calls):
    model = make(NOT_FUSABLE[name]).eval()
    src, lengths, tgt_in = random_batch(batch=3, src_len=6, tgt_len=4, seed=1)
    with torch.no_grad():
        model(src, lengths, tgt_in)
        encoder_out, state = model.encode(src, lengths)
        model.step(torch.full((3,), 2), state, encoder_out)
    assert fused_calls == []


def test_continuous_cross_attention_is_never_fused(fused_calls):
    """Combined continuous cross-attention (softmax heads plus a density) keeps its own path; its
    softmax self-attentions may be fused."""
    model = make({"mapping": "softmax", "params": {}, "continuous": {}}).eval()
    src, lengths, tgt_in = random_batch(batch=3, src_len=6, tgt_len=4, seed=1)
    with torch.no_grad():
        model(src, lengths, tgt_in)
    assert len(fused_calls) == len(model.encoder.layers) + len(model.decoder.layers)
    assert all(m.cross_attn.continuous is not None and not m.cross_attn.fusable for m in model.decoder.layers)


@pytest.mark.parametrize("beam_size", [1, 4])
@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_beam_search_finds_the_same_hypotheses(beam_size, mode, fused_calls, monkeypatch):
    model = make(seed=2).eval()
    with torch.no_grad():
        model.generator.proj.weight.mul_(4.0)  # peaked outputs: ends and clear winners
    src, lengths, _ = random_batch(batch=5, src_len=8, seed=4)
    results = {}
    for fused in (False, True):
        monkeypatch.setattr(mha, "fused_attention_serves", lambda x, on=fused: on)
        results[fused] = beam_search(model, src, lengths, bos=2, eos=3, pad=PAD, beam_size=beam_size,
                                     n_best=beam_size, max_length=9, mode=mode, return_attention=True)
    assert fused_calls
    plain, fused = results[False], results[True]
    for name in ("tokens", "lengths", "complete", "exact", "reason", "n_nonzero"):
        assert torch.equal(getattr(fused, name), getattr(plain, name)), name
    for name in ("scores", "attention"):
        torch.testing.assert_close(getattr(fused, name), getattr(plain, name), rtol=1e-9, atol=1e-10)


def test_rows_with_every_key_masked_give_the_unfused_zeros(monkeypatch):
    torch.manual_seed(0)
    module = MultiHeadAttention(8, 2).double().eval()
    q = module.queries(torch.randn(3, 2, 8, dtype=torch.float64))
    keys, values = module.keys_values(torch.randn(3, 5, 8, dtype=torch.float64))
    mask = torch.tensor([[True] * 5, [False] * 5, [True, True, False, False, False]]).view(3, 1, 1, 5)
    with torch.no_grad():
        plain, probs = module.attend(q, keys, values, mask, need_probs=False)
        assert probs is not None and not bool(probs[1].any())
        monkeypatch.setattr(mha, "fused_attention_serves", lambda x: True)
        fused, none = module.attend(q, keys, values, mask, need_probs=False)
    assert none is None
    torch.testing.assert_close(fused, plain, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fused[1], module.out_proj.bias.expand(2, 8))  # zero context: the bias


def test_attention_dropout_is_the_kernels_in_training_only(fused_calls, monkeypatch):
    """In training the fused heads drop with the module's rate (outputs differ between draws and
    from eval); in eval mode they never drop."""
    seen = []
    counted = mha.F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(kwargs.get("dropout_p"))
        return counted(*args, **kwargs)

    monkeypatch.setattr(mha.F, "scaled_dot_product_attention", spy)
    model = make(attention_dropout=0.3, dropout=0.0)
    src, lengths, tgt_in = random_batch(batch=3, src_len=6, tgt_len=4, seed=1)
    model.train()
    a, _ = model(src, lengths, tgt_in)
    b, _ = model(src, lengths, tgt_in)
    assert set(seen) == {0.3} and not torch.equal(a, b)
    seen.clear()
    model.eval()
    with torch.no_grad():
        c, _ = model(src, lengths, tgt_in)
        d, _ = model(src, lengths, tgt_in)
    assert set(seen) == {0.0} and torch.equal(c, d)


@pytest.mark.parametrize("positions,attention,kv_heads", [
    *((positions, SOFTMAX, 0) for positions in ("sinusoidal", "rotary", "relative", "alibi", "alibi-split")),
    ("sinusoidal", SOFTMAX, 2), ("sinusoidal", NOT_FUSABLE["entmax15"], 2)])
def test_a_fused_step_compiles_as_one_graph(positions, attention, kv_heads, fused_calls):
    """A decoding step compiles with ``torch.compile(fullgraph=True)`` and gives the eager step;
    ``kv_heads`` 2: 4 query heads on 2 key/value heads (the fused kernel's ``enable_gqa``, or the
    groups' views of heads it does not serve)."""
    grouped = {"heads": 4, "kv_heads": kv_heads, "d_model": 16} if kv_heads else {}
    model = make(attention, **positions_cfg(positions), **grouped).eval()
    src, lengths, _ = random_batch(batch=3, src_len=6, seed=1)
    with torch.no_grad():
        encoder_out, state = model.encode(src, lengths)
        tokens = torch.full((3,), 2)
        eager = model.step(tokens, state, encoder_out)
        compiled = torch.compile(model.step, fullgraph=True, backend="aot_eager")(tokens, state, encoder_out)
    torch.testing.assert_close(compiled[0], eager[0])
    torch.testing.assert_close(compiled[1], eager[1])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("positions", ["sinusoidal", "rotary", "relative", "alibi", "alibi-split"])
def test_on_cuda_the_fused_heads_serve_by_default_and_agree_with_the_unfused(positions, monkeypatch):
    """CUDA, float32: the default takes the fused kernel; logits, gradients and decoding steps
    agree with the unfused heads within float32 rounding."""
    assert mha.fused_attention_serves(torch.zeros(1, device="cuda"))
    src, lengths, tgt_in = (x.cuda() for x in random_batch(batch=4, src_len=7, tgt_len=6, seed=3))
    out = {}
    for fused in (True, False):
        monkeypatch.setattr(mha, "fused_attention_serves", lambda x, on=fused: on and x.is_cuda)
        model = make(dropout=0.0, attention_dropout=0.0, **positions_cfg(positions)).float().cuda().train()
        logits, _ = model(src, lengths.cpu(), tgt_in)
        logits.square().sum().backward()
        with torch.no_grad():
            encoder_out, state = model.encode(src, lengths.cpu())
            step_log_probs, _, _ = model.step(tgt_in[:, 0], state, encoder_out)
        out[fused] = (logits.detach(), model.encoder.layers[0].self_attn.q_proj.weight.grad.clone(), step_log_probs)
    for a, b in zip(out[True], out[False]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
