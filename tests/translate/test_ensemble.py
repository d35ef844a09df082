"""Ensembles: the mean of the members' probabilities, per step."""
from __future__ import annotations

import math

import pytest
import torch

from nmt.models.protocol import StepDecoder
from nmt.translate.beam_search import beam_search
from nmt.translate.ensemble import Ensemble
from toy_decoders import BOS, EOS, MarkovDecoder, TinyAttentionRNN, enumerate_support, random_sources


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
