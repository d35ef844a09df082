"""The training pairs segmented anew for every epoch (subword regularization).

:class:`ResampledPairs` keeps the raw training pairs and, per side, a sampler
(:mod:`nmt.data.subword_sampling`) or none (that side keeps its deterministic ids, encoded once).
``for_epoch(seed, epoch)`` is a :class:`~nmt.data.dataset.ParallelDataset` of that epoch's
segmentation: a function of ``(seed, epoch)`` only, so every process of a data-parallel job and a
resumed run see the same one. The length rules (:mod:`nmt.data.pair_filter`: maximum and minimum
lengths, length ratio) apply to each epoch's segmentation (a pair too long, too short or over the
ratio in one epoch is skipped in that epoch only); pieces outside the vocabulary become ``<unk>``.
"""
from __future__ import annotations

import gc
from collections.abc import Callable, Sequence

from nmt.data.corpus_arrays import ConcatenatedArrays
from nmt.data.dataset import ParallelDataset
from nmt.data.errors import DataError
from nmt.data.field import Field
from nmt.data.id_arrays import ArrayParallelDataset, encode_to_arrays
from nmt.data.pair_filter import PairFilter, length_rules
from nmt.data.source_tags import tagged
from nmt.data.subword_sampling import SubwordSampler, epoch_random
from nmt.data.unknown_tokens import SIDE_NAMES


class ResampledPairs:
    """Training pairs whose sampled sides are re-segmented each epoch.

    pairs: the raw ``(source, target)`` lines; src_sampler / tgt_sampler: a side's sampler (of
    tokens, or of that side's ids: ``sampler.ids``), or None for a side segmented
    deterministically; max_src_length / max_tgt_length: the length limits (``None``: no limit),
    or ``pair_filter`` all the length rules, applied per epoch; ``src_prefix`` (optional):
    ``f(i)``, the ids put before pair ``i``'s source ids every epoch (its corpus's source tag,
    :func:`nmt.data.source_tags.pair_prefixes`).
    """

    def __init__(self, pairs: Sequence[tuple[str, str]], src_field: Field, tgt_field: Field,
                 src_sampler: SubwordSampler | None, tgt_sampler: SubwordSampler | None,
                 max_src_length: int | None = None, max_tgt_length: int | None = None, *,
                 pair_filter: PairFilter | None = None,
                 src_prefix: Callable[[int], Sequence[int]] | None = None) -> None:
        if src_sampler is None and tgt_sampler is None:
            raise DataError("subword sampling: neither side samples")
        self.pairs = pairs
        self.src_field, self.tgt_field = src_field, tgt_field
        self.samplers = {"src": src_sampler, "tgt": tgt_sampler}
        self.pair_filter = length_rules(max_src_length, max_tgt_length, pair_filter)
        self.src_prefix = src_prefix
        # a side without sampling: its deterministic ids, once (every epoch reuses them)
        self._fixed = {side: [field.encode(text) if text.strip() else [] for text in
                              (p[k] for p in pairs)]
                       for k, (side, field) in enumerate((("src", src_field), ("tgt", tgt_field)))
                       if self.samplers[side] is None}

    def for_epoch(self, seed: int, epoch: int) -> ParallelDataset:
        """The pairs as segmented in ``epoch`` of a run seeded with ``seed`` (kept and skipped by
        :class:`ParallelDataset`'s rules; its ``line_numbers`` index ``pairs``)."""
        encoders = {}
        for side, field in (("src", self.src_field), ("tgt", self.tgt_field)):
            sampler = self.samplers[side]
            if sampler is None:
                fixed = self._fixed[side]
                encoders[side] = lambda i, _, fixed=fixed: fixed[i]
            else:  # the lines in order, each side from its own generator
                encoders[side] = _sampled_encoder(sampler, field, seed, epoch, side)
        if self.src_prefix is not None:
            encoders["src"] = tagged(encoders["src"], self.src_prefix)
        enabled = gc.isenabled()
        gc.disable()  # no cycles made here; the samplers' caches would make each collection long
        try:
            return ParallelDataset(self.pairs, self.src_field, self.tgt_field, pair_filter=self.pair_filter,
                                   src_encode=encoders["src"], tgt_encode=encoders["tgt"])
        finally:
            if enabled:
                gc.enable()

    def describe(self) -> str:
        """e.g. ``source: BPE-dropout 0.1; target: deterministic``."""
        return _describe(self.samplers)


def _describe(samplers: dict[str, SubwordSampler | None]) -> str:
    return "; ".join(f"{SIDE_NAMES[side]}: {sampler.describe() if sampler is not None else 'deterministic'}"
                     for side, sampler in samplers.items())


def _sampled_encoder(sampler: SubwordSampler, field: Field, seed: int, epoch: int, side: str):
    """``f(i, text) -> ids`` of one epoch's segmentation of ``side``: the lines in order, drawn from
    that side's generator of ``(seed, epoch)``."""
    rng = epoch_random(seed, epoch, side)
    if sampler.ids:
        return lambda i, text, sample=sampler.sample: sample(text, rng)
    return lambda i, text, sample=sampler.sample, encode=field.encode_tokens: encode(sample(text, rng))


class ResampledFiles:
    """The epochs of :class:`ResampledPairs` made by streaming the training files instead of
    holding their text (``data.id_cache``): ``files`` the ``(source, target)`` paths of each corpus,
    read one after the other every epoch; a deterministic side is encoded again with its field;
    ``src_prefixes`` (optional): per corpus, the ids put before each source (its source tag's).
    ``for_epoch`` returns flat in-memory id arrays (:class:`~nmt.data.id_arrays.ArrayParallelDataset`,
    4 bytes a token; several corpora as one :class:`~nmt.data.corpus_arrays.ConcatenatedArrays`)
    holding the pairs, ids and line numbers :class:`ResampledPairs` gives over the corpora's pairs
    read one after the other: the same draws, in the same order."""

    def __init__(self, files: Sequence[tuple[str, str]], src_field: Field, tgt_field: Field,
                 src_sampler: SubwordSampler | None, tgt_sampler: SubwordSampler | None,
                 max_src_length: int | None = None, max_tgt_length: int | None = None, *,
                 pair_filter: PairFilter | None = None, src_prefixes: Sequence[Sequence[int]] | None = None) -> None:
        if src_sampler is None and tgt_sampler is None:
            raise DataError("subword sampling: neither side samples")
        self.files = list(files)
        self.src_prefixes = [list(p) for p in src_prefixes] if src_prefixes is not None else [[]] * len(self.files)
        self.src_field, self.tgt_field = src_field, tgt_field
        self.samplers = {"src": src_sampler, "tgt": tgt_sampler}
        self.pair_filter = length_rules(max_src_length, max_tgt_length, pair_filter)

    def for_epoch(self, seed: int, epoch: int) -> ArrayParallelDataset | ConcatenatedArrays:
        """The files as segmented in ``epoch`` of a run seeded with ``seed`` (``line_numbers``
        count the corpora's lines one after the other)."""
        encoders = {side: None if sampler is None else _sampled_encoder(sampler, field, seed, epoch, side)
                    for (side, sampler), field in zip(self.samplers.items(), (self.src_field, self.tgt_field))}
        parts = []
        first = 0
        enabled = gc.isenabled()
        gc.disable()  # as in ResampledPairs.for_epoch
        try:
            for (src_path, tgt_path), prefix in zip(self.files, self.src_prefixes):
                arrays, meta = encode_to_arrays(src_path, tgt_path, self.src_field, self.tgt_field,
                                                src_encode=encoders["src"], tgt_encode=encoders["tgt"],
                                                first_index=first, pair_filter=self.pair_filter, src_prefix=prefix)
                parts.append(ArrayParallelDataset(arrays, meta, self.src_field, self.tgt_field))
                first += meta["n_input"]
        finally:
            if enabled:
                gc.enable()
        return parts[0] if len(parts) == 1 else ConcatenatedArrays(parts)

    def describe(self) -> str:
        """As :meth:`ResampledPairs.describe`."""
        return _describe(self.samplers)


__all__ = ["ResampledFiles", "ResampledPairs"]
