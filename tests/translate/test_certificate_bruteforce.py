"""The certificate against brute-force enumeration of every nonzero-probability sequence."""
from __future__ import annotations

import math
import sys

import pytest
import torch

import nmt.translate.search_step as step_module
import nmt.utils.topk as topk_module
from nmt.translate.beam_search import beam_search
from nmt.translate.length_penalty import length_penalty
from toy_decoders import (BOS, EOS, PAD, MarkovDecoder, TinyAttentionRNN, copy_table, enumerate_support,
                          random_sources, tiny_transformer)

MAX_LENGTH = 6
MODES = [dict(mode="dynamic"), dict(mode="static", stop_every=3)]  # both loops obey the certificate
MODE_IDS = ["dynamic", "static"]


def found_hypotheses(result, b: int) -> dict[tuple[int, ...], float]:
    out = {}
    for i in range(result.tokens.size(1)):
        if result.complete[b, i]:
            n = int(result.lengths[b, i])
            out[tuple(result.tokens[b, i, :n].tolist())] = float(result.scores[b, i])
    return out


def predicted_certificate(frontier: list[int], cut: bool, beam_size: int, support: dict,
                          max_length: int = MAX_LENGTH) -> tuple[bool, str | None]:
    """Without pruning, the candidates of step t are all nonzero prefixes of length t+1; a search
    that found no sequence of nonzero probability certifies nothing."""
    if any(count > beam_size for count in frontier[:max_length]):
        return False, "pruned"
    if cut:
        return False, "max_length"
    if not support:
        return False, "no_hypothesis"
    return True, None


def rank(seq: tuple[int, ...], logprob: float, penalty: str) -> float:
    return logprob / float(length_penalty(penalty, len(seq), 0.6))


MODELS = {  # name -> (output mapping, model parameters); "loop" models rarely end before max_length
    "sparsemax": ("sparsemax", dict(scale=1.0, eos_bonus=0.8)),
    "entmax15": ("entmax15", dict(scale=2.0, eos_bonus=1.5)),
    "sparsemax-loop": ("sparsemax", dict(scale=1.0, eos_bonus=0.15)),
    "entmax15-loop": ("entmax15", dict(scale=2.0, eos_bonus=0.3)),
}
CASES = [  # (model, seed, length penalty, min_length)
    ("sparsemax", 0, "none", 0),
    ("sparsemax", 1, "average", 0),
    ("sparsemax", 2, "gnmt", 2),
    ("entmax15", 0, "average", 0),
    ("entmax15", 1, "none", 0),
    ("entmax15", 2, "gnmt", 2),
    ("sparsemax-loop", 3, "none", 0),
    ("entmax15-loop", 4, "average", 1),
]
N_SOURCES = 8
beam_search_module = sys.modules["nmt.translate.beam_search"]  # the package exports a function of that name
_ENUMERATIONS: dict = {}


def model_and_sources(name: str, seed: int):
    mapping, params = MODELS[name]
    model = MarkovDecoder(vocab=7, mapping=mapping, seed=seed, **params)
    src, lengths = random_sources(N_SOURCES, 9, 5, seed=seed + 7)
    return model, src, lengths


def enumeration(mapping: str, seed: int, b: int, min_length: int):
    key = (mapping, seed, b, min_length)
    if key not in _ENUMERATIONS:
        model, src, lengths = model_and_sources(mapping, seed)
        _ENUMERATIONS[key] = enumerate_support(model, src[b], lengths[b], MAX_LENGTH, min_length)
    return _ENUMERATIONS[key]


def search_against_enumeration(mapping: str, seed: int, penalty: str, min_length: int, **search):
    """Beam search every toy source with beam sizes 1, 2, 4, 8 and check each sentence against the
    brute force; yields ``(beam_size, keywords, result)`` for further checks."""
    model, src, lengths = model_and_sources(mapping, seed)
    for beam_size in (1, 2, 4, 8):
        kw = dict(bos=BOS, eos=EOS, beam_size=beam_size, n_best=200, max_length=MAX_LENGTH,
                  min_length=min_length, length_penalty=penalty)
        result = beam_search(model, src, lengths, **kw, **search)
        names = result.reason_names()
        for b in range(N_SOURCES):
            support, frontier, cut = enumeration(mapping, seed, b, min_length)
            check_against_enumeration(result, names, b, support, frontier, cut, beam_size, penalty)
        yield (model, src, lengths), kw, result


@pytest.mark.parametrize("selection", ["native", "torch"])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("mapping,seed,penalty,min_length", CASES)
def test_certificate_matches_enumeration(mapping, seed, penalty, min_length, mode, selection, monkeypatch):
    """Candidates selected by the native pass (the CPU's) and by torch.topk (accelerators,
    compiled steps, no native library)."""
    if selection == "torch":
        monkeypatch.setattr(step_module, "step_candidates", lambda *args: None)
    for _ in search_against_enumeration(mapping, seed, penalty, min_length, **mode):
        pass


@pytest.mark.parametrize("block", [2, 3])
@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("mapping,seed,penalty,min_length", CASES[::2])
def test_certificate_matches_enumeration_with_blocked_topk(mapping, seed, penalty, min_length, mode, block,
                                                           monkeypatch):
    """The torch candidate selection through block maxima (``nmt.utils.topk``, used on real
    vocabularies where the native pass is not: accelerators, compiled steps) forced onto the toy
    vocabulary with blocks of 2 and 3 entries (a shorter last block included): the same
    certificates and hypotheses as the brute force."""
    monkeypatch.setattr(step_module, "step_candidates", lambda *args: None)
    monkeypatch.setattr(topk_module, "BLOCK", block)
    monkeypatch.setattr(topk_module, "MIN_BLOCKS_PER_K", 1)
    for _ in search_against_enumeration(mapping, seed, penalty, min_length, **mode):
        pass


@pytest.mark.parametrize("buckets", ["default", "never", "threes"])
@pytest.mark.parametrize("mapping,seed,penalty,min_length", CASES[1::2])
def test_certificate_matches_enumeration_with_coarse_compaction(mapping, seed, penalty, min_length, buckets,
                                                                monkeypatch):
    """The dynamic loop keeps finished sentences in the batch (stopped: probability-0 prefixes)
    until the live ones fit a smaller batch size: its own sizes (1, 2, 3, 4, 6, 8), none (the batch
    never shrinks) or multiples of 3. Certificates and hypotheses as the brute force, and as the
    static loop."""
    if buckets != "default":
        size = (lambda rows: 10 ** 9) if buckets == "never" else (lambda rows: -(-rows // 3) * 3)
        monkeypatch.setattr(beam_search_module, "bucket_size", size)
    for (model, src, lengths), kw, result in search_against_enumeration(mapping, seed, penalty, min_length,
                                                                         mode="dynamic"):
        static = beam_search(model, src, lengths, mode="static", **kw)
        for name in ("tokens", "lengths", "exact", "reason", "n_nonzero"):
            assert torch.equal(getattr(result, name), getattr(static, name)), name


def test_bucket_sizes():
    sizes = [beam_search_module.bucket_size(n) for n in range(0, 50)]
    assert sizes[:10] == [1, 1, 2, 3, 4, 6, 6, 8, 8, 12] and sizes[33] == 48 and sizes[49] == 64
    assert all(n <= s <= max(1.5 * n, 1) for n, s in enumerate(sizes))


def check_against_enumeration(result, names, b, support, frontier, cut, beam_size, penalty,
                              max_length: int = MAX_LENGTH) -> None:
    """Sentence b of a beam search result against the brute-force support of its model, enumerated
    up to ``max_length`` tokens before EOS."""
    exact, reason = predicted_certificate(frontier, cut, beam_size, support, max_length)
    assert bool(result.exact[b]) == exact
    assert names[b] == reason
    found = found_hypotheses(result, b)
    # sound in every case: what is found has the enumerated probability
    for seq, logprob in found.items():
        assert seq in support
        assert logprob == pytest.approx(support[seq], abs=1e-9)
    assert int(result.n_nonzero[b]) == len(found) <= len(support)
    mass = math.fsum(math.exp(v) for v in found.values())
    assert float(result.mass[b]) == pytest.approx(mass, abs=1e-9)
    if exact:
        assert set(found) == set(support) and support
        best = max(rank(s, v, penalty) for s, v in support.items())
        assert float(result.ranking_scores[b, 0]) == pytest.approx(best, abs=1e-9)
        first = tuple(result.tokens[b, 0, : int(result.lengths[b, 0])].tolist())
        assert rank(first, support[first], penalty) == pytest.approx(best, abs=1e-9)
    elif set(found) == set(support):
        # all sequences were found by luck, but a candidate was still dropped or cut, or
        # there is no sequence of nonzero probability at all (nothing to certify)
        assert reason in ("pruned", "max_length") or (reason == "no_hypothesis" and not support)


TRANSFORMER_CASES = [  # (output mapping, attention mapping + params [+ continuous cross-attention], eos bias, seed, penalty
    #  [, model.transformer.positions: sinusoidal where absent [, more model.transformer keys]])
    ("sparsemax", ("entmax15", {}), 1.0, 0, "none"),
    ("entmax15", ("softmax", {}), 1.5, 1, "average"),
    ("entmax15", ("entmax_bisect", {"alpha": "learned"}), 1.5, 2, "gnmt"),
    ("sparsemax", ("sparsemax", {}), 0.0, 1, "none"),
    ("entmax15", ("entmax15", {}, {"alpha": 2, "num_basis_mu": 4}), 1.5, 3, "average"),  # + continuous cross
    ("sparsemax", ("entmax15", {}), 1.0, 0, "none", "rotary"),  # rotary positions (rotated key caches)
    ("entmax15", ("softmax", {}), 1.5, 1, "gnmt", "rotary"),
    ("entmax15", ("entmax15", {}), 1.5, 2, "average", "relative"),  # Shaw relative keys / values
    ("sparsemax", ("entmax15", {}), 1.0, 0, "none", "alibi"),  # ALiBi biases (step bias from the cache length)
    ("entmax15", ("softmax", {}), 1.5, 1, "gnmt", "alibi"),
    ("sparsemax", ("entmax15", {}), 1.0, 0, "none", "alibi-split"),  # the direction-aware ALiBi encoder
    ("entmax15", ("entmax15", {}), 1.5, 4, "average", "rotary", {"activation": "swiglu", "layer_norm": "rms"}),
    ("sparsemax", ("softmax", {}), 1.0, 5, "none", "sinusoidal", {"activation": "geglu", "norm": "post"}),
]


def certificates_against_enumeration(model, src, lengths, penalty: str, mode: dict) -> set:
    """Beam search every source with beam sizes 1, 2, 4 and check each sentence against the brute
    force of ``model``; returns the reasons seen (None: certified)."""
    enumerations = [enumerate_support(model, src[b], lengths[b], MAX_LENGTH) for b in range(src.size(0))]
    reasons = set()
    for beam_size in (1, 2, 4):
        result = beam_search(model, src, lengths, bos=BOS, eos=EOS, beam_size=beam_size, n_best=200,
                             max_length=MAX_LENGTH, length_penalty=penalty, **mode)
        names = result.reason_names()
        reasons.update(names)
        for b, (support, frontier, cut) in enumerate(enumerations):
            check_against_enumeration(result, names, b, support, frontier, cut, beam_size, penalty)
    return reasons


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("output,attention,eos_bias,seed,penalty,positions,transformer",
                         [(*case, "sinusoidal", {})[:7] if len(case) == 5 else (*case, {})[:7]
                          for case in TRANSFORMER_CASES])
def test_certificate_on_a_tiny_transformer(output, attention, eos_bias, seed, penalty, positions, transformer, mode):
    """The same brute-force check on nmt's Transformer (incremental decoding with kv caches; gated
    feed-forward blocks and RMSNorm in two cases)."""
    model = tiny_transformer(output=output, attention=attention[0], attention_params=attention[1],
                             eos_bias=eos_bias, seed=seed, continuous=attention[2] if len(attention) > 2 else None,
                             positions=positions, transformer=transformer)
    src, lengths = random_sources(N_SOURCES, 9, 5, seed=seed + 7)
    reasons = certificates_against_enumeration(model, src, lengths, penalty, mode)
    assert None in reasons  # some sentences are certified exact


def tiny_lstm(output: str, seed: int, eos_bias: float, copy: bool = True, coverage: bool = False):
    """nmt's LSTM (Seq2Seq) with a copying output (``model.output.copy``) and / or coverage attention
    (``model.attention.coverage``), random weights scaled up so that the sparse mappings have zeros,
    PAD/BOS barred and EOS favoured so that sequences end."""
    from nmt.models import build_model

    cfg = {"embeddings": {"src_size": 6, "tgt_size": 6, "share": False, "tie_output": False, "dropout": 0.0},
           "encoder": {"type": "lstm", "layers": 1, "hidden_size": 8, "bidirectional": True, "dropout": 0.0},
           "decoder": {"type": "lstm", "layers": 1, "hidden_size": 6, "dropout": 0.0, "input_feeding": True,
                       "bridge": "linear"},
           "attention": {"score": "general", "mapping": "entmax15", "params": {}, "continuous": None,
                         "coverage": coverage},
           "output": {"mapping": output, "params": {}, "copy": copy}}
    torch.manual_seed(seed)
    model = build_model(cfg, 9, 7, PAD).to(torch.float64).eval()
    if copy:
        model.generator.copy.set_vocabularies(copy_table(9, 7))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(10)
        model.generator.proj.weight.mul_(0.3)
        model.generator.proj.bias[PAD] = model.generator.proj.bias[BOS] = -1e4
        model.generator.proj.bias[EOS] = eos_bias
    return model


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("kind,output,seed,penalty,eos_bias", [
    ("lstm", "sparsemax", 0, "none", 1.5), ("lstm", "entmax15", 1, "average", 3.0), ("lstm", "entmax15", 2, "gnmt", 2.0),
    ("transformer", "sparsemax", 0, "average", 5.0), ("transformer", "entmax15", 1, "none", 5.0),
])
def test_certificate_of_a_copying_model(kind, output, seed, penalty, eos_bias, mode):
    """A model that copies source tokens (its token distribution the joint mapping's marginal):
    the same brute-force check, sentences certified and not, some outputs copied."""
    model = (tiny_lstm(output, seed, eos_bias) if kind == "lstm"
             else tiny_transformer(output=output, eos_bias=eos_bias, seed=seed, copy=True))
    src, lengths = random_sources(N_SOURCES, 9, 5, seed=seed + 7)
    reasons = certificates_against_enumeration(model, src, lengths, penalty, mode)
    assert {None, "pruned"} <= reasons
    with torch.no_grad():  # the copies carry mass: the first step's joint distribution puts some on the source
        scores, _ = model(src, lengths, torch.full((N_SOURCES, 1), BOS))
        assert bool((model.generator.mapping(scores, dim=-1)[..., 7:] > 0).any())


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("output,seed,penalty,eos_bias,copy", [
    ("sparsemax", 0, "none", 1.25, False), ("entmax15", 4, "average", 3.0, False), ("entmax15", 2, "gnmt", 2.5, True),
])
def test_certificate_of_a_model_with_coverage_attention(output, seed, penalty, eos_bias, copy, mode):
    """Coverage attention (model.attention.coverage): the coverage travels in the decoder state, which
    the searches reorder with their hypotheses; the same brute-force check (with a copying output
    too), sentences certified and not."""
    model = tiny_lstm(output, seed, eos_bias, copy=copy, coverage=True)
    src, lengths = random_sources(N_SOURCES, 9, 5, seed=seed + 7)
    reasons = certificates_against_enumeration(model, src, lengths, penalty, mode)
    assert {None, "pruned"} <= reasons


def test_enumeration_cases_are_not_vacuous():
    """The cases above contain exact and non-exact sentences, for both reasons."""
    seen = set()
    for mapping, seed, _, min_length in CASES:
        for b in range(N_SOURCES):
            support, frontier, cut = enumeration(mapping, seed, b, min_length)
            for beam_size in (1, 2, 4, 8):
                seen.add(predicted_certificate(frontier, cut, beam_size, support)[1])
    assert seen == {None, "pruned", "max_length", "no_hypothesis"}


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_nbest_order_is_ranking_order(mode):
    model, src, lengths = model_and_sources("entmax15", 0)
    for penalty in ("none", "average", "gnmt"):
        r = beam_search(model, src, lengths, bos=BOS, eos=EOS, beam_size=4, n_best=10, max_length=MAX_LENGTH,
                        length_penalty=penalty, **mode)
        valid = torch.isfinite(r.ranking_scores)
        diffs = r.ranking_scores[:, :-1] - r.ranking_scores[:, 1:]
        assert bool((diffs[valid[:, 1:]] >= 0).all())
        expected = r.scores / length_penalty(penalty, r.lengths, 0.6)
        assert torch.allclose(r.ranking_scores[valid], expected[valid])


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
def test_softmax_output_is_never_exact_when_vocabulary_exceeds_beam(mode):
    model = TinyAttentionRNN(vocab=11, mapping="softmax")
    src, lengths = random_sources(5, 13, 6, seed=2)
    result = beam_search(model, src, lengths, bos=BOS, eos=EOS, beam_size=5, max_length=8, **mode)
    assert not bool(result.exact.any())
    assert result.reason_names() == ["pruned"] * 5
    # every returned hypothesis is complete or cut, and has a finite log-probability
    assert bool(torch.isfinite(result.scores[:, 0]).all())


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("max_length", [0, 1, 3])
def test_beam_wider_than_vocabulary_and_short_limits(max_length, mode):
    """k > V (fewer candidates than slots) and max_length 0: still exact and complete."""
    model = MarkovDecoder(vocab=4, mapping="entmax15", scale=0.5, eos_bonus=0.3, seed=5)
    src, lengths = random_sources(4, 9, 5, seed=5)
    r = beam_search(model, src, lengths, bos=BOS, eos=EOS, beam_size=8, n_best=50, max_length=max_length, **mode)
    for b in range(4):
        support, frontier, cut = enumerate_support(model, src[b], lengths[b], max_length)
        assert bool(r.exact[b]) == (not cut)
        found = found_hypotheses(r, b)
        assert set(found) == set(support)
        for seq, logprob in found.items():
            assert logprob == pytest.approx(support[seq], abs=1e-9)
