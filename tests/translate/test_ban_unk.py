"""``ban_unk_token`` (``-ban_unk_token``): no output holds ``<unk>``, checked against independent truths.

* The certificate keeps its meaning: on toy models whose whole output space is enumerated by brute
  force without the banned token, both loops, beam sizes 1 (greedy), 2, 4, 8, the native and the
  torch candidate selection: the certificate is the one the constrained enumeration predicts, a
  certified sentence's hypotheses are exactly the constrained support and its first is the
  constrained argmax; no output holds the token.
* Off changes nothing (the same tensor reaches the candidates).
* Sampling draws from each step's distribution without the token, renormalised (chi-square against
  the brute-force distribution).
* The mask makes no host sync and compiles as one graph; a search without the unk id refuses it.
"""
from __future__ import annotations

from collections import Counter

import pytest
import torch

import nmt.translate.search_step as step_module
from nmt.translate.beam_search import beam_search
from nmt.translate.sampling import sample_search
from nmt.translate.search_options import SearchOptions
from nmt.translate.search_step import RowState, Specials, banned_unk, select_step
from nmt.utils.sync_audit import SyncAudit
from test_certificate_bruteforce import CASES, MAX_LENGTH, N_SOURCES, check_against_enumeration, model_and_sources
from test_ngram_block import blocked_outcomes
from test_sampling import SPECIAL, assert_fits, drawn, tiny_model
from test_static_search import assert_same_result
from toy_decoders import BOS, EOS, PAD, MarkovDecoder, enumerate_support, random_sources

UNK = 3  # a token of the toy models' supports, playing <unk>
MODES = [dict(mode="dynamic"), dict(mode="static", stop_every=3)]
MODE_IDS = ["dynamic", "static"]


@pytest.mark.parametrize("selection", ["native", "torch"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("mapping,seed,penalty,min_length", CASES)
def test_certified_search_is_exact_without_the_banned_token(mapping, seed, penalty, min_length, mode, selection,
                                                            monkeypatch):
    if selection == "torch":
        monkeypatch.setattr(step_module, "step_candidates", lambda *args: None)
        monkeypatch.setattr(step_module, "step_update", lambda *args, **kwargs: None)
    model, src, lengths = model_and_sources(mapping, seed)
    for beam_size in (1, 2, 4, 8):
        result = beam_search(model, src, lengths, bos=BOS, eos=EOS, unk=UNK, beam_size=beam_size, n_best=200,
                             max_length=MAX_LENGTH, min_length=min_length, length_penalty=penalty,
                             ban_unk_token=True, **mode)
        names = result.reason_names()
        for b in range(N_SOURCES):
            support, frontier, cut = enumerate_support(model, src[b], lengths[b], MAX_LENGTH, min_length, banned=UNK)
            check_against_enumeration(result, names, b, support, frontier, cut, beam_size, penalty)
            for i in range(result.tokens.size(1)):
                assert UNK not in result.tokens[b, i, :int(result.lengths[b, i])].tolist()


def test_the_ban_bites():
    """Not vacuous: certified sentences whose unconstrained support holds the token."""
    bitten = 0
    for mapping, seed, penalty, min_length in CASES:
        model, src, lengths = model_and_sources(mapping, seed)
        result = beam_search(model, src, lengths, bos=BOS, eos=EOS, unk=UNK, beam_size=8, n_best=200,
                             max_length=MAX_LENGTH, min_length=min_length, length_penalty=penalty, ban_unk_token=True)
        for b in range(N_SOURCES):
            if bool(result.exact[b]):
                free, _, _ = enumerate_support(model, src[b], lengths[b], MAX_LENGTH, min_length)
                bitten += any(UNK in seq for seq in free)
    assert bitten >= 5


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_off_changes_nothing(mode):
    model = MarkovDecoder(vocab=7, mapping="entmax15", seed=4, scale=2.0, eos_bonus=0.3)
    src, lengths = random_sources(6, 9, 5, seed=3)
    kw = dict(bos=BOS, eos=EOS, pad=PAD, beam_size=3, n_best=4, max_length=8, **mode)
    before = beam_search(model, src, lengths, **kw)
    found = before.tokens[before.tokens > EOS]
    unk = int(found.mode().values)  # the token the outputs hold most
    assert_same_result(beam_search(model, src, lengths, unk=unk, ban_unk_token=False, **kw), before)
    banned = beam_search(model, src, lengths, unk=unk, ban_unk_token=True, **kw)
    assert not bool((banned.tokens == unk).any())


@pytest.mark.parametrize("mapping", ["softmax", "entmax15"])
def test_samples_follow_the_distribution_without_the_token(mapping):
    model = tiny_model(mapping, seed=3, scale=1.0)
    src, length = torch.tensor([[3, 4, 5, 6]]), torch.tensor([4])
    exact = blocked_outcomes(model, src, length, mapping, max_length=3, banned=UNK)
    assert abs(sum(exact.values()) - 1) < 1e-9 and len(exact) > 8
    n = 20000
    options = SearchOptions(sample=True, n_best=n, max_length=3, seed=5, ban_unk_token=True)
    counts = Counter(o for o, _ in drawn(sample_search(model, src, length, SPECIAL._replace(unk=UNK), options)))
    assert not any(UNK in o for o in counts)
    assert set(counts) <= {o for o, prob in exact.items() if prob > 0}
    assert_fits(counts, exact, n)
    free = Counter(o for o, _ in drawn(sample_search(model, src, length, SPECIAL, options.updated(ban_unk_token=False))))
    assert any(UNK in o for o in free)  # the model itself draws it


def test_the_mask_makes_no_host_sync_compiles_and_needs_the_unk_id():
    options, special = SearchOptions(beam_size=3, n_best=2, max_length=10, ban_unk_token=True), Specials(BOS, EOS, PAD, UNK)
    g = torch.Generator().manual_seed(1)
    log_probs = torch.log_softmax(torch.randn(15, 7, generator=g, dtype=torch.float64), -1)
    with SyncAudit() as audit:
        masked = banned_unk(log_probs, options, special)
    assert audit.total == 0, audit.report()
    assert bool((masked[:, UNK] == float("-inf")).all()) and torch.equal(masked[:, 4:], log_probs[:, 4:])
    assert banned_unk(log_probs, options.updated(ban_unk_token=False), special) is log_probs
    rows = RowState(torch.randn(5, 3, generator=g, dtype=torch.float64), torch.ones(5, dtype=torch.bool),
                    torch.zeros(5, dtype=torch.long), torch.full((5, 2), -5.0, dtype=torch.float64),
                    torch.zeros(5, dtype=torch.bool))
    compiled = torch.compile(select_step, fullgraph=True)(log_probs, None, rows, 3, options, special)
    eager = select_step(log_probs, None, rows, 3, options, special)
    assert torch.equal(compiled.chosen, eager.chosen) and not bool((eager.chosen == UNK).any())
    model = MarkovDecoder(vocab=7, mapping="softmax", seed=0)
    src, lengths = random_sources(2, 9, 4, seed=0)
    with pytest.raises(ValueError, match=r"^ban_unk_token needs the target vocabulary's unk id"):
        beam_search(model, src, lengths, bos=BOS, eos=EOS, ban_unk_token=True)
    with pytest.raises(ValueError, match=r"^ban_unk_token needs the target vocabulary's unk id"):  # before any step
        sample_search(model, src, lengths, SPECIAL, SearchOptions(sample=True, ban_unk_token=True))
    with pytest.raises(ValueError, match=r"^ban_unk_token must be True or False, got 1$"):
        SearchOptions(ban_unk_token=1)
