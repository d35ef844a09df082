"""The one-line Python API: nmt.load(...).translate / .score, against the CLI and beam search."""
from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

import nmt


def test_import_nmt_is_light():
    code = "import sys, nmt; assert callable(nmt.load); print(sorted(m for m in ('torch', 'numpy', 'nmt.api') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_translate_returns_text_score_certificate_and_nbest(checkpoint):
    from nmt.translate.beam_search import beam_search
    from nmt.utils.precision import ieee_float32

    m = nmt.load(checkpoint, device="auto", beam_size=3, max_length=8)
    assert (m.device == "cpu" or m.device.startswith("cuda:")) and m.options.beam_size == 3  # by index
    out = m.translate(["a b c", "", "c a"], n_best=3)
    assert len(out) == 3 and out[1].text == "" and out[1].certificate.reason == "empty_input"
    for sentence, t in zip(["a b c", "", "c a"], out):
        if not sentence:
            continue
        ids = torch.tensor([m.src_field.encode(sentence)], device=m.device)
        vocab = m.tgt_field.vocab
        # in IEEE float32, as the API decodes (a no-op on the CPU; on CUDA torch's default lets
        # cuDNN's LSTM take TF32 products); the API's padded batch against one sentence: on CUDA
        # other kernels and summation orders, hence a stated tolerance
        with ieee_float32():
            r = beam_search(m.decoder, ids, torch.tensor([ids.size(1)], device=m.device), bos=vocab.bos_index,
                            eos=vocab.eos_index, pad=vocab.pad_index, beam_size=3, n_best=3, max_length=8)
        assert t.text == m.tgt_field.decode(r.tokens[0, 0])
        assert t.score == pytest.approx(float(r.scores[0, 0]), rel=1e-6, abs=1e-5)
        assert t.certificate.certified == bool(r.exact[0]) and t.certificate.certified == (t.certificate.reason is None)
        assert 1 <= len(t.nbest) <= 3 and t.nbest[0].text == t.text and t.nbest[0].score == t.score
        assert [h.score for h in t.nbest] == sorted((h.score for h in t.nbest), reverse=True)
    # the call's keywords do not change the model's defaults
    assert m.options.n_best == 1 and len(m.translate(["a"])[0].nbest) == 1


def test_score_agrees_with_translation_and_flags_zero_probability(checkpoint):
    m = nmt.load(checkpoint, device="cpu", beam_size=4, max_length=8)
    best = m.translate(["a b c", "b"])
    scores = m.score(["a b c", "b"], [t.text for t in best])
    for t, s in zip(best, scores):
        assert s.logprob == pytest.approx(t.score, abs=1e-4) and not s.zero_probability
    zero = [s for s in m.score(["a b c"] * 3, ["cccccccc", "aaaaaaaa", "bbbbbbbb"]) if s.zero_probability]
    for s in zero:
        assert s.logprob == -math.inf and s.first_zero["support_size"] < s.first_zero["rank"]


def test_batching_defaults_to_nmt_translates_for_the_device(checkpoint, monkeypatch):
    """Unset, translation batches as nmt-translate does on the device (64 sentences on the CPU;
    tokens on a GPU, simulated); given, as given; token batches translate as sentence batches do;
    scoring counts sentences."""
    import nmt.translate.translator as translator_module

    m = nmt.load(checkpoint, device="cpu", max_length=8)
    assert (m.batch_size, m.batch_type) == (64, "sentences")
    tokens = nmt.load(checkpoint, device="cpu", max_length=8, batch_type="tokens", batch_size=5)
    assert (tokens.batch_size, tokens.batch_type) == (5, "tokens")
    lines = ["a b c", "c a", "b", "a a b", "c b a", ""]
    assert [t.text for t in tokens.translate(lines)] == [t.text for t in m.translate(lines)]
    assert [s.logprob for s in tokens.score(lines[:3], ["abc", "ca", "b"])] == \
        [s.logprob for s in m.score(lines[:3], ["abc", "ca", "b"])]
    seen = []
    real = translator_module.default_batching
    monkeypatch.setattr(translator_module, "default_batching",
                        lambda device, size=None, kind=None: seen.append(device) or real("cuda", size, kind))
    gpu_like = nmt.load(checkpoint, device="cpu")
    assert seen == ["cpu"] and (gpu_like.batch_size, gpu_like.batch_type) == (8192, "tokens")
    with pytest.raises(ValueError, match="^batch_type must be sentences or tokens, got 'words'$"):
        nmt.load(checkpoint, device="cpu", batch_type="words")


def test_precision_reaches_translation_and_scoring(checkpoint):
    """precision="bf16": the model runs under autocast in both (its scores differ from fp32's), and
    a translation's score is what scoring its text at that precision gives."""
    fp32, bf16 = (nmt.load(checkpoint, device="cpu", max_length=8, precision=p) for p in ("fp32", "bf16"))
    lines = ["a b c", "c a", "a a b"]
    t32, t16 = fp32.translate(lines), bf16.translate(lines)
    assert [t.score for t in t32] != [t.score for t in t16]
    for t, s in zip(t16, bf16.score(lines, [t.text for t in t16])):
        assert s.logprob == pytest.approx(t.score, abs=1e-3) or s.logprob == t.score == -math.inf
    with pytest.raises(ValueError, match="^precision must be one of fp32, bf16, fp16, int8, got 'fp8'$"):
        nmt.load(checkpoint, device="cpu", precision="fp8")


def test_prefixes_per_call(checkpoint):
    """``prefixes``: each output starts with its prefix, its score is the teacher-forced one, a
    sentence without a prefix is translated as without the argument; wrong counts or types and a
    prefix longer than max_length are errors naming what is wrong."""
    from nmt.translate.target_prefix import PrefixTooLong

    m = nmt.load(checkpoint, device="cpu", beam_size=3, max_length=8)
    lines, prefixes = ["a b c", "c a", "b", ""], ["a", "", "bb", "c"]
    forced, free = m.translate(lines, prefixes=prefixes), m.translate(lines)
    assert forced[1].text == free[1].text and forced[1].prefix_length == 0
    for t, p in zip(forced[:3], prefixes):
        assert t.text.startswith(p) and t.prefix_length == len(p)
    assert forced[3].certificate.reason == "empty_input"
    for t, s in zip(forced[:3], m.score(lines[:3], [t.text for t in forced[:3]])):
        assert s.logprob == pytest.approx(t.score, abs=1e-4) or (s.logprob == t.score == -math.inf)
    with pytest.raises(ValueError, match="^4 sentences but 3 prefixes$"):
        m.translate(lines, prefixes=prefixes[:3])
    with pytest.raises(TypeError, match="prefixes must be a list of sentences"):
        m.translate(lines, prefixes="a")
    with pytest.raises(PrefixTooLong, match=r"^input 2: a target prefix of 9 tokens, more than max_length 8"):
        m.translate(lines, prefixes=["", "a" * 9, "", ""])


def test_constraints_per_call(checkpoint):
    """``constraints``: every complete output holds its sentence's phrases (checked by a plain scan),
    ``constraints_met`` says so per hypothesis, a sentence without phrases translates as without the
    argument; wrong counts, shapes and impossible constraints are errors naming what is wrong."""
    from nmt.translate.constraint_automaton import ConstraintError, holds_phrase

    m = nmt.load(checkpoint, device="cpu", beam_size=3, max_length=8)
    lines, sets = ["a b c", "c a", "b", ""], [["b"], [], ["cc", "a"], ["a"]]
    held, free = m.translate(lines, constraints=sets, n_best=3), m.translate(lines, n_best=3)
    assert held[1].text == free[1].text and held[1].constraints == [] and held[1].constraints_met == []
    for t, phrases in zip(held[:3], sets):
        for (text, _), cut, met in zip(t.hypotheses, t.cut, t.constraints_met or [[True]] * len(t.hypotheses)):
            assert cut or (all(holds_phrase(text, p) for p in phrases) and all(met))
    assert held[3].certificate.reason == "empty_input"
    ordered = m.translate(["a b c"], constraints=[["c", "a"]], constraints_mode="ordered")[0]
    assert not ordered.hypotheses or ordered.cut[0] or ordered.text.index("c") < ordered.text.rindex("a")
    with pytest.raises(ValueError, match="^4 sentences but 3 constraint lists$"):
        m.translate(lines, constraints=sets[:3])
    with pytest.raises(TypeError, match="constraints must be a list of phrase lists"):
        m.translate(lines, constraints=["a", "b", "c", "d"])
    with pytest.raises(ConstraintError, match=r"^input 2: the constraints need at least 9 tokens, more than "
                                              r"max_length 8$"):
        m.translate(lines, constraints=[[], ["a" * 9], [], []])
    with pytest.raises(ValueError, match="constraints mode must be one of unordered, ordered"):
        m.translate(lines, constraints=sets, constraints_mode="sorted")
    # a prefix of 7 tokens without the phrase "bb" leaves 1 token of max_length 8 for its 2; one that
    # holds it ("abb" + 5) needs nothing more
    with pytest.raises(ConstraintError, match=r"^input 2: the target prefix and the constraints need at least 9 "
                                              r"tokens, more than max_length 8$"):
        m.translate(lines, prefixes=["", "a" * 7, "", ""], constraints=[[], ["bb"], [], []])
    fits = m.translate(lines[:2], prefixes=["", "abbaaaa"], constraints=[[], ["bb"]])[1]
    assert fits.certificate.reason != "max_length" or fits.cut[0]


def test_a_phrase_given_k_times_must_occur_k_times(checkpoint):
    """Unordered constraints are a multiset: ``["a", "a", "a"]`` asks for three a's (``str.count``
    on the output text, the character model's tokens), and ``constraints_met`` per entry says
    whether the output holds as many occurrences as the entries of its phrase so far; with the
    phrase once, one occurrence is enough."""
    m = nmt.load(checkpoint, device="cpu", beam_size=4, max_length=8)
    lines = ["a b c", "c a", "b"]
    once = m.translate(lines, constraints=[["a"], ["a"], ["b"]], n_best=4)
    thrice = m.translate(lines, constraints=[["a", "b", "a", "a"], ["a", "a", "a"], ["b", "b"]], n_best=4)
    complete = 0
    for t, phrases in zip(thrice, [["a", "b", "a", "a"], ["a", "a", "a"], ["b", "b"]]):
        for (text, _), cut, met in zip(t.hypotheses, t.cut, t.constraints_met):
            assert met == [text.count(p) >= phrases[: j + 1].count(p) for j, p in enumerate(phrases)]
            if not cut:
                complete += 1
                assert all(met) and all(text.count(p) >= phrases.count(p) for p in phrases), (text, phrases)
    assert complete > 0
    # the searches differ: with the phrase once, an output with fewer occurrences may come first
    needs = [("a", 3), ("a", 3), ("b", 2)]
    assert any(t.hypotheses and not t.cut[0] and t.text.count(p) < k for t, (p, k) in zip(once, needs))


def test_a_string_where_a_list_is_expected_is_a_type_error(checkpoint):
    m = nmt.load(checkpoint, device="cpu")
    with pytest.raises(TypeError, match="list of sentences, not a single string"):
        m.translate("ein Satz")
    with pytest.raises(TypeError, match="targets must be a list of sentences"):
        m.score(["a b"], "ab")
    with pytest.raises(TypeError, match=r"sentences\[1\] must be a str"):
        m.translate(["a", 3])
    with pytest.raises(TypeError, match="unknown search option"):
        m.translate(["a"], beam=3)
    with pytest.raises(ValueError, match="beam_size must be >= 1"):
        m.translate(["a"], beam_size=0)


def test_load_names_a_bad_checkpoint_or_batch_size_argument(checkpoint):
    from nmt.translate.scorer import Scorer
    from nmt.translate.translator import Translator

    with pytest.raises(TypeError, match="checkpoint must be a path or a list of paths, got int"):
        nmt.load(123)
    with pytest.raises(TypeError, match=r"checkpoint\[1\] must be a path, got NoneType"):
        nmt.load([checkpoint, None])
    for bad in ("8", 2.5, True):  # before: '<' not supported, or a failure only at translate time (None: the default)
        with pytest.raises(TypeError, match="batch_size must be an integer"):
            nmt.load(checkpoint, device="cpu", batch_size=bad)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        nmt.load(checkpoint, device="cpu", batch_size=0)
    m = nmt.load(checkpoint, device="cpu")
    for cls in (Translator, Scorer):
        with pytest.raises(TypeError, match="batch_size must be an integer"):
            cls(m.decoder, m.src_field, m.tgt_field, batch_size=2.5)


def test_alignments_and_unknown_words_per_call(checkpoint):
    from nmt.translate.alignment import AlignOptions, token_pairs

    m = nmt.load(checkpoint, device="cpu", beam_size=3, max_length=8)
    plain = m.translate(["a b c", "c a"], n_best=2, return_attention=True)
    aligned = m.translate(["a b c", "c a"], n_best=2, align=AlignOptions(mode="support", level="token"))
    for p, t in zip(plain, aligned):
        assert p.alignments is None and [h.text for h in p.nbest] == [h.text for h in t.nbest]
        rows = [r for r, label in enumerate(p.tokens[0]) if label != "<eos>"]
        assert t.alignment == token_pairs(p.attention, rows, AlignOptions("support", "token"))
        assert [h.alignment for h in t.nbest] == t.alignments
    assert m.translate(["a b"], align=True)[0].alignments is not None  # True: the defaults (argmax, words)
    assert m.score(["a b"], ["ab"], align=True)[0].alignment is not None and m.score(["a b"], ["ab"])[0].alignment is None
    with pytest.raises(TypeError, match="align must be True, False or an AlignOptions"):
        m.translate(["a"], align="support")
