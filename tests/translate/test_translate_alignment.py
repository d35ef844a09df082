"""Alignments and ``<unk>`` replacement through ``Translator`` / ``Scorer``.

Independent truths: a hypothesis's alignment from the search must be the alignment of the same
text scored by teacher forcing (``Scorer``: another code path, step by step on the given
tokens), for every n-best entry and every sample; the recorded attention must be the model's
teacher-forced attention (for the Transformer: the last layer's cross-attention averaged over
its heads, as ``forward(return_maps=True)`` gives every head); an ensemble's, the members' mean.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from nmt.data.field import Field
from nmt.data.tokenizers import SpaceTokenizer
from nmt.models import build_model
from nmt.models.protocol import NoAttention
from nmt.translate import alignment as al
from nmt.translate.alignment import AlignOptions
from nmt.translate.ensemble import Ensemble
from nmt.translate.scorer import Scorer
from nmt.translate.translator import Translator

SOURCES = ["a b c", "d e", "", "c a e b", "b", "e d c b a"]
RNN = {
    "type": "rnn",
    "embeddings": {"src_size": 6, "tgt_size": 6, "share": False, "tie_output": False, "dropout": 0.0},
    "encoder": {"type": "lstm", "layers": 1, "hidden_size": 8, "bidirectional": True, "dropout": 0.0},
    "decoder": {"type": "lstm", "layers": 1, "hidden_size": 8, "dropout": 0.0, "input_feeding": True,
                "bridge": "linear"},
    "attention": {"score": "general", "mapping": "sparsemax", "params": {}, "continuous": None},
    "output": {"mapping": "softmax", "params": {}},
}
TRANSFORMER = {
    "type": "transformer",
    "embeddings": {"src_size": 8, "tgt_size": 8, "share": False, "tie_output": False, "dropout": 0.0},
    "transformer": {"encoder_layers": 1, "decoder_layers": 2, "d_model": 8, "heads": 2, "d_ff": 16, "norm": "pre",
                    "positions": "sinusoidal", "max_positions": 64, "dropout": 0.0, "attention_dropout": 0.0,
                    "activation_dropout": 0.0, "activation": "relu"},
    "attention": {"score": "general", "mapping": "entmax15", "params": {}, "continuous": None,
                  "encoder_self": None, "decoder_self": None, "cross": None},
    "output": {"mapping": "softmax", "params": {}},
}
FULL_CONTEXT = {**TRANSFORMER, "transformer": {**TRANSFORMER["transformer"], "full_context_alignment": True}}
"""The Transformer whose alignments come from a pass without the future mask (model.transformer.full_context_alignment)."""
MODES = [AlignOptions(mode, level) for mode in al.ALIGN_MODES for level in al.ALIGN_LEVELS]


def fields() -> tuple[Field, Field]:
    return Field.build(SpaceTokenizer(), ["a b c d e"]), Field.build(SpaceTokenizer(), ["x y z w"])


def model(cfg: dict, seed: int, scale: float = 10.0, src: Field | None = None):
    """A random model in float64 whose attention has exact zeros (weights scaled up, the RNN's
    attention keys once more), which never outputs padding, BOS or <unk> (their output bias very
    low: they would not round-trip through the text) and ends late (EOS's bias lowered)."""
    src, tgt = (fields()[0] if src is None else src), fields()[1]
    torch.manual_seed(seed)
    m = build_model(cfg, len(src.vocab), len(tgt.vocab), tgt.vocab.pad_index).double().eval()
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(scale)
        if cfg["type"] == "rnn":
            m.decoder.attention.key_proj.weight.mul_(scale)
        m.generator.proj.bias[[0, 1, 2]] = -1e4
        m.generator.proj.bias[3] -= 20.0
    return m


@pytest.mark.parametrize("cfg, seed", [(RNN, 0), (RNN, 1), (TRANSFORMER, 6), (FULL_CONTEXT, 6)],
                         ids=["rnn0", "rnn1", "transformer", "full_context"])
@pytest.mark.parametrize("sample", [False, True], ids=["beam", "sample"])
@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_every_hypothesis_is_aligned_as_its_text_scored_by_teacher_forcing(cfg, seed, sample, mode):
    """Both loops (static: the GPU's, fixed shapes and masked rows) record each hypothesis's attention."""
    src, tgt = fields()
    decoder = model(cfg, seed)
    search = dict(sample=True, n_best=4, seed=5) if sample else dict(beam_size=4, n_best=4)
    search["mode"] = mode
    for options in MODES:
        translations = Translator(decoder, src, tgt, align=options, max_length=7, **search).translate(SOURCES)
        pairs = [(SOURCES[t.index], h) for t in translations for h in t.nbest if not h.missing]
        assert len(pairs) > len(SOURCES) and sum(bool(h.alignment) for _, h in pairs) > len(SOURCES)
        scores = Scorer(decoder, src, tgt, align=options).score([s for s, _ in pairs], [h.text for _, h in pairs])
        for (source, h), score in zip(pairs, scores):
            assert h.alignment == score.alignment, (options, source, h.text)
        assert translations[2].alignments == [] and translations[2].alignment == []  # the empty line
        record = translations[0].report()
        assert [al.parse_pharaoh(e["alignment"]) for e in record["nbest"]] == translations[0].alignments


def teacher_forced_attention(decoder, src: Field, source: str, ids: list[int]) -> np.ndarray:
    """(T, L) attention of the generated ``ids`` (BOS fed first), from the model's forward pass;
    the Transformer's: every head of the last layer's cross-attention, averaged here."""
    s = torch.tensor([src.encode(source)])
    tgt_in = torch.tensor([[2] + ids[:-1]])
    with torch.no_grad():
        if hasattr(decoder, "models"):
            return np.mean([teacher_forced_attention(m, src, source, ids) for m in decoder.models], axis=0)
        if getattr(decoder, "attention_kinds", None):
            _, _, maps = decoder(s, torch.tensor([s.size(1)]), tgt_in, return_maps=True)
            return maps["cross"][-1][0].mean(0).numpy()  # (heads, T, L) -> (T, L)
        _, attention = decoder(s, torch.tensor([s.size(1)]), tgt_in)
        return attention[0].numpy()


@pytest.mark.parametrize("which", ["rnn", "transformer", "ensemble"])
def test_the_recorded_attention_is_the_models_and_the_best_alignment_is_recomputed_from_it(which):
    src, tgt = fields()
    decoder = {"rnn": lambda: model(RNN, 3), "transformer": lambda: model(TRANSFORMER, 6),
               "ensemble": lambda: Ensemble([model(RNN, 5), model(TRANSFORMER, 4)])}[which]()
    for options in MODES:
        translations = Translator(decoder, src, tgt, align=options, beam_size=3, max_length=7).translate(SOURCES)
        for t in translations:
            if not t.hypotheses:
                continue
            ids = tgt.vocab.lookup(t.tokens[0])
            np.testing.assert_allclose(t.attention, teacher_forced_attention(decoder, src, SOURCES[t.index], ids),
                                       atol=1e-9)
            rows = [r for r, label in enumerate(t.tokens[0]) if label != "<eos>"]
            mine = al.token_pairs(t.attention, rows, AlignOptions(options.mode, "token"))
            # space tokenizers on both sides: the words are the tokens
            assert t.alignment == mine
            if options.mode == "support":  # the exact support: zeros left out, and there are zeros
                assert len(mine) == int((t.attention[rows] > 0).sum())
        if options.mode == "support":
            assert any((t.attention == 0).any() for t in translations if t.attention is not None)


@pytest.mark.parametrize("which", ["transformer", "ensemble"])
def test_full_context_alignments_come_from_each_output_run_alone_and_change_nothing_in_the_search(which):
    """A full-context model's recorded attention (every n-best entry) is its teacher-forced
    full-context alignment of that hypothesis alone (BOS + its tokens, no padding, no batch mates);
    an ensemble's the mean over members, the RNN's being its teacher-forced attention. The search
    (texts, scores, certificates) is the one of the same weights without the flag, whose steps'
    attention is another."""
    src, tgt = fields()
    if which == "transformer":
        full, causal = model(FULL_CONTEXT, 6), model(TRANSFORMER, 6)
    else:
        full, causal = (Ensemble([model(RNN, 5), model(cfg, 4)]) for cfg in (FULL_CONTEXT, TRANSFORMER))
    options = AlignOptions("argmax", "token")
    got = Translator(full, src, tgt, align=options, beam_size=3, n_best=3, max_length=7,
                     return_attention=True).translate(SOURCES)
    plain = Translator(causal, src, tgt, align=options, beam_size=3, n_best=3, max_length=7,
                       return_attention=True).translate(SOURCES)
    differ = 0
    for a, b in zip(got, plain):
        assert (a.hypotheses, a.tokens, a.certified, a.reason) == (b.hypotheses, b.tokens, b.certified, b.reason)
        for n, h in enumerate(a.nbest):
            ids = tgt.vocab.lookup(h.tokens)
            s = torch.tensor([src.encode(SOURCES[a.index])])
            with torch.no_grad():
                alone = full.teacher_forced_alignment(s, torch.tensor([s.size(1)]), torch.tensor([[2] + ids[:-1]]))[0]
            rows = [r for r, label in enumerate(h.tokens) if label != "<eos>"]
            assert h.alignment == al.token_pairs(alone.numpy(), rows, options), (a.index, n)
            if n == 0:
                np.testing.assert_allclose(a.attention, alone.numpy(), atol=1e-12)
                differ += not np.allclose(a.attention, b.attention, atol=1e-6)
    assert differ > 0


def test_alignments_change_nothing_in_the_search():
    src, tgt = fields()
    decoder = model(RNN, 7)
    plain = Translator(decoder, src, tgt, beam_size=3, n_best=3, max_length=7, return_support=True).translate(SOURCES)
    aligned = Translator(decoder, src, tgt, beam_size=3, n_best=3, max_length=7, return_support=True,
                         align=AlignOptions("support", "word")).translate(SOURCES)
    for a, b in zip(plain, aligned):
        assert (a.hypotheses, a.tokens, a.certified, a.reason, a.support) == (b.hypotheses, b.tokens, b.certified,
                                                                                b.reason, b.support)
        assert a.alignments is None and a.attention is None and "alignment" not in str(a.report())
    assert Translator(decoder, src, tgt).options.return_attention is False
    assert Translator(decoder, src, tgt, replace_unk=True).options.return_attention is True


class _NoAttentionModel(torch.nn.Module):
    """A StepDecoder whose step returns no attention."""

    def encode(self, src, src_lengths):
        return {"src_mask": src != 0}, {"n": torch.zeros(src.size(0))}

    def step(self, tokens, state, encoder_out):
        log_probs = torch.full((tokens.size(0), 8), -1e4).log_softmax(-1)
        log_probs[:, 3] = 0.0  # EOS
        return log_probs, None, {"n": state["n"] + 1}


@pytest.mark.parametrize("kw", [dict(align=AlignOptions()), dict(replace_unk=True), dict(return_attention=True),
                                dict(align=AlignOptions(), sample=True)])
def test_a_model_without_attention_is_a_clear_error(kw):
    src, tgt = fields()
    with pytest.raises(NoAttention, match="returns no source attention"):
        Translator(_NoAttentionModel(), src, tgt, **kw).translate(["a b"])
    with pytest.raises(NoAttention, match="returns no source attention"):
        Scorer(_NoAttentionModel(), src, tgt, align=AlignOptions()).score(["a b"], ["x"])
    assert Translator(_NoAttentionModel(), src, tgt).translate(["a b"])[0].text == ""  # not asked: fine


def test_word_level_needs_tokenizers_that_group_words():
    class Opaque(SpaceTokenizer):
        type_name = "opaque"

        def word_ids(self, pieces):
            return super(SpaceTokenizer, self).word_ids(pieces)

    src, tgt = fields()
    tgt = Field(Opaque(), tgt.vocab)
    with pytest.raises(ValueError, match="needs the target pieces' words, but the opaque tokenizer does not group"):
        Translator(model(RNN, 0), src, tgt, align=AlignOptions())
    Translator(model(RNN, 0), src, tgt, align=AlignOptions(level="token"))  # tokens: fine


UNK_OFFSET = {"rnn": 0.0, "transformer": 200.0}
"""Output bias of ``<unk>`` above the mean of the real tokens' that makes these random models output
``<unk>`` for some tokens, not all (measured on the CPU: 14 and 46 of 160 tokens of the n-best lists)."""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cfg, seed", [(RNN, 0), (TRANSFORMER, 6), (FULL_CONTEXT, 6)],
                         ids=["rnn0", "transformer", "full_context"])
@pytest.mark.parametrize("sample", [False, True], ids=["beam", "sample"])
def test_cuda_static_loop_aligns_and_replaces_unknowns_as_the_cpu(cfg, seed, sample):
    """``-report_align`` / ``-replace_unk`` on CUDA (the static-shape loop, ``mode: auto`` there, as
    nmt-translate runs it) give the CPU's dynamic loop's outputs: the same texts (<unk> replaced
    by the same source words), scores, alignments in both modes and levels and the same report
    settings, for beam search and samples. float64 models: the two devices' attention agrees to
    rounding, far from the ties and zeros that decide the pairs."""
    import copy

    from nmt.translate.search_options import SearchOptions

    assert SearchOptions(mode="auto").resolved_mode("cuda") == "static"
    src, tgt = fields()
    cpu_model = model(cfg, seed)
    with torch.no_grad():
        bias = cpu_model.generator.proj.bias
        bias[tgt.vocab.unk_index] = bias[4:].mean() + UNK_OFFSET[cfg["type"]]
    cuda_model = copy.deepcopy(cpu_model).to("cuda")
    search = dict(sample=True, n_best=4, seed=5) if sample else dict(beam_size=4, n_best=4)
    replaced = 0
    for options in MODES:
        for replace_unk in (False, True):
            outputs = {}
            for device, m, mode in (("cpu", cpu_model, "dynamic"), ("cuda", cuda_model, "auto")):
                translator = Translator(m, src, tgt, align=options, replace_unk=replace_unk, device=device,
                                        max_length=7, mode=mode, **search)
                outputs[device] = translator.translate(SOURCES)
            for a, b in zip(outputs["cpu"], outputs["cuda"]):
                assert [h for h, _ in a.hypotheses] == [h for h, _ in b.hypotheses], (options, replace_unk, a.index)
                assert [s for _, s in a.hypotheses] == pytest.approx([s for _, s in b.hypotheses], rel=1e-9)
                assert a.alignments == b.alignments, (options, replace_unk, a.index)
                assert a.decoding == b.decoding and (a.certified, a.reason) == (b.certified, b.reason)
                assert a.missing == b.missing and a.cut == b.cut
            plain = [tok for t in outputs["cpu"] for h in t.tokens for tok in h]
            if replace_unk:
                assert "<unk>" in plain  # the model did output <unk>: replaced in both texts
                assert not any("<unk>" in h for t in outputs["cuda"] for h, _ in t.hypotheses)
                replaced += 1
            assert any(pairs for t in outputs["cuda"] for pairs in t.alignments)
    assert replaced == len(MODES)


def test_a_phrase_table_translates_the_replaced_source_tokens(tmp_path):
    """``phrase_table``: each ``<unk>`` output becomes the table's entry for the source token it is
    replaced by (a copy where the token has none): checked piece by piece against the outputs
    without a table, whose replaced pieces are those source tokens; the search is unchanged. A table
    without ``replace_unk`` is refused; the file reader names a bad line; ``ban_unk_token`` leaves no
    ``<unk>`` to replace."""
    from nmt.data.errors import DataError
    from nmt.translate.phrase_table import read_phrase_table

    src, tgt = fields()
    m = model(RNN, 0)
    with torch.no_grad():
        bias = m.generator.proj.bias
        bias[tgt.vocab.unk_index] = bias[4:].mean() + UNK_OFFSET["rnn"]
    path = tmp_path / "table.txt"
    path.write_text("a|||ALPHA\n\nc|||gamma ray\nd|||delta\nc|||GAMMA\n", encoding="utf-8")
    table = read_phrase_table(path)
    assert table == {"a": "ALPHA", "c": "GAMMA", "d": "delta"}  # blank lines skipped, a later line wins
    search = dict(beam_size=4, n_best=4, max_length=7)
    copied = Translator(m, src, tgt, replace_unk=True, **search).translate(SOURCES)
    mapped = Translator(m, src, tgt, replace_unk=True, phrase_table=table, **search).translate(SOURCES)
    replaced = translated = 0
    for c, t in zip(copied, mapped):
        assert t.tokens == c.tokens and [s for _, s in t.hypotheses] == [s for _, s in c.hypotheses]
        assert t.decoding == {"replace_unk": True, "phrase_table": True}
        for labels, (plain, _), (text, _) in zip(c.tokens, c.hypotheses, t.hypotheses):
            pieces = [label for label in labels if label != "<eos>"]
            plain_pieces = plain.split()
            assert len(plain_pieces) == len(pieces)
            want = [table.get(p, p) if label == "<unk>" else p for label, p in zip(pieces, plain_pieces)]
            assert text == " ".join(want)
            replaced += pieces.count("<unk>")
            translated += sum(label == "<unk>" and p in table for label, p in zip(pieces, plain_pieces))
    assert replaced >= 5 and 0 < translated < replaced  # some source tokens in the table, some not
    with pytest.raises(ValueError, match="^a phrase table applies to replace_unk"):
        Translator(m, src, tgt, phrase_table=table)
    banned = Translator(m, src, tgt, replace_unk=True, phrase_table=table, ban_unk_token=True, **search)
    assert not any("<unk>" in labels for t in banned.translate(SOURCES) for labels in t.tokens)
    bad = tmp_path / "bad.txt"
    bad.write_text("a|||b\nno separator here\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"bad\.txt:2: a phrase table line is source\|\|\|target, got 'no separator"):
        read_phrase_table(bad)
    bad.write_text("|||b\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"bad\.txt:1: empty source before \|\|\|"):
        read_phrase_table(bad)


def tagged_fields(tag: str = "<t>") -> tuple[Field, Field]:
    """:func:`fields` with a source tag appended to the source vocabulary (as training does)."""
    from nmt.data.source_tags import with_tags

    src, tgt = fields()
    return Field(src.tokenizer, with_tags(src.vocab, [tag]), [tag]), tgt


def tagged_model(cfg: dict, seed: int):
    """:func:`model` of the source vocabulary of :func:`tagged_fields`."""
    return model(cfg, seed, src=tagged_fields()[0])


@pytest.mark.parametrize("cfg, seed", [(RNN, 0), (RNN, 1), (TRANSFORMER, 6)], ids=["rnn0", "rnn1", "transformer"])
def test_a_tagged_hypothesis_is_aligned_as_its_text_scored_by_teacher_forcing(cfg, seed):
    """With a source tag the search's alignment is still the scorer's of the same text (the tag's
    column is attention like any other: a target piece whose argmax is the tag aligns to nothing in
    both), and it is the untagged alignment rule applied to the recorded attention, tag column
    included, with the tag's pairs dropped and the others shifted past it."""
    src, tgt = tagged_fields()
    decoder = tagged_model(cfg, seed)
    tag_wins = 0
    for options in MODES:
        translations = Translator(decoder, src, tgt, align=options, beam_size=4, n_best=4, max_length=7,
                                  src_tag="<t>").translate(SOURCES)
        pairs = [(SOURCES[t.index], h) for t in translations for h in t.nbest if not h.missing]
        scores = Scorer(decoder, src, tgt, align=options, src_tag="<t>").score([s for s, _ in pairs],
                                                                              [h.text for _, h in pairs])
        for (source, h), score in zip(pairs, scores):
            assert h.alignment == score.alignment, (options, source, h.text)
        for t in translations:
            if not t.hypotheses:
                continue
            assert t.src_tokens[0] == "<t>"
            rows = [r for r, label in enumerate(t.tokens[0]) if label != "<eos>"]
            full = al.token_pairs(t.attention, rows, AlignOptions(options.mode, "token"))
            assert t.alignment == [(i - 1, j) for i, j in full if i >= 1]  # the space tokenizer: words = tokens
            if options.mode == "argmax":
                tag_wins += sum(i == 0 for i, _ in full)
    assert tag_wins > 0  # some target piece attends most to the tag: the case where the two could differ


@pytest.mark.parametrize("cfg, seed", [(RNN, 0), (TRANSFORMER, 6)], ids=["rnn0", "transformer"])
def test_a_tagged_unk_is_replaced_by_the_source_word_it_attends_to_most(cfg, seed):
    """``replace_unk`` with a source tag: each ``<unk>`` output becomes the line's word at the first
    maximum of its recorded attention row (tag column included, so the words sit one column to the
    right); one whose maximum is the tag stays ``<unk>``. The search is the untagged-code's: the
    same tokens and scores as without replace_unk."""
    src, tgt = tagged_fields()
    m = tagged_model(cfg, seed)
    with torch.no_grad():
        bias = m.generator.proj.bias
        bias[tgt.vocab.unk_index] = bias[4:].mean() + UNK_OFFSET[cfg["type"]]
    search = dict(beam_size=4, n_best=4, max_length=7, src_tag="<t>")
    plain = Translator(m, src, tgt, return_attention=True, **search).translate(SOURCES)
    replaced = Translator(m, src, tgt, replace_unk=True, **search).translate(SOURCES)
    seen = 0
    for p, r in zip(plain, replaced):
        assert p.tokens == r.tokens and [s for _, s in p.hypotheses] == [s for _, s in r.hypotheses]
        if not r.hypotheses:
            continue
        words = SOURCES[r.index].split()
        labels = [label for label in r.tokens[0] if label != "<eos>"]
        want = []
        for step, label in enumerate(labels):
            if label != "<unk>":
                want.append(label)
                continue
            seen += 1
            best = int(np.argmax(p.attention[step]))
            want.append("<unk>" if best == 0 or p.attention[step][best] <= 0 else words[best - 1])
        assert r.hypotheses[0][0] == " ".join(want)
    assert seen > 0
