"""Minimum Bayes risk decoding (``SearchOptions.mbr``) against brute force.

A toy Markov model whose every output of nonzero probability can be enumerated
(``toy_decoders.enumerate_support``) is decoded through the ``Translator`` with ``mbr``; the truth is
recomputed here from the enumeration with sacrebleu's own sentence functions
(``sacrebleu.sentence_chrf`` / ``sentence_bleu``): a sentence whose MBR decision is called exact has
the argmax of the expected utility over the model's *whole* output space, and it is called exact
exactly when its candidates are that whole space. ``exact_match`` gives the most probable output (no
length penalty), and MBR over samples equals its recomputation from the samples themselves.
"""
from __future__ import annotations

import math

import pytest
import sacrebleu
import torch
from torch import nn

from nmt.data.batching import encode_sources
from nmt.data.field import Field
from nmt.data.tokenizers import CharTokenizer, SpaceTokenizer
from nmt.data.vocabulary import Vocabulary
from nmt.translate.mbr import MASS_TOLERANCE
from nmt.translate.search_options import SearchOptions
from nmt.translate.translator import TranslationSummary, Translator
from toy_decoders import MarkovDecoder, enumerate_support

MAX_LENGTH = 6
LINES = ["x", "x y", "y z x", "z z", "y", "x z y x", "z", "y y x"]
TO_VOCAB = [0, 2, 3, 1, 4, 5, 6, 7]
"""Toy id -> vocabulary id: the toy's PAD, BOS, EOS (0, 1, 2) are the vocabulary's <pad>, <bos>,
<eos> (0, 2, 3); toy 3 is <unk> (1), never generated; toys 4..7 are the letters a..d."""
TO_TOY = [TO_VOCAB.index(v) for v in range(len(TO_VOCAB))]
MODELS = {  # name -> MarkovDecoder parameters; the "loop" ones often reach MAX_LENGTH (cut, not certified)
    "sparsemax": dict(mapping="sparsemax", scale=1.0, eos_bonus=0.8, seed=0),
    "entmax15": dict(mapping="entmax15", scale=2.0, eos_bonus=1.5, seed=1),
    "sparsemax-2": dict(mapping="sparsemax", scale=1.0, eos_bonus=0.8, seed=2),
    "sparsemax-loop": dict(mapping="sparsemax", scale=1.0, eos_bonus=0.15, seed=3),
}
SACREBLEU = {"chrf": lambda h, r: sacrebleu.sentence_chrf(h, [r]).score / 100.0,
             "bleu": lambda h, r: sacrebleu.sentence_bleu(h, [r]).score / 100.0,
             "exact_match": lambda h, r: float(h == r)}


class VocabularyOrder(nn.Module):
    """A ``MarkovDecoder`` seen through the vocabulary's ids (``TO_VOCAB``), so that the toy's EOS is
    the target field's; its <unk> column gets no probability."""

    def __init__(self, toy: MarkovDecoder) -> None:
        super().__init__()
        self.toy = toy
        with torch.no_grad():
            toy.table[:, TO_TOY[1]] = -1e4  # <unk>
        self.register_buffer("to_toy", torch.tensor(TO_TOY))

    def encode(self, src, src_lengths):
        return self.toy.encode(src, src_lengths)

    def step(self, tokens, state, encoder_out):
        log_probs, attention, state = self.toy.step(self.to_toy[tokens], state, encoder_out)
        return log_probs[:, self.to_toy], attention, state  # column v: the toy's id of v


def fields() -> tuple[Field, Field]:
    return Field(SpaceTokenizer(), Vocabulary(["x", "y", "z"])), Field(CharTokenizer(), Vocabulary(list("abcd")))


def setup(name: str):
    toy = MarkovDecoder(vocab=8, src_vocab=9, **MODELS[name])
    src_field, tgt_field = fields()
    return toy, VocabularyOrder(toy), src_field, tgt_field


_SUPPORTS: dict = {}


def support(name: str, toy: MarkovDecoder, src_field: Field, tgt_field: Field, line: str):
    """The brute force of one line: ({output tokens (labels, <eos> included): (text, logprob)}, cut)
    over the whole output space (no constraint; ``cut``: some output is longer than MAX_LENGTH)."""
    key = (name, line)
    if key not in _SUPPORTS:
        batch = encode_sources(src_field, [line])[0]  # the source exactly as the Translator encodes it
        sequences, _, cut = enumerate_support(toy, batch.src[0], batch.src_lengths[0], MAX_LENGTH)
        out = {}
        for seq, logprob in sequences.items():
            ids = [TO_VOCAB[t] for t in seq]
            out[tuple(tgt_field.vocab.tokens(ids))] = (tgt_field.decode(ids), logprob)
        _SUPPORTS[key] = (out, cut)
    return _SUPPORTS[key]


def brute_force_expected(outputs: dict, utility: str) -> dict[str, float]:
    """Per output text, its expected utility under the model: sum over every output r of p(r) u(h, r)."""
    u = SACREBLEU[utility]
    texts = [(text, math.exp(lp)) for text, lp in outputs.values()]
    return {h: math.fsum(p * u(h, r) for r, p in texts) for h, _ in texts}


def translate(model, src_field, tgt_field, lines=LINES, **options):
    return Translator(model, src_field, tgt_field, SearchOptions(max_length=MAX_LENGTH, **options)).translate(lines)


@pytest.mark.parametrize("mode", ["dynamic", "static"])
@pytest.mark.parametrize("utility", ["chrf", "bleu"])
def test_an_exact_decision_is_the_argmax_over_the_whole_output_space(utility, mode):
    exact_seen = differs_from_map = 0
    for name in MODELS:
        toy, model, src_field, tgt_field = setup(name)
        for beam_size in (2, 4, 8):
            translations = translate(model, src_field, tgt_field, beam_size=beam_size, n_best=200, mbr=utility,
                                     mode=mode)
            for line, t in zip(LINES, translations):
                outputs, _ = support(name, toy, src_field, tgt_field, line)
                assert t.mbr is not None and t.mbr.utility == utility
                if not t.mbr.exact:
                    continue
                exact_seen += 1
                truth = brute_force_expected(outputs, utility)
                best = max(truth.values())
                assert t.mbr.expected == pytest.approx(best, abs=1e-9)
                assert truth[t.text] == pytest.approx(best, abs=1e-9)  # the argmax (a tie: any of them)
                # every candidate's expected utility is the brute force's, and they come in its order
                assert [truth[h.text] for h in t.nbest] == pytest.approx(t.expected_utilities, abs=1e-9)
                assert t.expected_utilities == sorted(t.expected_utilities, reverse=True)
                most_probable = max(outputs.values(), key=lambda o: o[1])[0]
                differs_from_map += truth[most_probable] < best - 1e-9
    assert exact_seen >= 20
    assert differs_from_map >= 1  # MBR is not the most probable output in disguise


def candidate_sequences(t) -> set[tuple[str, ...]]:
    return {tuple(h.tokens) for h in t.nbest if h.expected_utility is not None}


@pytest.mark.parametrize("constraint", [{}, {"min_length": 2}, {"prefixes": True}])
def test_exact_means_the_candidates_are_the_whole_support(constraint):
    """``exact`` is True exactly when the candidates are every output of nonzero probability of the
    model (no constraint): a search certified under ``min_length`` or a forced prefix that removed
    outputs of nonzero probability is not exact; a cut or pruned one never is."""
    counts = {(True, True): 0, (False, False): 0, "certified, not exact": 0}
    for name in MODELS:
        toy, model, src_field, tgt_field = setup(name)
        options = {k: v for k, v in constraint.items() if k != "prefixes"}
        for beam_size in (2, 3, 8):
            translator = Translator(model, src_field, tgt_field,
                                    SearchOptions(max_length=MAX_LENGTH, beam_size=beam_size, n_best=400,
                                                  mbr="chrf", **options))
            prefixes = ["a" if i % 2 else "" for i in range(len(LINES))] if constraint.get("prefixes") else None
            for line, t in zip(LINES, translator.translate(LINES, prefixes=prefixes)):
                outputs, cut = support(name, toy, src_field, tgt_field, line)
                truth = not cut and candidate_sequences(t) == set(outputs)
                assert t.mbr.exact == truth, (name, beam_size, line, t.report())
                assert t.mbr.candidates == sum(h.expected_utility is not None for h in t.nbest)
                if truth:
                    assert abs(t.mass - 1.0) <= MASS_TOLERANCE
                counts[(truth, t.mbr.exact)] += 1
                counts["certified, not exact"] += t.certified and not t.mbr.exact
    assert counts[(True, True)] >= 5 and counts[(False, False)] >= 5
    if constraint:  # the mass test is what tells these apart from exact ones
        assert counts["certified, not exact"] >= 1


def test_exact_match_chooses_the_most_probable_output_without_length_penalty():
    seen_rerank = certified = 0
    for name in MODELS:
        toy, model, src_field, tgt_field = setup(name)
        for beam_size in (2, 4):
            kw = dict(beam_size=beam_size, length_penalty="average")
            plain = translate(model, src_field, tgt_field, n_best=1, **kw)
            chosen = translate(model, src_field, tgt_field, n_best=1, mbr="exact_match", **kw)
            every = translate(model, src_field, tgt_field, n_best=400, mbr="exact_match", **kw)
            for line, p, c, e in zip(LINES, plain, chosen, every):
                candidates = [h for h in e.nbest if h.expected_utility is not None]
                if not candidates:
                    continue
                top = max(h.score for h in candidates)
                assert c.score == top and c.text == e.text  # the candidate of highest log-probability
                total = sum(math.exp(h.score) for h in candidates)
                assert c.expected_utility == pytest.approx(math.exp(top) / total, rel=1e-9)
                seen_rerank += p.text != c.text  # the search ranked another first (length penalty)
                if c.mbr.exact:
                    certified += 1
                    outputs, _ = support(name, toy, src_field, tgt_field, line)
                    assert c.text == max(outputs.values(), key=lambda o: o[1])[0]
    assert certified >= 10 and seen_rerank >= 1


def test_mbr_over_samples_is_the_monte_carlo_estimate_of_the_samples():
    """Eikema & Aziz: the N samples are the candidates and the pseudo-references, 1/N each (a sample
    drawn twice counts twice); a cut sample is no candidate (it comes last, with no expected utility)."""
    seen_cut = 0
    for name in ("sparsemax", "sparsemax-loop"):
        _, model, src_field, tgt_field = setup(name)
        kw = dict(sample=True, n_best=9, seed=11, beam_size=1, max_length=4)
        samples = Translator(model, src_field, tgt_field, SearchOptions(**kw)).translate(LINES)
        ranked = Translator(model, src_field, tgt_field, SearchOptions(mbr="chrf", **kw)).translate(LINES)
        for s, r in zip(samples, ranked):
            kept = [h for h in s.nbest if not h.cut and not h.missing]
            rest = [h for h in s.nbest if h.cut or h.missing]
            expected = [math.fsum(SACREBLEU["chrf"](h.text, o.text) for o in kept) / len(kept) for h in kept]
            order = sorted(range(len(kept)), key=lambda i: -expected[i])  # ties: sample order
            assert [h.text for h in r.nbest] == [kept[i].text for i in order] + [h.text for h in rest]
            assert r.expected_utilities[:len(kept)] == pytest.approx([expected[i] for i in order], abs=1e-12)
            assert r.expected_utilities[len(kept):] == [None] * len(rest)
            assert r.mbr.candidates == len(kept) and r.mbr.exact is False and r.reason == "sampled"
            seen_cut += len(rest)
    assert seen_cut >= 1
    assert "over the samples" in TranslationSummary.of(ranked).line()


def test_hypotheses_cut_by_the_length_limit_are_no_candidates():
    """A model that never ends: every hypothesis is cut, so there is no candidate; the output stays
    the search's, with no expected utility, and nothing is exact."""
    _, model, src_field, tgt_field = setup("sparsemax")
    with torch.no_grad():
        model.toy.table[:, 2] = -1e4  # the toy's EOS: probability 0 everywhere
    for t in translate(model, src_field, tgt_field, beam_size=3, n_best=3, mbr="chrf"):
        assert t.nbest and all(h.cut for h in t.nbest)
        assert t.mbr.candidates == 0 and t.mbr.expected is None and t.mbr.exact is False
        assert t.report()["mbr"] == {"utility": "chrf", "expected": None, "exact": False, "candidates": 0}
        assert all(h["expected_utility"] is None for h in t.report()["nbest"])


def test_n_best_keeps_the_first_of_the_mbr_ranking_and_the_report_says_so():
    _, model, src_field, tgt_field = setup("entmax15")
    every = translate(model, src_field, tgt_field, beam_size=4, n_best=400, mbr="chrf")
    two = translate(model, src_field, tgt_field, beam_size=4, n_best=2, mbr="chrf")
    summary = TranslationSummary.of(two)
    exact = sum(t.mbr.exact for t in two)
    assert summary.line().endswith(f"; MBR chrf, exact {100.0 * exact / len(two):.1f}%")
    for e, t in zip(every, two):
        assert t.hypotheses == e.hypotheses[:2] and t.expected_utilities == e.expected_utilities[:2]
        record = t.report()
        assert record["mbr"] == {"utility": "chrf", "expected": t.expected_utility, "exact": t.mbr.exact,
                                 "candidates": e.mbr.candidates}
        assert [h["expected_utility"] for h in record["nbest"]] == t.expected_utilities


@pytest.mark.parametrize("options,message", [
    (dict(mbr="chrF"), "mbr must be one of none, chrf, bleu, exact_match, got 'chrF'"),
    (dict(mbr="bleu", beam_size=1), "mbr bleu needs beam_size >= 2 (greedy search finds one candidate), got "
                                    "beam_size 1"),
    (dict(mbr="chrf", sample=True, beam_size=1, n_best=1), "mbr chrf with sample=True needs n_best >= 2 samples"),
])
def test_bad_mbr_options_are_one_line_errors(options, message):
    with pytest.raises(ValueError) as info:
        SearchOptions(**options)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_constraints_choose_among_the_outputs_that_meet_them():
    """With lexical constraints the candidates are the outputs that hold the phrases; each
    hypothesis keeps its own ``constraints_met`` through the MBR reordering (recomputed from its
    text here), and a decision is exact only where no output of nonzero probability lacked them."""
    toy, model, src_field, tgt_field = setup("sparsemax-2")
    translator = Translator(model, src_field, tgt_field, SearchOptions(max_length=MAX_LENGTH, beam_size=4, n_best=50,
                                                                       mbr="chrf"))
    translations = translator.translate(LINES, constraints=[["b"]] * len(LINES))
    assert sum(len(t.nbest) > 1 for t in translations) >= 3
    for line, t in zip(LINES, translations):
        assert t.constraints_met == [["b" in h.text] for h in t.nbest]
        assert all("b" in h.text for h in t.nbest if not h.cut)
        outputs, cut = support("sparsemax-2", toy, src_field, tgt_field, line)
        assert t.mbr.exact == (not cut and candidate_sequences(t) == set(outputs))
        assert not t.mbr.exact or all("b" in text for text, _ in outputs.values())


@pytest.mark.parametrize("sample", [False, True])
def test_an_empty_input_line_has_an_mbr_record_with_no_candidate(sample):
    """Every ``-report`` record of an MBR run carries ``"mbr"`` (README): an empty input line is a
    sentence with no candidate, so ``{"expected": null, "exact": false, "candidates": 0}``, and the
    summary's exact percentage still counts the decoded sentences only."""
    _, model, src_field, tgt_field = setup("sparsemax")
    kw = dict(sample=True, n_best=4, beam_size=1) if sample else dict(beam_size=3)
    lines = ["x y", "", "z"]
    translations = translate(model, src_field, tgt_field, lines=lines, mbr="bleu", **kw)
    empty = translations[1]
    assert empty.reason == "empty_input" and empty.hypotheses == []
    assert empty.report()["mbr"] == {"utility": "bleu", "expected": None, "exact": False, "candidates": 0}
    assert empty.expected_utility is None
    for t in (translations[0], translations[2]):
        assert t.report()["mbr"]["candidates"] >= 1
    decoded = [translations[0], translations[2]]
    clause = TranslationSummary.of(translations).line().rsplit("; ", 1)[1]
    if sample:
        assert clause == "MBR bleu over the samples (estimated, not exact)"
    else:
        assert clause == f"MBR bleu, exact {100.0 * sum(t.mbr.exact for t in decoded) / 2:.1f}%"


def test_the_summary_of_mbr_over_samples_counts_the_empty_output_lines():
    """With ``-sample -mbr`` one line per sentence is written (the decision), so the summary's
    'empty lines' are the sentences none of whose samples has a hypothesis (every sample blocked
    here by ``block_ngram_repeat``), recounted from the lines ``output_lines`` writes, not the
    missing samples (the candidates that are not there)."""
    from nmt.cli.translate_common import output_lines

    _, model, src_field, tgt_field = setup("sparsemax")
    translations = translate(model, src_field, tgt_field, sample=True, n_best=8, beam_size=1, seed=0,
                             block_ngram_repeat=2, mbr="chrf")
    missing = sum(sum(t.missing) for t in translations)
    empty_lines = sum(output_lines(t, 1) == [""] for t in translations)
    assert missing > empty_lines >= 1  # some samples missing in sentences that still have an output
    line = TranslationSummary.of(translations).line()
    sentences = f"{empty_lines} sentence{'s' if empty_lines != 1 else ''}"
    assert (f"; {missing} of {8 * len(LINES)} samples without a hypothesis (no token of nonzero probability at "
            f"some step; no candidates), {sentences} with none (empty lines);") in line


def test_an_uncertified_sentence_reranks_the_beams_n_best_not_its_whole_history():
    """Where the search is not certified (a softmax output: EOS has nonzero probability at every step,
    so the history holds up to (T + 1) x K finished hypotheses) the candidates are the first
    ``beam_size`` complete hypotheses in the search's order, those a plain search's n-best list of
    ``beam_size`` holds (MBR over an n-best list), and their expected utilities are recomputed from
    them with sacrebleu; the others come after, with no expected utility."""
    toy = MarkovDecoder(vocab=8, src_vocab=9, mapping="softmax", scale=1.0, eos_bonus=0.8, seed=4)
    model, (src_field, tgt_field) = VocabularyOrder(toy), fields()
    longer_history = 0
    for beam_size in (2, 3):
        plain = translate(model, src_field, tgt_field, beam_size=beam_size, n_best=beam_size)
        ranked = translate(model, src_field, tgt_field, beam_size=beam_size, n_best=400, mbr="chrf")
        for p, t in zip(plain, ranked):
            assert not t.certified and not t.mbr.exact
            candidates = [h for h in t.nbest if h.expected_utility is not None]
            assert {tuple(h.tokens) for h in candidates} == {tuple(h.tokens) for h in p.nbest if not h.cut}
            assert t.mbr.candidates == len(candidates) <= beam_size
            assert all(h.expected_utility is None for h in t.nbest[len(candidates):])
            total = math.fsum(math.exp(h.score) for h in candidates)
            for h in candidates:
                assert h.expected_utility == pytest.approx(math.fsum(
                    math.exp(r.score) / total * SACREBLEU["chrf"](h.text, r.text) for r in candidates), abs=1e-9)
            longer_history += len(t.nbest) > beam_size
    assert longer_history >= 4  # the history held more finished hypotheses than the n-best list
