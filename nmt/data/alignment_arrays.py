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
``len``. Subword sampling (a new segmentation every epoch) is not served from the cache.
"""
from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from torch import Tensor

from nmt.data.errors import DataError
from nmt.data.id_arrays import read_array_cache, write_array_cache
from nmt.data.textfiles import PathLike, iter_lines
from nmt.data.tokenizers import Tokenizer
from nmt.data.word_alignments import WordCountMismatch, parse_alignment_line, reference_grid, token_pairs
from nmt.utils.allocator import release_freed_memory

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


def build_alignment_arrays(src_path: PathLike, tgt_path: PathLike, align_path: PathLike,
                           kept_lines: np.ndarray, n_input: int, src_tokenizer: Tokenizer, tgt_tokenizer: Tokenizer,
                           src_offset: int = 0, where_key: str = "data.train") -> tuple[dict[str, np.ndarray], dict]:
    """Stream one corpus's files: ``(arrays, meta)`` of the kept pairs' token pairs. ``kept_lines``:
    the corpus's kept input lines (1-based, increasing: its id dataset's ``line_numbers``);
    ``n_input``: its input lines, which the alignment file must have too; ``src_offset``: the source
    tag's tokens. ``meta``: ``with_reference`` (kept pairs with a non-empty line), ``mismatched`` and
    ``first_mismatched`` (``file:line``)."""
    kept = np.asarray(kept_lines, dtype=np.int64)
    flat: list[np.ndarray] = []
    offsets = np.zeros(kept.size + 1, dtype=np.int64)
    mismatched, first, with_reference, k, n = 0, None, 0, 0, 0
    for n, (src, tgt, text) in enumerate(zip(iter_lines(src_path), iter_lines(tgt_path), iter_lines(align_path)), 1):
        where = f"{align_path}:{n}"
        word_pairs = parse_alignment_line(text, where)
        if k < kept.size and kept[k] == n:
            counts = (len(src.split()), len(tgt.split()))
            try:
                pairs = token_pairs(word_pairs, src_tokenizer.tokenize(src), tgt_tokenizer.tokenize(tgt),
                                    src_tokenizer, tgt_tokenizer, src_offset, where, counts)
            except WordCountMismatch:
                pairs = np.zeros((0, 2), dtype=np.int32)
                mismatched += 1
                first = first or where
            flat.append(pairs)
            with_reference += bool(len(pairs))
            offsets[k + 1] = offsets[k] + len(pairs)
            k += 1
    n_align = sum(1 for _ in iter_lines(align_path)) if n == n_input else n
    if n_align != n_input or k != kept.size:
        raise DataError(f"{Path(align_path)} has {n_align} lines but {Path(src_path)} has {n_input} "
                        f"({where_key}.align: one alignment line per training pair)")
    pairs = np.concatenate(flat) if flat else np.zeros((0, 2), dtype=np.int32)
    meta = {"version": ALIGNMENT_CACHE_VERSION, "with_reference": with_reference, "mismatched": mismatched,
            "first_mismatched": first}
    return {"pairs": pairs.astype(np.int32).reshape(-1, 2), "offsets": offsets}, meta


def load_alignment_arrays(directory: Path, build: Callable[[], tuple[dict[str, np.ndarray], dict]]
                          ) -> tuple[dict[str, np.ndarray], dict]:
    """The arrays cached in ``directory`` (memory-mapped), built by ``build()`` and written there
    atomically first where missing (another process's finished cache stands)."""
    cached = read_array_cache(directory, ARRAYS, ALIGNMENT_CACHE_VERSION, "alignment cache")
    if cached is not None:
        logger.info("alignment cache: %s", directory)
        return cached
    arrays, meta = build()
    write_array_cache(directory, arrays, meta)
    del arrays
    release_freed_memory()
    cached = read_array_cache(directory, ARRAYS, ALIGNMENT_CACHE_VERSION, "alignment cache")
    if cached is None:
        raise DataError(f"{directory}: alignment cache missing right after it was written")
    logger.info("alignment cache written: %s", directory)
    return cached


class ArrayAlignments:
    """The reference token pairs of the kept pairs of one or more cached corpora, by input line
    (1-based, the corpora's lines counted one after the other, as the dataset's ``line_numbers``).

    ``parts``: per corpus with an alignment file, ``(line_numbers, arrays, meta)``: its kept pairs'
    global input lines (increasing) and :func:`build_alignment_arrays`' arrays and meta; ``files``:
    the alignment files."""

    def __init__(self, parts: Sequence[tuple[np.ndarray, dict[str, np.ndarray], dict]], files: Sequence[str]) -> None:
        self.lines = [np.asarray(lines, dtype=np.int64) for lines, _, _ in parts]
        self.pairs = [arrays["pairs"] for _, arrays, _ in parts]
        self.offsets = [arrays["offsets"] for _, arrays, _ in parts]
        self.files = list(files)
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


__all__ = ["ALIGNMENT_CACHE_VERSION", "ArrayAlignments", "alignment_cache_key", "build_alignment_arrays",
           "load_alignment_arrays"]
