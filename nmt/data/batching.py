"""Length-bucketed, seeded batching and padding of datasets into ``Batch`` tensors.

Layout of a ``Batch`` for a target ``y`` of length ``n``: ``tgt_in = <bos> y`` and
``tgt_out = y <eos>`` (both length ``n + 1``, right-padded with ``pad_index``); sources carry no
BOS/EOS. The *width* of an example is ``max(len(src), len(tgt) + 1)``; a token-budget batch
satisfies ``len(batch) * max(width) <= batch_size`` (padded tokens of the wider side) unless it
is a single example that alone exceeds the budget.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from nmt.data.dataset import SourceDataset
from nmt.data.errors import DataError
from nmt.data.field import Field
from nmt.utils.device import host_to_device

POOL_BATCHES = 100
"""Shuffled batching sorts pools of about this many batches by length (unless a ``bucket_size``
in examples is given), then shuffles batches."""

POOL_SORTS = ("target", "target_source", "source_target")
"""How shuffled batching sorts a pool (``training.pool_sort``): ``target``: by target length
alone, examples of one target length in the pool's random order (their source lengths mixed);
``target_source``: by target length, then source length; ``source_target``: by source length,
then target length (OpenNMT-py's order). Sorting by both lengths makes batches of one
source / target length *ratio*, and with a large pool batches that largely come back each
epoch; both cost quality (README.md, Data, Batches; BENCHMARKS.md, issue #21)."""
DEFAULT_POOL_SORT = "target"


class _Lengths(Protocol):
    src: list[list[int]]
    tgt: list[list[int]] | None
    src_lengths: list[int]
    tgt_lengths: list[int]

    def __len__(self) -> int: ...


@dataclass
class Batch:
    """A padded batch of B examples.

    src: (B, L) long; src_lengths: (B,) long; tgt_in / tgt_out: (B, T) long, ``T = max target
    length + 1``; tgt_lengths: (B,) long, ``len(y) + 1``; n_tokens: number of target tokens
    including EOS (``tgt_lengths.sum()`` as an int); indices: the examples' positions in the
    dataset (list of ints, row order). Source-only batches (translation) have ``tgt_in``,
    ``tgt_out``, ``tgt_lengths`` and ``n_tokens`` set to None; ``empty`` is True for a batch of
    empty input lines only (src is (B, 0)): its translations are empty strings. ``align``: guided
    alignment training's reference distributions (B, T, L) float32 (zero rows: no reference;
    :meth:`nmt.data.word_alignments.TrainingAlignments.reference`), None otherwise.
    """

    src: Tensor
    src_lengths: Tensor
    tgt_in: Tensor | None
    tgt_out: Tensor | None
    tgt_lengths: Tensor | None
    n_tokens: int | None
    indices: list[int]
    n_src_tokens: int = 0
    empty: bool = False
    pad_index: int = 0
    align: Tensor | None = None

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def src_mask(self) -> Tensor:
        """(B, L) bool, True at real source tokens."""
        return self.src != self.pad_index

    def to(self, device: torch.device | str, non_blocking: bool = False,
           lengths_on_host: bool = False) -> "Batch":
        """A copy with every tensor moved to ``device``; with ``lengths_on_host`` the source
        lengths stay where they are (the RNN encoder packs with host lengths: no device-to-host
        copy; what training and validation do). Host tensors bound for CUDA are copied through
        pinned memory without a host sync (:func:`~nmt.utils.device.host_to_device`), whatever
        ``non_blocking`` says; other moves pass ``non_blocking`` to ``Tensor.to``."""
        moved = {
            f.name: host_to_device(getattr(self, f.name), device, non_blocking)
            for f in fields(self)
            if isinstance(getattr(self, f.name), Tensor) and not (lengths_on_host and f.name == "src_lengths")
        }
        return replace(self, **moved)


def _cut_tokens(order: np.ndarray, widths: np.ndarray, budget: int) -> list[int]:
    """Sizes of the greedy token-budget batches cutting ``order`` (in order)."""
    sizes: list[int] = []
    size = 0
    widest = 0
    for w in widths[order].tolist():
        new_widest = max(widest, w)
        if size and (size + 1) * new_widest > budget:
            sizes.append(size)
            size, new_widest = 0, w
        size += 1
        widest = new_widest
    if size:
        sizes.append(size)
    return sizes


class BatchOrder:
    """A sequence of batches held in two arrays: ``positions`` (every example once, batch after
    batch) and ``starts``/``ends`` (batch ``k`` is ``positions[starts[k]:ends[k]]``).

    ``order[k]`` is a 1-d int64 numpy array (a view, no copy), ``order[a:b]`` a list of them;
    ``list(order)`` / :meth:`lists`
    give Python lists. Holding the order of tens of millions of examples costs 8 bytes per
    example instead of a Python int object each.
    """

    def __init__(self, positions: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        self.positions, self.starts, self.ends = positions, starts, ends

    def __len__(self) -> int:
        return int(self.starts.size)

    def __getitem__(self, k: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        if not -len(self) <= k < len(self):
            raise IndexError(f"batch {k} out of range ({len(self)} batches)")
        return self.positions[self.starts[k] : self.ends[k]]

    def __iter__(self):
        for k in range(len(self)):
            yield self[k]

    def lists(self) -> list[list[int]]:
        """Every batch as a list of ints."""
        return [self[k].tolist() for k in range(len(self))]


def make_batch_order(
    dataset: _Lengths,
    batch_size: int,
    batch_type: str = "sentences",
    shuffle: bool = True,
    seed: int = 0,
    epoch: int = 0,
    indices: Sequence[int] | None = None,
    bucket_size: int | None = None,
    pool_sort: str = DEFAULT_POOL_SORT,
) -> BatchOrder:
    """:func:`make_batches` as a :class:`BatchOrder` (arrays only; the same batches in the same order).

    Reads only ``len(dataset)`` and the ``src_lengths``/``tgt_lengths`` arrays, so an
    array-backed dataset (``nmt.data.id_arrays``) is batched without materialising lists.
    """
    if batch_type not in ("sentences", "tokens"):
        raise DataError(f"batch_type: expected 'sentences' or 'tokens', got {batch_type!r}")
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise DataError(f"batch_size: expected a positive integer, got {batch_size!r}")
    if seed < 0 or epoch < 0:
        raise DataError(f"seed and epoch must be >= 0, got seed={seed}, epoch={epoch}")
    if bucket_size is not None and (not isinstance(bucket_size, (int, np.integer)) or bucket_size < 1):
        raise DataError(f"bucket_size: expected a positive integer, got {bucket_size!r}")
    if pool_sort not in POOL_SORTS:
        raise DataError(f"pool_sort: expected one of {', '.join(POOL_SORTS)}, got {pool_sort!r}")
    # a copy: sorted in place below
    positions = np.arange(len(dataset)) if indices is None else np.array(indices, dtype=np.int64)
    empty = np.zeros(0, dtype=np.int64)
    if positions.size == 0:
        return BatchOrder(empty, empty, empty)
    src_len = np.asarray(dataset.src_lengths, dtype=np.int64)
    tgt_len = np.asarray(dataset.tgt_lengths, dtype=np.int64)
    widths = np.maximum(src_len, tgt_len + 1)
    rng = np.random.default_rng([seed, epoch])
    if shuffle:
        positions = positions[rng.permutation(positions.size)]
        if bucket_size is None:
            per_batch = batch_size if batch_type == "sentences" else max(1, batch_size // int(widths[positions].mean()))
            pool = per_batch * POOL_BATCHES
        else:
            pool = int(bucket_size)
        # training pools sort by target length first: the decoder's steps, the output layer and
        # the loss run over padded target positions, while the encoder packs its sources
        keys = {"target": (tgt_len,), "target_source": (src_len, tgt_len),
                "source_target": (tgt_len, src_len)}[pool_sort]  # np.lexsort: the last key is the first
    else:
        pool = positions.size
        keys = (tgt_len, src_len)
    sizes: list[np.ndarray] = []
    for start in range(0, positions.size, pool):
        chunk = positions[start : start + pool]
        # stable: ties keep order (the random one of a shuffled pool); sorted in place so
        # ``positions`` becomes batch after batch
        positions[start : start + pool] = chunk[np.lexsort(tuple(k[chunk] for k in keys))]
        if batch_type == "sentences":
            n = chunk.size
            sizes.append(np.full(n // batch_size, batch_size, dtype=np.int64))
            if n % batch_size:
                sizes.append(np.array([n % batch_size], dtype=np.int64))
        else:
            sizes.append(np.asarray(_cut_tokens(positions[start : start + pool], widths, batch_size), dtype=np.int64))
    ends = np.cumsum(np.concatenate(sizes))
    starts = ends - np.concatenate(sizes)
    if shuffle:
        permutation = rng.permutation(starts.size)
        starts, ends = starts[permutation], ends[permutation]
    return BatchOrder(positions, starts, ends)


def make_batches(
    dataset: _Lengths,
    batch_size: int,
    batch_type: str = "sentences",
    shuffle: bool = True,
    seed: int = 0,
    epoch: int = 0,
    indices: Sequence[int] | None = None,
    bucket_size: int | None = None,
    pool_sort: str = DEFAULT_POOL_SORT,
) -> list[list[int]]:
    """Length-bucketed batches of dataset positions; every position appears exactly once.

    ``batch_type="sentences"``: at most ``batch_size`` examples per batch; ``"tokens"``: at most
    ``batch_size`` padded tokens (see the module docstring). With ``shuffle``, the examples are
    permuted by a generator seeded with ``(seed, epoch)``, sorted by length within pools of
    ``bucket_size`` examples (default: ~``POOL_BATCHES`` batches; ``pool_sort``, one of
    :data:`POOL_SORTS`, says by which lengths), cut, and the batches shuffled: the same
    ``(seed, epoch)`` gives the same batches. Without it, all examples
    are sorted by (source, target) length (ties in dataset order), the order translation wants.
    ``indices`` restricts batching to those positions.
    :func:`make_batch_order` gives the same batches as arrays.
    """
    return make_batch_order(dataset, batch_size, batch_type, shuffle, seed, epoch, indices, bucket_size,
                            pool_sort).lists()


def shard_batches(batches: list, shard: tuple[int, int] | None) -> list:
    """The batches of process ``rank`` of ``ranks`` (``shard``) when several processes share
    ``batches``, every one cutting the same list: every ``ranks``-th from its rank (round-robin over
    length-sorted batches: nearly equal shares of the work); all of them for None. ValueError for a
    rank outside ``[0, ranks)``."""
    if shard is None:
        return batches
    rank, ranks = shard
    if not 0 <= rank < ranks:
        raise ValueError(f"shard {shard}: rank must be in [0, {ranks})")
    return batches[rank::ranks]


def _pad(rows: list[list[int]], width: int, pad: int) -> Tensor:
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.long).view(len(rows), width)


def collate(
    dataset: _Lengths, indices: Sequence[int], pad_index: int, bos_index: int, eos_index: int
) -> Batch:
    """Pad the examples at ``indices`` into a ``Batch`` (CPU tensors; see ``Batch`` for layout)."""
    indices = [int(i) for i in indices]
    if not indices:
        raise DataError("collate: empty list of indices")
    src = [dataset.src[i] for i in indices]
    src_lengths = [len(s) for s in src]
    batch_src = _pad(src, max(src_lengths), pad_index)
    if dataset.tgt is None:
        return Batch(
            src=batch_src,
            src_lengths=torch.tensor(src_lengths, dtype=torch.long),
            tgt_in=None,
            tgt_out=None,
            tgt_lengths=None,
            n_tokens=None,
            indices=indices,
            n_src_tokens=sum(src_lengths),
            empty=max(src_lengths) == 0,
            pad_index=pad_index,
        )
    tgt = [dataset.tgt[i] for i in indices]
    tgt_lengths = [len(t) + 1 for t in tgt]
    width = max(tgt_lengths)
    return Batch(
        src=batch_src,
        src_lengths=torch.tensor(src_lengths, dtype=torch.long),
        tgt_in=_pad([[bos_index] + t for t in tgt], width, pad_index),
        tgt_out=_pad([t + [eos_index] for t in tgt], width, pad_index),
        tgt_lengths=torch.tensor(tgt_lengths, dtype=torch.long),
        n_tokens=sum(tgt_lengths),
        indices=indices,
        n_src_tokens=sum(src_lengths),
        pad_index=pad_index,
    )


def encode_sources(
    field: Field,
    lines: Sequence[str],
    batch_size: int = 64,
    batch_type: str = "sentences",
    max_length: int | None = None,
    src_tag: str | None = None,
) -> list[Batch]:
    """Source-only batches for translating ``lines``; every line is in exactly one batch.
    ``src_tag``: a source tag of ``field`` put before every non-empty line (:class:`SourceDataset`).

    Batches are length-sorted (not shuffled); ``batch.indices`` are the 0-based line numbers, so
    outputs are put back in input order with them. Empty lines never share a batch with
    non-empty ones: they come last, in batches with ``empty=True`` and src of shape (B, 0),
    for which the translator outputs empty strings. Lines longer than ``max_length`` tokens
    are truncated.
    """
    data = SourceDataset(lines, field, max_length, src_tag)
    v = field.vocab
    nonempty = [i for i, n in enumerate(data.src_lengths) if n > 0]
    empty = [i for i, n in enumerate(data.src_lengths) if n == 0]
    groups = make_batches(data, batch_size, batch_type, shuffle=False, indices=nonempty)
    groups += [empty[i : i + batch_size] for i in range(0, len(empty), batch_size)]
    return [collate(data, g, v.pad_index, v.bos_index, v.eos_index) for g in groups]


__all__ = ["DEFAULT_POOL_SORT", "POOL_BATCHES", "POOL_SORTS", "Batch", "BatchOrder", "collate", "encode_sources", "make_batch_order", "make_batches",
           "shard_batches"]
