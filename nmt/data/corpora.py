"""Several training corpora with weights (``data.train`` as a list of ``{src, tgt, weight, name}``).

The corpora's pairs are read one after the other into one list (:func:`read_corpora`) and
encoded as one dataset (the length rules, :mod:`nmt.data.pair_filter`, apply to every pair, so to
each corpus; the log counts each rule's skips per corpus). Each epoch
holds corpus ``k``'s kept pairs ``weight_k`` times: ``floor(weight_k)`` full copies plus
``round(frac(weight_k) x kept_k)`` of them (halves rounded up) drawn without replacement by a
generator seeded with ``(seed, epoch, k)`` (:func:`epoch_indices`): a function of the seed and the
epoch only, so a resumed run and every process of a data-parallel job build the same list.
A sampling temperature ``T`` (``data.sampling_temperature``; multilingual NMT's temperature
sampling, Arivazhagan et al. 2019) flattens the corpora's shares: corpus ``k`` then takes a share of
the epoch proportional to ``(weight_k x kept_k)^(1/T)`` (:func:`tempered_weights`), the epoch as
large as at ``T = 1``; ``T = 1`` is the weights as given, a large ``T`` the corpora in equal shares.
:class:`EpochExamples` is that list as a dataset the batcher and ``collate`` read (a view, the
token ids are not copied).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nmt.data.dataset import read_parallel
from nmt.data.errors import DataError
from nmt.data.pair_filter import describe_skipped
from nmt.data.textfiles import iter_lines


@dataclass(frozen=True)
class Corpus:
    """One training corpus: ``key`` is its config key (``data.train`` or ``data.train[i]``)."""

    key: str
    src: str
    tgt: str
    weight: float = 1.0
    name: str | None = None
    src_tag: str | None = None
    align: str | None = None
    noise: dict | None = None

    @property
    def label(self) -> str:
        """Its name in the log: ``name``, else ``src, tgt``."""
        return self.name if self.name is not None else f"{self.src}, {self.tgt}"

    @property
    def tag_note(self) -> str:
        """``, source tag <BT>`` for the data log, ``""`` without a tag."""
        return "" if self.src_tag is None else f", source tag {self.src_tag}"


def training_corpora(train_cfg: dict | list[dict]) -> list[Corpus]:
    """The corpora of a resolved ``data.train`` (one mapping or a list of them)."""
    if isinstance(train_cfg, dict):
        return [Corpus("data.train", train_cfg["src"], train_cfg["tgt"], train_cfg.get("weight", 1.0),
                       train_cfg.get("name"), train_cfg.get("src_tag"), train_cfg.get("align"), train_cfg.get("noise"))]
    return [Corpus(f"data.train[{i}]", c["src"], c["tgt"], c.get("weight", 1.0), c.get("name"), c.get("src_tag"),
                   c.get("align"), c.get("noise"))
            for i, c in enumerate(train_cfg)]


def is_weighted(train_cfg: dict | list[dict]) -> bool:
    """Whether ``data.train`` asks for a weighted epoch list: a list, or one mapping whose weight is
    not 1 (one mapping of weight 1 is the plain dataset, batched as it always was)."""
    return isinstance(train_cfg, list) or train_cfg.get("weight", 1.0) != 1.0


def check_corpus_files(corpora: Sequence[Corpus]) -> None:
    """A one-line ``DataError`` naming the key of the first missing file, e.g.
    ``data.train[1].src: bt.de: file not found``."""
    for corpus in corpora:
        for side in ("src", "tgt"):
            path = Path(getattr(corpus, side))
            if not path.is_file():
                raise DataError(f"{corpus.key}.{side}: {path}: file not found")


def read_corpora(corpora: Sequence[Corpus]) -> tuple[list[tuple[str, str]], np.ndarray]:
    """All corpora's ``(source, target)`` lines, one corpus after the other, and ``starts``
    (``len(corpora) + 1`` ints: corpus ``k`` holds pairs ``starts[k]:starts[k + 1]``). A missing
    file or other reading problem is a one-line ``DataError`` naming the key, e.g.
    ``data.train[1].src: bt.de: file not found``."""
    pairs: list[tuple[str, str]] = []
    starts = [0]
    for corpus in corpora:
        check_corpus_files([corpus])
        try:
            pairs.extend(read_parallel(corpus.src, corpus.tgt))
        except DataError as exc:
            raise DataError(f"{corpus.key}: {exc}") from None
        starts.append(len(pairs))
    return pairs, np.asarray(starts, dtype=np.int64)


def tag_line_counts(corpora: Sequence[Corpus]) -> dict[str, int]:
    """Tag -> the non-blank source lines it starts in the training ``corpora`` (its count in a
    vocabulary file; streamed, each tagged corpus's source once)."""
    counts: dict[str, int] = {}
    for corpus in corpora:
        if corpus.src_tag is not None:
            counts[corpus.src_tag] = counts.get(corpus.src_tag, 0) + sum(1 for line in iter_lines(corpus.src)
                                                                         if line.strip())
    return counts


def examples_per_epoch(kept: int, weight: float) -> int:
    """How many examples an epoch holds of a corpus of ``kept`` pairs: ``floor(weight) x kept`` plus
    ``round(frac(weight) x kept)`` (halves up)."""
    whole = int(weight)
    return whole * kept + int((weight - whole) * kept + 0.5)


def tempered_weights(weights: Sequence[float], kept: Sequence[int], temperature: float) -> list[float]:
    """The weights that give corpus ``k`` (``kept[k]`` pairs, weight ``weights[k]``) a share of the epoch
    proportional to ``(weights[k] x kept[k])^(1 / temperature)``, the epoch's size ``sum_k weights[k] x
    kept[k]`` unchanged: ``c (w_k n_k)^(1/T) / n_k``. ``temperature`` 1 returns ``weights``; a corpus
    that kept no pair keeps its weight (it adds nothing to an epoch)."""
    if temperature == 1.0:
        return list(weights)
    sizes = [w * n for w, n in zip(weights, kept)]
    powered = [size ** (1.0 / temperature) if size > 0 else 0.0 for size in sizes]
    scale = sum(sizes) / sum(powered) if sum(powered) > 0 else 1.0
    return [scale * p / n if n > 0 else w for w, n, p in zip(weights, kept, powered)]


def epoch_indices(corpus_ids: np.ndarray, weights: Sequence[float], seed: int, epoch: int) -> np.ndarray:
    """The dataset positions of one epoch: for each corpus ``k`` (the examples whose
    ``corpus_ids`` is ``k``, in dataset order) ``floor(weights[k])`` copies of all of them, then the
    ``round(frac x n_k)`` positions drawn without replacement by ``numpy.random.default_rng([seed,
    epoch, k])`` (kept in dataset order). Returns an int64 array of ``sum_k examples_per_epoch``."""
    parts = [np.zeros(0, dtype=np.int64)]
    for k, weight in enumerate(weights):
        members = np.flatnonzero(corpus_ids == k).astype(np.int64)
        whole = int(weight)
        parts.extend([members] * whole)
        extra = examples_per_epoch(members.size, weight) - whole * members.size
        if extra:
            chosen = np.random.default_rng([seed, epoch, k]).choice(members.size, size=extra, replace=False)
            parts.append(members[np.sort(chosen)])
    return np.concatenate(parts)


def corpus_of_lines(starts: np.ndarray, line_numbers: Sequence[int] | np.ndarray) -> np.ndarray:
    """The corpus of each 1-based input line, corpus ``k`` holding pairs ``starts[k]:starts[k + 1]``
    of the concatenated list (:func:`read_corpora`'s ``starts``): an int64 array of the lines' shape."""
    return np.searchsorted(starts, np.asarray(line_numbers, dtype=np.int64) - 1, side="right") - 1


class _Rows:
    """``rows[indices[i]]`` for ``i`` in ``range(len(indices))`` (no copy)."""

    def __init__(self, rows: Sequence, indices: np.ndarray) -> None:
        self.rows, self.indices = rows, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        return self.rows[int(self.indices[i])]


class EpochExamples:
    """The examples at ``indices`` of ``dataset`` (repeats allowed), read as a dataset:
    ``src`` / ``tgt`` rows, ``src_lengths`` / ``tgt_lengths`` (int64 arrays of ``len(indices)``),
    ``line_numbers`` of the underlying pairs, and ``dataset_index`` (the positions themselves)."""

    def __init__(self, dataset, indices: np.ndarray) -> None:
        self.dataset, self.dataset_index = dataset, np.asarray(indices, dtype=np.int64)
        self.src = _Rows(dataset.src, self.dataset_index)
        self.tgt = _Rows(dataset.tgt, self.dataset_index)
        self.src_lengths = np.asarray(dataset.src_lengths, dtype=np.int64)[self.dataset_index]
        self.tgt_lengths = np.asarray(dataset.tgt_lengths, dtype=np.int64)[self.dataset_index]
        self.line_numbers = np.asarray(dataset.line_numbers, dtype=np.int64)[self.dataset_index]

    def __len__(self) -> int:
        return len(self.dataset_index)

    def __getitem__(self, i: int) -> tuple[list[int], list[int]]:
        return self.src[i], self.tgt[i]


class CorpusWeights:
    """The corpora of a run and where their pairs start in the concatenated list
    (:func:`read_corpora`): builds each epoch's examples and the per-corpus log lines."""

    def __init__(self, corpora: Sequence[Corpus], starts: np.ndarray, temperature: float = 1.0) -> None:
        self.corpora, self.starts = list(corpora), np.asarray(starts, dtype=np.int64)
        self.temperature = float(temperature)

    def corpus_ids(self, dataset) -> np.ndarray:
        """The corpus of each example of ``dataset`` (from its 1-based ``line_numbers``): (len,) int64."""
        return corpus_of_lines(self.starts, dataset.line_numbers)

    def kept(self, corpus_ids: np.ndarray) -> np.ndarray:
        """(corpora,) int64: how many examples each corpus has among ``corpus_ids`` (:meth:`corpus_ids`)."""
        return np.bincount(corpus_ids, minlength=len(self.corpora))

    def weights(self, kept: np.ndarray) -> list[float]:
        """Each corpus's weight for its ``kept`` pairs (:meth:`kept`): its ``weight``, tempered by the
        sampling temperature (:func:`tempered_weights`)."""
        return tempered_weights([c.weight for c in self.corpora], [int(n) for n in kept], self.temperature)

    def for_epoch(self, dataset, seed: int, epoch: int) -> EpochExamples:
        """``dataset``'s examples of ``epoch`` (:func:`epoch_indices`)."""
        corpus_ids = self.corpus_ids(dataset)
        indices = epoch_indices(corpus_ids, self.weights(self.kept(corpus_ids)), seed, epoch)
        if indices.size == 0:
            raise DataError(f"epoch {epoch}: the weights of data.train leave no training example "
                            f"({len(dataset)} pairs kept): raise a weight")
        return EpochExamples(dataset, indices)

    def describe(self, dataset) -> list[str]:
        """One line per corpus: ``<name or files>: kept K of N pairs (skipped 2 empty, 8 too long),
        weight W, E examples per epoch`` (then ``, source tag T`` for a tagged corpus): each rule's count of that corpus (:meth:`skipped_per_corpus`)."""
        kept = self.kept(self.corpus_ids(dataset))
        skipped = self.skipped_per_corpus(dataset)
        weights = self.weights(kept)
        lines = []
        for k, corpus in enumerate(self.corpora):
            total = int(self.starts[k + 1] - self.starts[k])
            weight = f"weight {corpus.weight:g}" + ("" if self.temperature == 1.0 else
                                                    f" ({weights[k]:.4g} at sampling temperature {self.temperature:g})")
            lines.append(f"{corpus.label}: kept {int(kept[k])} of {total} pairs (skipped {describe_skipped(skipped[k])}), "
                         f"{weight}, {examples_per_epoch(int(kept[k]), weights[k])} examples "
                         f"per epoch{corpus.tag_note}")
        return lines

    def skipped_per_corpus(self, dataset) -> list[dict[str, int]]:
        """Each corpus's skipped pairs by rule (the keys of ``dataset.skipped``), from ``dataset``'s
        ``skipped_at`` lines (a list dataset), its ``parts`` (the caches of several corpora, one each) or,
        for one corpus, ``dataset.skipped`` itself."""
        n = len(self.corpora)
        parts = getattr(dataset, "parts", None)
        if parts is not None and len(parts) == n:
            return [dict(p.skipped) for p in parts]
        at = getattr(dataset, "skipped_at", None)
        if at is not None:
            per_rule = {rule: np.bincount(corpus_of_lines(self.starts, lines), minlength=n) for rule, lines in at.items()}
            return [{rule: int(counts[k]) for rule, counts in per_rule.items()} for k in range(n)]
        if n == 1:
            return [dict(dataset.skipped)]
        raise DataError(f"{n} corpora but a dataset that does not say which corpus a skipped pair came from")


__all__ = ["Corpus", "CorpusWeights", "check_corpus_files", "corpus_of_lines", "EpochExamples", "epoch_indices", "examples_per_epoch", "is_weighted",
           "read_corpora", "tag_line_counts", "tempered_weights", "training_corpora"]
