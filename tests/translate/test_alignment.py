"""``nmt.translate.alignment`` against brute-force recomputations from the attention matrix."""
from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from nmt.data.vocabulary import BOS, EOS, PAD, UNK
from nmt.translate import alignment as al
from nmt.translate.alignment import AlignOptions


def sparse_attention(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Rows on the simplex with exact zeros (as sparsemax/entmax give), ties included now and then."""
    att = rng.random((rows, cols)) * (rng.random((rows, cols)) < 0.5)
    for r in range(rows):
        if not att[r].any():
            att[r, rng.integers(cols)] = 1.0
        if rng.random() < 0.2 and cols > 1:  # a tie for the maximum
            att[r, :2] = att[r].max()
    return att / att.sum(1, keepdims=True)


def test_labels_agree_with_the_vocabulary() -> None:
    assert (al.UNK, al.EOS, *al.NOT_OUTPUT) == (UNK, EOS, PAD, BOS)


def test_output_rows_are_the_pieces_decode_keeps() -> None:
    assert al.output_rows(["a", "b", EOS]) == [0, 1]
    assert al.output_rows(["a", PAD, BOS, UNK, EOS, "c"]) == [0, 3]  # <unk> is kept, nothing after EOS
    assert al.output_rows(["a", "b"]) == [0, 1]  # cut by the length limit: no EOS


@pytest.mark.parametrize("seed", range(5))
def test_pairs_against_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    py = random.Random(seed)
    for _ in range(40):
        T, L = int(rng.integers(1, 8)), int(rng.integers(1, 7))
        att = sparse_attention(rng, T + 1, L)  # one row more: the EOS step
        rows = list(range(T))
        # argmax: the first maximum of each row
        expected = sorted({(next(i for i in range(L) if att[r, i] == att[r].max()), j) for j, r in enumerate(rows)})
        assert al.token_pairs(att, rows, AlignOptions("argmax", "token")) == expected
        # support, threshold 0 and above
        for threshold in (0.0, 0.2):
            expected = sorted((i, j) for j, r in enumerate(rows) for i in range(L) if att[r, i] > threshold)
            assert al.token_pairs(att, rows, AlignOptions("support", "token", threshold)) == expected
        # words: any piece of the source word and any piece of the target word aligned
        src_words = [py.choice([None, 0, 1, 2]) for _ in range(L)]
        tgt_words = [py.choice([None, 0, 1, 2, 3]) for _ in range(T)]
        for mode in al.ALIGN_MODES:
            options = AlignOptions(mode, "word")
            token = al.token_pairs(att, rows, AlignOptions(mode, "token"))
            expected = [(s, t) for s, t in itertools.product(range(3), range(4))
                        if any((i, j) in token for i in range(L) for j in range(T)
                               if src_words[i] == s and tgt_words[j] == t)]
            assert al.align(att, rows, options, src_words, tgt_words) == expected


def test_exact_support_of_sparse_attention_and_argmax_of_a_tie() -> None:
    att = np.array([[0.0, 0.7, 0.3, 0.0], [0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    assert al.token_pairs(att, [0, 1, 2], AlignOptions("support", "token")) == [(0, 1), (1, 0), (1, 1), (2, 0), (3, 2)]
    assert al.token_pairs(att, [0, 1, 2], AlignOptions("argmax", "token")) == [(0, 1), (1, 0), (3, 2)]
    assert al.token_pairs(att, [0, 1, 2], AlignOptions("support", "token", 0.4)) == [(0, 1), (1, 0), (1, 1), (3, 2)]
    assert al.attended(np.zeros(3), "argmax") == [] and al.attended(np.zeros(0), "support") == []


def test_pharaoh_round_trip_and_errors() -> None:
    pairs = [(0, 0), (1, 2), (10, 3)]
    assert al.pharaoh(pairs) == "0-0 1-2 10-3" and al.parse_pharaoh("0-0 1-2 10-3") == pairs
    assert al.pharaoh([]) == "" and al.parse_pharaoh("") == []
    with pytest.raises(ValueError, match="'1:2'"):
        al.parse_pharaoh("0-0 1:2")


def test_replace_unknowns_takes_the_most_attended_source_piece() -> None:
    rng = np.random.default_rng(7)
    src = ["Zurich", "is", "in", "Switzerland"]
    for _ in range(50):
        pieces = [rng.choice(["a", UNK, "b"]) for _ in range(5)]
        rows = [0, 1, 3, 4, 5]  # a BOS-like row 2 in between is skipped
        att = sparse_attention(rng, 7, len(src))
        out = al.replace_unknowns(pieces, rows, att, src)
        for j, piece in enumerate(pieces):
            if piece == UNK:  # the first maximum of its row, recomputed
                assert out[j] == src[int(np.flatnonzero(att[rows[j]] == att[rows[j]].max())[0])]
            else:
                assert out[j] == piece


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="align_mode"):
        AlignOptions(mode="soft")
    with pytest.raises(ValueError, match="align_level"):
        AlignOptions(level="char")
    with pytest.raises(ValueError, match="align_threshold"):
        AlignOptions(threshold=1.0)
    with pytest.raises(ValueError, match="needs the words"):
        al.align(np.ones((1, 1)), [0], AlignOptions(level="word"))
