"""Reference word alignments of training pairs (guided alignment training), as token positions.

A corpus's alignment file (``data.train.align``) has one line per pair, in the Pharaoh format
fast_align, eflomal and GIZA++ conversions write: ``i-j`` pairs, source word ``i`` aligned to
target word ``j``, both 0-based indices into the whitespace-separated words of the raw lines
(an empty line: the pair has no reference and gets no alignment loss). The model attends over
*tokens*, so each pair becomes every (source piece, target piece) pair of the two words, the
pieces grouped into words by the tokenizer (:meth:`nmt.data.tokenizers.base.Tokenizer.word_ids`:
``space`` one word a token; BPE pieces ending in the separator continue into the next;
sentencepiece pieces starting with the word mark start a word; ``char`` the characters between
space tokens, the space token in no word), and source positions shifted by a source tag's token
(:mod:`nmt.data.source_tags`).

:class:`TrainingAlignments` holds them per input line of the training corpora (counted one after
the other, as ``line_numbers`` count them) and builds a batch's reference distributions: row
``t`` of example ``b`` is the uniform distribution over the source positions aligned to target
token ``t`` (EOS, padding and unaligned tokens: a zero row, no loss).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from nmt.data.errors import DataError
from nmt.data.field import Field
from nmt.data.textfiles import read_lines
from nmt.data.tokenizers import Tokenizer

Pairs = np.ndarray
"""(K, 2) int32: (source position, target position) of the pair's aligned tokens."""


def parse_alignment_line(text: str, where: str) -> list[tuple[int, int]]:
    """The ``(source word, target word)`` pairs of one Pharaoh line; ``DataError`` naming ``where``
    (``file:line``) for an item that is not ``i-j`` with non-negative integers."""
    pairs = []
    for item in text.split():
        s, sep, t = item.partition("-")
        if not sep or not s.isdigit() or not t.isdigit():
            raise DataError(f"{where}: {item!r} is not an alignment pair (Pharaoh format: source-target word "
                            "indices, 0-based, e.g. '0-0 1-2 2-1')")
        pairs.append((int(s), int(t)))
    return pairs


def _positions_of_words(word_ids: Sequence[int | None]) -> tuple[dict[int, list[int]], int]:
    """word -> its piece positions, and the number of words (the highest word id + 1)."""
    positions: dict[int, list[int]] = {}
    for k, w in enumerate(word_ids):
        if w is not None:
            positions.setdefault(w, []).append(k)
    return positions, max(positions, default=-1) + 1


def pieces_of(ids: Sequence[int], field: Field) -> list[str]:
    """The pieces of token ``ids`` as ``field``'s vocabulary spells them (``<unk>`` for unknown ones):
    a segmentation read back from a dataset's ids, for the tokenizer to group into words."""
    tokens = field.vocab.itos
    return [tokens[i] for i in ids]


class WordCountMismatch(DataError):
    """The tokenizer's pieces make another number of words than the raw line has (a normalisation
    that joins, splits or drops words): the line's word indices cannot be mapped to its pieces."""


def token_pairs(word_pairs: Sequence[tuple[int, int]], src_pieces: list[str], tgt_pieces: list[str],
                src_tokenizer: Tokenizer, tgt_tokenizer: Tokenizer, src_offset: int = 0,
                where: str = "<alignments>", words: tuple[int, int] | None = None) -> Pairs:
    """Word pairs -> token pairs: every piece of source word ``i`` (shifted by ``src_offset``, a
    source tag's tokens) with every piece of target word ``j``, each pair once, sorted. ``words``:
    the raw lines' word counts (source, target), against which the indices are checked (else the
    pieces' word counts). A word index past the line's words is a ``DataError`` naming ``where``
    and the word count; pieces that make other word counts than ``words`` raise
    :class:`WordCountMismatch`."""
    (src_words, n_src), (tgt_words, n_tgt) = (_positions_of_words(src_tokenizer.word_ids(src_pieces)),
                                              _positions_of_words(tgt_tokenizer.word_ids(tgt_pieces)))
    counts = words if words is not None else (n_src, n_tgt)
    for i, j in word_pairs:
        for side, index, count in (("source", i, counts[0]), ("target", j, counts[1])):
            if index >= count:
                raise DataError(f"{where}: {side} word {index} does not exist: the {side} line has {count} "
                                f"word{'s' if count != 1 else ''} (indices are 0-based)")
    if (n_src, n_tgt) != tuple(counts):
        raise WordCountMismatch(f"{where}: the tokenizers make {n_src} source and {n_tgt} target words of lines of "
                                f"{counts[0]} and {counts[1]} words")
    out: set[tuple[int, int]] = set()
    for i, j in word_pairs:
        out.update((a + src_offset, b) for a in src_words.get(i, ()) for b in tgt_words.get(j, ()))
    return np.array(sorted(out), dtype=np.int32).reshape(-1, 2)


def reference_grid(pairs: Sequence[Pairs | None], tgt_width: int, src_width: int, rows: int | None = None) -> Tensor:
    """(B, T, L) float32 (CPU): row ``[b, t]`` uniform over the source positions that ``pairs[b]``
    (token pairs, or None: no reference) aligns to target token ``t``, a zero row where it aligns
    none; ``rows``: B when more than the examples given (the rows after them zeros)."""
    grid = np.zeros((len(pairs) if rows is None else rows, tgt_width, src_width), dtype=np.float32)
    for b, p in enumerate(pairs):
        if p is not None and len(p):
            grid[b, p[:, 1], p[:, 0]] = 1.0
    sums = grid.sum(axis=-1, keepdims=True)
    np.divide(grid, sums, out=grid, where=sums > 0)
    return torch.from_numpy(grid)


@dataclass(frozen=True)
class LineWords:
    """What a kept pair's reference is made from, whatever its segmentation: its word ``pairs``, the
    raw lines' word ``counts`` (source, target), the source tag's ``offset`` and ``where`` (file:line)."""

    pairs: list[tuple[int, int]]
    counts: tuple[int, int]
    offset: int
    where: str


class TrainingAlignments:
    """The reference token pairs of the training pairs, by input line (1-based, the corpora's lines
    counted one after the other: a dataset's ``line_numbers``); lines of a corpus without an
    alignment file, and pairs the data rules skipped, have none. ``words``: each kept aligned
    line's :class:`LineWords`, from which :meth:`for_segmentation` maps another segmentation."""

    def __init__(self, by_line: dict[int, Pairs], files: Sequence[str], mismatched: Sequence[str] = (),
                 words: dict[int, LineWords] | None = None) -> None:
        self.by_line = by_line
        self.files = list(files)
        self.mismatched = list(mismatched)
        """``file:line`` of the kept pairs whose tokenization changes a side's word count: no reference."""
        self.words = words or {}

    def for_segmentation(self, dataset, src_field: Field, tgt_field: Field) -> "TrainingAlignments":
        """The references of another segmentation of the same pairs (subword sampling's epoch):
        ``dataset`` (``src`` / ``tgt`` id rows, ``line_numbers``) read back into pieces through the
        fields' vocabularies (:func:`pieces_of`) and grouped into words by their tokenizers. A sampled
        piece outside the vocabulary reads back as ``<unk>``, which can hide a word boundary: such a
        pair's word count changes and it gets no reference (``mismatched``)."""
        by_line: dict[int, Pairs] = {}
        mismatched: list[str] = []
        for k, line in enumerate(dataset.line_numbers):
            entry = self.words.get(int(line))
            if entry is None:
                continue
            src, tgt = pieces_of(dataset.src[k][entry.offset:], src_field), pieces_of(dataset.tgt[k], tgt_field)
            try:
                by_line[int(line)] = token_pairs(entry.pairs, src, tgt, src_field.tokenizer, tgt_field.tokenizer,
                                                 entry.offset, entry.where, entry.counts)
            except WordCountMismatch:
                mismatched.append(entry.where)
        return TrainingAlignments(by_line, self.files, mismatched, self.words)

    def __len__(self) -> int:
        """How many kept pairs have a reference (a non-empty alignment line)."""
        return sum(1 for p in self.by_line.values() if len(p))

    @property
    def n_mismatched(self) -> int:
        """How many kept pairs have no reference because their tokenization changes a word count."""
        return len(self.mismatched)

    def reference(self, line_numbers: Sequence[int], tgt_width: int, src_width: int,
                  rows: int | None = None) -> Tensor:
        """(B, T, L) float32 (CPU) reference distributions of the batch whose examples are input
        lines ``line_numbers`` (row order), padded to ``tgt_width`` (T, decoder inputs) and
        ``src_width`` (L): row ``[b, t]`` is uniform over the source positions aligned to target
        token ``t``, a zero row where that token has none (and on EOS and padding). ``rows``: B when
        it differs from the lines given (the rows after them zeros: a data-parallel rank's
        stand-in batch, which adds no loss)."""
        return reference_grid([self.by_line.get(int(line)) for line in line_numbers], tgt_width, src_width, rows)

    def describe(self, kept: int, pairs: str = "training pairs") -> str:
        """One log line: how many of the ``kept`` ``pairs`` have a reference, from which files."""
        skipped = (f"; {len(self.mismatched)} left without one, their tokenization changing a line's word count "
                   f"(first: {self.mismatched[0]})" if self.mismatched else "")
        return f"{len(self)} of {kept} kept {pairs} have reference alignments ({', '.join(self.files)})" + skipped


def read_training_alignments(corpora: Sequence, pairs: Sequence[tuple[str, str]], starts: Sequence[int],
                             kept_lines: Sequence[int], src_tokenizer: Tokenizer, tgt_tokenizer: Tokenizer,
                             src_offsets: Sequence[int]) -> TrainingAlignments | None:
    """The reference alignments of the corpora that have an ``align`` file (None: none has).

    ``corpora``: :class:`nmt.data.corpora.Corpus` list (``align`` the file or None); ``pairs``: the
    raw training pairs, corpus ``k``'s from ``starts[k]`` on; ``kept_lines``: the 1-based input
    lines the data rules kept (only those are mapped to tokens; every line is parsed); the
    tokenizers group pieces into words; ``src_offsets[k]``: tokens before corpus ``k``'s sources
    (its source tag). ``DataError`` naming the file and line for a file that cannot be read, a line
    count other than its source file's, a malformed pair or a word index past a line's words (of the
    raw line). A pair whose tokenization makes another number of words than its raw line has (a
    normalisation joining or dropping words) gets no reference; ``mismatched`` lists them."""
    if not any(getattr(c, "align", None) for c in corpora):
        return None
    by_line: dict[int, Pairs] = {}
    words: dict[int, LineWords] = {}
    mismatched: list[str] = []
    kept = set(int(n) for n in kept_lines)
    files = []
    for k, corpus in enumerate(corpora):
        if not corpus.align:
            continue
        files.append(corpus.align)
        lines = read_lines(corpus.align)
        n_pairs = int(starts[k + 1] - starts[k])
        if len(lines) != n_pairs:
            raise DataError(f"{Path(corpus.align)} has {len(lines)} lines but {Path(corpus.src)} has {n_pairs} "
                            f"({corpus.key}.align: one alignment line per training pair)")
        for n, text in enumerate(lines, 1):
            where = f"{corpus.align}:{n}"
            word_pairs = parse_alignment_line(text, where)
            line = int(starts[k]) + n
            if line not in kept:
                continue
            src, tgt = pairs[line - 1]
            words[line] = LineWords(word_pairs, (len(src.split()), len(tgt.split())), src_offsets[k], where)
            try:
                by_line[line] = token_pairs(word_pairs, src_tokenizer.tokenize(src), tgt_tokenizer.tokenize(tgt),
                                            src_tokenizer, tgt_tokenizer, src_offsets[k], where, words[line].counts)
            except WordCountMismatch:
                mismatched.append(where)
    return TrainingAlignments(by_line, files, mismatched, words)


__all__ = ["LineWords", "Pairs", "TrainingAlignments", "WordCountMismatch", "pieces_of", "parse_alignment_line",
           "read_training_alignments", "reference_grid", "token_pairs"]
