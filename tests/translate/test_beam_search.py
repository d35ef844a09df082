"""Batched beam search: batch == alone, beam 1 == greedy, host syncs, scores, support, edge cases."""
from __future__ import annotations

import math

import pytest
import torch

from nmt.translate.beam_search import beam_search, greedy_search
from nmt.translate.certificate import REASONS
from toy_decoders import BOS, EOS, PAD, MarkovDecoder, TinyAttentionRNN, random_sources


def search(model, src, lengths, **kw):
    kw.setdefault("max_length", 12)
    kw.setdefault("return_attention", True)
    return beam_search(model, src, lengths, bos=BOS, eos=EOS, pad=PAD, **kw)


def teacher_forced(model, src_row, src_len, hyp: list[int]):
    """Step log-probability rows along ``hyp`` (tokens incl. EOS) for one source sentence."""
    with torch.no_grad():
        enc, state = model.encode(src_row.view(1, -1), src_len.view(1))
        prev, rows, atts = BOS, [], []
        for tok in hyp:
            lp, att, state = model.step(torch.tensor([prev]), state, enc)
            rows.append(lp[0])
            atts.append(att[0])
            prev = tok
    return rows, atts


@pytest.mark.parametrize("mapping", ["softmax", "entmax15"])
@pytest.mark.parametrize("beam_size,n_best", [(1, 1), (4, 3)])
def test_batched_equals_alone(mapping, beam_size, n_best):
    model = TinyAttentionRNN(mapping=mapping, seed=1)
    src, lengths = random_sources(5, 13, 6, seed=3)
    batched = search(model, src, lengths, beam_size=beam_size, n_best=n_best, length_penalty="average")
    for b in range(src.size(0)):
        n = int(lengths[b])
        alone = search(model, src[b : b + 1, :n], lengths[b : b + 1], beam_size=beam_size, n_best=n_best,
                       length_penalty="average")
        assert torch.equal(batched.lengths[b], alone.lengths[0])
        for i in range(n_best):
            m = int(alone.lengths[0, i])
            assert torch.equal(batched.tokens[b, i, :m], alone.tokens[0, i, :m])
            assert bool((batched.tokens[b, i, m:] == PAD).all())
            torch.testing.assert_close(batched.attention[b, i, :m, :n], alone.attention[0, i, :m, :n])
        torch.testing.assert_close(batched.scores[b], alone.scores[0])
        assert bool(batched.exact[b]) == bool(alone.exact[0])
        assert int(batched.reason[b]) == int(alone.reason[0])
        assert int(batched.n_nonzero[b]) == int(alone.n_nonzero[0])
        torch.testing.assert_close(batched.mass[b], alone.mass[0])


def greedy_reference(model, src_row, src_len, max_length):
    """Independent greedy loop: argmax token until EOS; after max_length tokens, EOS if it
    has nonzero probability (else the hypothesis is returned cut, without EOS)."""
    with torch.no_grad():
        enc, state = model.encode(src_row.view(1, -1), src_len.view(1))
        prev, out, total = BOS, [], 0.0
        for t in range(max_length + 1):
            lp, _, state = model.step(torch.tensor([prev]), state, enc)
            tok = EOS if t == max_length else int(lp[0].argmax())
            if lp[0, tok] == -math.inf:
                break
            total += float(lp[0, tok])
            out.append(tok)
            if tok == EOS:
                break
            prev = tok
    return out, total


@pytest.mark.parametrize("mapping", ["softmax", "sparsemax", "entmax15"])
def test_beam_one_is_greedy(mapping):
    model = TinyAttentionRNN(mapping=mapping, seed=2)
    src, lengths = random_sources(9, 13, 6, seed=4)
    result = greedy_search(model, src, lengths, bos=BOS, eos=EOS, pad=PAD, max_length=10)
    for b in range(src.size(0)):
        tokens, total = greedy_reference(model, src[b], lengths[b], 10)
        n = int(result.lengths[b, 0])
        assert result.tokens[b, 0, :n].tolist() == tokens
        assert float(result.scores[b, 0]) == pytest.approx(total, abs=1e-9)


def test_scores_attention_and_support_follow_the_model():
    """Teacher-forcing each returned hypothesis through the model reproduces its score,
    its attention rows and its per-step support."""
    model = TinyAttentionRNN(mapping="sparsemax", seed=5)
    src, lengths = random_sources(4, 13, 6, seed=6)
    r = search(model, src, lengths, beam_size=4, n_best=3, return_support=True, support_topk=4)
    for b in range(4):
        for i in range(3):
            m = int(r.lengths[b, i])
            if m == 0:
                continue
            hyp = r.tokens[b, i, :m].tolist()
            rows, atts = teacher_forced(model, src[b, : int(lengths[b])], lengths[b], hyp)
            assert float(r.scores[b, i]) == pytest.approx(math.fsum(float(row[t]) for t, row in zip(hyp, rows)))
            for t, (row, att) in enumerate(zip(rows, atts)):
                n = int(lengths[b])
                torch.testing.assert_close(r.attention[b, i, t, :n], att)
                assert int(r.support_size[b, i, t]) == int(torch.isfinite(row).sum())
                probs = row.exp()
                top = probs.topk(4)
                torch.testing.assert_close(r.support_probs[b, i, t], top.values)
                nonzero = top.values > 0
                assert r.support_tokens[b, i, t][nonzero].tolist() == top.indices[nonzero].tolist()
            assert bool((r.attention[b, i, m:] == 0).all())
            assert bool((r.support_size[b, i, m:] == 0).all())


def count_host_syncs(monkeypatch) -> list[str]:
    """Patch every Tensor -> Python conversion; returns the list that records the calls."""
    calls: list[str] = []
    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "nonzero"):
        original = getattr(torch.Tensor, name)

        def wrapper(self, *args, _original=original, _name=name, **kwargs):
            calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, wrapper)
    original_nonzero = torch.nonzero

    def nonzero(*args, **kwargs):
        calls.append("torch.nonzero")
        return original_nonzero(*args, **kwargs)

    monkeypatch.setattr(torch, "nonzero", nonzero)
    return calls


@pytest.mark.parametrize("certify", [True, False])
@pytest.mark.parametrize("beam_size", [1, 4])
def test_at_most_one_host_sync_per_step(monkeypatch, certify, beam_size):
    model = TinyAttentionRNN(mapping="entmax15", seed=7)
    src, lengths = random_sources(6, 13, 6, seed=8)
    calls = count_host_syncs(monkeypatch)
    r = search(model, src, lengths, beam_size=beam_size, n_best=2, certify=certify, return_support=True,
               length_penalty="gnmt", max_length=15)
    monkeypatch.undo()
    assert r.steps >= 2
    assert calls == ["tolist"] * len(calls)
    assert 1 <= len(calls) <= r.steps


def test_certify_off_gives_the_same_search_when_nothing_is_exact():
    model = TinyAttentionRNN(mapping="softmax", seed=9)
    src, lengths = random_sources(6, 13, 6, seed=10)
    on = search(model, src, lengths, beam_size=3, n_best=2)
    off = search(model, src, lengths, beam_size=3, n_best=2, certify=False, support_stats=False)
    assert torch.equal(on.tokens, off.tokens)
    torch.testing.assert_close(on.scores, off.scores)
    assert not bool(on.exact.any()) and not bool(off.exact.any())
    assert set(off.reason_names()) == {"not_certified"}
    assert off.support_size is None


def test_hypotheses_cut_at_max_length_when_eos_is_impossible():
    model = MarkovDecoder(vocab=7, mapping="sparsemax", eos_bonus=0.0, seed=0)
    with torch.no_grad():
        model.table[:, EOS] = -1e4
    src, lengths = random_sources(3, 9, 5, seed=0)
    r = search(model, src, lengths, beam_size=2, n_best=2, max_length=4)
    assert r.reason_names() == ["max_length"] * 3 or set(r.reason_names()) <= {"max_length", "pruned"}
    assert not bool(r.complete.any())
    assert bool((r.lengths[:, 0] == 4).all())  # returned without EOS
    assert bool((r.tokens[:, 0, :4] != EOS).all())
    assert bool((r.n_nonzero == 0).all()) and bool((r.mass == 0).all())


def test_min_length_and_nbest_padding():
    model = TinyAttentionRNN(mapping="entmax15", seed=11)
    src, lengths = random_sources(5, 13, 6, seed=12)
    r = search(model, src, lengths, beam_size=2, n_best=40, min_length=3)
    valid = r.lengths > 0
    assert bool((r.lengths[valid] >= 4).all())
    assert bool((r.scores[~valid] == -math.inf).all()) and bool((r.tokens[~valid] == PAD).all())
    assert r.tokens.shape[:2] == (5, 40)


def test_half_precision_log_probs_are_upcast():
    class Half(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def encode(self, src, lengths):
            return self.inner.encode(src, lengths)

        def step(self, tokens, state, enc):
            lp, att, st = self.inner.step(tokens, state, enc)
            return lp.half(), att.half(), st

    model = TinyAttentionRNN(mapping="sparsemax", seed=13, dtype=torch.float32)
    src, lengths = random_sources(3, 13, 6, seed=14)
    r = search(Half(model), src, lengths, beam_size=3)
    assert r.scores.dtype == torch.float32 and r.attention.dtype == torch.float32
    assert bool(torch.isfinite(r.scores[:, 0]).all())


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(beam_size=0), "beam_size"),
        (dict(n_best=0), "n_best"),
        (dict(max_length=-1), "max_length"),
        (dict(min_length=20), "min_length"),
        (dict(length_penalty="avg"), "length_penalty"),
    ],
)
def test_invalid_arguments(kwargs, message):
    model = TinyAttentionRNN()
    src, lengths = random_sources(2, 13, 4, seed=0)
    with pytest.raises(ValueError, match=message):
        search(model, src, lengths, **kwargs)


def test_reason_table_is_complete():
    assert REASONS[0] is None
    assert set(REASONS.values()) == {None, "pruned", "max_length", "not_certified", "nonfinite_scores",
                                     "no_hypothesis", "sampled"}


def test_support_statistics_do_not_change_the_search():
    model = TinyAttentionRNN(mapping="entmax15", seed=15)
    src, lengths = random_sources(5, 13, 6, seed=16)
    with_stats = search(model, src, lengths, beam_size=3, n_best=2)
    without = search(model, src, lengths, beam_size=3, n_best=2, support_stats=False)
    assert without.support_size is None and with_stats.support_size is not None
    for name in ("tokens", "scores", "exact", "reason", "n_nonzero", "mass", "attention"):
        assert torch.equal(getattr(with_stats, name), getattr(without, name)), name
