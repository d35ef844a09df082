"""Hypotheses cut by the length limit (no EOS) are marked: ``Hypothesis.cut``, the report's
``cut`` (the output line) and each n-best entry's, and a count in the summary line.

A hypothesis whose EOS has probability 0 when its sentence reaches ``max_length`` (or its
``max_length_ratio`` limit) comes back as the prefix it was, without EOS; its text was written
to the output and the report like a finished translation, and the certificate's reason says
"max_length" only when nothing else broke the certificate first (never with certify=False).
"""
from __future__ import annotations

import torch

from nmt.cli.translate_common import report_line
from nmt.data.field import Field
from nmt.data.tokenizers import CharTokenizer, SpaceTokenizer
from nmt.data.vocabulary import Vocabulary
from nmt.translate.search_options import SearchOptions
from nmt.translate.translator import Translator, TranslationSummary
from toy_decoders import MarkovDecoder

SOURCES = ["x y", "", "y", "x"]


def translator(eos_possible: bool, **options) -> Translator:
    """The toy model (7 ids, as this vocabulary's) with sparsemax, EOS of probability 0 at every
    step; with ``eos_possible``, softmax: every step gives EOS nonzero probability."""
    src_field = Field(SpaceTokenizer(), Vocabulary(["x", "y"]))
    tgt_field = Field(CharTokenizer(), Vocabulary(["a", "b", "c"]))
    v = tgt_field.vocab
    model = MarkovDecoder(vocab=7, mapping="softmax" if eos_possible else "sparsemax", seed=0)
    with torch.no_grad():
        model.table[:, v.bos_index] = -1e4  # the toy's own EOS column is this vocabulary's BOS
        if not eos_possible:
            model.table[:, v.eos_index] = -1e4
    return Translator(model, src_field, tgt_field, SearchOptions(**{"beam_size": 2, "n_best": 2, **options}))


def test_a_model_that_never_ends_is_cut_and_says_so():
    reasons = set()
    for certify in (True, False):
        translations = translator(False, max_length=3, certify=certify).translate(SOURCES)
        for t in translations:
            if t.index == 1:  # the empty line: no hypothesis, not cut
                assert not t.output_cut and t.report()["cut"] is False
                continue
            assert t.nbest and all(h.cut and h.tokens[-1] != "<eos>" and len(h.tokens) == 3 for h in t.nbest)
            record = t.report()
            assert record["cut"] is True and all(h["cut"] for h in record["nbest"])
            assert '"cut": true' in report_line(t)
            reasons.add(t.reason)
        summary = TranslationSummary.of(translations)
        assert summary.cut == 3 and summary.line().endswith("; 3 outputs cut at the length limit (no EOS)")
    # the certificate's reason names the first violation met: here a pruning hid the cut
    assert "pruned" in reasons and "not_certified" in reasons


def test_the_ratio_limit_cuts_too():
    translations = translator(False, max_length=9, max_length_ratio=1.0, max_length_offset=0).translate(SOURCES)
    lengths = {t.index: len(t.nbest[0].tokens) for t in translations if t.nbest}
    assert lengths == {0: 2, 2: 1, 3: 1} and all(t.output_cut for t in translations if t.nbest)


def test_finished_hypotheses_are_not_cut():
    translations = translator(True, max_length=12).translate(SOURCES)
    hypotheses = [h for t in translations for h in t.nbest]
    assert hypotheses and all(not h.cut and h.tokens[-1] == "<eos>" for h in hypotheses)
    assert TranslationSummary.of(translations).cut == 0
    assert "cut" not in TranslationSummary.of(translations).line()


def test_every_cut_sample_counts_in_the_summary():
    """With -sample every sample is an output line: the summary counts the samples cut at the
    length limit (recounted from the hypotheses' own flags and tokens), not only each sentence's
    first; a model that can end cuts none."""
    for eos_possible, max_length in ((False, 3), (True, 12)):
        translations = translator(eos_possible, max_length=max_length, sample=True, n_best=3, seed=5,
                                  beam_size=1).translate(SOURCES)
        samples = [h for t in translations if t.reason == "sampled" for h in t.nbest]
        cut = [h for h in samples if len(h.tokens) == max_length and h.tokens[-1] != "<eos>"]
        assert [h.cut for h in samples] == [h in cut for h in samples]
        summary = TranslationSummary.of(translations)
        assert summary.samples == len(samples) == 9 and summary.cut == len(cut)
        if eos_possible:
            assert summary.cut == 0 and "cut" not in summary.line()
        else:
            assert summary.cut == 9 and summary.line().endswith("; 9 of 9 samples cut at the length limit (no EOS)")
