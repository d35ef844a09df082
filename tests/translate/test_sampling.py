"""Sampling (``SearchOptions.sample``) against independent truths.

* Exact distributions: on tiny nmt models (V = 6, at most 3 tokens before EOS) every outcome is
  enumerated by brute force, its probability computed from the teacher-forced logits of
  ``model.forward`` with the ``entmax`` package's mappings (not nmt's), temperature, top-k and
  top-p applied in Python; 20,000 samples must fit it (chi-square at significance 1e-4 over the
  cells expected >= 5 times, rarer ones pooled; total variation within its expectation bound plus
  0.015, a 1e-4 tail; fixed seed, so deterministic),
  never hold an outcome of probability zero, and score each outcome with its exact model log-probability.
* Temperature: ``tempered_step`` equals ``mapping(logits / T)`` of the forward logits, for every
  output mapping, and for an ensemble the mean of its members' tempered probabilities.
* Truncation: the support of top-k / top-p equals the brute-force set, ties included.
* Reproducibility: the same samples for batch sizes 1, 3, all, a shuffled batch and token
  batching; other seeds give other samples; the noise is lowbias32 bit for bit.
* Host syncs (``SyncAudit``) and ``torch.compile(fullgraph=True)`` of the step.
"""
from __future__ import annotations

import math
import random
from collections import Counter

import entmax
import numpy as np
import pytest
import torch
from scipy import stats

from nmt.data.field import Field
from nmt.data.tokenizers import CharTokenizer, SpaceTokenizer
from nmt.models import build_model
from nmt.translate.beam_search import beam_search
from nmt.translate.counter_noise import gumbel, mix32, row_keys, token_keys, uniform_bits
from nmt.translate.ensemble import Ensemble
from nmt.translate.sample_distribution import sampling_log_probs, tempered_step, top_k, top_p
from nmt.translate.sampling import SampleRows, sample_search, sample_step
from nmt.translate.search_options import SearchOptions
from nmt.translate.search_step import Specials
from nmt.translate.translator import Translator, TranslationSummary
from nmt.utils.sync_audit import SyncAudit
from toy_decoders import MarkovDecoder, TinyAttentionRNN, random_sources

PAD, BOS, EOS = 0, 1, 2
V, SRC_V = 6, 8
SPECIAL = Specials(BOS, EOS, PAD)


def model_config(mapping: str, params: dict | None = None) -> dict:
    """A tiny LSTM nmt model's config with output ``mapping``."""
    return {
        "type": "rnn",
        "embeddings": {"src_size": 4, "tgt_size": 4, "share": False, "tie_output": False, "dropout": 0.0},
        "encoder": {"type": "lstm", "layers": 1, "hidden_size": 6, "bidirectional": True, "dropout": 0.0},
        "decoder": {"type": "lstm", "layers": 1, "hidden_size": 6, "dropout": 0.0, "input_feeding": True,
                    "bridge": "linear"},
        "attention": {"score": "general", "mapping": "softmax", "params": {}, "continuous": None},
        "output": {"mapping": mapping, "params": params or {}},
    }


def tiny_model(mapping: str = "softmax", params: dict | None = None, seed: int = 0, scale: float = 3.0):
    """A random-weight LSTM nmt model with a 6-token target vocabulary and output ``mapping``."""
    torch.manual_seed(seed)
    model = build_model(model_config(mapping, params), SRC_V, V, PAD).eval()
    with torch.no_grad():
        model.generator.proj.weight.mul_(scale)
    return model


def reference_mapping(z: np.ndarray, mapping: str, params: dict) -> np.ndarray:
    """The output mapping by the ``entmax`` package / torch, in float64 (not nmt's code)."""
    x = torch.from_numpy(z).double()
    if mapping == "softmax":
        p = torch.softmax(x, -1)
    elif mapping == "sparsemax":
        p = entmax.sparsemax(x, -1)
    elif mapping == "entmax15":
        p = entmax.entmax15(x, -1)
    elif mapping == "entmax_bisect":
        p = entmax.entmax_bisect(x, alpha=params["alpha"], dim=-1, n_iter=200)
    else:
        raise ValueError(mapping)
    return p.numpy()


def truncate(q: np.ndarray, k: int, p: float) -> np.ndarray:
    """Brute-force top-k (ties kept) then top-p (the smallest prefix of the tokens by decreasing
    probability whose mass reaches p, ties with its last kept), renormalised."""
    q = q.copy()
    if 0 < k < len(q):
        kth = sorted(q, reverse=True)[k - 1]
        q[q < kth] = 0.0
    q = q / q.sum()
    if p < 1.0:
        mass, smallest = 0.0, None
        for v in sorted(range(len(q)), key=lambda i: -q[i]):
            if mass >= p:
                break
            smallest, mass = q[v], mass + q[v]
        q[q < smallest] = 0.0
        q = q / q.sum()
    return q


def forward_logits(model, src, length, prefix: tuple[int, ...]) -> np.ndarray:
    """The output scores after ``BOS prefix`` by teacher forcing (``model.forward``), float64."""
    tgt_in = torch.tensor([[BOS, *prefix]])
    with torch.no_grad():
        logits, _ = model(src, length, tgt_in)
    return logits[0, -1].double().numpy()


def exact_outcomes(model, src, length, mapping, params, *, max_length, temperature=1.0, k=0, p=1.0,
                   min_length=0) -> dict[tuple[int, ...], tuple[float, float]]:
    """Every outcome of sampling -> (its probability, its model log-probability): sequences ending
    in EOS, or cut at max_length where EOS has probability 0 (without EOS)."""
    out: dict[tuple[int, ...], tuple[float, float]] = {}

    def walk(prefix: tuple[int, ...], prob: float, score: float) -> None:
        z = forward_logits(model, src, length, prefix)
        model_p = reference_mapping(z, mapping, params)
        t = len(prefix)
        if t == max_length:  # only EOS may follow
            if model_p[EOS] > 0:
                out[prefix + (EOS,)] = (prob, score + math.log(model_p[EOS]))
            else:
                out[prefix] = (prob, score)
            return
        q = reference_mapping(z / temperature, mapping, params)
        if t < min_length:
            q[EOS] = 0.0
        q = truncate(q, k, p)
        for v in range(V):
            if q[v] <= 0:
                continue
            lp = math.log(model_p[v]) if model_p[v] > 0 else -math.inf
            if v == EOS:
                out[prefix + (EOS,)] = (prob * q[v], score + lp)
            else:
                walk(prefix + (v,), prob * q[v], score + lp)

    walk((), 1.0, 0.0)
    return out


def assert_fits(counts: Counter, exact: dict[tuple[int, ...], float], n: int) -> None:
    """Chi-square goodness of fit (at 1e-4) of ``counts`` of ``n`` draws to the outcome
    probabilities ``exact``: the outcomes expected at least 5 times each, the rest pooled."""
    big = [o for o, prob in exact.items() if prob * n >= 5]
    observed, expected = [counts[o] for o in big], [exact[o] * n for o in big]
    if n - sum(expected) >= 5:
        observed.append(n - sum(observed))
        expected.append(n - sum(expected))
    chi2 = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    assert chi2 < stats.chi2.ppf(1 - 1e-4, len(expected) - 1), (chi2, len(expected))


def drawn(result, sentence: int = 0) -> list[tuple[tuple[int, ...], float]]:
    """(outcome, score) of every sample of one sentence."""
    tokens, lengths, scores = result.tokens[sentence], result.lengths[sentence], result.scores[sentence]
    return [(tuple(tokens[s, : lengths[s]].tolist()), float(scores[s])) for s in range(tokens.size(0))]


CASES = [
    ("softmax", {}, dict()),
    ("sparsemax", {}, dict()),
    ("entmax15", {}, dict(min_length=1)),
    ("entmax_bisect", {"alpha": 1.3}, dict(temperature=0.7)),
    ("softmax", {}, dict(temperature=1.5, sample_topk=3)),
    ("entmax15", {}, dict(temperature=2.0, sample_topp=0.8)),
    ("softmax", {}, dict(sample_topk=4, sample_topp=0.7)),
]


@pytest.mark.parametrize("mapping,params,fields", CASES,
                         ids=[f"{m}-{'-'.join(f'{k}={v}' for k, v in f.items()) or 'plain'}" for m, _, f in CASES])
def test_samples_follow_the_exact_sequence_distribution(mapping, params, fields):
    model = tiny_model(mapping, params, seed=3)
    src, length = torch.tensor([[3, 4, 5, 6]]), torch.tensor([4])
    n, max_length = 20000, 3
    exact = exact_outcomes(model, src, length, mapping, params, max_length=max_length,
                           temperature=fields.get("temperature", 1.0), k=fields.get("sample_topk", 0),
                           p=fields.get("sample_topp", 1.0), min_length=fields.get("min_length", 0))
    assert abs(sum(prob for prob, _ in exact.values()) - 1) < 1e-9
    assert len(exact) > 8  # a distribution worth testing
    options = SearchOptions(sample=True, n_best=n, max_length=max_length, seed=11, **fields)
    samples = drawn(sample_search(model, src, length, SPECIAL, options))
    counts = Counter(outcome for outcome, _ in samples)
    # no sample of probability zero (outside the sparse support, or truncated away)
    assert set(counts) <= {o for o, (prob, _) in exact.items() if prob > 0}, set(counts) - set(exact)
    # each sample's score is its exact log-probability under the model (T = 1, no truncation)
    for outcome, score in samples[:500]:
        assert score == pytest.approx(exact[outcome][1], abs=2e-4)
    assert_fits(counts, {o: prob for o, (prob, _) in exact.items()}, n)  # goodness of fit
    # total variation: E[TV] <= B = sum_o sqrt(p_o (1 - p_o) / n) / 2 (Jensen), and TV moves by at most
    # 1/n per sample, so P(TV > B + 0.015) <= exp(-2 n 0.015^2) ~ 1e-4 (McDiarmid)
    tv = 0.5 * sum(abs(counts[o] / n - prob) for o, (prob, _) in exact.items())
    bound = 0.5 * sum(math.sqrt(prob * (1 - prob) / n) for prob, _ in exact.values())
    assert tv < bound + 0.015, (tv, bound)


def test_sparse_samples_stay_in_the_support_found_by_the_certified_search():
    """Every sample of a sparse model is among the sequences of nonzero probability that a
    certified beam search enumerates (a second, independent enumeration: nmt's own search)."""
    model = MarkovDecoder(mapping="sparsemax", seed=0)
    src, lengths = random_sources(4, 9, 5, seed=6)
    searched = beam_search(model, src, lengths, bos=BOS, eos=EOS, pad=PAD, beam_size=64, n_best=64, max_length=12)
    sampled = sample_search(model, src, lengths, SPECIAL, SearchOptions(sample=True, n_best=300, max_length=12))
    assert searched.certified.all()
    for b in range(4):
        scores = {outcome: score for outcome, score in drawn(searched, b) if outcome}  # the whole support
        samples = drawn(sampled, b)
        assert {o for o, _ in samples} <= set(scores)
        assert all(score == pytest.approx(scores[o], abs=1e-9) for o, score in samples)
        assert len({o for o, _ in samples}) > min(3, len(scores) - 1)


@pytest.mark.parametrize("mapping,params", [("softmax", {}), ("sparsemax", {}), ("entmax15", {}),
                                            ("entmax_bisect", {"alpha": 1.7})])
@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.5])
def test_temperature_divides_the_scores_before_the_mapping(mapping, params, temperature):
    model = tiny_model(mapping, params, seed=2)
    src, length = torch.tensor([[3, 7, 4]]), torch.tensor([3])
    encoder_out, state = model.encode(src, length)
    with torch.no_grad():
        log_probs, tempered, _, _ = tempered_step(model, torch.tensor([BOS]), state, encoder_out, temperature, False)
    z = forward_logits(model, src, length, ())
    want = reference_mapping(z / temperature, mapping, params)
    # tempered holds log-probabilities up to a per-row constant (softmax: z / T - max): renormalised
    got = torch.softmax(tempered[0].double(), -1).numpy()
    np.testing.assert_allclose(got, want, atol=2e-6)
    assert ((got > 0) == (want > 0)).all()  # the same support
    np.testing.assert_allclose(log_probs[0].double().exp().numpy(), reference_mapping(z, mapping, params), atol=2e-6)


def test_an_ensemble_samples_from_the_mean_of_its_tempered_members():
    members = [tiny_model("entmax15", seed=4), tiny_model("softmax", seed=5)]
    ensemble = Ensemble(members)
    src, length = torch.tensor([[3, 5]]), torch.tensor([2])
    encoder_out, state = ensemble.encode(src, length)
    with torch.no_grad():
        log_probs, tempered, _, _ = tempered_step(ensemble, torch.tensor([BOS]), state, encoder_out, 0.6, False)
    logits = [forward_logits(m, src, length, ()) for m in members]
    want = (reference_mapping(logits[0] / 0.6, "entmax15", {}) + reference_mapping(logits[1] / 0.6, "softmax", {})) / 2
    np.testing.assert_allclose(tempered[0].double().exp().numpy(), want, atol=2e-6)
    plain = (reference_mapping(logits[0], "entmax15", {}) + reference_mapping(logits[1], "softmax", {})) / 2
    np.testing.assert_allclose(log_probs[0].double().exp().numpy(), plain, atol=2e-6)


def test_temperature_needs_a_model_with_output_scores():
    model = TinyAttentionRNN()
    src, lengths = random_sources(1, 13, 3, seed=0)
    with pytest.raises(ValueError, match="^temperature 0.5 needs the model's output scores.*TinyAttentionRNN has none$"):
        sample_search(model, src, lengths, SPECIAL, SearchOptions(sample=True, temperature=0.5))


def brute_force_support(q: np.ndarray, k: int, p: float) -> set[int]:
    return {int(v) for v in np.flatnonzero(truncate(q, k, p) > 0)}


@pytest.mark.parametrize("k,p", [(1, 1.0), (3, 1.0), (0, 0.5), (0, 0.9), (4, 0.6), (0, 1e-9), (50, 0.999)])
def test_top_k_and_top_p_keep_the_brute_force_support(k, p):
    g = torch.Generator().manual_seed(k * 100 + int(p * 10))
    rows = [torch.randn(9, generator=g, dtype=torch.float64) * 2 for _ in range(30)]
    rows.append(torch.tensor([1.0, 1.0, 1.0, 0.5, 0.5, -math.inf, 2.0, 0.5, -math.inf], dtype=torch.float64))  # ties
    rows.append(torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64))  # all tied
    log_q = torch.log_softmax(torch.stack(rows), -1)  # (R, 9), -inf entries are zeros
    kept = torch.isfinite(sampling_log_probs(log_q, k, p))
    for r in range(log_q.size(0)):
        assert set(torch.nonzero(kept[r]).flatten().tolist()) == brute_force_support(log_q[r].exp().numpy(), k, p), r
    assert torch.equal(top_k(log_q, 0), log_q) and torch.equal(top_p(log_q, 1.0), log_q)


def test_the_noise_is_lowbias32_and_uniform():
    def lowbias32(x: int) -> int:
        x ^= x >> 16
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        return x ^ (x >> 16)

    rng = random.Random(0)
    xs = [0, 1, 0xFFFFFFFF] + [rng.getrandbits(32) for _ in range(2000)]
    assert mix32(torch.tensor(xs)).tolist() == [lowbias32(x) for x in xs]
    keys = row_keys(123, torch.arange(40), torch.zeros(40, dtype=torch.long))
    bits = uniform_bits(keys, 5, token_keys(1000, "cpu"))  # (40, 1000)
    u = (bits.double() + 0.5) / 2 ** 32
    assert stats.kstest(u.flatten().numpy(), "uniform").pvalue > 1e-4
    assert bits.unique().numel() > 0.999 * bits.numel()
    g = gumbel(bits).double().flatten().numpy()
    assert stats.kstest(g, "gumbel_r").pvalue > 1e-4
    assert np.isfinite(g).all()


def sample_tokens(result) -> dict[tuple[int, int], tuple[tuple[int, ...], float]]:
    out = {}
    for b in range(result.tokens.size(0)):
        for s, item in enumerate(drawn(result, b)):
            out[b, s] = item
    return out


def test_samples_do_not_depend_on_the_batch():
    model = tiny_model("entmax15", seed=8, scale=2.0)
    src, lengths = random_sources(7, SRC_V, 5, seed=9)
    options = SearchOptions(sample=True, n_best=4, max_length=8, seed=5, temperature=1.3)
    whole = sample_tokens(sample_search(model, src, lengths, SPECIAL, options))
    for size in (1, 3):
        for start in range(0, 7, size):
            ids = torch.arange(start, min(start + size, 7))
            part = sample_tokens(sample_search(model, src[ids], lengths[ids], SPECIAL, options, sentence_ids=ids))
            for (b, s), item in part.items():
                assert item[0] == whole[int(ids[b]), s][0]
                assert item[1] == pytest.approx(whole[int(ids[b]), s][1], abs=1e-5)
    order = torch.tensor([4, 0, 6, 2, 5, 1, 3])
    shuffled = sample_tokens(sample_search(model, src[order], lengths[order], SPECIAL, options, sentence_ids=order))
    assert {(int(order[b]), s): item[0] for (b, s), item in shuffled.items()} == {k: v[0] for k, v in whole.items()}
    assert len({v[0] for v in whole.values()}) > 7  # the samples differ


def test_the_seed_fixes_the_samples():
    model = tiny_model("softmax", seed=8)
    src, lengths = random_sources(5, SRC_V, 5, seed=9)
    runs = {seed: sample_tokens(sample_search(model, src, lengths, SPECIAL,
                                              SearchOptions(sample=True, n_best=3, max_length=6, seed=seed)))
            for seed in (0, 1, 2 ** 40)}
    again = sample_tokens(sample_search(model, src, lengths, SPECIAL,
                                        SearchOptions(sample=True, n_best=3, max_length=6, seed=1)))
    assert again == runs[1]
    assert runs[0] != runs[1] and runs[1] != runs[2 ** 40]


def fields() -> tuple[Field, Field]:
    src = Field.build(SpaceTokenizer(), ["a b c d e"])
    tgt = Field.build(CharTokenizer(), ["abc"])
    return src, tgt


def test_translator_samples_do_not_depend_on_batching_and_are_not_certified():
    src_field, tgt_field = fields()
    cfg_vocab = (len(src_field.vocab), len(tgt_field.vocab))
    model = build_model(model_config("entmax15"), *cfg_vocab, tgt_field.vocab.pad_index).eval()
    with torch.no_grad():
        model.generator.proj.weight.mul_(3)
    lines = ["a b", "c d e a", "", "e", "b b c", "d a", "c"]
    kw = dict(sample=True, n_best=3, max_length=6, seed=3, return_support=True)
    runs = [Translator(model, src_field, tgt_field, batch_size=size, batch_type=kind, **kw).translate(lines)
            for size, kind in ((1, "sentences"), (3, "sentences"), (64, "sentences"), (7, "tokens"))]
    for other in runs[1:]:
        assert [t.hypotheses for t in other] == [t.hypotheses for t in runs[0]]
    first = runs[0]
    assert [t.reason for t in first] == ["sampled", "sampled", "empty_input", "sampled", "sampled", "sampled", "sampled"]
    assert not any(t.certified for t in first)
    assert all(len(t.hypotheses) == 3 for i, t in enumerate(first) if i != 2)
    # a stream translated in pieces: indices from the stream's start give the same samples
    pieces = Translator(model, src_field, tgt_field, batch_size=2, **kw)
    streamed = pieces.translate(lines[:4]) + pieces.translate(lines[4:], first_index=4)
    assert [t.hypotheses for t in streamed] == [t.hypotheses for t in first]
    assert [t.index for t in streamed] == list(range(7))
    summary = TranslationSummary.of(first)
    assert summary.certified_percent is None and summary.sampled
    assert "sampled, not certified" in summary.line()
    assert first[0].report()["reason"] == "sampled" and first[0].report()["certified"] is False


@pytest.mark.parametrize(
    "fields,message",
    [
        (dict(temperature=0.7), r"^temperature applies to sampling only \(sample=True\), got 0.7$"),
        (dict(sample_topk=5), r"^sample_topk applies to sampling only"),
        (dict(sample_topp=0.9), r"^sample_topp applies to sampling only"),
        (dict(sample=True, temperature=0.0), r"^temperature must be a finite number > 0 \(sampling at temperature 0 would be greedy.*, got 0.0$"),
        (dict(sample=True, temperature=math.inf), r"^temperature must be a finite number > 0"),
        (dict(sample=True, sample_topp=1.5), r"^sample_topp must be in \(0, 1\], got 1.5$"),
        (dict(sample=True, sample_topp=0.0), r"^sample_topp must be in \(0, 1\], got 0.0$"),
        (dict(sample=True, sample_topp=math.nan), r"^sample_topp must be in \(0, 1\], got nan$"),
        (dict(sample=True, sample_topk=-1), r"^sample_topk must be >= 0"),
        (dict(sample=True, seed=-1), r"^seed must be in \[0, 2\^64\), got -1$"),
        (dict(sample=True, seed=1.5), r"^seed must be an integer"),
        (dict(sample=True, length_penalty="gnmt"), r"^length_penalty must be none with sample=True"),
        (dict(sample="yes"), r"^sample must be True or False"),
    ],
)
def test_invalid_sampling_options_name_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        SearchOptions(**fields)


def test_beam_search_with_sample_true_samples():
    model = tiny_model("sparsemax", seed=1)
    src, lengths = random_sources(3, SRC_V, 4, seed=2)
    options = SearchOptions(sample=True, n_best=2, max_length=5, seed=9)
    via_search = beam_search(model, src, lengths, bos=BOS, eos=EOS, pad=PAD, options=options)
    direct = sample_search(model, src, lengths, SPECIAL, options)
    assert torch.equal(via_search.tokens, direct.tokens) and via_search.reason_names() == ["sampled"] * 3


def test_length_limits_end_or_cut_samples_as_beam_search_does():
    """At max_length (or a sentence's ratio limit) a sample ends with EOS where the model gives it
    nonzero probability (that probability in its score), else it is cut without EOS."""
    model = TinyAttentionRNN(mapping="sparsemax", seed=3, scale=4.0)
    src, lengths = random_sources(6, 13, 6, seed=4)
    options = SearchOptions(sample=True, n_best=40, max_length=3, max_length_ratio=0.5, max_length_offset=1)
    result = sample_search(model, src, lengths, SPECIAL, options)
    limits = options.length_limits(lengths)
    for b in range(6):
        for s in range(40):
            n = int(result.lengths[b, s])
            if bool(result.complete[b, s]):
                assert int(result.tokens[b, s, n - 1]) == EOS and n - 1 <= int(limits[b])
            elif n:
                assert n == int(limits[b]) and EOS not in result.tokens[b, s, :n].tolist()
    assert bool(result.complete.any())


def test_sample_step_makes_no_host_sync_and_the_loop_syncs_once_per_stop_every_steps():
    g = torch.Generator().manual_seed(0)
    log_probs = torch.log(entmax.entmax15(torch.randn(12, 9, generator=g) * 3, -1))
    tempered = torch.log(entmax.entmax15(torch.randn(12, 9, generator=g), -1))
    rows = SampleRows.start(12, torch.device("cpu"))
    keys = row_keys(4, torch.arange(12), torch.zeros(12, dtype=torch.long))
    options = SearchOptions(sample=True, n_best=1, temperature=0.8, sample_topk=5, sample_topp=0.9, min_length=2,
                            return_support=True, return_attention=True)
    with SyncAudit() as audit:
        step = sample_step(log_probs, tempered, torch.rand(12, 4, generator=g), rows, keys, token_keys(9, "cpu"),
                           1, options, SPECIAL, torch.arange(12) % 3 == 0)
    assert audit.total == 0, audit.report()
    final = torch.arange(12) % 3 == 0
    ends = torch.where(torch.isfinite(log_probs[:, EOS]), EOS, PAD)  # EOS where it has nonzero probability
    assert torch.equal(step.token[final], ends[final]) and torch.equal(step.rows.cut, final & (ends == PAD))
    assert not bool(step.rows.alive[final].any())

    model = TinyAttentionRNN(mapping="entmax15", seed=7)
    src, lengths = random_sources(5, 13, 6, seed=8)
    for every in (1, 3):
        with SyncAudit() as audit:
            r = sample_search(model, src, lengths, SPECIAL,
                              SearchOptions(sample=True, n_best=3, max_length=12, stop_every=every,
                                            mode="static"))  # the accelerator loop (auto: dynamic on the CPU)
        assert set(audit.counts) <= {"Tensor.__bool__"}, audit.report()
        assert audit.total <= math.ceil(r.steps / every), audit.report()


def test_sample_step_compiles_as_one_graph():
    g = torch.Generator().manual_seed(1)
    log_probs = torch.log_softmax(torch.randn(6, 11, generator=g), -1)
    tempered = torch.log(entmax.sparsemax(torch.randn(6, 11, generator=g) * 2, -1))
    rows = SampleRows.start(6, torch.device("cpu"))
    keys = row_keys(7, torch.arange(6), torch.arange(6))
    options = SearchOptions(sample=True, sample_topk=4, sample_topp=0.8, min_length=3)
    args = (log_probs, tempered, None, rows, keys, token_keys(11, "cpu"), 2, options, SPECIAL, torch.arange(6) == 2)
    eager = sample_step(*args)
    compiled = torch.compile(sample_step, fullgraph=True)(*args)
    assert torch.equal(compiled.token, eager.token)
    assert torch.equal(compiled.rows.score, eager.rows.score) and torch.equal(compiled.rows.alive, eager.rows.alive)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_draws_the_cpus_noise_and_samples():
    keys = row_keys(2 ** 33 + 5, torch.arange(50), torch.arange(50) % 4)
    bits = uniform_bits(keys, 7, token_keys(3000, "cpu"))
    on_gpu = uniform_bits(keys.cuda(), 7, token_keys(3000, "cuda"))
    assert torch.equal(on_gpu.cpu(), bits)  # integer operations: the same bits
    src_field, tgt_field = fields()
    model = build_model(model_config("entmax15"), len(src_field.vocab), len(tgt_field.vocab),
                        tgt_field.vocab.pad_index).eval()
    lines = ["a b", "c d e a", "e", "b b c", "d a"]
    kw = dict(sample=True, n_best=3, max_length=6, seed=3)
    cpu = Translator(model, src_field, tgt_field, device="cpu", **kw).translate(lines)
    gpu = Translator(model.cuda(), src_field, tgt_field, device="cuda", **kw).translate(lines)
    assert [[h for h, _ in t.hypotheses] for t in gpu] == [[h for h, _ in t.hypotheses] for t in cpu]
