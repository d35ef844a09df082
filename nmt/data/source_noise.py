"""Noise on the training sources: words deleted, blanked and moved a few places, anew every epoch.

Noised back-translation (Edunov et al. 2018, *Understanding Back-Translation at Scale*: delete
each word with probability 0.1, replace each with a filler token with probability 0.1, and move
words by a random permutation that takes none further than three positions) and the word noise of
unsupervised and denoising training (Lample et al. 2018; fairseq's ``UnsupervisedMTNoising``, whose
filler is ``<unk>``). ``data.train[i].noise: {delete, blank, shuffle}`` sets it per corpus.

A *unit* is what the source tokenizer calls a word where its pieces say so
(:meth:`nmt.data.tokenizers.base.Tokenizer.noise_units`): a sentencepiece word is a piece starting
with "▁" and the pieces after it, a BPE word a run of pieces ending in "@@" and the piece after
them (fairseq's word grouping by the same markers); a ``space`` tokenizer's tokens are words and a
``char`` tokenizer's units are its characters (its space symbol included). A source tag
(``src_tag``) is never noised and stays first. Each unit, independently:

- ``delete``: removed with this probability (all its pieces); a sentence whose units would all go
  keeps the one that was drawn least likely to (one unit always remains);
- ``blank``: (when kept) replaced by one ``<unk>``, whatever its number of pieces;
- ``shuffle: k``: unit ``i`` sorts by ``i + U(0, k + 1)``, so no unit lands more than ``k`` places
  from where it was (Lample et al. 2018; 0: order kept). Pieces of one unit stay together, in order.

The draws are a counter-based hash (:mod:`nmt.utils.counter_hash`) of ``(training.seed, epoch,
example, unit, operation)``: an example's noise depends on nothing else (not its batch, its place
there, the number of processes, a resume), and changes every epoch. The noise runs on the host
batch after ``collate`` (a few vectorised numpy operations on the (B, L) ids, no Python per token
or sentence) and hands on what ``collate`` would have made of the noised rows: the sources
shortened by deletions, the width that of the longest. Targets are untouched.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from nmt.data.batching import Batch
from nmt.data.corpora import corpus_of_lines
from nmt.data.field import Field
from nmt.data.vocabulary import SPECIALS
from nmt.utils.counter_hash import absorb, seed_state

SALT = 0x6E6F6973  # "nois": keeps these draws apart from every other use of the hash
_DELETE, _BLANK, _SHUFFLE = 1, 2, 3


@dataclass(frozen=True)
class NoiseSettings:
    """One corpus's noise (``data.train[i].noise``): the probabilities of deleting and of blanking
    each unit, and the farthest a unit moves (``shuffle``)."""

    delete: float = 0.0
    blank: float = 0.0
    shuffle: int = 0

    @classmethod
    def from_config(cls, cfg: dict | None) -> "NoiseSettings":
        """From a resolved ``noise`` section (None: none)."""
        cfg = cfg or {}
        return cls(float(cfg.get("delete", 0.0)), float(cfg.get("blank", 0.0)), int(cfg.get("shuffle", 0)))

    @property
    def active(self) -> bool:
        return self.delete > 0 or self.blank > 0 or self.shuffle > 0

    def describe(self) -> str:
        """``delete 0.1, blank 0.1, shuffle 3`` (the active parts), or ``none``."""
        parts = [f"{name} {value:g}" for name, value in (("delete", self.delete), ("blank", self.blank),
                                                           ("shuffle", self.shuffle)) if value > 0]
        return ", ".join(parts) or "none"


def unit_tables(field: Field) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, carries)``: (V,) bool of the source vocabulary, from the tokenizer's
    :meth:`~nmt.data.tokenizers.base.Tokenizer.noise_units` of each token (the specials and the
    source tags: units of their own)."""
    vocab, tokenizer = field.vocab, field.tokenizer
    own = set(field.tags)
    marks = [(True, False) if k < len(SPECIALS) or t in own else tokenizer.noise_units(t)
             for k, t in enumerate(vocab.itos)]
    return np.array([m[0] for m in marks], dtype=bool), np.array([m[1] for m in marks], dtype=bool)


def _uniform(states: np.ndarray, operation: int) -> np.ndarray:
    """float64 in [0, 1) (24 bits) from hash states (int64 in [0, 2^32)) and an operation."""
    return (absorb(states, operation) >> 8).astype(np.float64) * (1.0 / (1 << 24))


def noised_sources(src: np.ndarray, lengths: np.ndarray, keys: np.ndarray, delete: np.ndarray, blank: np.ndarray,
                   shuffle: np.ndarray, tagged: np.ndarray, starts: np.ndarray, carries: np.ndarray, unk_index: int,
                   pad_index: int) -> tuple[np.ndarray, np.ndarray]:
    """The noised rows of a padded batch of sources.

    src: (B, L) int64 ids, right-padded; lengths: (B,) int64; keys: (B,) int64 hash states of the
    examples (:meth:`SourceNoise.example_keys`); delete, blank: (B,) float64 probabilities; shuffle:
    (B,) int64 farthest moves; tagged: (B,) bool, a source tag at position 0 (kept first, never
    noised); starts, carries: (V,) bool (:func:`unit_tables`). numpy arrays: the batch is on the
    host, where numpy's cost per operation is a fraction of torch's at these sizes.

    Returns ``(src, lengths)``: (B, L') int64 with ``L'`` the longest noised row, padded with
    ``pad_index``, and the noised lengths (each >= 1 where the input's was). A row with no noise
    comes back unchanged.
    """
    ids, size = src, lengths
    n, width = ids.shape
    if width == 0:
        return src, lengths
    pos = np.arange(width)
    real = pos[None, :] < size[:, None]
    kept_tag = tagged[:, None] & (pos == 0)[None, :] & real
    begins = starts[ids]
    begins[:, 1:] &= ~carries[ids[:, :-1]]
    begins[:, 1:] |= kept_tag[:, :-1]  # the unit after a tag begins afresh
    begins[:, 0] = True
    unit = np.cumsum(begins, axis=1, dtype=np.int64) - 1  # (B, L): each position's unit
    states = absorb(keys[:, None], unit)
    movable = real & ~kept_tag
    u_delete = _uniform(states, _DELETE)
    deleted = movable & (u_delete < delete[:, None])
    # a sentence keeps at least one unit: the one drawn least likely to go
    emptied = movable.any(axis=1) & ~(movable & ~deleted).any(axis=1)
    best = np.where(movable, u_delete, -1.0).argmax(axis=1)[:, None]
    deleted &= ~(emptied[:, None] & (unit == np.take_along_axis(unit, best, axis=1)))
    blanked = movable & ~deleted & (_uniform(states, _BLANK) < blank[:, None])
    tokens = np.where(blanked & begins, unk_index, ids)
    kept = real & ~deleted & ~(blanked & ~begins)
    reach = np.where(shuffle > 0, shuffle + 1.0, 0.0)
    order_key = unit + _uniform(states, _SHUFFLE) * reach[:, None]
    order_key[kept_tag] = -1.0
    order_key[~kept] = np.inf
    order = np.argsort(order_key, axis=1, kind="stable")
    new_lengths = kept.sum(axis=1)
    out = np.where(pos[None, :] < new_lengths[:, None], np.take_along_axis(tokens, order, axis=1), pad_index)
    return out[:, :new_lengths.max()].astype(np.int64), new_lengths.astype(np.int64)


class SourceNoise:
    """The noise of a run's training corpora, applied to its training batches.

    corpora: each corpus's :class:`NoiseSettings` and whether it carries a source tag, in
    ``data.train`` order; ``starts``: where corpus ``k``'s pairs begin among the concatenated
    training pairs (``len(corpora) + 1`` ints, as :func:`nmt.data.corpora.read_corpora`); field:
    the source field (its vocabulary and tokenizer say what a unit is); seed: ``training.seed``.
    """

    def __init__(self, corpora: Sequence[tuple[NoiseSettings, bool]], starts: Sequence[int], field: Field,
                 seed: int) -> None:
        settings = [s for s, _ in corpora]
        self.starts = np.asarray(starts, dtype=np.int64)
        self.delete = np.array([s.delete for s in settings], dtype=np.float64)
        self.blank = np.array([s.blank for s in settings], dtype=np.float64)
        self.shuffle = np.array([s.shuffle for s in settings], dtype=np.int64)
        self.tagged = np.array([t for _, t in corpora], dtype=bool)
        self.active = np.array([s.active for s in settings], dtype=bool)
        self.starts_table, self.carries_table = unit_tables(field)
        self.unk_index, self.pad_index = field.vocab.unk_index, field.vocab.pad_index
        self.seed = int(seed)

    def example_keys(self, epoch: int, examples: Sequence[int]) -> np.ndarray:
        """(B,) int64 hash states of ``examples`` (their positions in the epoch's training set)."""
        state = absorb(absorb(seed_state(self.seed), SALT), epoch)
        return absorb(np.full(len(examples), state, dtype=np.int64), np.asarray(examples, dtype=np.int64))

    def apply(self, batch: Batch, dataset, epoch: int) -> Batch:
        """``batch`` (a host batch of ``dataset``'s examples ``batch.indices``) with its sources noised
        as their corpora say; ``batch`` itself when none of its examples is from a noised corpus."""
        lines = dataset.line_numbers
        corpus = corpus_of_lines(self.starts, [lines[i] for i in batch.indices])
        if not self.active[corpus].any():
            return batch
        src, lengths = noised_sources(batch.src.numpy(), batch.src_lengths.numpy(),
                                      self.example_keys(epoch, batch.indices), self.delete[corpus], self.blank[corpus],
                                      self.shuffle[corpus], self.tagged[corpus], self.starts_table, self.carries_table,
                                      self.unk_index, self.pad_index)
        return replace(batch, src=torch.from_numpy(src), src_lengths=torch.from_numpy(lengths),
                       n_src_tokens=int(lengths.sum()))


__all__ = ["NoiseSettings", "SourceNoise", "noised_sources", "unit_tables"]
