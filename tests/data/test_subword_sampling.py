"""Subword sampling (sentencepiece sampling, BPE-dropout) against independent truths: the
deterministic limits, round trips, the model's pieces, reproducibility across processes, the
distributions sentencepiece and subword-nmt define (chi-square at a fixed seed), per-epoch length
limits."""
from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import random
from random import Random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import chi2, chi2_contingency

import subword_nmt.apply_bpe as apply_bpe
from nmt.data import DataError, build_tokenizer
from nmt.data.epoch_segmentation import ResampledPairs
from nmt.data.field import Field
from nmt.data import subword_sampling
from nmt.data.subword_sampling import (MAX_ENUMERATED_POSITIONS, MAX_EXACT_CHARACTERS, BPEDropoutSampler,
                                       SentencePieceSampler, build_sampler, epoch_random)
from nmt.data.vocabulary import Vocabulary

SYLLABLES = ["ka", "ro", "mi", "sel", "tan", "bu", "ler", "ön", "st", "ei", "ung", "pa", "do", "ri", "ve"]


def corpus(n: int = 600, seed: int = 0) -> list[str]:
    """Lines of words made of syllables (many segmentations per word), a few long words."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(1500)]
    words += ["counterrevolutionaries", "unbelievably", "a"]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(1, 9))) for _ in range(n)]


CORPUS = corpus()


@pytest.fixture(scope="module")
def spm():
    tok = build_tokenizer({"type": "sentencepiece", "vocab_size": 250, "model_type": "unigram"})
    tok.train(CORPUS)
    return tok


@pytest.fixture(scope="module")
def bpe():
    tok = build_tokenizer({"type": "bpe", "merges": 80, "min_frequency": 2})
    tok.train(CORPUS)
    return tok


def sp_pieces(tok) -> dict[str, float]:
    """The normal pieces of a sentencepiece model with their scores."""
    sp = tok._processor()
    return {sp.id_to_piece(i): sp.get_score(i) for i in range(sp.get_piece_size())
            if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i))}


# (a) the deterministic limits ---------------------------------------------------------------------

def test_sentencepiece_nbest_1_is_the_deterministic_segmentation(spm):
    sampler = SentencePieceSampler(spm, alpha=0.5, nbest=1)
    for n, line in enumerate(CORPUS):
        assert sampler.sample(line, Random(n)) == spm.tokenize(line)


def test_sentencepiece_large_alpha_concentrates_on_the_best_segmentation(spm):
    sampler = SentencePieceSampler(spm, alpha=1000.0, nbest=-1)
    assert all(sampler.sample(line, Random(n)) == spm.tokenize(line) for n, line in enumerate(CORPUS[:100]))


def test_bpe_dropout_0_is_the_deterministic_segmentation(bpe):
    sampler = BPEDropoutSampler(bpe, 0.0)
    long_line = "counterrevolutionaries unbelievably " + "x" * 30
    for n, line in enumerate(CORPUS + [long_line]):
        assert sampler.sample(line, Random(n)) == bpe.tokenize(line)


# (b) round trips and the model's pieces -------------------------------------------------------------

@pytest.mark.parametrize("alpha,nbest", [(0.1, -1), (0.0, -1), (0.5, 8)])
def test_sentencepiece_samples_detokenize_to_the_text_and_use_model_pieces(spm, alpha, nbest):
    sampler = SentencePieceSampler(spm, alpha=alpha, nbest=nbest)
    pieces = sp_pieces(spm)
    varied = 0
    for n, line in enumerate(CORPUS):
        sample = sampler.sample(line, Random(n))
        assert spm.detokenize(sample) == line
        assert set(sample) <= set(pieces), set(sample) - set(pieces)
        varied += sample != spm.tokenize(line)
    assert varied > len(CORPUS) // 4


def bpe_symbols(tok) -> set[str]:
    """Every symbol a BPE segmentation may hold: characters and the merges' results (no </w>)."""
    merged = {a + b for a, b in tok._bpe.bpe_codes}
    return {s[:-4] if s.endswith("</w>") else s for s in merged} | set("".join(CORPUS)) | {""}


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_bpe_dropout_samples_detokenize_to_the_text_and_use_merge_symbols(bpe, p):
    sampler = BPEDropoutSampler(bpe, p)
    symbols = bpe_symbols(bpe)
    varied = 0
    for n, line in enumerate(CORPUS):
        sample = sampler.sample(line, Random(n))
        assert bpe.detokenize(sample) == line
        assert all(t.removesuffix("@@") in symbols for t in sample)
        varied += sample != bpe.tokenize(line)
    assert varied > len(CORPUS) // 4


# (c) variation between epochs, reproducibility across runs and processes ------------------------------

def _fields(tok) -> tuple[Field, Field]:
    field = Field.build(tok, CORPUS)
    return field, field


def _segmentation_digest(kind: str, seed: int, epoch: int) -> str:
    tok = build_tokenizer({"type": "sentencepiece", "vocab_size": 250} if kind == "sentencepiece"
                          else {"type": "bpe", "merges": 80})
    tok.train(CORPUS)
    src, tgt = _fields(tok)
    settings = {"alpha": 0.2, "nbest": -1, "dropout": 0.0} if kind == "sentencepiece" else \
        {"alpha": None, "nbest": -1, "dropout": 0.2}
    sampler = build_sampler(tok, settings, src.encode_tokens)
    pairs = list(zip(CORPUS, reversed(CORPUS)))
    ds = ResampledPairs(pairs, src, tgt, sampler, sampler, 100, 100).for_epoch(seed, epoch)
    return hashlib.sha256(json.dumps([ds.src, ds.tgt]).encode()).hexdigest()


@pytest.mark.parametrize("kind", ["sentencepiece", "bpe"])
def test_segmentations_vary_by_epoch_and_repeat_in_another_process(kind):
    digests = {epoch: _segmentation_digest(kind, 7, epoch) for epoch in range(3)}
    assert len(set(digests.values())) == 3  # every epoch another segmentation
    assert _segmentation_digest(kind, 7, 1) == digests[1]  # the same (seed, epoch): the same, here
    assert _segmentation_digest(kind, 8, 1) != digests[1]
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from test_subword_sampling import _segmentation_digest; "
            f"print(_segmentation_digest({kind!r}, 7, 1))")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}  # another string hashing, another process
    out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], capture_output=True, text=True,
                         env=env, check=True)
    assert out.stdout.strip() == digests[1]


def test_sentencepiece_sample_ignores_sentencepieces_own_generator(spm):
    import sentencepiece
    sampler = SentencePieceSampler(spm, alpha=0.0, nbest=-1)
    line = CORPUS[3] + " " + CORPUS[4]
    first = sampler.sample(line, Random(99))
    sentencepiece.set_random_generator_seed(5)
    spm._processor().encode(line, enable_sampling=True, alpha=0.0, nbest_size=-1)  # another user of the generator
    assert sampler.sample(line, Random(99)) == first


def test_bpe_dropout_leaves_pythons_global_random_alone(bpe):
    random.seed(3)
    expected = random.random()
    random.seed(3)
    BPEDropoutSampler(bpe, 0.3).sample(" ".join(CORPUS[:20]), Random(1))
    assert random.random() == expected


def test_epoch_random_is_a_function_of_seed_epoch_and_side():
    draws = lambda *key: [epoch_random(*key).random() for _ in range(3)]
    a = draws(1, 2, "src")
    assert a == draws(1, 2, "src")
    assert a != draws(1, 2, "tgt") and a != draws(1, 3, "src") and a != draws(2, 2, "src")
    random.seed(0)
    before = random.random()
    random.seed(0)
    draws(1, 2, "src")
    assert random.random() == before  # Python's global generator untouched


# (d) sentencepiece's distribution ------------------------------------------------------------------

def chi_square_p(observed: Counter, expected: dict, n: int) -> float:
    """p-value of Pearson's chi-square test of ``observed`` counts (of n draws) against the
    probabilities ``expected`` (cells with an expected count below 5 pooled)."""
    cells = sorted(expected, key=lambda k: -expected[k])
    assert set(observed) <= set(expected), set(observed) - set(expected)
    big = [c for c in cells if expected[c] * n >= 5]
    small = [c for c in cells if expected[c] * n < 5]
    obs = [observed[c] for c in big]
    exp = [expected[c] * n for c in big]
    if small:
        obs.append(sum(observed[c] for c in small))
        exp.append(sum(expected[c] for c in small) * n)
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    return float(chi2.sf(stat, len(obs) - 1))


@pytest.mark.parametrize("word,k,alpha", [("karomi", 6, 0.3), ("tanbuler", 4, 1.0), ("önstei", 10, 0.1)])
def test_sentencepiece_nbest_distribution_is_softmax_of_alpha_times_the_nbest_scores(spm, word, k, alpha):
    proto = spm._processor().nbest_encode(word, nbest_size=k, out_type="proto")
    scores = {tuple(p.piece for p in best.pieces): best.score for best in proto.nbests}
    assert len(scores) >= 3
    top = max(scores.values())
    weights = {seg: math.exp(alpha * (s - top)) for seg, s in scores.items()}
    expected = {seg: w / sum(weights.values()) for seg, w in weights.items()}
    sampler = SentencePieceSampler(spm, alpha=alpha, nbest=k)
    n = 4000
    observed = Counter(tuple(sampler.sample(word, Random(seed))) for seed in range(n))
    assert chi_square_p(observed, expected, n) > 1e-3


def all_segmentations(text: str, pieces: dict[str, float]) -> dict[tuple[str, ...], float]:
    """Brute force: every segmentation of ``text`` into pieces, with its score (sum of piece scores)."""
    out = {}
    for cuts in itertools.product([False, True], repeat=len(text) - 1):
        parts, start = [], 0
        for i, cut in enumerate(cuts, 1):
            if cut:
                parts.append(text[start:i])
                start = i
        parts.append(text[start:])
        if all(p in pieces for p in parts):
            out[tuple(parts)] = sum(pieces[p] for p in parts)
    return out


@pytest.mark.parametrize("word,alpha,listed", [("karomi", 0.2, True), ("selung", 0.0, True),
                                               ("tanbulerpado", 0.5, True), ("tanbulerpado", 0.5, False),
                                               ("riveönstkase", 0.1, False)])
def test_sentencepiece_full_lattice_distribution_matches_a_brute_force_enumeration(spm, word, alpha, listed,
                                                                                    monkeypatch):
    if not listed:  # backward sampling through the lattice instead of listing the segmentations
        monkeypatch.setattr(subword_sampling, "MAX_ENUMERATED_SEGMENTATIONS", 0)
    segs = all_segmentations("\u2581" + word, sp_pieces(spm))
    assert len(segs) >= 4
    weights = {seg: math.exp(alpha * s) for seg, s in segs.items()}
    expected = {seg: w / sum(weights.values()) for seg, w in weights.items()}
    sampler = SentencePieceSampler(spm, alpha=alpha, nbest=-1)
    n = 4000
    observed = Counter(tuple(sampler.sample(word, Random(seed))) for seed in range(n))
    assert chi_square_p(observed, expected, n) > 1e-3


# (e) BPE-dropout against subword-nmt's own --------------------------------------------------------

def subword_nmt_samples(tok, word: str, p: float, n: int, seed: int) -> Counter:
    """``n`` segmentations of ``word`` by subword-nmt's ``segment_tokens(..., dropout=p)``, its
    global ``random`` replaced by a seeded generator for the call."""
    saved = apply_bpe.random
    apply_bpe.random = random.Random(seed)
    try:
        return Counter(tuple(tok._bpe.segment_tokens([word], dropout=p)) for _ in range(n))
    finally:
        apply_bpe.random = saved


@pytest.mark.parametrize("word,p", [("karomi", 0.1), ("selung", 0.3), ("tanbuler", 0.5),
                                    ("counterrevolutionaries", 0.1), ("kaselrotanbuler", 0.3)])
def test_bpe_dropout_distribution_equals_subword_nmts(bpe, word, p):
    n = 3000
    ours = Counter(tuple(BPEDropoutSampler(bpe, p).sample(word, Random(seed))) for seed in range(n))
    theirs = subword_nmt_samples(bpe, word, p, n, seed=0)
    cells = sorted(set(ours) | set(theirs), key=lambda c: -(ours[c] + theirs[c]))
    assert len(cells) >= 3
    big = [c for c in cells if ours[c] + theirs[c] >= 10]
    table = [[ours[c] for c in big] + [sum(ours[c] for c in cells if c not in big)],
             [theirs[c] for c in big] + [sum(theirs[c] for c in cells if c not in big)]]
    if table[0][-1] + table[1][-1] == 0:
        table = [row[:-1] for row in table]
    assert chi2_contingency(table)[1] > 1e-3


def test_bpe_dropout_word_paths_short_long_and_runs_are_exercised(bpe):
    assert len("tanbuler") <= MAX_EXACT_CHARACTERS < len("kaselrotanbuler")  # exact finals vs chain walk
    # a run longer than MAX_ENUMERATED_POSITIONS positions of one pair: simulated draw by draw
    tok = build_tokenizer({"type": "bpe", "merges": 3, "min_frequency": 1})
    tok.train(["aaaaaaaaaaaaaaaaaaaaaaaa aaaa aa"] * 3)
    word = "a" * (MAX_ENUMERATED_POSITIONS + 6)
    n = 2000
    ours = Counter(tuple(BPEDropoutSampler(tok, 0.3).sample(word, Random(seed))) for seed in range(n))
    theirs = subword_nmt_samples(tok, word, 0.3, n, seed=1)
    cells = sorted(set(ours) | set(theirs), key=lambda c: -(ours[c] + theirs[c]))
    big = [c for c in cells if ours[c] + theirs[c] >= 10]
    table = [[ours[c] for c in big] + [sum(ours[c] for c in cells if c not in big)],
             [theirs[c] for c in big] + [sum(theirs[c] for c in cells if c not in big)]]
    assert chi2_contingency(table)[1] > 1e-3


def test_bpe_dropout_near_1_gives_mostly_characters(bpe):
    sampler = BPEDropoutSampler(bpe, 0.999)
    tokens = [t for n, line in enumerate(CORPUS) for t in sampler.sample(line, Random(n))]
    chars = sum(len(t.removesuffix("@@")) == 1 for t in tokens)
    assert chars / len(tokens) > 0.99
    deterministic = bpe.tokenize(" ".join(CORPUS))
    assert sum(len(t.removesuffix("@@")) == 1 for t in deterministic) < 0.7 * len(deterministic)


# per-epoch data: length limits, <unk>, the deterministic side ------------------------------------------

def test_an_epoch_skips_the_pairs_its_own_segmentation_makes_too_long(bpe):
    field = Field.build(bpe, CORPUS)
    pairs = list(zip(CORPUS, CORPUS))
    det = [len(bpe.tokenize(line)) for line in CORPUS]
    limit = sorted(det)[int(0.9 * len(det))]  # deterministic: about 10% too long; sampled (longer): more
    sampler = BPEDropoutSampler(bpe, 0.4)
    data = ResampledPairs(pairs, field, field, sampler, None, limit, None)
    for epoch in (0, 1):
        ds = data.for_epoch(3, epoch)
        rng = epoch_random(3, epoch, "src")  # recomputed apart, by another sampler: the lines in order
        lengths = [len(BPEDropoutSampler(bpe, 0.4).sample(line, rng)) for line in CORPUS]
        assert ds.skipped["too_long"] == sum(n > limit for n in lengths)
        assert ds.skipped["too_long"] > sum(n > limit for n in det)
        assert ds.line_numbers == [i + 1 for i, n in enumerate(lengths) if n <= limit]
        assert ds.src_lengths == [n for n in lengths if n <= limit]
        assert ds.tgt == [field.encode(CORPUS[i - 1]) for i in ds.line_numbers]  # unsampled side: deterministic
        assert "too long" in ds.summary()


def test_sampled_pieces_outside_the_vocabulary_are_unk_and_counted(bpe):
    lines = CORPUS[:50]
    vocab = Vocabulary.build([bpe.tokenize(line) for line in lines], 1, None)  # deterministic pieces only
    field = Field(bpe, vocab)
    ds = ResampledPairs(list(zip(lines, lines)), field, field, BPEDropoutSampler(bpe, 0.5), None).for_epoch(0, 0)
    rng = epoch_random(0, 0, "src")
    unknown = sum(t not in vocab for line in lines for t in BPEDropoutSampler(bpe, 0.5).sample(line, rng))
    assert unknown > 0
    assert ds.unk_tokens["src"][0] == unknown
    assert ds.unk_tokens["tgt"][0] == 0
    assert "<unk>: source" in ds.summary()


def test_build_sampler_errors_name_the_key(spm, bpe):
    with pytest.raises(DataError, match=r"^subword_sampling.alpha: .*bpe tokenizer"):
        build_sampler(bpe, {"alpha": 0.1, "nbest": -1, "dropout": 0.0})
    with pytest.raises(DataError, match=r"^subword_sampling.dropout: .*sentencepiece"):
        build_sampler(spm, {"alpha": None, "nbest": -1, "dropout": 0.1})
    with pytest.raises(DataError, match=r"^subword_sampling.alpha: .*'char'"):
        build_sampler(build_tokenizer({"type": "char"}), {"alpha": 0.1, "nbest": -1, "dropout": 0.0})
    with pytest.raises(DataError, match=r"nbest"):
        SentencePieceSampler(spm, 0.1, 0)
    assert build_sampler(spm, {"alpha": None, "nbest": -1, "dropout": 0.0}) is None


@pytest.mark.parametrize("kind", ["sentencepiece", "bpe"])
def test_a_sampler_of_ids_draws_the_ids_of_its_tokens(spm, bpe, kind, monkeypatch):
    tok = spm if kind == "sentencepiece" else bpe
    field = Field.build(tok, CORPUS[:100])  # a vocabulary lacking some sampled pieces: <unk> ids too
    settings = {"alpha": 0.3, "nbest": -1, "dropout": 0.0} if kind == "sentencepiece" else \
        {"alpha": None, "nbest": -1, "dropout": 0.3}
    if kind == "sentencepiece":  # the lattice walk as well as the listed segmentations
        monkeypatch.setattr(subword_sampling, "MAX_ENUMERATED_SEGMENTATIONS", 4)
    tokens, ids = build_sampler(tok, settings), build_sampler(tok, settings, field.encode_tokens)
    assert not tokens.ids and ids.ids
    a, b = Random(5), Random(5)
    for line in CORPUS:
        assert ids.sample(line, b) == field.encode_tokens(tokens.sample(line, a))


def test_sentencepiece_nbest_is_bounded_by_sentencepieces_own_limit(spm):
    """sentencepiece's nbest_encode refuses nbest_size 513 (it raised mid-epoch from the sampler):
    the sampler takes sentencepiece's largest accepted value and refuses the next one up front,
    and the config schema refuses it naming the key."""
    from nmt.config import ConfigError, resolve_config
    from nmt.data.subword_sampling import MAX_NBEST
    sp = spm._processor()
    word = "counterrevolutionaries"
    assert sp.nbest_encode(word, out_type=str, nbest_size=MAX_NBEST)
    with pytest.raises(RuntimeError, match="nbest_size"):
        sp.nbest_encode(word, out_type=str, nbest_size=MAX_NBEST + 1)
    sampled = SentencePieceSampler(spm, 0.1, MAX_NBEST).sample(word, Random(0))
    assert "".join(sampled).replace("▁", "") == word
    with pytest.raises(DataError, match=r"subword_sampling.nbest: .* 1 to 512 .* got 513"):
        SentencePieceSampler(spm, 0.1, MAX_NBEST + 1)
    config = {"data": {"train": {"src": "a", "tgt": "b"}, "valid": {"src": "c", "tgt": "d"},
                       "src": {"tokenizer": {"type": "sentencepiece"},
                               "subword_sampling": {"alpha": 0.1, "nbest": MAX_NBEST + 1}}},
              "training": {"save_dir": "run", "max_steps": 1}}
    with pytest.raises(ConfigError, match=r"data.src.subword_sampling.nbest"):
        resolve_config(config, "c.yaml")
    config["data"]["src"]["subword_sampling"]["nbest"] = MAX_NBEST
    assert resolve_config(config, "c.yaml")["data"]["src"]["subword_sampling"]["nbest"] == MAX_NBEST
