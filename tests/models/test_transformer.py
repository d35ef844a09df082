"""The Transformer: incremental decoding == teacher forcing, exact-zero masks, learned alphas, builder errors."""
from __future__ import annotations

import pytest
import torch
from tiny_models import PAD, SRC_VOCAB, TGT_VOCAB, positions_cfg, random_batch, transformer_cfg

from nmt.models.protocol import select_state, tile_state
from nmt.models.transformer import build_transformer

MAPPINGS = {  # name -> model.attention section (all three kinds inherit it)
    "softmax": {"mapping": "softmax", "params": {}},
    "sparsemax": {"mapping": "sparsemax", "params": {}},
    "entmax15": {"mapping": "entmax15", "params": {}},
    "entmax_bisect": {"mapping": "entmax_bisect", "params": {"alpha": 1.3}},
    "adaptive": {"mapping": "entmax_bisect", "params": {"alpha": "learned"}},
    "entmax15-warm": {"mapping": "entmax15", "params": {"temperature": 2.5}},
    "fusedmax": {"mapping": "fusedmax", "params": {"lam": 0.2}},
    "oscarmax": {"mapping": "oscarmax", "params": {"lam": 0.05}},
    # combined discrete + continuous cross-attention (Martins et al. 2020), per head
    "continuous": {"mapping": "entmax15", "params": {}, "continuous": {"alpha": 2, "num_basis_mu": 4}},
    "continuous-gaussian": {"mapping": "softmax", "params": {}, "continuous": {}},
}


def make(dtype=torch.float64, src_vocab=SRC_VOCAB, tgt_vocab=TGT_VOCAB, scale: float = 1.0, **sections):
    torch.manual_seed(0)
    model = build_transformer(transformer_cfg(**sections), src_vocab, tgt_vocab, PAD).to(dtype).eval()
    if scale != 1.0:  # sharper scores: sparse mappings give exact zeros inside rows too
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "proj.weight" in name and "generator" not in name:
                    p.mul_(scale)
    return model


def incremental(model, src, src_lengths, tgt_in, permutation=None):
    """Step through tgt_in; optionally reorder the batch (state and encoder_out) after step 1."""
    encoder_out, state = model.encode(src, src_lengths)
    log_probs, attention = [], []
    order = torch.arange(src.size(0))
    for t in range(tgt_in.size(1)):
        lp, att, state = model.step(tgt_in[order, t], state, encoder_out)
        log_probs.append(lp[order.argsort()])
        attention.append(att[order.argsort()])
        if t == 0 and permutation is not None:
            state, encoder_out = select_state(state, permutation), select_state(encoder_out, permutation)
            order = permutation
    return torch.stack(log_probs, 1), torch.stack(attention, 1)


@pytest.mark.parametrize("name", list(MAPPINGS))
@pytest.mark.parametrize("norm,positions", [("pre", "sinusoidal"), ("post", "learned"), ("pre", "rotary"),
                                            ("post", "relative"), ("pre", "alibi"), ("post", "alibi"),
                                            ("pre", "alibi-split"), ("pre-rms-swiglu", "rotary"),
                                            ("post-rms-geglu", "sinusoidal")])
def test_incremental_steps_equal_teacher_forcing(name, norm, positions):
    norm, *rest = norm.split("-")  # "pre-rms-swiglu": RMSNorm and a gated feed-forward block
    more = {"layer_norm": rest[0], "activation": rest[1]} if rest else {}
    model = make(scale=3.0, attention=MAPPINGS[name], output={"mapping": "entmax15", "params": {}},
                 transformer={"norm": norm, **positions_cfg(positions), **more})
    if rest:
        norms = [m for m in model.modules() if isinstance(m, (torch.nn.LayerNorm, torch.nn.RMSNorm))]
        assert norms and all(isinstance(m, torch.nn.RMSNorm) for m in norms)
    src, src_lengths, tgt_in = random_batch(batch=3, src_len=7, tgt_len=6, seed=1)
    logits, attention = model(src, src_lengths, tgt_in)
    expected = model.log_probs(logits)
    got, got_attention = incremental(model, src, src_lengths, tgt_in, permutation=torch.tensor([2, 0, 1]))
    assert torch.equal(torch.isinf(got), torch.isinf(expected))  # the same exact zeros
    finite = torch.isfinite(expected)
    assert (got[finite] - expected[finite]).abs().max() <= 1e-10
    assert (got_attention - attention).abs().max() <= 1e-10


@pytest.mark.parametrize("name", list(MAPPINGS))
def test_steps_of_beam_rows_share_the_encoder_out(name):
    """``shares_encoder_out``: k step rows per sentence with the untiled cross keys/values give the
    tiled steps' log-probabilities, attention and caches (float64, to rounding)."""
    model = make(scale=3.0, attention=MAPPINGS[name], output={"mapping": "entmax15", "params": {}})
    assert model.shares_encoder_out
    src, src_lengths, tgt_in = random_batch(batch=3, src_len=7, tgt_len=4, seed=2)
    k = 3
    with torch.no_grad():
        encoder_out, state = model.encode(src, src_lengths)
        state = tile_state(state, k)
        shared_state, tiled_state = state, state
        for t in range(tgt_in.size(1)):
            tokens = tgt_in[:, t].repeat_interleave(k)
            shared = model.step(tokens, shared_state, encoder_out)
            tiled = model.step(tokens, tiled_state, tile_state(encoder_out, k))
            finite = torch.isfinite(tiled[0])
            assert torch.equal(finite, torch.isfinite(shared[0]))
            torch.testing.assert_close(shared[0][finite], tiled[0][finite], rtol=0, atol=1e-10)
            torch.testing.assert_close(shared[1], tiled[1], rtol=0, atol=1e-10)
            shared_state, tiled_state = shared[2], tiled[2]
    for name_ in tiled_state:
        torch.testing.assert_close(shared_state[name_], tiled_state[name_], rtol=0, atol=1e-10)


def test_sparse_attention_is_sparse_inside_rows():
    """Not vacuous: with sharp scores the sparse kinds have zeros at unmasked positions."""
    model = make(scale=3.0, attention=MAPPINGS["entmax15"])
    src, src_lengths, tgt_in = random_batch(batch=3, src_len=7, tgt_len=6, seed=1)
    _, _, maps = model(src, src_lengths, tgt_in, return_maps=True)
    cross = maps["cross"][0]
    real = torch.arange(7)[None, None, None, :] < src_lengths[:, None, None, None]
    assert bool(((cross == 0) & real).any())


@pytest.mark.parametrize("name", list(MAPPINGS))
def test_masks_give_exact_zeros(name):
    model = make(attention=MAPPINGS[name])
    src, src_lengths, tgt_in = random_batch(batch=4, src_len=7, tgt_len=5, lengths=[7, 3, 1, 5], seed=2)
    _, attention, maps = model(src, src_lengths, tgt_in, return_maps=True)
    pad_key = torch.arange(7)[None, :] >= src_lengths[:, None]  # (B, L)
    for probs in maps["encoder_self"] + maps["cross"]:
        assert bool((probs.masked_select(pad_key[:, None, None, :].expand_as(probs)) == 0).all())
        torch.testing.assert_close(probs.sum(-1), torch.ones_like(probs.sum(-1)))
    future = torch.ones(5, 5, dtype=torch.bool).triu(1)
    for probs in maps["decoder_self"]:
        assert bool((probs[..., future] == 0).all())
    assert bool((attention.masked_select(pad_key[:, None, :].expand_as(attention)) == 0).all())


@pytest.mark.parametrize("name", ["entmax15", "continuous"])
def test_padding_does_not_change_a_sentence(name):
    model = make(attention=MAPPINGS[name])
    src, src_lengths, tgt_in = random_batch(batch=3, src_len=7, tgt_len=5, lengths=[7, 3, 5], seed=3)
    logits, _ = model(src, src_lengths, tgt_in)
    alone, _ = model(src[1:2, :3], src_lengths[1:2], tgt_in[1:2])
    assert (alone[0] - logits[1]).abs().max() <= 1e-12


def test_learned_alpha_gets_a_gradient_and_stays_in_range():
    model = make(attention=MAPPINGS["adaptive"], scale=2.0).train()
    alphas = model.learned_alphas()
    assert set(alphas) == {"encoder_self", "decoder_self", "cross"}
    for value in alphas.values():
        assert value.shape == (2, 2)
        assert torch.equal(value, torch.full_like(value, 1.5))
    src, src_lengths, tgt_in = random_batch(batch=3, src_len=7, tgt_len=5, seed=4)
    logits, _ = model(src, src_lengths, tgt_in)
    logits.pow(2).sum().backward()
    logit_params = [p for n, p in model.named_parameters() if n.endswith("alpha_logit")]
    assert len(logit_params) == 2 + 2 + 2
    assert all(p.grad is not None and bool((p.grad != 0).any()) for p in logit_params)
    # the gradient matches a finite difference of the loss in one alpha
    p = logit_params[0]
    analytic = p.grad[0].item()
    with torch.no_grad():
        values = []
        for h in (1e-6, -1e-6):
            p[0] += h
            values.append(model(src, src_lengths, tgt_in)[0].pow(2).sum().item())
            p[0] -= h
    assert analytic == pytest.approx((values[0] - values[1]) / 2e-6, rel=1e-5, abs=1e-8)
    # large steps push alphas to both ends; they stay in [1.01, 2] (within (1, 2])
    optimizer = torch.optim.SGD(logit_params, lr=1e3)
    seen = torch.cat([v.flatten() for v in model.learned_alphas().values()])
    for sign in (1.0, -1.0):
        for _ in range(3):
            optimizer.zero_grad()
            (sign * model(src, src_lengths, tgt_in)[0].pow(2).sum()).backward()
            optimizer.step()
            values = torch.cat([v.flatten() for v in model.learned_alphas().values()])
            assert bool(((values >= 1.01) & (values <= 2)).all())
            seen = torch.cat([seen, values])
    assert float(seen.min()) < 1.1 and float(seen.max()) > 1.9


def test_kinds_take_their_own_mapping():
    model = make(attention={"mapping": "softmax", "params": {},
                            "encoder_self": {"mapping": "sparsemax", "params": None},
                            "cross": {"mapping": "entmax_bisect", "params": {"alpha": "learned"}}})
    assert model.encoder.layers[0].self_attn.mapping.name == "sparsemax"
    assert model.decoder.layers[0].self_attn.mapping.name == "softmax"
    assert model.decoder.layers[1].cross_attn.mapping.learned_alpha
    assert set(model.learned_alphas()) == {"cross"}


def test_shared_and_tied_embeddings():
    model = make(src_vocab=11, tgt_vocab=11, embeddings={"share": True, "tie_output": True})
    assert model.src_embeddings is model.tgt_embeddings
    assert model.generator.proj.weight is model.tgt_embeddings.lut.weight
    assert bool((model.src_embeddings.lut.weight[PAD] == 0).all())


def test_learned_alpha_starts_at_alpha_init():
    """alpha_init sets every head's starting alpha (1 + sigmoid of the logit; a float32 logit)."""
    model = make(attention={"mapping": "entmax_bisect", "params": {"alpha": "learned", "alpha_init": 1.1}})
    for value in model.learned_alphas().values():
        torch.testing.assert_close(value, torch.full_like(value, 1.1), rtol=0, atol=1e-6)


@pytest.mark.parametrize("params", [{"temperature": 2.5}, {"alpha": "learned", "alpha_init": 1.2, "temperature": 0.5}])
def test_temperature_divides_the_scores(params):
    """A head mapping with a temperature maps scores / temperature: the mapping's own values
    (entmax15 and learned-alpha entmax_bisect, in float64), exact zeros and all."""
    from nmt.models.transformer.head_mapping import HeadMapping
    from nmt.sparse import entmax15, entmax_bisect
    torch.manual_seed(0)
    scores = torch.randn(2, 3, 4, 6, dtype=torch.float64) * 3
    mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    mask[1, ..., 4:] = False
    name = "entmax_bisect" if "alpha" in params else "entmax15"
    mapping = HeadMapping(3, name, params).double()
    got = mapping(scores, mask)
    t = params["temperature"]
    if "alpha" in params:
        want = entmax_bisect(scores / t, alpha=mapping.alpha().view(1, 3, 1, 1), dim=-1, mask=mask)
    else:
        want = entmax15(scores / t, dim=-1, mask=mask)
    assert torch.equal(got, want) and "temperature=" in repr(mapping)
    untempered = {k: v for k, v in params.items() if k != "temperature"}
    assert bool((got == 0).any()) and not torch.equal(got, HeadMapping(3, name, untempered).double()(scores, mask))


@pytest.mark.parametrize("sections,message", [
    ({"embeddings": {"share": True}}, "model.embeddings.share: needs one shared vocabulary"),
    ({"attention": {"cross": {"mapping": "entmax15", "params": {"temperature": 0}}}},
     "model.attention.cross: temperature must be a positive number, got 0"),
    ({"transformer": {"heads": 3}}, "model.transformer.heads: d_model (8) must be a multiple of heads (3)"),
    ({"transformer": {"norm": "sandwich"}}, "model.transformer.norm: unknown norm 'sandwich'"),
    ({"transformer": {"positions": "xpos"}}, "model.transformer.positions: unknown positions 'xpos'"),
    ({"transformer": {"positions": "rotary", "heads": 8}},
     "model.transformer.positions: rotary positions turn pairs of coordinates and need an even d_head "
     "(d_model / heads), got 1"),
    ({"transformer": {"positions": "rotary", "rotary_base": 1.0}}, "model.transformer.rotary_base: must be > 1, got 1.0"),
    ({"transformer": {"positions": "relative", "max_relative_positions": 0}},
     "model.transformer.max_relative_positions: must be >= 1, got 0"),
    ({"attention": {"cross": {"mapping": "softmax", "params": {"alpha": "learned"}}}},
     "model.attention.cross: alpha: 'learned' needs mapping entmax_bisect"),
    ({"attention": {"cross": {"mapping": "entmax_bisect", "params": {"alpha": "learned", "alpha_init": 1.0}}}},
     "model.attention.cross: alpha_init must lie in [1.01, 2), got 1.0"),
    ({"attention": {"decoder_self": {"mapping": "sparsemx", "params": None}}},
     "model.attention.decoder_self: unknown mapping 'sparsemx'"),
])
def test_builder_errors_name_the_key(sections, message):
    with pytest.raises(ValueError) as info:
        build_transformer(transformer_cfg(**sections), SRC_VOCAB, TGT_VOCAB, PAD)
    assert str(info.value).startswith(message)


def test_learned_positions_reject_too_long_inputs():
    model = make(transformer={"positions": "learned", "max_positions": 6})
    src, src_lengths, tgt_in = random_batch(batch=2, src_len=7, tgt_len=3, seed=5)
    with pytest.raises(ValueError, match="exceeds model.transformer.max_positions=6"):
        model(src, src_lengths, tgt_in)
    assert model.position_limits() == (6, 6)  # what nmt-translate and the trainer check inputs against
    assert make().position_limits() == (None, None)  # sinusoids: any length


@pytest.mark.parametrize("positions", ["sinusoidal", "rotary", "relative", "alibi", "alibi-split"])
@pytest.mark.parametrize("name", ["softmax", "softmax-fused", "sparsemax", "entmax15", "continuous",
                                  "softmax-fused-grouped", "entmax15-grouped"])
def test_forward_backward_and_step_do_not_synchronise(name, positions, monkeypatch):
    """The Transformer itself reads nothing back from the device (masks, positions and caches
    are built from shapes). The mappings run their accelerator path (``impl: static``, what
    CUDA runs): the CPU path hands rows to NumPy's sort, which the audit counts. "softmax-fused":
    the heads whose probabilities nobody reads through the fused kernel, as on CUDA. "-grouped":
    4 query heads on 2 key/value heads (``kv_heads``). The encoder keeps the padded layout, as off
    the CPU (its packed rows read the mask: CPU only)."""
    import nmt.models.transformer.multihead_attention as mha
    import nmt.models.transformer.packed_rows as packed_rows
    from nmt.utils.sync_audit import SyncAudit

    monkeypatch.setattr(packed_rows, "PACKED_ENCODER", False)

    grouped = {"heads": 4, "kv_heads": 2, "d_model": 16} if name.endswith("-grouped") else {}
    name = name.removesuffix("-grouped")
    fused_calls, fused = [], name == "softmax-fused"
    if fused:
        real = mha.F.scaled_dot_product_attention
        monkeypatch.setattr(mha, "fused_attention_serves", lambda x: True)
        monkeypatch.setattr(mha.F, "scaled_dot_product_attention",
                            lambda *args, **kwargs: fused_calls.append(1) or real(*args, **kwargs))
        name = "softmax"
    section = dict(MAPPINGS[name])
    if name != "softmax":
        section["params"] = {**section["params"], "impl": "static"}
    model = make(attention=section, transformer={**positions_cfg(positions), **grouped}).train()
    src, src_lengths, tgt_in = random_batch(batch=3, src_len=7, tgt_len=5, seed=6)
    model(src, src_lengths, tgt_in)  # warm up lazy initialisations
    with SyncAudit() as audit:
        logits, _ = model(src, src_lengths, tgt_in)
        logits.pow(2).sum().backward()
        with torch.no_grad():
            encoder_out, state = model.encode(src, src_lengths)
            for t in range(3):
                _, _, state = model.step(tgt_in[:, t], state, encoder_out)
    assert audit.total == 0, audit.report()
    assert bool(fused_calls) == fused


def test_continuous_cross_attention_adds_the_density_context():
    """Combined cross-attention: each head's context is (p + w) v with w the source weights of the
    continuous density matched to that head's p (zero on padding); the returned probabilities stay
    the discrete ones, self-attention is unchanged, no parameter is added, and gradients reach the
    source embeddings."""
    plain = make(attention=MAPPINGS["entmax15"])
    combined = make(attention=MAPPINGS["continuous"])
    assert all(layer.cross_attn.continuous is not None and layer.self_attn.continuous is None
               for layer in combined.decoder.layers)
    assert all(layer.self_attn.continuous is None for layer in combined.encoder.layers)
    combined.load_state_dict(plain.state_dict())  # the same parameters, none added
    src, src_lengths, tgt_in = random_batch(batch=3, src_len=7, tgt_len=5, lengths=[7, 3, 5], seed=3)
    logits_plain, _ = plain(src, src_lengths, tgt_in)
    logits, _ = combined(src, src_lengths, tgt_in)
    assert (logits - logits_plain).abs().max() > 1e-6  # the continuous context changes the output

    layer, reference = combined.decoder.layers[0].cross_attn, plain.decoder.layers[0].cross_attn
    g = torch.Generator().manual_seed(5)
    memory = torch.randn(3, 7, layer.d_model, generator=g, dtype=torch.float64)
    query = torch.randn(3, 2, layer.d_model, generator=g, dtype=torch.float64)
    source = torch.arange(7)[None] < src_lengths[:, None]  # (B, S)
    mask = source[:, None, None, :]
    keys, values = layer.keys_values(memory)
    out, probs = layer(query, keys, values, mask)
    _, discrete = reference(query, keys, values, mask)
    assert torch.equal(probs, discrete)
    manual = []
    for h in range(layer.heads):
        w = layer.continuous.source_weights(probs[:, h], source)  # (B, T, S)
        assert torch.all(w.masked_select(~source[:, None, :].expand_as(w)) == 0)
        manual.append((probs[:, h] + w) @ values[:, h])
    torch.testing.assert_close(out, layer.out_proj(torch.cat(manual, dim=-1)), rtol=0, atol=1e-12)

    logits.sum().backward()
    grad = combined.src_embeddings.lut.weight.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
    with pytest.raises(ValueError, match="source key mask"):
        layer(query, keys, values, None)


@pytest.mark.parametrize("name", ["softmax", "entmax15", "adaptive"])
@pytest.mark.parametrize("kv_heads", [0, 1, 2])
def test_frozen_region_steps_equal_module_steps(name, kv_heads):
    """Decoding's frozen region (float32: the scale folded into the query projection, the
    self-attention's three projections as one product, cached contiguous cross keys/values) gives
    the steps of the plain modules, to float32 rounding, with the same exact zeros. ``kv_heads`` 1
    and 2: 4 query heads on that many key/value heads (the one product's weights then 16 + 2 x 4
    kv_heads rows)."""
    from nmt.utils.packed_linear import frozen_weights

    grouped = {"heads": 4, "kv_heads": kv_heads, "d_model": 16} if kv_heads else {}
    model = make(dtype=torch.float32, scale=3.0, attention=MAPPINGS[name], output={"mapping": "entmax15", "params": {}},
                 transformer=grouped)
    src, src_lengths, tgt_in = random_batch(batch=3, src_len=7, tgt_len=6, seed=2)
    with torch.no_grad():
        expected, expected_attention = incremental(model, src, src_lengths, tgt_in, permutation=torch.tensor([1, 2, 0]))
        with frozen_weights():
            got, got_attention = incremental(model, src, src_lengths, tgt_in, permutation=torch.tensor([1, 2, 0]))
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    # compared as probabilities (a 1.5-entmax log-probability, 2 log(z - tau) + const, turns any
    # rounding into large relative errors at the support's edge). This scaled-up model's scores
    # reach tens, so their float32 rounding (oneDNN's kernels against MKL's: 1e-6 relative) moves
    # sparse probabilities by up to 2e-5 (seen on an AMD EPYC); a folded scale 1% off changes supports
    torch.testing.assert_close(got.exp(), expected.exp(), rtol=1e-5, atol=5e-5)
    torch.testing.assert_close(got_attention, expected_attention, rtol=1e-5, atol=5e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_frozen_self_projections_are_one_product_of_the_scaled_weights(dtype, monkeypatch):
    """In a frozen region ``self_projections`` makes one product (queries, keys and values) and
    equals ``queries`` and ``keys_values`` outside it (to rounding: the products may take other
    kernels); ``queries`` folds the scale 1/sqrt(d_head). float32 on the CPU goes through a
    FrozenWeight, other dtypes (and devices) through ``F.linear`` on the same cached weights. A
    weight changed between regions is read again."""
    from nmt.models.transformer.multihead_attention import MultiHeadAttention
    from nmt.utils import packed_linear

    torch.manual_seed(3)
    attention = MultiHeadAttention(d_model=32, heads=2).to(dtype).eval()  # d_head 16: scale 1/4
    with torch.no_grad():
        for proj in (attention.q_proj, attention.k_proj, attention.v_proj):
            proj.bias.normal_()
    x = torch.randn(5, 3, 32, dtype=dtype)
    calls = []
    frozen_call, f_linear = packed_linear.FrozenWeight.__call__, packed_linear.F.linear

    def counted_frozen(self, inputs, bias=None):
        calls.append(tuple(self._weight.shape))
        return frozen_call(self, inputs, bias)

    def counted_linear(inputs, weight, bias=None):
        calls.append(tuple(weight.shape))
        return f_linear(inputs, weight, bias)

    tol = {"rtol": 1e-6, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    with torch.no_grad():
        expected = (attention.queries(x), *attention.keys_values(x))
        monkeypatch.setattr(packed_linear.FrozenWeight, "__call__", counted_frozen)
        monkeypatch.setattr(packed_linear.F, "linear", counted_linear)
        with packed_linear.frozen_weights():
            got = attention.self_projections(x)
            query = attention.queries(x)
        monkeypatch.undo()
        assert calls == [(96, 32), (32, 32)]
        for a, b in zip((*got, query), (*expected, expected[0])):
            torch.testing.assert_close(a, b, **tol)
        attention.k_proj.weight.mul_(2.0)
        with packed_linear.frozen_weights():
            changed = attention.self_projections(x)
        torch.testing.assert_close(changed[1], attention.keys_values(x)[0], **tol)
    x.requires_grad_()
    with packed_linear.frozen_weights():  # autograd records: the modules' products
        assert packed_linear.frozen_linear("t", x, [attention.q_proj.weight], lambda: (attention.q_proj.weight, None)) is None


def test_cross_keys_values_are_contiguous_and_equal_the_projection():
    model = make(dtype=torch.float32, attention=MAPPINGS["softmax"])
    memory = torch.randn(4, 6, model.decoder.layers[0].cross_attn.d_model)
    with torch.no_grad():
        for layer, (keys, values) in zip(model.decoder.layers, model.decoder.cross_keys_values(memory)):
            assert keys.is_contiguous() and values.is_contiguous()
            k, v = layer.cross_attn.keys_values(memory)
            assert torch.equal(keys, k) and torch.equal(values, v)


@pytest.mark.parametrize("activation", ["relu", "gelu", "silu", "swiglu", "geglu"])
def test_feed_forward_gradients_equal_the_plain_composition(activation):
    """The in-place ReLU on the inner product's output, the gated blocks' halves: the value and the
    gradients of ``W2 act(W1 x + b1) + b2`` (gated: ``W2 (act(W_a x + b_a) * (W_b x + b_b)) + b2``
    with ``W_a``, ``W_b`` the first and last 16 rows of ``W1``) computed with torch's functions."""
    from nmt.models.transformer.feed_forward import FeedForward

    F = torch.nn.functional
    torch.manual_seed(4)
    block = FeedForward(8, 16, activation).double()
    gated = activation in ("swiglu", "geglu")
    assert block.inner.weight.shape == ((32 if gated else 16), 8)
    x = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    out = block(x)
    act = {"relu": torch.relu, "gelu": F.gelu, "silu": F.silu, "swiglu": F.silu, "geglu": F.gelu}[activation]
    x2 = x.detach().clone().requires_grad_()
    w1, b1, w2, b2 = (p.detach().clone().requires_grad_() for p in
                      (block.inner.weight, block.inner.bias, block.outer.weight, block.outer.bias))
    if gated:
        inner = act(F.linear(x2, w1[:16], b1[:16])) * F.linear(x2, w1[16:], b1[16:])
    else:
        inner = act(F.linear(x2, w1, b1))
    expected = F.linear(inner, w2, b2)
    assert torch.allclose(out, expected, atol=1e-12)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad)
    assert torch.allclose(x.grad, x2.grad, atol=1e-12)
    assert torch.allclose(block.inner.weight.grad, w1.grad, atol=1e-12)
    assert torch.allclose(block.outer.bias.grad, b2.grad, atol=1e-12)


def test_rms_norm_is_the_root_mean_square_scaling():
    """``layer_norm: rms``: x / sqrt(mean(x^2) + 1e-6) * g, no centring and no bias (Zhang & Sennrich
    2019), against that formula in float64."""
    from nmt.models.transformer.layers import RMS_EPS, layer_norm

    norm = layer_norm("rms", 6).double()
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 2.0, 6, dtype=torch.float64))
    x = torch.randn(4, 6, dtype=torch.float64) + 3.0  # off-centre: LayerNorm would subtract the mean
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * norm.weight
    torch.testing.assert_close(norm(x), expected, rtol=1e-12, atol=1e-12)
    assert sum(p.numel() for p in norm.parameters()) == 6  # a gain, no bias
    with pytest.raises(ValueError, match="unknown layer_norm 'batch'"):
        layer_norm("batch", 6)


@pytest.mark.parametrize("packing", [True, False])
def test_feed_forward_trains_through_the_packed_training_products(packing, monkeypatch):
    """float32 at the Transformer's usual sizes, where training's products go through oneDNN on
    processors that pack them (AMD's; forced here either way): the in-place ReLU is allowed on
    that output (it was refused there: "a view ... modified inplace") and the gradients equal
    torch's composition to float32 rounding."""
    from nmt.models.transformer.feed_forward import FeedForward
    from nmt.utils import packed_linear

    monkeypatch.setattr(packed_linear, "TRAIN_PACKING", packing)
    torch.manual_seed(5)
    block = FeedForward(256, 1024, "relu")
    x = torch.randn(4, 7, 256, requires_grad=True)
    out = block(x)
    nodes, seen = [out.grad_fn], set()
    while nodes:  # the graph's node types
        node = nodes.pop()
        if node is not None and node not in seen:
            seen.add(node)
            nodes.extend(n for n, _ in node.next_functions)
    assert packing == (packed_linear._BUILT and any("PackedLinear" in type(n).__name__ for n in seen))
    x2 = x.detach().clone().requires_grad_()
    w1, b1, w2, b2 = (p.detach().clone().requires_grad_() for p in
                      (block.inner.weight, block.inner.bias, block.outer.weight, block.outer.bias))
    expected = torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(x2, w1, b1)), w2, b2)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad)
    for got, want in ((x.grad, x2.grad), (block.inner.weight.grad, w1.grad), (block.outer.weight.grad, w2.grad),
                      (block.inner.bias.grad, b1.grad)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * want.abs().max().item())


def test_a_learned_alpha_is_not_rounded_under_autocast(monkeypatch):
    """Under bfloat16 autocast the scores are bfloat16; the heads' learned alphas reach
    entmax_bisect as they are (float32), not rounded to the scores' dtype (steps of 2^-7 there:
    the documented minimum 1.01 became 1.0078, and training saw another alpha than evaluation)."""
    from nmt.models.transformer.head_mapping import HeadMapping
    import nmt.sparse.entmax as entmax

    mapping = HeadMapping(4, "entmax_bisect", {"alpha": "learned"})
    with torch.no_grad():
        mapping.alpha_logit.copy_(torch.tensor([-2.0, -0.5, 0.3, -6.0]))
    seen = []
    real = entmax.EntmaxBisectFunction.apply
    monkeypatch.setattr(entmax.EntmaxBisectFunction, "apply", lambda x, a, *rest: (seen.append(a), real(x, a, *rest))[1])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        scores = torch.randn(2, 4, 3, 6) @ torch.eye(6)  # bfloat16 under autocast
        assert scores.dtype == torch.bfloat16
        mapping(scores)
    assert torch.equal(seen[0][0, :, 0, 0], mapping.alpha().detach())


def test_learned_alpha_heads_compute_no_softmax_rows(monkeypatch):
    """Off the host path (the static path an accelerator takes) entmax_bisect with a tensor alpha
    selects softmax for rows with alpha = 1 by a mask, computing a softmax of every row. The learned
    heads' alphas are at least 1.01: they skip it, with the same probabilities and gradients
    (scores and alphas) as through the masked selection."""
    from nmt.models.transformer.head_mapping import HeadMapping
    import nmt.sparse.entmax as entmax

    mapping = HeadMapping(3, "entmax_bisect", {"alpha": "learned", "impl": "static"})
    with torch.no_grad():
        mapping.alpha_logit.copy_(torch.tensor([-6.0, 0.0, 2.0]))  # alpha 1.01 (clamped), 1.5, 1.88
    scores = torch.randn(2, 3, 4, 7, generator=torch.Generator().manual_seed(0), requires_grad=True)
    grad = torch.randn(2, 3, 4, 7, generator=torch.Generator().manual_seed(1))
    softmaxes = []
    real_softmax = entmax.softmax
    monkeypatch.setattr(entmax, "softmax", lambda *a, **k: (softmaxes.append(1), real_softmax(*a, **k))[1])
    p = mapping(scores)
    got = torch.autograd.grad(p, [scores, mapping.alpha_logit], grad)
    assert softmaxes == []
    alpha = mapping.alpha().view(1, 3, 1, 1)
    q = entmax.entmax_bisect(scores, alpha=alpha, dim=-1, impl="static")  # the masked selection
    want = torch.autograd.grad(q, [scores, mapping.alpha_logit], grad)
    assert softmaxes == [1]
    torch.testing.assert_close(p, q, rtol=0, atol=0)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
