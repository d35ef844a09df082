"""``Tokenizer.word_ids``: pieces grouped into the words of the detokenized text.

The truth is the tokenizer's own ``detokenize``: the words of ``detokenize(pieces).split()``
must be, one for one, the groups of pieces ``word_ids`` makes (each group detokenized alone),
and a piece of no word must be whitespace in the text. Checked on tokenizations of random
sentences and on random piece sequences from each tokenizer's vocabulary (what a model outputs
need not be the tokenization of any text), BPE and sentencepiece trained here on small texts.
"""
from __future__ import annotations

import random

import pytest

from nmt.data.tokenizers import Tokenizer, build_tokenizer
from nmt.data.tokenizers.base import words_of_spans

WORDS = ("house mouse the cat sat on a mat running runner quickly brown fox über straße der "
         "schnelle fuchs springt hund läuft x y zz").split()


def sentences(rng: random.Random, n: int) -> list[str]:
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 9))) for _ in range(n)]


@pytest.fixture(scope="module")
def tokenizers() -> dict[str, Tokenizer]:
    corpus = sentences(random.Random(0), 400)
    bpe = build_tokenizer({"type": "bpe", "merges": 40})
    bpe.train(corpus)
    bpe_plus = build_tokenizer({"type": "bpe", "merges": 40, "separator": "++"})
    bpe_plus.train(corpus)
    spm = build_tokenizer({"type": "sentencepiece", "vocab_size": 70})
    spm.train(corpus)
    spm_bpe = build_tokenizer({"type": "sentencepiece", "vocab_size": 70, "model_type": "bpe"})
    spm_bpe.train(corpus)
    return {"char": build_tokenizer({"type": "char"}), "space": build_tokenizer({"type": "space"}),
            "bpe": bpe, "bpe++": bpe_plus, "sentencepiece": spm, "sentencepiece-bpe": spm_bpe}


def check_grouping(tok: Tokenizer, pieces: list[str]) -> None:
    """The words of the detokenized text are the groups of ``word_ids``, in order."""
    ids = tok.word_ids(pieces)
    words = tok.detokenize(pieces).split()
    assert len(ids) == len(pieces)
    numbered = [w for w in ids if w is not None]
    assert numbered == sorted(numbered), (pieces, ids)  # words in text order
    assert sorted(set(numbered)) == list(range(len(words))), (pieces, ids, words)
    for w, word in enumerate(words):
        group = [p for p, i in zip(pieces, ids) if i == w]
        assert tok.detokenize(group).strip() == word, (pieces, ids, w)
    for p, i in zip(pieces, ids):
        if i is None:  # part of no word: only whitespace in the text
            assert not tok.detokenize([p]).strip(), (pieces, ids)


@pytest.mark.parametrize("kind", ["char", "space", "bpe", "bpe++", "sentencepiece", "sentencepiece-bpe"])
def test_word_ids_of_tokenized_sentences(tokenizers: dict[str, Tokenizer], kind: str) -> None:
    tok, rng = tokenizers[kind], random.Random(1)
    texts = sentences(rng, 150) + ["unseen wörds qq  here", "a", "x  y\tzz", "ÿ straßenbahn"]
    for text in texts:
        pieces = tok.tokenize(text)
        check_grouping(tok, pieces)
        # the text's own words (up to the tokenizer's whitespace normalisation)
        assert tok.detokenize(pieces).split() == text.split()


@pytest.mark.parametrize("kind", ["char", "space", "bpe", "bpe++", "sentencepiece", "sentencepiece-bpe"])
def test_word_ids_of_random_piece_sequences(tokenizers: dict[str, Tokenizer], kind: str) -> None:
    """Model outputs: any sequence of vocabulary pieces, ``<unk>`` included."""
    tok, rng = tokenizers[kind], random.Random(2)
    vocab = sorted({p for text in sentences(random.Random(3), 200) for p in tok.tokenize(text)}) + ["<unk>"]
    for _ in range(300):
        pieces = [rng.choice(vocab) for _ in range(rng.randint(0, 12))]
        check_grouping(tok, pieces)


@pytest.mark.parametrize("kind", ["sentencepiece", "sentencepiece-bpe"])
def test_pieces_of_another_sentencepiece_model(tokenizers: dict[str, Tokenizer], kind: str) -> None:
    """Pieces the model does not hold (``-replace_unk`` copies source pieces, which another model
    may have made): the marker "▁" starts a word as in any piece. Truth: the words of the pieces
    joined with "▁" read as a space (the text is plain: no normalisation to undo)."""
    tok, rng = tokenizers[kind], random.Random(4)
    other_texts = [" ".join(w[::-1] + "qu" for w in line.split()) for line in sentences(random.Random(5), 300)]
    other = build_tokenizer({"type": "sentencepiece", "vocab_size": 60})
    other.train(other_texts)
    own = sorted({p for text in sentences(random.Random(3), 200) for p in tok.tokenize(text)})
    foreign = sorted({p for text in other_texts for p in other.tokenize(text)} - set(own))
    assert sum(p.startswith("\u2581") and len(p) > 1 for p in foreign) > 10
    for _ in range(300):
        pieces = [rng.choice(foreign if rng.random() < 0.4 else own) for _ in range(rng.randint(0, 12))]
        assert tok.detokenize(pieces).split() == "".join(pieces).replace("\u2581", " ").split(), pieces
        check_grouping(tok, pieces)


def test_word_ids_known_cases(tokenizers: dict[str, Tokenizer]) -> None:
    assert tokenizers["char"].word_ids(["a", "b", "\u2581", "c", "\u2581", "\u2581", "d"]) == [0, 0, None, 1, None, None, 2]
    assert tokenizers["char"].word_ids(["\u2581", "a", "\u2581\u2581"]) == [None, 0, 0]  # an escaped marker is a letter
    assert tokenizers["space"].word_ids(["a", "<unk>", "c"]) == [0, 1, 2]
    bpe = tokenizers["bpe"]
    assert bpe.word_ids(["the", "runn@@", "er", "x@@", "y@@", "z"]) == [0, 1, 1, 2, 2, 2]
    assert bpe.word_ids(["a@@", "b", "@@"]) == [0, 0, None]  # a trailing lone separator: no text
    assert tokenizers["bpe++"].word_ids(["runn++", "er", "a@@"]) == [0, 0, 1]  # the configured separator
    spm = tokenizers["sentencepiece"]
    pieces = spm.tokenize("the cat ÿq")
    assert pieces == ["\u2581the", "\u2581cat", "\u2581", "ÿ", "q"]  # a lone marker before unseen letters
    assert spm.word_ids(pieces) == [0, 1, 2, 2, 2]
    assert spm.word_ids(["\u2581the", "\u2581ca", "t"]) == [0, 1, 1]  # "▁ca" is no piece: its marker still a space
    assert spm.word_ids(["\u2581a", "<unk>", "b"]) == [0, 1, 2]  # <unk> decodes to " ⁇ ": a word of its own
    assert spm._marker_word_ids(pieces) == [0, 1, 2, 2, 2]


def test_words_of_spans() -> None:
    text = "ab  cd e"
    assert words_of_spans(text, [(0, 1), (1, 2), (2, 3), (3, 6), (6, 8)]) == [0, 0, None, 1, 2]
    assert words_of_spans(text, [(3, 4)], blank_to_next=True) == [1]  # blank just before "cd"
    assert words_of_spans(text, [(2, 3)], blank_to_next=True) == [None]  # not adjacent
    assert words_of_spans("", [(0, 0)]) == [None]
