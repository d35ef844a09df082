"""Vocabulary counts over sampled segmentations (``data.<side>.subword_sampling.vocab_samples``).

With subword sampling a piece the deterministic segmentation never makes (``a@@`` under
BPE-dropout, a short unigram piece) is ``<unk>`` in training unless the vocabulary counted it.
:func:`vocabulary_token_lists` gives, for ``Vocabulary.build``, the deterministic segmentation of
every line followed by the segmentations of the first ``samples`` training epochs, drawn exactly
as training draws them (:func:`nmt.data.subword_sampling.epoch_random` of ``(seed, epoch, side)``,
epochs ``0 .. samples - 1``, every non-blank line in order, one generator per side): a token's
count is the sum of its occurrences over these ``samples + 1`` segmentations of the corpus, and
``min_freq`` / ``max_size`` apply to these sums. So the first ``samples`` epochs of a run with
``min_freq: 1`` and no ``max_size`` see no sampled ``<unk>`` at all, and without ``max_size`` the
vocabulary holds every token the deterministic count kept (a sum is never below its
deterministic part).

OpenNMT-py's ``onmt_build_vocab -n_sample`` counts one transformed pass (one sampled segmentation,
from the transform's own seed) of the first ``n_sample`` lines of each corpus; here the count also
holds the deterministic segmentation (validation and ``nmt-translate`` use it) and the samples are
the training epochs' own.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from nmt.data.subword_sampling import SubwordSampler, epoch_random
from nmt.data.tokenizers import Tokenizer


def sampled_segmentations(lines: Sequence[str], sampler: SubwordSampler, seed: int, side: str,
                          epochs: int) -> Iterator[list]:
    """The tokens of each non-blank line of ``lines`` as training epochs ``0 .. epochs - 1`` of a run
    seeded with ``seed`` segment ``side`` (``"src"``/``"tgt"``): epoch by epoch, lines in order.
    ``sampler`` must return tokens (built without ``encode``); it draws what the training
    sampler (with ``encode``) draws, as both consume the generator alike."""
    if sampler.ids:
        raise ValueError("sampled_segmentations: the sampler returns ids; build it without encode")
    for epoch in range(epochs):
        rng = epoch_random(seed, epoch, side)
        sample = sampler.sample
        for text in lines:
            if text.strip():  # ParallelDataset samples a side's non-blank lines only
                yield sample(text, rng)


def vocabulary_token_lists(tokenizer: Tokenizer, sides: Iterable[tuple[str, Sequence[str], SubwordSampler | None]],
                           seed: int, samples: int) -> Iterator[list]:
    """Token lists whose counts make a vocabulary: for each ``(side, lines, sampler)`` of ``sides``
    the deterministic tokens of its lines, then (``sampler`` not None, ``samples`` > 0) its
    :func:`sampled_segmentations` of the first ``samples`` epochs."""
    sides = list(sides)
    for _, lines, _ in sides:
        for line in lines:
            yield tokenizer.tokenize(line)
    if samples > 0:
        for side, lines, sampler in sides:
            if sampler is not None:
                yield from sampled_segmentations(lines, sampler, seed, side, samples)


__all__ = ["sampled_segmentations", "vocabulary_token_lists"]
