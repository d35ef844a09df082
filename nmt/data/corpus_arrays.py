"""Several training corpora's token-id caches read as one dataset (``data.id_cache`` with
``data.train`` a list of corpora).

Each corpus has its own cache (:func:`nmt.data.id_arrays.load_id_dataset`: next to its source
file, keyed by its files, the fields and the length limits), so a corpus shared by two runs'
lists is encoded once. :class:`ConcatenatedArrays` reads them one after the other, as
:func:`nmt.data.corpora.read_corpora` puts the pairs of the list path one after the other: its
``line_numbers`` count the corpora's lines consecutively (corpus ``k``'s line ``n`` is
``starts[k] + n``), so :class:`nmt.data.corpora.CorpusWeights` builds the same epochs from it as
from the list dataset. The token ids stay memory-mapped; only the per-pair lengths and line
numbers (8 bytes a pair each) are copied into one array.
"""
from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

import numpy as np

from nmt.data.errors import DataError
from nmt.data.id_arrays import ArrayParallelDataset, PairArrays, RaggedIds
from nmt.data.unknown_tokens import UnkCounts


class _ChainedRows:
    """The rows of ``parts`` one after the other: ``rows[i]`` is a list of ids."""

    def __init__(self, parts: Sequence[RaggedIds]) -> None:
        self.parts = list(parts)
        self.ends = np.cumsum([len(p) for p in self.parts]).tolist()

    def __len__(self) -> int:
        return self.ends[-1] if self.ends else 0

    def __getitem__(self, i: int) -> list[int]:
        if not 0 <= i < len(self):
            raise IndexError(f"row {i} out of range [0, {len(self)})")
        k = bisect_right(self.ends, i)
        return self.parts[k][i - (self.ends[k - 1] if k else 0)]


class ConcatenatedArrays(PairArrays):
    """The kept pairs of several :class:`ArrayParallelDataset` (one per corpus, in order), with the
    interface the trainer, batching and collation read: ``src`` / ``tgt`` rows, ``src_lengths`` /
    ``tgt_lengths`` (int64, one per kept pair), ``line_numbers`` (1-based over the corpora's
    lines counted consecutively), ``skipped`` / ``n_input`` / ``unk_tokens`` summed over the
    corpora, ``starts`` (``len(parts) + 1``: corpus ``k`` holds input lines ``starts[k] + 1`` to
    ``starts[k + 1]``) and ``summary()`` (:meth:`PairArrays.summary`, over all corpora)."""

    def __init__(self, parts: Sequence[ArrayParallelDataset]) -> None:
        if not parts:
            raise DataError("concatenated id arrays: no corpus")
        self.parts = list(parts)
        self.src_field, self.tgt_field = parts[0].src_field, parts[0].tgt_field
        self.src = _ChainedRows([p.src for p in parts])
        self.tgt = _ChainedRows([p.tgt for p in parts])
        self.src_lengths = np.concatenate([np.asarray(p.src_lengths, dtype=np.int64) for p in parts])
        self.tgt_lengths = np.concatenate([np.asarray(p.tgt_lengths, dtype=np.int64) for p in parts])
        self.starts = np.concatenate([[0], np.cumsum([p.n_input for p in parts])]).astype(np.int64)
        self.line_numbers = np.concatenate([np.asarray(p.line_numbers, dtype=np.int64) + start
                                            for p, start in zip(parts, self.starts[:-1])])
        self.n_input = int(self.starts[-1])
        self.skipped = {key: sum(p.skipped.get(key, 0) for p in parts) for key in parts[0].skipped}
        self.max_src_length, self.max_tgt_length = parts[0].max_src_length, parts[0].max_tgt_length
        counts = [p.unk_tokens for p in parts]
        self.unk_tokens: UnkCounts | None = (None if any(c is None for c in counts) else
                                             {side: (sum(c[side][0] for c in counts), sum(c[side][1] for c in counts))
                                              for side in ("src", "tgt")})


__all__ = ["ConcatenatedArrays"]
