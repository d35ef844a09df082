"""Word alignments from source attention, and unknown-word replacement (pure functions, NumPy only).

The attention of one hypothesis is a (T, L) matrix: row t is the source attention of decoding
step t (the step that produced target token t), column i source piece i. Sources carry no
BOS/EOS, so every column is a source piece; the rows are the generated tokens, EOS included when
generated (:func:`output_rows` keeps the rows of output pieces: those before the first EOS,
padding and BOS left out, ``<unk>`` kept). For the Transformer the matrix is the last decoder
layer's cross-attention averaged over its heads (``TransformerSeq2Seq``); for an RNN model the
global attention's distribution (with combined continuous attention, its discrete part); for an
ensemble the members' mean.

Two modes give a target piece its source pieces:

- ``argmax``: the most attended source piece (the first on ties), as OpenNMT-py's
  ``-report_align`` and fairseq's ``--print-alignment`` take it;
- ``support``: every source piece whose attention exceeds ``threshold`` (default 0: the exact
  support of a sparse attention -- sparsemax, entmax, fusedmax give exact zeros; a softmax
  attention's support is every source piece).

Token-level pairs number pieces; word-level pairs number words, a source word and a target word
being aligned when any of their pieces are (pieces grouped by
:meth:`nmt.data.tokenizers.base.Tokenizer.word_ids`; pieces of no word, such as the ``char``
tokenizer's space token, make no pair). Pairs are ``(source, target)``, 0-based, sorted, and
written in the Pharaoh format ``"0-0 1-2 ..."`` (:func:`pharaoh`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from nmt.data.word_alignments import parse_alignment_line

ALIGN_MODES = ("argmax", "support")
ALIGN_LEVELS = ("word", "token")
UNK = "<unk>"
"""The label of the unknown token (``nmt.data.vocabulary.UNK``), the one ``replace_unknowns`` replaces."""
NOT_OUTPUT = ("<pad>", "<bos>")
"""Labels of generated tokens that are no output piece (``Field.decode_tokens`` drops them)."""
EOS = "<eos>"

Pair = tuple[int, int]


@dataclass(frozen=True)
class AlignOptions:
    """How alignments are made: ``mode`` ("argmax" or "support"), ``level`` ("word" or
    "token") and, for "support", the attention ``threshold`` a source piece must exceed (>= 0,
    default 0: the exact support). ValueError naming the field for a bad value."""

    mode: str = "argmax"
    level: str = "word"
    threshold: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in ALIGN_MODES:
            raise ValueError(f"align_mode must be one of {', '.join(ALIGN_MODES)}, got {self.mode!r}")
        if self.level not in ALIGN_LEVELS:
            raise ValueError(f"align_level must be one of {', '.join(ALIGN_LEVELS)}, got {self.level!r}")
        value = self.threshold
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise ValueError(f"align_threshold must be a number in [0, 1), got {value!r}")

    def report_settings(self) -> dict[str, Any]:
        """The settings as a report records them (``-report``'s ``"decoding"``, scoring's records),
        named as the flags: ``align_mode``, ``align_level`` and, for "support", ``align_threshold``
        (argmax reads no threshold)."""
        settings: dict[str, Any] = {"align_mode": self.mode, "align_level": self.level}
        if self.mode == "support":
            settings["align_threshold"] = float(self.threshold)
        return settings


def output_rows(tokens: Sequence[str]) -> list[int]:
    """Rows (steps) of ``tokens`` (one label per generated id) that are output pieces: those
    before the first EOS, without padding or BOS; the pieces ``Field.decode_tokens`` keeps."""
    rows = []
    for t, label in enumerate(tokens):
        if label == EOS:
            break
        if label not in NOT_OUTPUT:
            rows.append(t)
    return rows


def attended(row: np.ndarray, mode: str, threshold: float = 0.0) -> list[int]:
    """Source positions one attention ``row`` (L,) aligns to: ``[argmax]`` (the first maximum;
    none where the row is all zero) or, for "support", every position above ``threshold``."""
    if row.size == 0:
        return []
    if mode == "argmax":
        best = int(np.argmax(row))
        return [best] if row[best] > 0 else []
    return [int(i) for i in np.flatnonzero(row > threshold)]


def token_pairs(attention: np.ndarray, rows: Sequence[int], options: AlignOptions) -> list[Pair]:
    """``(source piece, target piece)`` pairs, sorted: target piece j is attention row ``rows[j]``
    ((T, L) matrix, see :func:`output_rows`)."""
    pairs = {(i, j) for j, r in enumerate(rows) for i in attended(attention[r], options.mode, options.threshold)}
    return sorted(pairs)


def word_pairs(pairs: Iterable[Pair], src_words: Sequence[int | None], tgt_words: Sequence[int | None]) -> list[Pair]:
    """Token pairs as ``(source word, target word)`` pairs, sorted and unique: piece k of a side
    is in word ``*_words[k]`` (None: in no word, its pairs dropped)."""
    out = set()
    for i, j in pairs:
        s, t = src_words[i], tgt_words[j]
        if s is not None and t is not None:
            out.add((s, t))
    return sorted(out)


def align(attention: np.ndarray, rows: Sequence[int], options: AlignOptions,
          src_words: Sequence[int | None] | None = None, tgt_words: Sequence[int | None] | None = None,
          src_offset: int = 0) -> list[Pair]:
    """The alignment of one hypothesis: token pairs (``options.level == "token"``) or word pairs
    (``src_words`` / ``tgt_words``: each piece's word, as ``Tokenizer.word_ids`` gives them).
    ``src_offset``: the attention's first source columns that are no piece of the line (a source
    tag): attended like any column, but a token pair to one is dropped and the others count the
    line's pieces from 0 (at word level their ``src_words`` entries are None)."""
    pairs = token_pairs(attention, rows, options)
    if options.level == "token":
        return [(i - src_offset, j) for i, j in pairs if i >= src_offset] if src_offset else pairs
    if src_words is None or tgt_words is None:
        raise ValueError("word-level alignment needs the words of the source and target pieces")
    return word_pairs(pairs, src_words, tgt_words)


def pharaoh(pairs: Iterable[Pair]) -> str:
    """Pairs in the Pharaoh format: ``"0-0 1-2"`` (source-target, as given)."""
    return " ".join(f"{s}-{t}" for s, t in pairs)


def parse_pharaoh(text: str) -> list[Pair]:
    """The pairs of a Pharaoh string (inverse of :func:`pharaoh`); ValueError (a ``DataError``) for
    a bad one: :func:`nmt.data.word_alignments.parse_alignment_line`, which reads training
    alignment files too."""
    return parse_alignment_line(text, "Pharaoh alignment")


def replace_unknowns(pieces: Sequence[str], rows: Sequence[int], attention: np.ndarray,
                     src_pieces: Sequence[str], unk: str = UNK, table: Mapping[str, str] | None = None) -> list[str]:
    """``pieces`` with each ``unk`` replaced by the source piece of highest attention at its step
    (attention row ``rows[j]`` for piece j; the first maximum on ties): that piece's surface
    string in ``src_pieces`` (the tokenized input, which keeps the rare words the vocabulary maps
    to ``<unk>``), or its entry in ``table`` where it has one (a phrase table,
    :mod:`nmt.translate.phrase_table`). An ``<unk>`` whose row is all zero (no source) stays."""
    out = list(pieces)
    for j, piece in enumerate(pieces):
        if piece == unk:
            best = attended(attention[rows[j]], "argmax")
            if best and best[0] < len(src_pieces):
                source = src_pieces[best[0]]
                out[j] = source if table is None else table.get(source, source)
    return out


__all__ = ["ALIGN_LEVELS", "ALIGN_MODES", "AlignOptions", "Pair", "UNK", "align", "attended", "output_rows",
           "parse_pharaoh", "pharaoh", "replace_unknowns", "token_pairs", "word_pairs"]
