"""Forced target prefixes (``beam_search(prefix=...)``, ``-tgt_prefix``) against independent truths.

* The mask: :func:`force_prefix` equals a Python definition (every token but the forced one at
  -inf in rows whose prefix reaches the step); unknown scores stay unknown; the same tensor where
  nothing is forced; no host sync; one compiled graph.
* The certificate keeps its meaning: on toy models whose whole output space is enumerated by brute
  force with the constraint (``enumerate_support(prefix=...)``: only sequences that start with the
  prefix), both loops, beam sizes 1 (greedy), 2, 4, 8, the native and the torch candidate selection,
  every length penalty, prefixes of nonzero and of zero probability, batches that mix sentences
  with and without prefixes: the certificate is the one the constrained enumeration predicts, a
  certified sentence's hypotheses are exactly the constrained support, its first is the
  constrained argmax, and every output starts with its prefix.
* Scores are the model's log-probabilities of the whole output: teacher-forced scoring of the
  outputs gives them.
* A batch is its sentences searched alone; an empty prefix changes nothing; a sentence's length
  limit grows to its prefix.
* Sampling draws only outputs that start with the prefix, from the model's distribution
  conditioned on it (chi-square against the brute-force conditional distribution).
"""
from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

import nmt.translate.search_step as step_module
from nmt.translate.beam_search import beam_search
from nmt.translate.sampling import sample_search
from nmt.translate.scoring import score_batch
from nmt.translate.search_options import SearchOptions
from nmt.translate.search_step import RowState, Specials, select_step
from nmt.translate.static_search import static_step
from nmt.translate.target_prefix import (
    NO_PREFIX,
    force_prefix,
    lengthen_limits,
    prefix_lengths,
    prefix_tensor,
)
from nmt.utils.sync_audit import SyncAudit
from test_certificate_bruteforce import CASES, MAX_LENGTH, N_SOURCES, check_against_enumeration, model_and_sources
from test_ngram_block import blocked_outcomes
from test_sampling import SPECIAL, assert_fits, drawn, forward_logits, reference_mapping, tiny_model
from test_static_search import assert_same_result
from toy_decoders import BOS, EOS, PAD, TinyAttentionRNN, enumerate_support, random_sources, tiny_transformer

MODES = [dict(mode="dynamic"), dict(mode="static", stop_every=3)]
MODE_IDS = ["dynamic", "static"]


# --- the mask --------------------------------------------------------------------------------------

def test_prefix_tensor_and_lengths():
    prefix = prefix_tensor([[4, 5], [], [6]])
    assert prefix.tolist() == [[4, 5], [NO_PREFIX, NO_PREFIX], [6, NO_PREFIX]] and prefix.dtype == torch.long
    assert prefix_lengths(prefix).tolist() == [2, 0, 1]
    assert prefix_tensor([[], []]).shape == (2, 0) and prefix_lengths(prefix_tensor([[], []])).tolist() == [0, 0]


@pytest.mark.parametrize("slots", [None, 3])
def test_the_mask_equals_the_python_definition(slots):
    g = torch.Generator().manual_seed(0)
    rows, width, vocab = 40, 4, 9
    lengths = torch.randint(0, width + 1, (rows,), generator=g)
    tokens = torch.randint(0, vocab, (rows, width), generator=g)
    prefix = torch.where(torch.arange(width) < lengths.unsqueeze(1), tokens, NO_PREFIX)
    shape = (rows, vocab) if slots is None else (rows, slots, vocab)
    log_probs = torch.log_softmax(torch.randn(shape, generator=g, dtype=torch.float64), -1)
    for t in range(width + 2):
        out = force_prefix(log_probs, prefix, t)
        if t >= width:
            assert out is log_probs
            continue
        for r in range(rows):
            forced = int(prefix[r, t]) if t < int(lengths[r]) else None
            for v in range(vocab):
                got, was = out[r, ..., v], log_probs[r, ..., v]
                want = was if forced is None or v == forced else torch.full_like(was, -math.inf)
                assert torch.equal(got, want), (r, t, v)
    assert force_prefix(log_probs, None, 0) is log_probs


def test_an_unknown_forced_score_stays_unknown():
    prefix = torch.tensor([[2], [NO_PREFIX]])
    for value in (math.nan, math.inf, -math.inf, -0.5):
        log_probs = torch.full((2, 4), -1.0)
        log_probs[:, 2] = value
        log_probs[:, 0] = math.nan  # an unknown score of a barred token: barred (probability 0 by the constraint)
        out = force_prefix(log_probs, prefix, 0)
        assert torch.equal(out[0, 2], log_probs[0, 2]) or (math.isnan(value) and math.isnan(out[0, 2]))
        assert bool((out[0, [0, 1, 3]] == -math.inf).all())
        assert torch.equal(out[1].nan_to_num(7.0), log_probs[1].nan_to_num(7.0))  # no prefix: unchanged


def test_limits_grow_to_the_prefix():
    limits, prefix = torch.tensor([3, 1, 0]), prefix_tensor([[4, 5], [4, 5, 6], []])
    assert lengthen_limits(limits, prefix).tolist() == [3, 3, 0]
    assert lengthen_limits(None, prefix) is None and lengthen_limits(limits, None) is limits


def test_the_mask_makes_no_host_sync_and_compiles_as_one_graph():
    g = torch.Generator().manual_seed(1)
    prefix = torch.tensor([[3, 4, NO_PREFIX], [NO_PREFIX] * 3, [5, 5, 6]])
    log_probs = torch.log_softmax(torch.randn(3, 2, 8, generator=g), -1)
    with SyncAudit() as audit:
        eager = force_prefix(log_probs, prefix, 1)
    assert audit.total == 0, audit.report()
    compiled = torch.compile(lambda x, p: force_prefix(x, p, 1), fullgraph=True, backend="aot_eager")(log_probs, prefix)
    assert torch.equal(compiled, eager)


# --- the certificate against brute force ----------------------------------------------------------

def chosen_prefixes(mapping: str, seed: int, min_length: int) -> list[tuple[int, ...]]:
    """A prefix per toy source, from its unconstrained support so that most have nonzero
    probability and the constraint bites: the first one or two tokens of its second-best output
    (one in three sentences none; one sentence a first token of probability 0, whose constrained
    support is empty)."""
    model, src, lengths = model_and_sources(mapping, seed)
    out: list[tuple[int, ...]] = []
    for b in range(N_SOURCES):
        support, _, _ = enumerate_support(model, src[b], lengths[b], MAX_LENGTH, min_length)
        ranked = sorted(support, key=support.get, reverse=True)
        if b % 3 == 2 or not ranked:
            out.append(())
        elif b == 4:  # a token of probability 0 at the first step
            with torch.no_grad():
                encoder_out, state = model.encode(src[b].view(1, -1), lengths[b].view(1))
                log_probs, _, _ = model.step(torch.tensor([BOS]), state, encoder_out)
            zero = [v for v in range(log_probs.size(-1)) if log_probs[0, v] == -math.inf and v not in (EOS, BOS, PAD)]
            out.append((zero[0],) if zero else ())
        else:
            pick = ranked[min(1, len(ranked) - 1)]
            body = [tok for tok in pick if tok != EOS]
            out.append(tuple(body[: 1 + b % 2]))
    return out


def check_prefixed_search(mapping, seed, penalty, min_length, **search) -> Counter:
    """Every toy source with its prefix (:func:`chosen_prefixes`), beam sizes 1, 2, 4, 8, against the
    constrained brute force; returns what was seen."""
    model, src, lengths = model_and_sources(mapping, seed)
    prefixes = chosen_prefixes(mapping, seed, min_length)
    prefix = prefix_tensor(prefixes)
    seen: Counter = Counter()
    for beam_size in (1, 2, 4, 8):
        result = beam_search(model, src, lengths, bos=BOS, eos=EOS, beam_size=beam_size, n_best=200,
                             max_length=MAX_LENGTH, min_length=min_length, length_penalty=penalty, prefix=prefix,
                             **search)
        names = result.reason_names()
        for b in range(N_SOURCES):
            support, frontier, cut = enumerate_support(model, src[b], lengths[b], MAX_LENGTH, min_length,
                                                       prefix=prefixes[b])
            check_against_enumeration(result, names, b, support, frontier, cut, beam_size, penalty)
            for i in range(result.tokens.size(1)):  # every n-best entry, complete or cut
                n = int(result.lengths[b, i])
                if n:
                    assert tuple(result.tokens[b, i, :len(prefixes[b])].tolist()) == prefixes[b]
            if prefixes[b] and not support:
                seen["zero-probability prefix"] += 1
                assert names[b] == "no_hypothesis" and int(result.lengths[b, 0]) == 0
            if bool(result.exact[b]) and prefixes[b]:
                seen["certified"] += 1
                free, _, _ = enumerate_support(model, src[b], lengths[b], MAX_LENGTH, min_length)
                if max(free, key=free.get) not in support:
                    seen["argmax excluded"] += 1
    return seen


@pytest.mark.parametrize("selection", ["native", "torch"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("mapping,seed,penalty,min_length", CASES)
def test_certified_search_is_exact_for_the_prefixed_problem(mapping, seed, penalty, min_length, mode, selection,
                                                            monkeypatch):
    """"native": the CPU's one-pass candidates and native bookkeeping; "torch": torch's (the
    accelerators' reference, compiled steps)."""
    if selection == "torch":
        monkeypatch.setattr(step_module, "step_candidates", lambda *args: None)
        monkeypatch.setattr(step_module, "step_update", lambda *args, **kwargs: None)
    check_prefixed_search(mapping, seed, penalty, min_length, **mode)


def test_the_constraint_bites():
    """Not vacuous: certified prefixed sentences whose unconstrained argmax the prefix excludes,
    and prefixes of probability 0."""
    seen: Counter = Counter()
    for mapping, seed, penalty, min_length in CASES:
        seen.update(check_prefixed_search(mapping, seed, penalty, min_length, mode="dynamic"))
    assert seen["certified"] >= 10 and seen["argmax excluded"] >= 5 and seen["zero-probability prefix"] >= 2, seen


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_a_tiny_transformer_against_brute_force_and_scoring(mode):
    """nmt's Transformer (kv caches reordered by the beam): the constrained brute force, and the
    outputs' scores equal teacher-forced scoring of the same tokens."""
    model = tiny_transformer(output="entmax15", attention="entmax15", eos_bias=2.0, seed=2)
    src, lengths = random_sources(N_SOURCES, 9, 5, seed=9)
    prefixes = []  # the first one or two tokens of each sentence's second-best output (every third: none)
    for b in range(N_SOURCES):
        support, _, _ = enumerate_support(model, src[b], lengths[b], MAX_LENGTH)
        ranked = [tok for tok in sorted(support, key=support.get, reverse=True)[min(1, len(support) - 1)]
                  if tok != EOS]
        prefixes.append(tuple(ranked[: 1 + b % 2]) if b % 3 != 2 else ())
    assert sum(map(bool, prefixes)) >= 4
    certified = 0
    for beam_size in (1, 3, 8):
        result = beam_search(model, src, lengths, bos=BOS, eos=EOS, pad=PAD, beam_size=beam_size, n_best=50,
                             max_length=MAX_LENGTH, prefix=prefix_tensor(prefixes), **mode)
        names = result.reason_names()
        for b in range(N_SOURCES):
            support, frontier, cut = enumerate_support(model, src[b], lengths[b], MAX_LENGTH, prefix=prefixes[b])
            check_against_enumeration(result, names, b, support, frontier, cut, beam_size, "none")
            certified += bool(result.exact[b]) and bool(prefixes[b])
        complete = [(b, i) for b in range(N_SOURCES) for i in range(result.tokens.size(1)) if result.complete[b, i]]
        width = result.tokens.size(2)
        tgt_out = torch.stack([result.tokens[b, i] for b, i in complete])  # (N, T) EOS, then PAD
        tgt_in = torch.cat([torch.full((len(complete), 1), BOS), tgt_out[:, :-1]], 1).masked_fill(tgt_out == PAD, PAD)
        tgt_lengths = torch.stack([result.lengths[b, i] for b, i in complete])
        rows = torch.tensor([b for b, _ in complete])
        scored = score_batch(model, src[rows], lengths[rows], tgt_in, tgt_out, tgt_lengths)
        want = torch.stack([result.scores[b, i] for b, i in complete])
        assert width >= 1 and torch.allclose(scored.total.to(want.dtype), want, atol=1e-9, rtol=0)
    assert certified >= 5


# --- batches, empty prefixes, length limits ------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("case", range(3))
def test_a_batch_is_its_sentences_alone(case, mode):
    make, options = [
        (lambda: TinyAttentionRNN(mapping="sparsemax", seed=2), dict(beam_size=3, n_best=3, return_support=True)),
        (lambda: TinyAttentionRNN(mapping="softmax", seed=1), dict(beam_size=1, block_ngram_repeat=2)),
        (lambda: tiny_transformer(output="sparsemax", attention="entmax15", eos_bias=-1.0, seed=2),
         dict(beam_size=2, n_best=2, return_attention=True, max_length_ratio=1.0)),
    ][case]
    model = make()
    src, lengths = random_sources(6, 9 if case == 2 else 13, 6, seed=case)
    prefixes = [(4, 5, 6), (), (7,), (3, 4), (), (5, 5, 5, 5)]
    kw = dict(bos=BOS, eos=EOS, pad=PAD, max_length=8, **options, **mode)
    together = beam_search(model, src, lengths, prefix=prefix_tensor(prefixes), **kw)
    for b in range(6):
        alone = beam_search(model, src[b:b + 1, :int(lengths[b])], lengths[b:b + 1],
                            prefix=prefix_tensor(prefixes[b:b + 1]), **kw)
        n = int(together.lengths[b, 0])
        assert int(alone.lengths[0, 0]) == n and torch.equal(alone.tokens[0, 0, :n], together.tokens[b, 0, :n])
        assert float(alone.scores[0, 0]) == pytest.approx(float(together.scores[b, 0]), abs=1e-5)
        assert bool(alone.exact[0]) == bool(together.exact[b]) and int(alone.reason[0]) == int(together.reason[b])
        if n:
            assert together.tokens[b, 0, :len(prefixes[b])].tolist() == list(prefixes[b])
    if mode["mode"] == "dynamic":
        static = beam_search(model, src, lengths, prefix=prefix_tensor(prefixes), **{**kw, "mode": "static"})
        assert_same_result(static, together)


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_an_empty_prefix_changes_nothing(mode):
    model = tiny_transformer(output="entmax15", attention="softmax", eos_bias=1.0, seed=1)
    src, lengths = random_sources(5, 9, 6, seed=4)
    kw = dict(bos=BOS, eos=EOS, pad=PAD, beam_size=3, n_best=3, max_length=9, **mode)
    free = beam_search(model, src, lengths, **kw)
    for prefix in (prefix_tensor([[]] * 5), torch.full((5, 3), NO_PREFIX)):
        assert_same_result(beam_search(model, src, lengths, prefix=prefix, **kw), free)


def test_a_length_limit_grows_to_the_prefix():
    """A sentence's ``max_length_ratio`` limit (here 1 x 1 + 2 = 3 tokens) below its prefix's
    length: the prefix still fits, and the output goes on no further than the prefix (the limit
    raised to it, not beyond): it ends with EOS right after it, or is cut there."""
    model = TinyAttentionRNN(mapping="softmax", seed=3)
    src, lengths = torch.tensor([[5, PAD, PAD]]), torch.tensor([1])
    forced = [4, 6, 7, 8, 9]
    kw = dict(bos=BOS, eos=EOS, pad=PAD, beam_size=2, n_best=2, max_length=10, max_length_ratio=1.0,
              max_length_offset=2)
    result = beam_search(model, src, lengths, prefix=prefix_tensor([forced]), **kw)
    assert result.tokens[0, 0, :5].tolist() == forced and result.tokens[0, 0, 5:].tolist() in ([EOS], [])
    assert int(result.lengths[0, 0]) == 6 and bool(result.complete[0, 0])  # softmax: EOS has nonzero probability
    assert result.reason_names() == ["max_length"]  # live outputs were cut at the raised limit
    free = beam_search(model, src, lengths, **kw)
    assert int(free.lengths[0, 0]) <= 4  # without the prefix: the ratio's limit, 3 tokens before EOS


def test_bad_prefixes_are_refused():
    model = TinyAttentionRNN(mapping="softmax", seed=3)
    src, lengths = random_sources(2, 13, 4, seed=0)
    kw = dict(bos=BOS, eos=EOS, max_length=3)
    with pytest.raises(ValueError, match=r"^a target prefix of 4 tokens does not fit max_length 3"):
        beam_search(model, src, lengths, prefix=prefix_tensor([[4, 4, 4, 4], []]), **kw)
    with pytest.raises(ValueError, match=r"^prefix must be \(batch, P\) = \(2, P\), got shape \(3, 1\)"):
        beam_search(model, src, lengths, prefix=prefix_tensor([[4], [4], [4]]), **kw)
    with pytest.raises(ValueError, match=r"^prefix must hold token ids \(torch.long\)"):
        beam_search(model, src, lengths, prefix=torch.ones(2, 1), **kw)


# --- host syncs and one graph in the search --------------------------------------------------------

def test_static_steps_with_a_prefix_make_no_host_sync():
    model = TinyAttentionRNN(mapping="entmax15", seed=7)
    src, lengths = random_sources(6, 13, 6, seed=8)
    options = SearchOptions(beam_size=4, n_best=2, max_length=7, return_support=True)
    special = Specials(BOS, EOS, PAD)
    prefix = prefix_tensor([[4, 5], [], [6, 6, 6], [7], [], [3, 4, 5]])
    with torch.no_grad():
        encoder_out, state = model.encode(src, src_lengths=lengths)
        rows = RowState.start(6, options.n_best, options.certify, src.device, None, None, prefix)
        stopped = torch.zeros(6, dtype=torch.bool)
        tokens = torch.full((6,), BOS)
        chosen = []
        for t in range(options.max_length + 1):
            with SyncAudit() as audit:
                record, tokens, state, rows, stopped, _ = static_step(model, tokens, state, encoder_out, rows, stopped,
                                                                      t, options, special)
            assert audit.total == 0, f"step {t}: {audit.report()}"
            chosen.append(record["token"])
            if t == 0:
                encoder_out = {k: v.repeat_interleave(4, dim=0) for k, v in encoder_out.items()}
    assert bool((chosen[0][0] == 4).all() | (record["score"][0] == -math.inf).all())  # the first slot of row 0


def test_a_search_step_with_a_prefix_compiles_as_one_graph():
    options, special = SearchOptions(beam_size=3, n_best=2, max_length=10), Specials(BOS, EOS, PAD)
    g = torch.Generator().manual_seed(1)
    prefix = torch.tensor([[3, 4], [NO_PREFIX, NO_PREFIX], [5, 6], [6, NO_PREFIX], [4, 4]])
    rows = RowState(torch.randn(5, 3, generator=g, dtype=torch.float64), torch.ones(5, dtype=torch.bool),
                    torch.zeros(5, dtype=torch.long), torch.full((5, 2), -5.0, dtype=torch.float64),
                    torch.zeros(5, dtype=torch.bool), None, None, prefix)
    log_probs = torch.log_softmax(torch.randn(15, 7, generator=g, dtype=torch.float64), -1)
    compiled = torch.compile(select_step, fullgraph=True)(log_probs, None, rows, 1, options, special)
    eager = select_step(log_probs, None, rows, 1, options, special)
    for name in ("chosen", "parent", "done"):
        assert torch.equal(getattr(compiled, name), getattr(eager, name)), name
    assert torch.equal(compiled.rows.scores, eager.rows.scores) and compiled.rows.prefix is not None
    live = torch.isfinite(eager.record["score"])
    for r, forced in ((0, 4), (2, 6), (4, 4)):
        assert bool((eager.chosen[r][live[r]] == forced).all()) and bool(live[r].any())
    assert not bool((eager.chosen[1][live[1]] == eager.chosen[1][0]).all())  # row 1 is free


# --- sampling --------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["dynamic", "static"])
@pytest.mark.parametrize("mapping", ["softmax", "entmax15"])
def test_samples_follow_the_distribution_given_the_prefix(mapping, mode):
    model = tiny_model(mapping, seed=3, scale=1.0)
    src, length = torch.tensor([[3, 4, 5, 6]]), torch.tensor([4])
    with torch.no_grad():
        first = reference_mapping(forward_logits(model, src, length, ()), mapping, {})
    forced = (int(first[3:].argmin()) + 3,) if mapping == "softmax" else (int(first[3:].argmax()) + 3,)
    exact = blocked_outcomes(model, src, length, mapping, max_length=4, prefix=forced)
    assert abs(sum(exact.values()) - 1) < 1e-9 and len(exact) > 5
    n = 20000
    options = SearchOptions(sample=True, n_best=n, max_length=4, seed=5, mode=mode)
    result = sample_search(model, src, length, SPECIAL, options, prefix=prefix_tensor([forced]))
    counts = Counter(outcome for outcome, _ in drawn(result))
    assert all(o[:len(forced)] == forced for o in counts)
    assert set(counts) <= {o for o, prob in exact.items() if prob > 0}, set(counts) - set(exact)
    assert_fits(counts, exact, n)

def test_sampled_scores_are_the_model_log_probabilities_and_a_mixed_batch_draws_as_alone():
    model = TinyAttentionRNN(mapping="entmax15", seed=7)
    src, lengths = random_sources(4, 13, 6, seed=8)
    prefixes = [[4, 5], [], [6], [3, 3, 3]]
    options = SearchOptions(sample=True, n_best=6, max_length=8, seed=2)
    ids = torch.arange(4)
    together = sample_search(model, src, lengths, SPECIAL, options, sentence_ids=ids, prefix=prefix_tensor(prefixes))
    for b in range(4):
        alone = sample_search(model, src[b:b + 1], lengths[b:b + 1], SPECIAL, options, sentence_ids=ids[b:b + 1],
                              prefix=prefix_tensor(prefixes[b:b + 1]))
        assert torch.equal(alone.lengths[0], together.lengths[b])
        for s in range(6):
            n = int(together.lengths[b, s])
            assert torch.equal(alone.tokens[0, s, :n], together.tokens[b, s, :n])
            if n:
                assert together.tokens[b, s, :len(prefixes[b])].tolist() == prefixes[b]
    checked = 0
    with torch.no_grad():  # the score of every sample: its tokens scored by the model step by step
        for b in range(4):
            for s in range(6):
                n = int(together.lengths[b, s])
                if n == 0:
                    assert float(together.scores[b, s]) == -math.inf
                    continue
                encoder_out, state = model.encode(src[b:b + 1], lengths[b:b + 1])
                total, prev = 0.0, BOS
                for tok in together.tokens[b, s, :n].tolist():
                    log_probs, _, state = model.step(torch.tensor([prev]), state, encoder_out)
                    total += float(log_probs[0, tok])
                    prev = tok
                assert float(together.scores[b, s]) == pytest.approx(total, abs=1e-5)
                checked += bool(prefixes[b])
    assert checked >= 6


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", range(2))
def test_cuda_static_search_with_prefixes_and_a_banned_token_equals_the_cpu(case):
    """On CUDA (the static loop, ``mode: auto`` there, its Triton step and masking) forced prefixes
    (given on the host, as nmt-translate passes them) and ``ban_unk_token`` give the CPU's dynamic
    loop's outputs, scores and certificates (float64 toy models: the devices agree to rounding)."""
    import copy

    make = [lambda: TinyAttentionRNN(mapping="entmax15", seed=2).double(),
            lambda: tiny_transformer(output="sparsemax", attention="entmax15", eos_bias=1.0, seed=2)][case]
    cpu_model = make()
    cuda_model = copy.deepcopy(cpu_model).to("cuda")
    src, lengths = random_sources(6, 9, 6, seed=case)
    kw = dict(bos=BOS, eos=EOS, pad=PAD, beam_size=3, n_best=3, max_length=8, max_length_ratio=1.0)
    free = beam_search(cpu_model, src, lengths, mode="dynamic", **kw)
    unk = int(free.tokens[free.tokens > EOS].mode().values)  # a token the outputs use, banned
    prefixes = []  # the first tokens of each sentence's second output (of its first), none every third
    for b in range(6):
        entry = 1 if int(free.lengths[b, 1]) > 1 else 0
        tokens = [t for t in free.tokens[b, entry, :int(free.lengths[b, entry])].tolist() if t not in (EOS, unk)]
        prefixes.append(tokens[:2] if b % 3 != 2 else [])
    prefix = prefix_tensor(prefixes)
    kw.update(unk=unk, ban_unk_token=True)
    cpu = beam_search(cpu_model, src, lengths, mode="dynamic", prefix=prefix, **kw)
    cuda = beam_search(cuda_model, src.cuda(), lengths, mode="auto", prefix=prefix, **kw)
    assert_same_result(cpu, type(cpu)(**{f: (v.cpu() if isinstance(v, torch.Tensor) else v)
                                          for f, v in vars(cuda).items()}))
    assert sum(int(n) > 0 for n in cpu.lengths[:, 0]) >= 3 and any(prefixes)  # outputs were found
