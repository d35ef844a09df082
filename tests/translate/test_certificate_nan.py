"""NaN scores are never exact zeros: a model with NaN weights certifies nothing, and a model with
NaN on some paths is certified exactly when brute force says no nonzero-probability prefix meets one."""
from __future__ import annotations

import math

import pytest
import torch

from nmt.translate.beam_search import beam_search
from toy_decoders import BOS, EOS, MarkovDecoder, TinyAttentionRNN, random_sources

MAX_LENGTH = 5


MODES = [dict(mode="dynamic"), dict(mode="static", stop_every=2)]  # both loops follow the same rule
MODE_IDS = ["dynamic", "static"]


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_nan_weights_certify_nothing(mode):
    model = TinyAttentionRNN(vocab=11, mapping="softmax")  # (the toy's entmax package cannot take NaN)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(math.nan)
    src, lengths = random_sources(4, 13, 6, seed=1)
    for beam_size in (1, 3):
        r = beam_search(model, src, lengths, bos=BOS, eos=EOS, beam_size=beam_size, n_best=3, max_length=6,
                        **mode)
        assert not bool(r.exact.any())
        assert r.reason_names() == ["nonfinite_scores"] * 4
        assert r.n_nonzero.tolist() == [0] * 4 and r.mass.tolist() == [0.0] * 4
        assert not bool(r.complete.any())
        r = beam_search(model, src, lengths, bos=BOS, eos=EOS, beam_size=beam_size, certify=False, max_length=6,
                        **mode)
        assert r.reason_names() == ["not_certified"] * 4 and not bool(r.exact.any())


class NaNAfterToken(MarkovDecoder):
    """A sparsemax Markov model whose scores after ``bad_token`` are all NaN (as from a NaN row
    of its transition table; the toy's entmax package cannot take NaN, so it is injected after)."""

    def __init__(self, seed: int, bad_token: int) -> None:
        super().__init__(vocab=7, mapping="sparsemax", scale=1.0, eos_bonus=0.8, seed=seed)
        self.bad_token = bad_token

    def step(self, tokens, state, encoder_out):
        log_probs, attention, state = super().step(tokens, state, encoder_out)
        log_probs = log_probs.masked_fill((tokens == self.bad_token).unsqueeze(-1), math.nan)
        return log_probs, attention, state


def brute_force(model, src, length, max_length: int):
    """Depth-first over finite log-probabilities only: (support, frontier, cut, nan_reached) where
    nan_reached says a prefix of nonzero probability got a NaN score at some step <= max_length."""
    with torch.no_grad():
        encoder_out, state = model.encode(src.view(1, -1), length.view(1))
        support, frontier, flags = {}, [0] * (max_length + 1), {"cut": False, "nan": False}

        def visit(prefix, logprob, state):
            t = len(prefix)
            prev = torch.tensor([prefix[-1] if prefix else BOS])
            log_probs, _, new_state = model.step(prev, state, encoder_out)
            row = log_probs[0].tolist()
            flags["nan"] |= any(math.isnan(lp) for lp in row)
            for tok, lp in enumerate(row):
                if not math.isfinite(lp):
                    continue
                if tok == EOS:
                    frontier[t] += 1
                    support[tuple(prefix + [EOS])] = logprob + lp
                elif t == max_length:
                    flags["cut"] = True
                else:
                    frontier[t] += 1
                    visit(prefix + [tok], logprob + lp, new_state)

        visit([], 0.0, state)
    return support, frontier, flags["cut"], flags["nan"]


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("seed, bad_token", [(0, 3), (1, 4), (2, 5), (6, 5), (4, 3)])
def test_partial_nan_certificate_matches_brute_force(seed, bad_token, mode):
    model = NaNAfterToken(seed, bad_token)
    src, lengths = random_sources(8, 9, 5, seed=seed + 11)
    seen = set()
    for beam_size in (1, 2, 4, 16):
        r = beam_search(model, src, lengths, bos=BOS, eos=EOS, beam_size=beam_size, n_best=300,
                        max_length=MAX_LENGTH, **mode)
        names = r.reason_names()
        for b in range(src.size(0)):
            support, frontier, cut, nan_reached = brute_force(model, src[b], lengths[b], MAX_LENGTH)
            unpruned = all(count <= beam_size for count in frontier[:MAX_LENGTH])
            expected = unpruned and not cut and not nan_reached and bool(support)
            assert bool(r.exact[b]) == expected, (beam_size, b, names[b])
            if unpruned and not cut and nan_reached:
                assert names[b] == "nonfinite_scores"
            found = {tuple(r.tokens[b, i, : int(r.lengths[b, i])].tolist()): float(r.scores[b, i])
                     for i in range(r.tokens.size(1)) if r.complete[b, i]}
            for seq, logprob in found.items():  # sound: only finite, enumerated sequences
                assert logprob == pytest.approx(support[seq], abs=1e-9)
            if expected:
                assert set(found) == set(support)
            seen.add((expected, nan_reached))
    assert (True, False) in seen and (False, True) in seen  # both kinds of sentence occur


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_slot_flags_and_support_counts_match_per_entry_tests(dtype):
    """unknown_slots (a row maximum) and support_size (a float count) against per-entry tests, with
    NaN and +inf at every position of a vectorised row (the reductions' lanes and tails)."""
    from nmt.translate.certificate import unknown_slots
    from nmt.translate.search_step import support_size

    n = 37
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3 * n + 1, n, generator=g).to(dtype).log_softmax(-1)
    x[:, ::3] = -math.inf
    for i in range(n):
        x[i, i] = math.nan
        x[n + i, i] = math.inf
        x[2 * n + i, : i + 1] = -math.inf  # rows up to all -inf
    x[3 * n] = -math.inf
    lp = x.view(3 * n + 1, 1, n)
    expected_unknown = (torch.isnan(lp) | torch.isposinf(lp)).any(-1)
    assert torch.equal(unknown_slots(lp), expected_unknown)
    assert torch.equal(support_size(lp), torch.isfinite(lp).sum(-1, dtype=torch.int32))
