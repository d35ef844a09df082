"""The training pairs segmented anew for every epoch (subword regularization).

:class:`ResampledPairs` keeps the raw training pairs and, per side, a sampler
(:mod:`nmt.data.subword_sampling`) or none (that side keeps its deterministic ids, encoded once).
``for_epoch(seed, epoch)`` is a :class:`~nmt.data.dataset.ParallelDataset` of that epoch's
segmentation: a function of ``(seed, epoch)`` only, so every process of a data-parallel job and a
resumed run see the same one. Length limits apply to each epoch's segmentation (a pair too long in
one epoch is skipped in that epoch only); pieces outside the vocabulary become ``<unk>``.
"""
from __future__ import annotations

import gc
from collections.abc import Sequence

from nmt.data.dataset import ParallelDataset
from nmt.data.errors import DataError
from nmt.data.field import Field
from nmt.data.subword_sampling import SubwordSampler, epoch_random
from nmt.data.unknown_tokens import SIDE_NAMES


class ResampledPairs:
    """Training pairs whose sampled sides are re-segmented each epoch.

    pairs: the raw ``(source, target)`` lines; src_sampler / tgt_sampler: a side's sampler (of
    tokens, or of that side's ids: ``sampler.ids``), or None for a side segmented
    deterministically; max_src_length / max_tgt_length: the length limits (``None``: no limit),
    applied per epoch.
    """

    def __init__(self, pairs: Sequence[tuple[str, str]], src_field: Field, tgt_field: Field,
                 src_sampler: SubwordSampler | None, tgt_sampler: SubwordSampler | None,
                 max_src_length: int | None = None, max_tgt_length: int | None = None) -> None:
        if src_sampler is None and tgt_sampler is None:
            raise DataError("subword sampling: neither side samples")
        self.pairs = pairs
        self.src_field, self.tgt_field = src_field, tgt_field
        self.samplers = {"src": src_sampler, "tgt": tgt_sampler}
        self.limits = (max_src_length, max_tgt_length)
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
            elif sampler.ids:  # the lines in order, each side from its own generator
                encoders[side] = lambda i, text, sample=sampler.sample, rng=epoch_random(seed, epoch, side): \
                    sample(text, rng)
            else:
                encoders[side] = lambda i, text, sample=sampler.sample, rng=epoch_random(seed, epoch, side), \
                    encode=field.encode_tokens: encode(sample(text, rng))
        enabled = gc.isenabled()
        gc.disable()  # no cycles made here; the samplers' caches would make each collection long
        try:
            return ParallelDataset(self.pairs, self.src_field, self.tgt_field, *self.limits,
                                   src_encode=encoders["src"], tgt_encode=encoders["tgt"])
        finally:
            if enabled:
                gc.enable()

    def describe(self) -> str:
        """e.g. ``source: BPE-dropout 0.1; target: deterministic``."""
        return "; ".join(f"{SIDE_NAMES[side]}: {sampler.describe() if sampler is not None else 'deterministic'}"
                         for side, sampler in self.samplers.items())


__all__ = ["ResampledPairs"]
