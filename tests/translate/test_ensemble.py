"""Ensembles: the mean of the members' probabilities, per step."""
from __future__ import annotations

import math

import pytest
import torch

from nmt.models.protocol import StepDecoder
from nmt.translate.beam_search import beam_search
from nmt.translate.ensemble import Ensemble
from toy_decoders import BOS, EOS, MarkovDecoder, TinyAttentionRNN, enumerate_support, random_sources, tiny_transformer


def test_ensemble_of_one_is_the_model():
    model = TinyAttentionRNN(mapping="entmax15", seed=1)
    src, lengths = random_sources(5, 13, 6, seed=2)
    kw = dict(bos=BOS, eos=EOS, beam_size=3, n_best=3, max_length=10, return_attention=True)
    single, ens = beam_search(model, src, lengths, **kw), beam_search(Ensemble([model]), src, lengths, **kw)
    assert isinstance(Ensemble([model]), StepDecoder)
    assert torch.equal(single.tokens, ens.tokens)
    assert torch.equal(single.scores, ens.scores)
    assert torch.equal(single.exact, ens.exact) and torch.equal(single.mass, ens.mass)
    assert torch.equal(single.attention, ens.attention)


@pytest.mark.parametrize("mapping", ["softmax", "entmax15"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ensemble_of_the_same_model_twice_is_the_model(mapping, dtype):
    """The mean of N equal distributions is that distribution, bit for bit: log-probabilities,
    beam search outputs, scores and certificates equal the model's own (logsumexp - log N
    moved them by rounding: a log-probability of -1e-8 became 0)."""
    model = TinyAttentionRNN(mapping=mapping, seed=1, dtype=dtype)
    src, lengths = random_sources(5, 13, 6, seed=2)
    enc, state = model.encode(src, lengths)
    tokens = torch.full((5,), BOS)
    lp = model.step(tokens, state, enc)[0]
    ens = Ensemble([model, model, model])
    e_enc, e_state = ens.encode(src, lengths)
    assert torch.equal(ens.step(tokens, e_state, e_enc)[0], lp)
    x = -torch.rand(10000, dtype=dtype) * 20
    x[:4] = torch.tensor([-1e-8, -3e-6, 0.0, float("-inf")], dtype=dtype)

    class Fixed:
        def encode(self, src, src_lengths):
            return {"src_mask": torch.ones_like(src, dtype=torch.bool)}, {}

        def step(self, tokens, state, encoder_out):
            return x.expand(tokens.size(0), -1), torch.ones(tokens.size(0), 1, dtype=dtype), {}

    twin = Ensemble([Fixed(), Fixed()])
    t_enc, t_state = twin.encode(src, lengths)
    assert torch.equal(twin.step(tokens, t_state, t_enc)[0], x.expand(5, -1))
    kw = dict(bos=BOS, eos=EOS, beam_size=3, n_best=3, max_length=10, return_attention=True)
    single, pair = beam_search(model, src, lengths, **kw), beam_search(Ensemble([model, model]), src, lengths, **kw)
    assert torch.equal(single.tokens, pair.tokens)
    assert torch.equal(single.scores, pair.scores)
    assert torch.equal(single.exact, pair.exact) and torch.equal(single.mass, pair.mass)
    assert torch.equal(single.attention, pair.attention)


def test_step_is_log_of_mean_probability():
    members = [MarkovDecoder(vocab=7, mapping="sparsemax", seed=s) for s in (0, 1, 2)]
    ens = Ensemble(members)
    src, lengths = random_sources(4, 9, 5, seed=3)
    enc, state = ens.encode(src, lengths)
    tokens = torch.tensor([BOS, 3, 4, 5])
    lp, att, new_state = ens.step(tokens, state, enc)
    expected = torch.zeros(4, 7, dtype=torch.float64)
    for m in members:
        e, s = m.encode(src, lengths)
        expected += m.step(tokens, s, e)[0].exp() / 3
    torch.testing.assert_close(lp.exp(), expected)
    assert torch.equal(torch.isinf(lp), expected == 0)  # -inf exactly where all members give 0
    assert set(new_state) == {"0.pos", "1.pos", "2.pos"}
    assert att.shape == (4, src.size(1))


def test_ensemble_certificate_against_enumeration():
    members = [MarkovDecoder(vocab=7, mapping="entmax15", scale=2.0, eos_bonus=1.5, seed=s) for s in (4, 5)]
    ens = Ensemble(members)
    src, lengths = random_sources(5, 9, 5, seed=6)
    r = beam_search(ens, src, lengths, bos=BOS, eos=EOS, beam_size=6, n_best=100, max_length=5)
    checked_exact = 0
    for b in range(5):
        support, frontier, cut = enumerate_support(ens, src[b], lengths[b], 5)
        exact = all(c <= 6 for c in frontier[:5]) and not cut
        assert bool(r.exact[b]) == exact
        if exact:
            checked_exact += 1
            assert int(r.n_nonzero[b]) == len(support)
            assert float(r.mass[b]) == pytest.approx(math.fsum(math.exp(v) for v in support.values()))
    assert checked_exact > 0


def test_empty_ensemble_is_an_error():
    with pytest.raises(ValueError, match="at least one"):
        Ensemble([])


def test_ensemble_of_an_rnn_and_a_transformer():
    """Different architectures with the same vocabularies: per-member states side by side,
    certificates still agree with brute-force enumeration of the ensemble's support."""
    from nmt.models import build_model

    rnn_cfg = {
        "type": "rnn",
        "embeddings": {"src_size": 6, "tgt_size": 6, "share": False, "tie_output": False, "dropout": 0.0},
        "encoder": {"type": "lstm", "layers": 1, "hidden_size": 8, "bidirectional": True, "dropout": 0.0},
        "decoder": {"type": "gru", "layers": 1, "hidden_size": 8, "dropout": 0.0, "input_feeding": True,
                    "bridge": "linear"},
        "attention": {"score": "general", "mapping": "sparsemax", "params": {}, "continuous": None},
        "output": {"mapping": "sparsemax", "params": {}},
    }
    torch.manual_seed(3)
    rnn = build_model(rnn_cfg, 9, 7, 0).double().eval()
    with torch.no_grad():
        rnn.generator.proj.weight.mul_(30.0)
        rnn.generator.proj.bias[EOS] = 1.0
        rnn.generator.proj.bias[BOS] = rnn.generator.proj.bias[0] = -1e4
    transformer = tiny_transformer(output="sparsemax", attention="entmax_bisect",
                                   attention_params={"alpha": "learned"}, eos_bias=1.0, seed=1)
    ens = Ensemble([rnn, transformer])
    src, lengths = random_sources(5, 9, 5, seed=6)
    enc, state = ens.encode(src, lengths)
    assert {k.split(".")[0] for k in state} == {"0", "1"}
    assert any(k.startswith("1.self.") for k in state) and "0.h" in state
    r = beam_search(ens, src, lengths, bos=BOS, eos=EOS, beam_size=6, n_best=100, max_length=5,
                    return_attention=True)
    assert r.attention is not None and r.attention.size(-1) == src.size(1)
    checked_exact = 0
    for b in range(5):
        support, frontier, cut = enumerate_support(ens, src[b], lengths[b], 5)
        exact = all(c <= 6 for c in frontier[:5]) and not cut and bool(support)  # nothing found: not certified
        assert bool(r.exact[b]) == exact
        found = {tuple(r.tokens[b, i, : int(r.lengths[b, i])].tolist()): float(r.scores[b, i])
                 for i in range(r.tokens.size(1)) if r.complete[b, i]}
        for seq, logprob in found.items():
            assert logprob == pytest.approx(support[seq], abs=1e-9)
        if exact:
            checked_exact += 1
            assert set(found) == set(support)
    assert checked_exact > 0
