"""Static-shape beam search: same results as the dynamic loop, and its host-sync contract.

The brute-force certificate tests run in both modes (test_certificate_bruteforce.py); here the
static loop is compared with the dynamic one field by field (hypotheses, scores, certificates,
n_nonzero, steps) on random toy models and on a tiny trained nmt model, and its host syncs are
counted with ``SyncAudit``: the step makes none, the whole search at most
``ceil(T / stop_every) + 1`` for T steps (one stop flag per ``stop_every`` steps, and one read
of the step where every sentence had stopped).
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import nmt.utils.topk as topk_module
from nmt.models import build_model
from nmt.models import encoder as encoder_module
from nmt.models import packed_decoder_step
from nmt.sparse import get_loss
from nmt.translate.beam_search import beam_search
from nmt.translate.search_options import SearchOptions
from nmt.translate.search_step import RowState, Specials, select_step
from nmt.translate.static_search import static_step
from nmt.utils.sync_audit import SyncAudit
from toy_decoders import BOS, EOS, PAD, MarkovDecoder, TinyAttentionRNN, random_sources, tiny_transformer


def assert_same_result(a, b) -> None:
    """Every field of two SearchResults is equal: integer and boolean fields exactly, floating
    ones to rounding (the dynamic loop runs the model on fewer rows, and a matrix product of
    another shape may round differently; a sequence's score sums its steps' roundings, which the
    sparse mappings' thresholds amplify: 1e-5 relative, some 100 float32 ulps)."""
    assert a.steps == b.steps
    for field in dataclasses.fields(a):
        if not field.compare:  # the model's encoding of the batch, kept for a later pass, not an outcome
            continue
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, torch.Tensor):
            assert x.shape == y.shape, field.name
            if x.is_floating_point():
                torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5, msg=field.name)
            else:
                assert torch.equal(x, y), field.name
        else:
            assert x == y, field.name


CASES = [  # (model, search options)
    (lambda: TinyAttentionRNN(mapping="softmax", seed=1), dict(beam_size=4, n_best=3, length_penalty="average")),
    (lambda: TinyAttentionRNN(mapping="sparsemax", seed=2), dict(beam_size=3, n_best=5, return_support=True)),
    (lambda: TinyAttentionRNN(mapping="entmax15", seed=3), dict(beam_size=5, n_best=2, length_penalty="gnmt",
                                                               min_length=2, return_attention=True)),
    (lambda: TinyAttentionRNN(mapping="entmax15", seed=4, scale=1.0), dict(beam_size=2, certify=False)),
    (lambda: TinyAttentionRNN(mapping="sparsemax", seed=5), dict(beam_size=1)),
    (lambda: MarkovDecoder(vocab=7, mapping="sparsemax", seed=6, eos_bonus=0.8), dict(beam_size=8, n_best=40)),
    (lambda: MarkovDecoder(vocab=4, mapping="entmax15", seed=7, eos_bonus=0.3, scale=0.5),
     dict(beam_size=8, n_best=50, max_length=3)),
    (lambda: MarkovDecoder(vocab=7, mapping="entmax15", seed=8, eos_bonus=0.3, scale=2.0),
     dict(beam_size=3, n_best=4, support_stats=False, max_length=5)),
    (lambda: tiny_transformer(output="entmax15", attention="softmax", eos_bias=1.5, seed=1),  # kv caches
     dict(beam_size=4, n_best=3, length_penalty="average", return_attention=True)),
    (lambda: tiny_transformer(output="sparsemax", attention="entmax15", eos_bias=0.5, seed=2),  # greedy: the
     dict(beam_size=1, return_attention=True, max_length_ratio=0.8, max_length_offset=2)),  # caches stay in order
]


@pytest.mark.parametrize("stop_every", [1, 2, 5])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_static_equals_dynamic_on_toy_models(case, stop_every):
    make, options = CASES[case]
    model = make()
    src, lengths = random_sources(7, 9, 6, seed=case)
    options = {"max_length": 10, **options}
    dynamic = beam_search(model, src, lengths, bos=BOS, eos=EOS, pad=PAD, mode="dynamic", **options)
    static = beam_search(model, src, lengths, bos=BOS, eos=EOS, pad=PAD, mode="static", stop_every=stop_every,
                         **options)
    assert_same_result(static, dynamic)


def test_auto_mode_is_dynamic_on_cpu_and_static_on_cuda():
    assert SearchOptions().mode == "auto"
    assert SearchOptions().resolved_mode("cpu") == "dynamic"
    assert SearchOptions().resolved_mode(torch.device("cuda", 0)) == "static"
    assert SearchOptions(mode="dynamic").resolved_mode("cuda") == "dynamic"
    assert SearchOptions(mode="static").resolved_mode("cpu") == "static"
    with pytest.raises(ValueError, match=r"^mode must be one of auto, dynamic, static, got 'fast'$"):
        SearchOptions(mode="fast")
    with pytest.raises(ValueError, match=r"^stop_every must be >= 1, got 0$"):
        SearchOptions(stop_every=0)


TRAINED_VOCAB = 9
TRAINED_CFG = {
    "embeddings": {"src_size": 8, "tgt_size": 8, "share": False, "tie_output": False, "dropout": 0.0},
    "encoder": {"type": "lstm", "layers": 1, "hidden_size": 12, "bidirectional": True, "dropout": 0.0},
    "decoder": {"type": "lstm", "layers": 1, "hidden_size": 12, "dropout": 0.0, "input_feeding": True,
                "bridge": "linear"},
    "attention": {"score": "general", "mapping": "entmax15", "params": {}, "continuous": None},
    "output": {"mapping": "entmax15", "params": {}},
}


@pytest.fixture(scope="module")
def trained_model():
    """A tiny LSTM (entmax15 attention and output) trained 80 steps on a copy task."""
    torch.manual_seed(0)
    model = build_model(TRAINED_CFG, TRAINED_VOCAB, TRAINED_VOCAB, PAD)
    vocab = TRAINED_VOCAB
    loss_fn = get_loss("entmax15")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(0)
    for _ in range(80):
        lengths = torch.randint(2, 6, (16,), generator=g)
        src = torch.randint(3, vocab, (16, 5), generator=g)
        src = src.masked_fill(torch.arange(5) >= lengths.unsqueeze(1), PAD)
        tgt = torch.cat([src, torch.full((16, 1), PAD)], dim=1)  # copy task: learnt (sparse) in few steps
        tgt[torch.arange(16), lengths] = EOS
        tgt_in = torch.cat([torch.full((16, 1), BOS), tgt[:, :-1]], dim=1)
        tgt_in = tgt_in.masked_fill(tgt_in == EOS, PAD)
        logits, _ = model(src, lengths, tgt_in)
        loss = loss_fn(logits.reshape(-1, vocab), tgt.reshape(-1), ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def static_impl_copy(model):
    """The same trained weights with the sync-free (impl="static") 1.5-entmax attention and output."""
    cfg = {**TRAINED_CFG, "attention": {**TRAINED_CFG["attention"], "params": {"impl": "static"}},
           "output": {"mapping": "entmax15", "params": {"impl": "static"}}}
    twin = build_model(cfg, TRAINED_VOCAB, TRAINED_VOCAB, PAD)
    twin.load_state_dict(model.state_dict())
    return twin.eval()


@pytest.mark.parametrize("stop_every", [1, 4])
def test_static_search_of_a_trained_model_with_sync_free_mappings(trained_model, stop_every, monkeypatch):
    """With impl="static" mappings the whole search of an nmt model syncs only for its stop flags
    (ceil(T / stop_every)) and the final read; results equal the default mappings' search."""
    twin = static_impl_copy(trained_model)
    # the encoder's CPU-only runs by source length read the (host) lengths, the CPU decoder step's
    # token products the (host) tokens; never on accelerators
    monkeypatch.setattr(encoder_module, "CPU_RUNS", False)
    monkeypatch.setattr(packed_decoder_step, "TOKEN_PRODUCTS", False)
    src, lengths = random_sources(12, 9, 5, seed=11)
    kw = dict(bos=BOS, eos=EOS, pad=PAD, beam_size=4, n_best=3, max_length=8)
    with SyncAudit() as audit:
        static = beam_search(twin, src, lengths, mode="static", stop_every=stop_every, **kw)
    assert audit.total <= math.ceil(static.steps / stop_every) + 1, audit.report()
    dynamic = beam_search(trained_model, src, lengths, mode="dynamic", **kw)
    assert torch.equal(static.tokens, dynamic.tokens) and torch.equal(static.exact, dynamic.exact)
    assert torch.equal(static.n_nonzero, dynamic.n_nonzero)
    torch.testing.assert_close(static.scores, dynamic.scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("beam_size,stop_every", [(1, 3), (4, 1), (4, 4)])
def test_static_equals_dynamic_on_a_trained_model(trained_model, beam_size, stop_every):
    src, lengths = random_sources(12, 9, 5, seed=11)
    kw = dict(bos=BOS, eos=EOS, pad=PAD, beam_size=beam_size, n_best=3, max_length=8, return_attention=True)
    dynamic = beam_search(trained_model, src, lengths, mode="dynamic", **kw)
    static = beam_search(trained_model, src, lengths, mode="static", stop_every=stop_every, **kw)
    assert_same_result(static, dynamic)
    if beam_size == 4:  # certified and pruned sentences both occur
        assert bool(dynamic.exact.any()) and not bool(dynamic.exact.all())


@pytest.mark.parametrize("ratio", [0.0, 0.5])
def test_static_step_makes_no_host_sync(ratio):
    """Every step, the last included; with per-sentence limits (``max_length_ratio``) every step
    may end some rows (and returns their cut hypotheses), and every sentence has ended by the last."""
    model = TinyAttentionRNN(mapping="entmax15", seed=7)
    src, lengths = random_sources(6, 13, 6, seed=8)
    options = SearchOptions(beam_size=4, n_best=2, max_length=5 if ratio == 0 else 8, return_support=True,
                            return_attention=True, length_penalty="gnmt", min_length=2 if ratio == 0 else 1,
                            max_length_ratio=ratio, max_length_offset=1)
    special = Specials(BOS, EOS, PAD)
    limits = options.length_limits(lengths)
    assert limits is None or len(set(limits.tolist())) > 1
    with torch.no_grad():
        encoder_out, state = model.encode(src, src_lengths=lengths)
        rows = RowState.start(6, options.n_best, options.certify, src.device, limits)
        stopped = torch.zeros(6, dtype=torch.bool)
        tokens = torch.full((6,), BOS)
        for t in range(options.max_length + 1):
            with SyncAudit() as audit:
                _, tokens, state, rows, stopped, truncated = static_step(
                    model, tokens, state, encoder_out, rows, stopped, t, options, special)
            assert audit.total == 0, f"step {t}: {audit.report()}"
            assert (truncated is not None) == (t == options.max_length or limits is not None)
            if t == 0:
                encoder_out = {k: v.repeat_interleave(4, dim=0) for k, v in encoder_out.items()}
    assert limits is None or bool(stopped.all())


@pytest.mark.parametrize("stop_every", [1, 3, 4])
@pytest.mark.parametrize("certify", [True, False])
def test_static_search_syncs_at_most_once_per_stop_every_steps(stop_every, certify):
    model = TinyAttentionRNN(mapping="entmax15", seed=7)
    src, lengths = random_sources(6, 13, 6, seed=8)
    with SyncAudit() as audit:
        r = beam_search(model, src, lengths, bos=BOS, eos=EOS, pad=PAD, beam_size=4, n_best=2, certify=certify,
                        return_support=True, max_length=15, mode="static", stop_every=stop_every)
    assert r.steps >= 4
    assert set(audit.counts) <= {"Tensor.__bool__", "Tensor.__int__"}, audit.report()
    assert audit.total <= math.ceil(r.steps / stop_every) + 1, audit.report()


@pytest.mark.parametrize("blocked", [False, True], ids=["topk", "blocked-topk"])
def test_search_step_compiles_as_one_graph(blocked, monkeypatch):
    """``torch.compile(fullgraph=True)`` fails on any graph break, e.g. a host read of a tensor;
    ``blocked``: the candidates chosen through block maxima (forced onto the toy vocabulary), with
    a NaN and a +inf score among them."""
    if blocked:
        monkeypatch.setattr(topk_module, "BLOCK", 3)
        monkeypatch.setattr(topk_module, "MIN_BLOCKS_PER_K", 1)
    options, special = SearchOptions(beam_size=4, n_best=2, max_length=10), Specials(BOS, EOS, PAD)
    g = torch.Generator().manual_seed(0)
    rows = RowState(torch.randn(6, 4, generator=g, dtype=torch.float64), torch.ones(6, dtype=torch.bool),
                    torch.zeros(6, dtype=torch.long), torch.full((6, 2), -5.0, dtype=torch.float64),
                    torch.zeros(6, dtype=torch.bool))
    log_probs = torch.log_softmax(torch.randn(24, 11, generator=g, dtype=torch.float64), -1)
    if blocked:
        log_probs[3, 4], log_probs[9, 2] = math.nan, math.inf
    attention = torch.rand(24, 5, generator=g, dtype=torch.float64)
    compiled = torch.compile(select_step, fullgraph=True)(log_probs, attention, rows, 3, options, special)
    eager = select_step(log_probs, attention, rows, 3, options, special)
    for name in ("chosen", "parent", "done"):
        assert torch.equal(getattr(compiled, name), getattr(eager, name)), name
    assert torch.equal(compiled.rows.scores, eager.rows.scores)
    assert torch.equal(compiled.rows.exact, eager.rows.exact)
    assert torch.equal(compiled.rows.reason, eager.rows.reason)
    if blocked:  # rows 0 and 2 met an unknown score in a live slot first; every row prunes candidates
        from nmt.translate.certificate import NONFINITE, PRUNED
        assert eager.rows.reason.tolist() == [NONFINITE, PRUNED, NONFINITE, PRUNED, PRUNED, PRUNED]
        scores = eager.rows.scores  # neither NaN nor +inf entered the beam (-inf: finished slots)
        assert not torch.isnan(scores).any() and (scores < math.inf).all()


SHARED_ATTENTION = [  # attention configurations of the nmt LSTM, whose step shares encoder_out
    {"score": "general", "mapping": "entmax15", "params": {}, "continuous": None},
    {"score": "dot", "mapping": "sparsemax", "params": {}, "continuous": None},
    {"score": "mlp", "mapping": "softmax", "params": {}, "continuous": None},
    {"score": "general", "mapping": "entmax15", "params": {}, "continuous": {"alpha": 2.0}},
]


@pytest.mark.parametrize("mode", ["dynamic", "static"])
@pytest.mark.parametrize("attention", range(len(SHARED_ATTENTION)))
def test_shared_encoder_out_equals_tiled(attention, mode):
    """The nmt LSTM takes one encoder row per sentence for its beam slots (beam search does not
    tile ``encoder_out``): the same search as with the encoder output tiled to every slot,
    hypotheses, certificates and supports exactly, scores to rounding (products of other shapes)."""
    torch.manual_seed(attention)
    cfg = {**TRAINED_CFG, "attention": SHARED_ATTENTION[attention], "output": {"mapping": "entmax15", "params": {}}}
    model = build_model(cfg, TRAINED_VOCAB, TRAINED_VOCAB, PAD).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(6.0)  # sparse outputs: finished hypotheses and certificates
    assert model.shares_encoder_out
    src, lengths = random_sources(6, TRAINED_VOCAB, 7, seed=attention)
    options = dict(beam_size=4, n_best=3, max_length=8, length_penalty="average", return_attention=True)
    shared = beam_search(model, src, lengths, bos=BOS, eos=EOS, pad=PAD, mode=mode, **options)
    model.shares_encoder_out = False
    tiled = beam_search(model, src, lengths, bos=BOS, eos=EOS, pad=PAD, mode=mode, **options)
    assert_same_result(shared, tiled)
    assert (shared.lengths > 0).all()


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_shared_encoder_out_equals_tiled_on_the_trained_model(trained_model, mode, monkeypatch):
    src, lengths = random_sources(12, 9, 5, seed=11)
    options = dict(beam_size=4, n_best=3, max_length=8, return_attention=True)
    shared = beam_search(trained_model, src, lengths, bos=BOS, eos=EOS, pad=PAD, mode=mode, **options)
    monkeypatch.setattr(trained_model, "shares_encoder_out", False, raising=False)
    tiled = beam_search(trained_model, src, lengths, bos=BOS, eos=EOS, pad=PAD, mode=mode, **options)
    assert_same_result(shared, tiled)
    assert shared.exact.any()


TRANSFORMERS = [
    lambda: tiny_transformer(output="entmax15", attention="softmax", eos_bias=1.5, seed=1),
    lambda: tiny_transformer(output="sparsemax", attention="entmax15", seed=2),
    lambda: tiny_transformer(output="entmax15", attention="entmax15", seed=3, continuous={"alpha": 2}),
]


@pytest.mark.parametrize("mode", ["dynamic", "static"])
@pytest.mark.parametrize("case", range(len(TRANSFORMERS)))
def test_shared_cross_keys_values_equal_tiled(case, mode):
    """The Transformer keeps its cross-attention keys/values once per sentence in beam search:
    the same search as with them tiled to every slot (kv caches reordered as before)."""
    model = TRANSFORMERS[case]()
    assert model.shares_encoder_out
    src, lengths = random_sources(7, 9, 6, seed=case)
    options = dict(beam_size=4, n_best=3, max_length=10, length_penalty="average", return_attention=True)
    shared = beam_search(model, src, lengths, bos=BOS, eos=EOS, pad=PAD, mode=mode, **options)
    model.shares_encoder_out = False
    tiled = beam_search(model, src, lengths, bos=BOS, eos=EOS, pad=PAD, mode=mode, **options)
    assert_same_result(shared, tiled)
    assert shared.exact.any()


def test_step_with_shared_encoder_rows_compiles_as_one_graph(trained_model):
    """The LSTM step of k beam rows per sentence over the untiled encoder output (the attention's
    grouping reads only shapes) under ``torch.compile(fullgraph=True)``, sync-free mappings."""
    twin = static_impl_copy(trained_model)
    src, lengths = random_sources(5, 9, 5, seed=3)
    k = 3
    with torch.no_grad():
        encoder_out, state = twin.encode(src, lengths)
        state = {name: value.repeat_interleave(k, dim=0) for name, value in state.items()}
        tokens = torch.randint(3, TRAINED_VOCAB, (5 * k,), generator=torch.Generator().manual_seed(0))
        eager = twin.step(tokens, state, encoder_out)
        compiled = torch.compile(twin.step, fullgraph=True)(tokens, state, encoder_out)
    for a, b in zip(compiled[:2], eager[:2]):
        finite = torch.isfinite(b)
        assert torch.equal(torch.isfinite(a), finite)
        torch.testing.assert_close(a[finite], b[finite], rtol=1e-5, atol=1e-6)
