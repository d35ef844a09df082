"""Reference word alignments as token positions (``nmt.data.word_alignments``): word pairs mapped to
the pieces of each tokenizer (hand-built expectations), the source tag's shift, the batch's reference
grid, and the one-line errors naming the file and line."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from nmt.data.corpora import training_corpora
from nmt.data.errors import DataError
from nmt.data.tokenizers import build_tokenizer
from nmt.data.word_alignments import (TrainingAlignments, WordCountMismatch, parse_alignment_line,
                                      read_training_alignments, token_pairs)


def pairs_of(array: np.ndarray) -> set[tuple[int, int]]:
    return {(int(a), int(b)) for a, b in array}


def test_pharaoh_lines_parse_and_bad_items_name_the_place():
    assert parse_alignment_line("0-0 2-1  1-2\n", "f:1") == [(0, 0), (2, 1), (1, 2)]
    assert parse_alignment_line("", "f:1") == []
    for bad in ("0-", "a-1", "0:1", "1-2-3", "-1-0", "0p1"):
        with pytest.raises(DataError, match=rf"^train.align:7: '{bad}' is not an alignment pair \(Pharaoh"):
            parse_alignment_line(f"0-0 {bad}", "train.align:7")


def test_words_become_all_pairs_of_their_pieces_for_every_tokenizer():
    """Source 'new@@ est cat@@ s' (BPE: words 'newest', 'cats'), target characters 'k a t ▁ x' (char:
    'kat', 'x'; the space token in no word): pairs 0-1 and 1-0 give every piece of source word 0 with
    every character of target word 1, and every piece of source word 1 with each of 'k', 'a', 't'."""
    bpe = build_tokenizer({"type": "bpe"})
    char = build_tokenizer({"type": "char"})
    got = token_pairs([(0, 1), (1, 0)], ["new@@", "est", "cat@@", "s"], ["k", "a", "t", "▁", "x"], bpe, char)
    assert got.dtype == np.int32 and got.shape == (8, 2)
    assert pairs_of(got) == {(0, 4), (1, 4), (2, 0), (2, 1), (2, 2), (3, 0), (3, 1), (3, 2)}
    assert got.tolist() == sorted(got.tolist())  # sorted, each pair once
    space = build_tokenizer({"type": "space"})
    # space: a token is a word; a repeated pair counts once; the source tag shifts source positions
    got = token_pairs([(0, 2), (2, 0), (0, 2)], ["a", "b", "c"], ["x", "y", "z"], space, space, src_offset=1)
    assert pairs_of(got) == {(1, 2), (3, 0)}
    assert token_pairs([], ["a"], ["x"], space, space).shape == (0, 2)


@pytest.fixture(scope="module")
def spm():
    """A character-level sentencepiece model (its default nmt_nfkc normalisation)."""
    tokenizer = build_tokenizer({"type": "sentencepiece", "vocab_size": 40, "model_type": "char"})
    tokenizer.train(["the cat sat on the mat", "a cat and a hat"] * 20)
    return tokenizer


def test_sentencepiece_pieces_are_grouped_by_their_word_marks(spm):
    src = spm.tokenize("cat sat")  # characters: '▁c a t ▁s a t' (the word mark on the first of each word)
    assert src == ["▁c", "a", "t", "▁s", "a", "t"] or src == ["▁", "c", "a", "t", "▁", "s", "a", "t"]
    space = build_tokenizer({"type": "space"})
    first = src.index("t")  # the end of word 0
    got = pairs_of(token_pairs([(1, 0)], src, ["x"], spm, space))
    assert got == {(k, 0) for k in range(first + 1, len(src))}


def test_a_word_index_past_the_line_names_file_line_side_and_count():
    space = build_tokenizer({"type": "space"})
    with pytest.raises(DataError, match=r"^a.align:3: source word 3 does not exist: the source line has 3 words "
                                        r"\(indices are 0-based\)$"):
        token_pairs([(3, 0)], ["a", "b", "c"], ["x"], space, space, where="a.align:3")
    with pytest.raises(DataError, match=r"^a.align:3: target word 1 does not exist: the target line has 1 word "):
        token_pairs([(0, 1)], ["a", "b", "c"], ["x"], space, space, where="a.align:3")


def test_the_reference_grid_is_uniform_over_the_aligned_source_tokens():
    by_line = {5: np.array([[0, 0], [2, 0], [1, 1]], dtype=np.int32), 6: np.zeros((0, 2), dtype=np.int32)}
    grid = TrainingAlignments(by_line, ["x.align"]).reference([6, 5, 9], tgt_width=4, src_width=3)
    expected = torch.zeros(3, 4, 3)
    expected[1, 0, 0] = expected[1, 0, 2] = 0.5  # target token 0 <- source tokens 0 and 2
    expected[1, 1, 1] = 1.0
    assert grid.dtype == torch.float32 and torch.equal(grid, expected)  # lines 6 (empty) and 9 (none): zeros
    # a data-parallel rank's stand-in batch: its rows given, no line: zeros (no loss)
    assert torch.equal(TrainingAlignments(by_line, []).reference([], 4, 3, rows=2), torch.zeros(2, 4, 3))


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_corpora_alignments_follow_their_lines_tags_and_kept_pairs(tmp_path):
    """Two corpora, the second tagged and without alignments; line 2 of the first skipped by the data
    rules (not in ``kept``): its (bad) word index is not checked, its syntax is."""
    a = {"src": write(tmp_path / "a.src", ["a b", "a b c d", "c"]), "tgt": write(tmp_path / "a.tgt", ["x y", "z", "w"]),
         "align": write(tmp_path / "a.align", ["0-1 1-0", "9-9", ""])}
    b = {"src": write(tmp_path / "b.src", ["d"]), "tgt": write(tmp_path / "b.tgt", ["v"]), "src_tag": "<BT>"}
    corpora = training_corpora([a, b])
    pairs = [("a b", "x y"), ("a b c d", "z"), ("c", "w"), ("d", "v")]
    space = build_tokenizer({"type": "space"})
    refs = read_training_alignments(corpora, pairs, [0, 3, 4], [1, 3, 4], space, space, [0, 1])
    assert set(refs.by_line) == {1, 3} and pairs_of(refs.by_line[1]) == {(0, 1), (1, 0)} and len(refs) == 1
    assert refs.describe(3) == f"1 of 3 kept training pairs have reference alignments ({a['align']})"
    assert refs.describe(3, "validation pairs").startswith("1 of 3 kept validation pairs have reference")
    # the second corpus tagged and aligned: source positions after the tag
    b["align"] = write(tmp_path / "b.align", ["0-0"])
    refs = read_training_alignments(training_corpora([a, b]), pairs, [0, 3, 4], [1, 3, 4], space, space, [0, 1])
    assert pairs_of(refs.by_line[4]) == {(1, 0)}
    assert read_training_alignments(training_corpora([{k: a[k] for k in ("src", "tgt")}]), pairs[:3], [0, 3],
                                    [1, 2, 3], space, space, [0]) is None


def test_bad_alignment_files_are_one_line_errors(tmp_path):
    src = write(tmp_path / "t.src", ["a b", "c"])
    tgt = write(tmp_path / "t.tgt", ["x", "y"])
    space = build_tokenizer({"type": "space"})
    pairs = [("a b", "x"), ("c", "y")]

    def read(lines):
        align = write(tmp_path / "t.align", lines)
        return read_training_alignments(training_corpora({"src": src, "tgt": tgt, "align": align}), pairs, [0, 2],
                                        [1, 2], space, space, [0])

    with pytest.raises(DataError, match=r"t.align has 1 lines but .*t.src has 2 \(data.train.align: one alignment "
                                        r"line per training pair\)$"):
        read(["0-0"])
    with pytest.raises(DataError, match=r"t.align:2: '0_0' is not an alignment pair"):
        read(["0-0", "0_0"])
    with pytest.raises(DataError, match=r"t.align:1: source word 2 does not exist: the source line has 2 words"):
        read(["2-0", "0-0"])
    with pytest.raises(DataError, match=r"nowhere.align"):
        read_training_alignments(training_corpora({"src": src, "tgt": tgt, "align": str(tmp_path / "nowhere.align")}),
                                 pairs, [0, 2], [1, 2], space, space, [0])


def test_indices_are_checked_against_the_raw_lines_and_a_changed_word_count_is_named(spm):
    """The raw source 'cat \u200b sat' has three words; sentencepiece's normalisation drops the
    zero-width space, and its pieces make two: the line's indices cannot be mapped (index 1 would
    land on 'sat'), which :class:`WordCountMismatch` says; an index past the raw line's words is the
    plain error, checked first."""
    space = build_tokenizer({"type": "space"})
    pieces = spm.tokenize("cat \u200b sat")
    assert max(w for w in spm.word_ids(pieces) if w is not None) == 1
    with pytest.raises(WordCountMismatch, match=r"^f:2: the tokenizers make 2 source and 1 target words of lines "
                                                r"of 3 and 1 words$"):
        token_pairs([(1, 0)], pieces, ["x"], spm, space, where="f:2", words=(3, 1))
    with pytest.raises(DataError, match=r"^f:2: source word 3 does not exist: the source line has 3 words") as info:
        token_pairs([(3, 0)], pieces, ["x"], spm, space, where="f:2", words=(3, 1))
    assert not isinstance(info.value, WordCountMismatch)


def test_pairs_whose_tokenization_changes_the_word_count_get_no_reference(tmp_path, spm):
    """Through the corpus reader: the line is left without a reference and named in the log line."""
    src = write(tmp_path / "t.src", ["cat sat", "cat \u200b sat"])
    tgt = write(tmp_path / "t.tgt", ["x y", "x"])
    align = write(tmp_path / "t.align", ["0-0 1-1", "1-0"])
    space = build_tokenizer({"type": "space"})
    refs = read_training_alignments(training_corpora({"src": src, "tgt": tgt, "align": align}),
                                    [("cat sat", "x y"), ("cat \u200b sat", "x")], [0, 2], [1, 2], spm, space, [0])
    assert set(refs.by_line) == {1} and refs.mismatched == [f"{align}:2"]
    assert refs.describe(2).endswith(f"; 1 left without one, their tokenization changing a line's word count "
                                     f"(first: {align}:2)")
