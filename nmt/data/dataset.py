"""Parallel (and source-only) datasets held as token-id lists, with input checking.

``read_parallel`` raises a one-line ``DataError`` naming the file (and line) for a missing
file, bad UTF-8 or different line counts. ``ParallelDataset`` encodes the pairs, skipping and
counting empty pairs and those the length rules drop (:mod:`nmt.data.pair_filter`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from nmt.data.errors import DataError
from nmt.data.field import Field
from nmt.data.pair_filter import PairFilter, length_rules, skipped_counts
from nmt.data.textfiles import PathLike, read_lines
from nmt.data.unknown_tokens import UnkCounts, count_unk, kept_pairs_line


def read_parallel(src_path: PathLike, tgt_path: PathLike) -> list[tuple[str, str]]:
    """Line-aligned ``(source, target)`` pairs of two UTF-8 files.

    Raises ``DataError``, e.g. ``train.de has 120 lines but train.en has 119``.
    """
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(
            f"{Path(src_path)} has {len(src)} lines but {Path(tgt_path)} has {len(tgt)}"
        )
    return list(zip(src, tgt))


class ParallelDataset:
    """Encoded parallel data.

    Attributes: ``src``/``tgt`` (lists of id lists, no BOS/EOS), ``src_lengths``/``tgt_lengths``
    (lists of ints), ``line_numbers`` (1-based line of each kept pair in the input), ``skipped``
    (rule -> number of pairs it skipped, for the rules of :attr:`PairFilter.rules`: always
    ``{"empty": n, "too_long": m}``, plus ``"too_short"`` / ``"ratio"`` where those rules are on),
    ``skipped_at`` (rule -> the 1-based input lines it skipped: the per-corpus counts of the log),
    ``n_input`` (number of input pairs) and ``unk_tokens`` (side -> ``(<unk> ids, all ids)`` over
    the kept pairs: tokens outside the vocabulary).
    A pair is *empty* when either side has no token, *too long* when a side has more tokens than
    its limit (``None`` = no limit); ``pair_filter`` (:class:`~nmt.data.pair_filter.PairFilter`)
    gives all the rules instead of ``max_src_length`` / ``max_tgt_length`` (then left None).

    ``src_encode`` / ``tgt_encode`` (optional) encode a side instead of its field's deterministic
    ``encode``: ``f(i, text) -> ids`` for pair ``i`` (0-based), e.g. one epoch's sampled
    segmentation (:mod:`nmt.data.epoch_segmentation`).
    """

    def __init__(
        self,
        pairs: Sequence[tuple[str, str]],
        src_field: Field,
        tgt_field: Field,
        max_src_length: int | None = None,
        max_tgt_length: int | None = None,
        *,
        src_encode: Callable[[int, str], list[int]] | None = None,
        tgt_encode: Callable[[int, str], list[int]] | None = None,
        pair_filter: PairFilter | None = None,
    ) -> None:
        rules = length_rules(max_src_length, max_tgt_length, pair_filter)
        self.src_field, self.tgt_field = src_field, tgt_field
        self.pair_filter = rules
        self.max_src_length, self.max_tgt_length = rules.max_src_length, rules.max_tgt_length
        self.src: list[list[int]] = []
        self.tgt: list[list[int]] = []
        self.line_numbers: list[int] = []
        self.skipped = skipped_counts(rules.rules)
        self.skipped_at: dict[str, list[int]] = {rule: [] for rule in rules.rules}
        self.n_input = len(pairs)
        encode_src = src_encode or (lambda _, text: src_field.encode(text))
        encode_tgt = tgt_encode or (lambda _, text: tgt_field.encode(text))
        reason = rules.reason
        for n, (s, t) in enumerate(pairs, 1):
            s_ids = encode_src(n - 1, s) if s.strip() else []
            t_ids = encode_tgt(n - 1, t) if t.strip() else []
            why = reason(len(s_ids), len(t_ids))
            if why is not None:
                self.skipped[why] += 1
                self.skipped_at[why].append(n)
            else:
                self.src.append(s_ids)
                self.tgt.append(t_ids)
                self.line_numbers.append(n)
        self.src_lengths = [len(x) for x in self.src]
        self.tgt_lengths = [len(x) for x in self.tgt]
        self.unk_tokens: UnkCounts = {"src": count_unk(self.src, src_field.vocab.unk_index),
                                      "tgt": count_unk(self.tgt, tgt_field.vocab.unk_index)}

    @classmethod
    def from_files(
        cls,
        src_path: PathLike,
        tgt_path: PathLike,
        src_field: Field,
        tgt_field: Field,
        max_src_length: int | None = None,
        max_tgt_length: int | None = None,
        *,
        pair_filter: PairFilter | None = None,
    ) -> "ParallelDataset":
        """``ParallelDataset(read_parallel(src_path, tgt_path), ...)``."""
        return cls(read_parallel(src_path, tgt_path), src_field, tgt_field, max_src_length, max_tgt_length,
                   pair_filter=pair_filter)

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, i: int) -> tuple[list[int], list[int]]:
        return self.src[i], self.tgt[i]

    def summary(self) -> str:
        """One log line, e.g. ``kept 5990 of 6000 pairs (skipped 2 empty, 8 too long)``, followed
        by ``; <unk>: target 40 of 27000 tokens (0.1%)`` where a side has tokens outside its vocabulary."""
        return kept_pairs_line(len(self), self.n_input, self.skipped, self.unk_tokens)


class SourceDataset:
    """Encoded source lines for translation; every input line is kept, in order.

    Empty lines (no token) have an empty id list; lines longer than ``max_length`` are truncated
    (``n_truncated`` counts them). ``tgt`` is ``None`` and ``tgt_lengths`` are zeros. ``src_tag``:
    one of the field's source tags (:mod:`nmt.data.source_tags`), whose id goes before every
    non-empty line's ids (and counts toward ``max_length``; a tag the field lacks is a ``DataError``).
    """

    def __init__(self, lines: Sequence[str], field: Field, max_length: int | None = None,
                 src_tag: str | None = None) -> None:
        if max_length is not None and max_length < 1:
            raise DataError(f"max_length: expected a positive integer or null, got {max_length}")
        self.field = field
        prefix = field.tag_ids(src_tag)
        self.src: list[list[int]] = [field.encode(line) if line.strip() else [] for line in lines]
        if prefix:
            self.src = [prefix + ids if ids else ids for ids in self.src]
        self.n_truncated = 0
        if max_length is not None:
            for i, ids in enumerate(self.src):
                if len(ids) > max_length:
                    self.src[i] = ids[:max_length]
                    self.n_truncated += 1
        self.tgt = None
        self.src_lengths = [len(x) for x in self.src]
        self.tgt_lengths = [0] * len(self.src)
        self.line_numbers = list(range(1, len(self.src) + 1))

    def __len__(self) -> int:
        return len(self.src)


__all__ = ["ParallelDataset", "SourceDataset", "read_lines", "read_parallel"]
