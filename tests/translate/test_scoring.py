"""Teacher-forced scoring against brute-force enumeration, beam search and the model's own forward."""
from __future__ import annotations

import math

import pytest
import torch

from nmt.translate.beam_search import beam_search
from nmt.translate.ensemble import Ensemble
from nmt.translate.scoring import score_batch
from nmt.utils.sync_audit import count_host_syncs
from toy_decoders import BOS, EOS, PAD, MarkovDecoder, enumerate_support, random_sources

MAX_LENGTH = 6


def pack(sequences: list[tuple[int, ...]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tgt_in, tgt_out, tgt_lengths) of sequences that end with EOS (the Batch layout)."""
    width = max(len(s) for s in sequences)
    tgt_out = torch.full((len(sequences), width), PAD, dtype=torch.long)
    tgt_in = torch.full((len(sequences), width), PAD, dtype=torch.long)
    for i, s in enumerate(sequences):
        tgt_out[i, : len(s)] = torch.tensor(s)
        tgt_in[i, : len(s)] = torch.tensor((BOS,) + s[:-1])
    return tgt_in, tgt_out, torch.tensor([len(s) for s in sequences])


def score_for_source(model, src, length, sequences):
    n = len(sequences)
    tgt_in, tgt_out, lengths = pack(sequences)
    return score_batch(model, src.view(1, -1).expand(n, -1), length.view(1).expand(n), tgt_in, tgt_out, lengths)


def first_exit(model, src, length, seq):
    """Brute force: (position, support size) where ``seq`` first has probability 0, else None."""
    with torch.no_grad():
        encoder_out, state = model.encode(src.view(1, -1), length.view(1))
        prev = BOS
        for t, tok in enumerate(seq):
            log_probs, _, state = model.step(torch.tensor([prev]), state, encoder_out)
            if log_probs[0, tok] == -math.inf:
                return t, int(torch.isfinite(log_probs[0]).sum())
            prev = tok
    return None


@pytest.mark.parametrize("mapping,seed", [("sparsemax", 0), ("entmax15", 1), ("sparsemax", 2)])
def test_every_enumerated_sequence_scores_its_beam_search_logprob(mapping, seed):
    params = dict(scale=1.0, eos_bonus=0.8) if mapping == "sparsemax" else dict(scale=2.0, eos_bonus=1.5)
    model = MarkovDecoder(vocab=7, mapping=mapping, seed=seed, **params)
    src, lengths = random_sources(4, 9, 5, seed=seed + 7)
    result = beam_search(model, src, lengths, bos=BOS, eos=EOS, beam_size=64, n_best=500, max_length=MAX_LENGTH)
    checked = 0
    for b in range(src.size(0)):
        sequences, _, cut = enumerate_support(model, src[b], lengths[b], MAX_LENGTH)
        if cut or not bool(result.exact[b]):
            continue
        found = {}
        for i in range(result.tokens.size(1)):
            if result.complete[b, i]:
                n = int(result.lengths[b, i])
                found[tuple(result.tokens[b, i, :n].tolist())] = float(result.scores[b, i])
        assert set(found) == set(sequences)
        seqs = sorted(sequences)
        scores = score_for_source(model, src[b], lengths[b], seqs)
        assert not scores.zero.any()
        for i, seq in enumerate(seqs):
            assert float(scores.total[i]) == pytest.approx(found[seq], abs=1e-9)
            assert float(scores.total[i]) == pytest.approx(sequences[seq], abs=1e-9)
            assert int(scores.lengths[i]) == len(seq)
            assert float(scores.token_logprobs[i].sum()) == pytest.approx(found[seq], abs=1e-9)
        checked += 1
    assert checked >= 2


@pytest.mark.parametrize("mapping", ["sparsemax", "entmax15"])
def test_zero_probability_references_and_where_they_leave_the_support(mapping):
    model = MarkovDecoder(vocab=7, mapping=mapping, seed=3, scale=1.5, eos_bonus=0.8)
    src, lengths = random_sources(3, 9, 5, seed=11)
    g = torch.Generator().manual_seed(5)
    zeros = 0
    for b in range(3):
        seqs = [tuple(torch.randint(3, 7, (int(n),), generator=g).tolist()) + (EOS,)
                for n in torch.randint(0, 5, (12,), generator=g)]
        scores = score_for_source(model, src[b], lengths[b], seqs)
        assert scores.rank_by == "probability"
        for i, seq in enumerate(seqs):
            exit_ = first_exit(model, src[b], lengths[b], seq)
            assert bool(scores.zero[i]) == (exit_ is not None)
            assert (float(scores.total[i]) == -math.inf) == (exit_ is not None)
            if exit_ is None:
                assert int(scores.first_zero[i]) == -1 and int(scores.zero_rank[i]) == -1
                continue
            zeros += 1
            position, support = exit_
            assert int(scores.first_zero[i]) == position
            assert int(scores.zero_token[i]) == seq[position]
            assert int(scores.zero_support[i]) == support
            assert int(scores.zero_rank[i]) == support + 1  # ranked by probability: behind the support
            assert torch.isfinite(scores.token_logprobs[i, :position]).all()
    assert zeros > 0


def test_ensemble_scores_match_ensemble_beam_search():
    members = [MarkovDecoder(vocab=7, mapping="sparsemax", seed=s, scale=1.0, eos_bonus=0.8) for s in (0, 4)]
    ensemble = Ensemble(members)
    src, lengths = random_sources(3, 9, 4, seed=2)
    result = beam_search(ensemble, src, lengths, bos=BOS, eos=EOS, beam_size=6, n_best=6, max_length=MAX_LENGTH)
    for b in range(3):
        seqs, totals = [], []
        for i in range(result.tokens.size(1)):
            if result.complete[b, i]:
                seqs.append(tuple(result.tokens[b, i, : int(result.lengths[b, i])].tolist()))
                totals.append(float(result.scores[b, i]))
        scores = score_for_source(ensemble, src[b], lengths[b], seqs)
        assert scores.total.tolist() == pytest.approx(totals, abs=1e-9)


RNN_CFG = {"embeddings": {"src_size": 6, "tgt_size": 6, "share": False, "tie_output": False, "dropout": 0.0},
           "encoder": {"type": "lstm", "layers": 1, "hidden_size": 8, "bidirectional": True, "dropout": 0.0},
           "decoder": {"type": "lstm", "layers": 1, "hidden_size": 8, "dropout": 0.0, "input_feeding": True,
                       "bridge": "linear"},
           "attention": {"score": "general", "mapping": "softmax", "params": {}, "continuous": None},
           "output": {"mapping": "sparsemax", "params": {}}}
TRANSFORMER_CFG = {
    "type": "transformer",
    "embeddings": {"src_size": 8, "tgt_size": 8, "share": False, "tie_output": False, "dropout": 0.0},
    "transformer": {"encoder_layers": 1, "decoder_layers": 2, "d_model": 8, "heads": 2, "d_ff": 16, "norm": "pre",
                    "positions": "sinusoidal", "max_positions": 64, "dropout": 0.0, "attention_dropout": 0.0,
                    "activation_dropout": 0.0, "activation": "relu"},
    "attention": {"score": "general", "mapping": "entmax15", "params": {}, "continuous": None,
                  "encoder_self": None, "decoder_self": None, "cross": None},
    "output": {"mapping": "sparsemax", "params": {}},
}


@pytest.mark.parametrize("cfg", [RNN_CFG, TRANSFORMER_CFG], ids=["rnn", "transformer"])
def test_models_score_their_teacher_forced_forward_and_rank_by_logits(cfg):
    from nmt.models import build_model

    torch.manual_seed(0)
    model = build_model(cfg, 13, 11, PAD).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(8.0)  # sharp outputs: sparsemax leaves most tokens out
    src = torch.tensor([[4, 5, 6, 7], [8, 9, PAD, PAD]])
    src_lengths = torch.tensor([4, 2])
    tgt_out = torch.tensor([[5, 6, 7, 3], [9, 3, PAD, PAD]])
    tgt_in = torch.tensor([[BOS, 5, 6, 7], [BOS, 9, PAD, PAD]])
    tgt_lengths = torch.tensor([4, 2])
    scores = score_batch(model, src, src_lengths, tgt_in, tgt_out, tgt_lengths)
    assert scores.rank_by == "score"
    with torch.no_grad():
        logits, _ = model(src, src_lengths, tgt_in)  # (B, T, V) teacher forcing in one pass
        log_probs = model.log_probs(logits)
    expected = log_probs.gather(2, tgt_out.unsqueeze(2)).squeeze(2)
    for b, n in enumerate(tgt_lengths.tolist()):
        assert scores.token_logprobs[b, :n].tolist() == pytest.approx(expected[b, :n].tolist(), abs=1e-9)
        zero_at = [t for t in range(n) if expected[b, t] == -math.inf]
        assert bool(scores.zero[b]) == bool(zero_at)
        if zero_at:
            t = zero_at[0]
            assert int(scores.first_zero[b]) == t
            ref = logits[b, t, tgt_out[b, t]]
            assert int(scores.zero_rank[b]) == int((logits[b, t] > ref).sum()) + 1
            assert int(scores.zero_support[b]) == int(torch.isfinite(log_probs[b, t]).sum())
            assert int(scores.zero_rank[b]) > int(scores.zero_support[b])
    assert scores.zero.any()  # the case the ranks are for


def test_scoring_never_synchronises_with_the_host():
    model = MarkovDecoder(vocab=7, mapping="entmax15", seed=1, scale=2.0, eos_bonus=1.5)
    src, lengths = random_sources(4, 9, 5, seed=3)
    tgt_in, tgt_out, tgt_lengths = pack([(3, 4, EOS), (5, EOS), (3, 3, 3, 4, EOS), (EOS,)])
    _, audit = count_host_syncs(score_batch, model, src, lengths, tgt_in, tgt_out, tgt_lengths)
    assert audit.total == 0, audit.report()


def test_a_blank_reference_is_scored_as_its_tokens():
    """A reference of spaces only was scored as the empty output (EOS alone), although a char
    tokenizer makes it tokens (a model may translate into it): its search log-probability never
    came back. Only a reference without tokens is the empty output."""
    from nmt.data.field import Field
    from nmt.data.tokenizers import SPACE_SYMBOL, CharTokenizer, SpaceTokenizer
    from nmt.data.vocabulary import Vocabulary
    from nmt.translate.scorer import Scorer

    model = MarkovDecoder(vocab=7, mapping="softmax", seed=0)  # every sequence has nonzero probability
    src_field = Field(SpaceTokenizer(), Vocabulary(["x", "y"]))
    tgt_field = Field(CharTokenizer(), Vocabulary([SPACE_SYMBOL, "a", "b"]))
    v = tgt_field.vocab
    blank, empty = Scorer(model, src_field, tgt_field).score(["x y", "x y"], ["  ", ""])
    assert blank.tokens == [SPACE_SYMBOL, SPACE_SYMBOL, "<eos>"] and empty.tokens == ["<eos>"]
    src, lengths = torch.tensor([src_field.encode("x y")]), torch.tensor([2])
    space = v.lookup([SPACE_SYMBOL])[0]
    expected = score_batch(model, src, lengths, torch.tensor([[v.bos_index, space, space]]),
                           torch.tensor([[space, space, v.eos_index]]), torch.tensor([3]))
    assert blank.logprob == pytest.approx(float(expected.total[0]), abs=1e-12) != empty.logprob


def test_nan_scores_are_not_scored_and_say_so():
    """A model whose scores hold NaN (a diverged one) gives its pairs no log-probability: reason
    "nonfinite_scores" (as the search's certificate), not a probability of zero and not a NaN in
    the summary's means; the other pairs are scored as before."""
    from nmt.data.field import Field
    from nmt.data.tokenizers import CharTokenizer, SpaceTokenizer
    from nmt.data.vocabulary import Vocabulary
    from nmt.translate.scorer import NONFINITE_SCORES, Scorer, ScoreSummary

    model = MarkovDecoder(vocab=7, mapping="softmax", seed=0)
    src_field = Field(SpaceTokenizer(), Vocabulary(["x", "y"]))
    tgt_field = Field(CharTokenizer(), Vocabulary(["a", "b"]))
    scorer = Scorer(model, src_field, tgt_field)
    fine = scorer.score(["x y"], ["ab"])[0]
    assert fine.reason is None and math.isfinite(fine.logprob)
    with torch.no_grad():
        model.table[:, 3] = float("nan")  # every step's scores hold a NaN
    bad = scorer.score(["x y"], ["ab"])[0]
    assert bad.logprob is None and bad.reason == NONFINITE_SCORES and not bad.zero_probability
    assert bad.report()["logprob"] is None and bad.report()["reason"] == "nonfinite_scores"
    summary = ScoreSummary.of([fine, bad])
    assert summary.scored == 1 and summary.mean_logprob == pytest.approx(fine.logprob)
    assert "1 not scored: an empty source or NaN scores" in summary.line()
