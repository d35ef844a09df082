"""Reference word alignments of ``data.id_cache`` corpora as flat token-pair arrays, cached beside their ids.

Guided alignment reads a corpus's Pharaoh file (``data.train.align``) and maps each kept pair's word
pairs to token pairs (:func:`nmt.data.word_alignments.token_pairs`). For a corpus held as a token-id
cache (:mod:`nmt.data.id_arrays`: tens of millions of pairs, never a Python list per sentence) the
token pairs are held the same way: ``pairs`` (K, 2) int32, every kept pair's (source position,
target position) one after the other, and ``offsets`` (int64, one more than the kept pairs): kept pair
``i`` has ``pairs[offsets[i]:offsets[i + 1]]``. They are built once by streaming the source, target and
alignment files together (each kept pair tokenized again, as the text path does, so the references are
the same), written atomically into the id cache's directory under a key that adds the alignment file's
path, size, mtime and ctime to the id cache's key, and memory-mapped at load. Every line is parsed (a
malformed pair, a word index past its raw line's words or another line count is a ``DataError`` naming
file and line, as without the cache); a pair whose tokenization changes a line's word count has no
reference (counted, the first named).

:class:`ArrayAlignments` answers what the trainer asks of
:class:`nmt.data.word_alignments.TrainingAlignments`: ``reference`` grids by input line, ``describe``,
``len``, and with subword sampling :meth:`ArrayAlignments.for_segmentation` (each epoch's references,
streaming the files again and reading the epoch's pieces back from its ids, held in memory for the
epoch: 8 bytes a token pair).
"""
from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from pathlib import Path

import numpy as np
from torch import Tensor

from nmt.data.errors import DataError
from nmt.data.field import Field
from nmt.data.id_arrays import cached_arrays
from nmt.data.textfiles import PathLike, iter_lines
from nmt.data.tokenizers import Tokenizer
from nmt.data.word_alignments import WordCountMismatch, parse_alignment_line, pieces_of, reference_grid, token_pairs

logger = logging.getLogger(__name__)

ALIGNMENT_CACHE_VERSION = 1
ARRAYS = ("pairs", "offsets")


def alignment_cache_key(id_key: str, align_path: PathLike, src_offset: int) -> str:
    """The key of a corpus's alignment arrays: its id cache's key (files, fields, rules, tag), the
    alignment file's path, size, mtime and ctime, and the source tag's length."""
    path = Path(align_path).resolve()
    try:
        stat = path.stat()
    except OSError:
        raise DataError(f"{path}: no such file") from None
    record = {"version": ALIGNMENT_CACHE_VERSION, "id_key": id_key, "src_offset": int(src_offset),
              "align": [str(path), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]}
    return "align-" + hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:24]


def _token_pair_arrays(src_path: PathLike, tgt_path: PathLike, align_path: PathLike, kept: np.ndarray,
                       pieces: Callable[[int, str, str], tuple[list[str], list[str]]], src_tokenizer: Tokenizer,
                       tgt_tokenizer: Tokenizer, src_offset: int, parse_every_line: bool
                       ) -> tuple[dict[str, np.ndarray], dict, int]:
    """The files streamed together: ``(arrays, meta, the alignment file's lines)`` of the pairs at the
    corpus's input lines ``kept`` (1-based, increasing), the ``k``-th's pieces from ``pieces(k, source
    line, target line)``; ``parse_every_line``: the other lines' alignments are parsed (checked) too.
    The alignment file is read once (its lines past the source file's are counted, not parsed)."""
    flat: list[np.ndarray] = []
    offsets = np.zeros(kept.size + 1, dtype=np.int64)
    mismatched, first, with_reference, k, n = 0, None, 0, 0, 0
    align_lines = iter_lines(align_path)
    for n, (src, tgt, text) in enumerate(zip(iter_lines(src_path), iter_lines(tgt_path), align_lines), 1):
        if not (k < kept.size and kept[k] == n):
            if parse_every_line:
                parse_alignment_line(text, f"{align_path}:{n}")
            continue
        where = f"{align_path}:{n}"
        try:
            pairs = token_pairs(parse_alignment_line(text, where), *pieces(k, src, tgt), src_tokenizer, tgt_tokenizer,
                                src_offset, where, (len(src.split()), len(tgt.split())))
        except WordCountMismatch:
            pairs = np.zeros((0, 2), dtype=np.int32)
            mismatched += 1
            first = first or where
        flat.append(pairs)
        with_reference += bool(len(pairs))
        offsets[k + 1] = offsets[k] + len(pairs)
        k += 1
    pairs = np.concatenate(flat).astype(np.int32).reshape(-1, 2) if flat else np.zeros((0, 2), dtype=np.int32)
    meta = {"version": ALIGNMENT_CACHE_VERSION, "with_reference": with_reference, "mismatched": mismatched,
            "first_mismatched": first}
    # zip stops at the shortest file: the alignment lines it did not take (none where the files agree)
    return {"pairs": pairs, "offsets": offsets[:k + 1]}, meta, n + sum(1 for _ in align_lines)


def build_alignment_arrays(src_path: PathLike, tgt_path: PathLike, align_path: PathLike,
                           kept_lines: np.ndarray, n_input: int, src_tokenizer: Tokenizer, tgt_tokenizer: Tokenizer,
                           src_offset: int = 0, where_key: str = "data.train") -> tuple[dict[str, np.ndarray], dict]:
    """Stream one corpus's files: ``(arrays, meta)`` of the kept pairs' token pairs (each kept pair
    tokenized again, as the text path does). ``kept_lines``: the corpus's kept input lines (1-based,
    increasing: its id dataset's ``line_numbers``); ``n_input``: its input lines, which the alignment
    file must have too; ``src_offset``: the source tag's tokens. ``meta``: ``with_reference`` (kept
    pairs with a non-empty line), ``mismatched`` and ``first_mismatched`` (``file:line``)."""
    kept = np.asarray(kept_lines, dtype=np.int64)
    arrays, meta, n_align = _token_pair_arrays(
        src_path, tgt_path, align_path, kept,
        lambda _, src, tgt: (src_tokenizer.tokenize(src), tgt_tokenizer.tokenize(tgt)),
        src_tokenizer, tgt_tokenizer, src_offset, parse_every_line=True)
    if n_align != n_input or arrays["offsets"].size != kept.size + 1:
        raise DataError(f"{Path(align_path)} has {n_align} lines but {Path(src_path)} has {n_input} "
                        f"({where_key}.align: one alignment line per training pair)")
    return arrays, meta


def load_alignment_arrays(directory: Path, build: Callable[[], tuple[dict[str, np.ndarray], dict]]
                          ) -> tuple[dict[str, np.ndarray], dict]:
    """The arrays cached in ``directory`` (memory-mapped), built by ``build()`` and written there
    atomically first where missing (:func:`nmt.data.id_arrays.cached_arrays`)."""
    cached = cached_arrays(directory, ARRAYS, ALIGNMENT_CACHE_VERSION, build, "alignment cache")
    assert cached is not None  # built where missing
    return cached


@dataclass(frozen=True)
class AlignedFiles:
    """One aligned corpus as :meth:`ArrayAlignments.for_segmentation` streams it again: its files, the
    input lines before it (``start``: its line ``n`` is input line ``start + n``) and its own
    (``n_input``), its source tag's tokens (``src_offset``) and its config key (``key``, e.g.
    ``data.train[0]``)."""

    src: str
    tgt: str
    align: str
    start: int
    n_input: int
    src_offset: int
    key: str = "data.train"


def segmentation_arrays(files: AlignedFiles, dataset: Any, src_field: Field, tgt_field: Field
                        ) -> tuple[np.ndarray, dict[str, np.ndarray], dict]:
    """``(line_numbers, arrays, meta)`` as :class:`ArrayAlignments` holds a part, for another
    segmentation of the corpus's pairs (subword sampling's epoch): ``dataset`` (``src`` / ``tgt`` id
    rows, increasing global ``line_numbers``) read back into pieces through the fields' vocabularies
    (:func:`nmt.data.word_alignments.pieces_of`) while the corpus's source, target (their raw word
    counts) and alignment files are streamed; a pair whose pieces make other word counts (a sampled
    piece read back as ``<unk>`` can hide a word boundary) has no reference (counted). In memory."""
    lines = np.asarray(dataset.line_numbers, dtype=np.int64)
    first = int(np.searchsorted(lines, files.start + 1))
    after = int(np.searchsorted(lines, files.start + files.n_input + 1))
    offset = files.src_offset

    def pieces(k: int, _src: str, _tgt: str) -> tuple[list[str], list[str]]:
        return pieces_of(dataset.src[first + k][offset:], src_field), pieces_of(dataset.tgt[first + k], tgt_field)

    arrays, meta, _ = _token_pair_arrays(files.src, files.tgt, files.align, lines[first:after] - files.start, pieces,
                                         src_field.tokenizer, tgt_field.tokenizer, offset, parse_every_line=False)
    return lines[first:after], arrays, meta


class ArrayAlignments:
    """The reference token pairs of the kept pairs of one or more cached corpora, by input line
    (1-based, the corpora's lines counted one after the other, as the dataset's ``line_numbers``).

    ``parts``: per corpus with an alignment file, ``(line_numbers, arrays, meta)``: its kept pairs'
    global input lines (increasing) and :func:`build_alignment_arrays`' arrays and meta; ``sources``:
    those corpora's :class:`AlignedFiles`, in the same order (what :meth:`for_segmentation` streams
    again; ``files``: their alignment files)."""

    def __init__(self, parts: Sequence[tuple[np.ndarray, dict[str, np.ndarray], dict]],
                 sources: Sequence[AlignedFiles]) -> None:
        self.sources = list(sources)
        self.lines = [np.asarray(lines, dtype=np.int64) for lines, _, _ in parts]
        self.pairs = [arrays["pairs"] for _, arrays, _ in parts]
        self.offsets = [arrays["offsets"] for _, arrays, _ in parts]
        self.files = [f.align for f in self.sources]
        self.n_with_reference = sum(int(meta["with_reference"]) for _, _, meta in parts)
        self.n_mismatched = sum(int(meta["mismatched"]) for _, _, meta in parts)
        firsts = [meta["first_mismatched"] for _, _, meta in parts if meta["first_mismatched"]]
        self.first_mismatched = firsts[0] if firsts else None

    def __len__(self) -> int:
        """How many kept pairs have a reference (a non-empty alignment line)."""
        return self.n_with_reference

    def pairs_of(self, line: int) -> np.ndarray | None:
        """(K, 2) the token pairs of input line ``line`` (None: no alignment file covers it, or the
        data rules skipped it)."""
        for lines, pairs, offsets in zip(self.lines, self.pairs, self.offsets):
            k = int(np.searchsorted(lines, line))
            if k < lines.size and lines[k] == line:
                return np.asarray(pairs[offsets[k]:offsets[k + 1]])
        return None

    def reference(self, line_numbers: Sequence[int], tgt_width: int, src_width: int,
                  rows: int | None = None) -> Tensor:
        """As :meth:`nmt.data.word_alignments.TrainingAlignments.reference`: (B, T, L) float32 reference
        distributions of the batch whose examples are input lines ``line_numbers``."""
        return reference_grid([self.pairs_of(int(line)) for line in line_numbers], tgt_width, src_width, rows)

    def describe(self, kept: int, pairs: str = "training pairs") -> str:
        """One log line: how many of the ``kept`` ``pairs`` have a reference, from which files."""
        skipped = (f"; {self.n_mismatched} left without one, their tokenization changing a line's word count "
                   f"(first: {self.first_mismatched})" if self.n_mismatched else "")
        return (f"{len(self)} of {kept} kept {pairs} have reference alignments ({', '.join(self.files)}; "
                "cached with the token ids)" + skipped)

    @property
    def mismatched(self) -> list[str]:
        """The first pair left without a reference (``file:line``), as a one-item list (the count: ``n_mismatched``)."""
        return [self.first_mismatched] if self.first_mismatched else []

    def for_segmentation(self, dataset: Any, src_field: Field, tgt_field: Field) -> "ArrayAlignments":
        """The references of another segmentation of the same pairs (subword sampling's epoch, whose
        ``dataset`` holds its ids): each aligned corpus streamed again (:func:`segmentation_arrays`),
        held in memory for the epoch."""
        return ArrayAlignments([segmentation_arrays(f, dataset, src_field, tgt_field) for f in self.sources],
                               self.sources)


__all__ = ["ALIGNMENT_CACHE_VERSION", "AlignedFiles", "ArrayAlignments", "alignment_cache_key",
           "build_alignment_arrays", "load_alignment_arrays", "segmentation_arrays"]
