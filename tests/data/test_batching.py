"""Length-bucketed batching, Batch layout, source-only batches for translation."""
from __future__ import annotations

import random
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nmt.data import DataError, Field, Vocabulary, collate, encode_sources, make_batches
from nmt.data.batching import POOL_BATCHES
from nmt.data.tokenizers import build_tokenizer


class Lengths:
    """A dataset stand-in with given lengths (ids are arbitrary non-special tokens)."""

    def __init__(self, src_lengths: list[int], tgt_lengths: list[int]) -> None:
        self.src = [[4 + (i + j) % 5 for j in range(n)] for i, n in enumerate(src_lengths)]
        self.tgt = [[4 + (i * j) % 7 for j in range(n)] for i, n in enumerate(tgt_lengths)]
        self.src_lengths, self.tgt_lengths = list(src_lengths), list(tgt_lengths)

    def __len__(self) -> int:
        return len(self.src)


def _random_lengths(n: int, seed: int) -> Lengths:
    rng = random.Random(seed)
    return Lengths([rng.randint(1, 40) for _ in range(n)], [rng.randint(1, 40) for _ in range(n)])


def _width(ds: Lengths, i: int) -> int:
    return max(ds.src_lengths[i], ds.tgt_lengths[i] + 1)


@given(
    st.lists(st.tuples(st.integers(1, 30), st.integers(1, 30)), min_size=1, max_size=300),
    st.integers(1, 50),
    st.sampled_from(["sentences", "tokens"]),
    st.booleans(),
    st.integers(0, 3),
)
@settings(max_examples=60, deadline=None)
def test_every_index_once_and_limits(pairs, size, batch_type, shuffle, seed) -> None:
    ds = Lengths([s for s, _ in pairs], [t for _, t in pairs])
    budget = size if batch_type == "sentences" else size * 4
    batches = make_batches(ds, budget, batch_type, shuffle=shuffle, seed=seed, epoch=seed)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(ds)))
    for b in batches:
        assert b
        if batch_type == "sentences":
            assert len(b) <= budget
        else:
            padded = len(b) * max(_width(ds, i) for i in b)
            assert padded <= budget or len(b) == 1


def test_same_seed_same_batches_other_epoch_differs() -> None:
    ds = _random_lengths(2000, 0)
    a = make_batches(ds, 500, "tokens", seed=7, epoch=3)
    assert a == make_batches(ds, 500, "tokens", seed=7, epoch=3)
    assert a != make_batches(ds, 500, "tokens", seed=7, epoch=4)
    assert a != make_batches(ds, 500, "tokens", seed=8, epoch=3)


def test_buckets_reduce_padding() -> None:
    rng = random.Random(1)
    src = [rng.randint(1, 40) for _ in range(3000)]
    ds = Lengths(src, [max(1, n + rng.randint(-3, 3)) for n in src])  # correlated, like real data

    def padding(batches):
        return sum(len(b) * max(_width(ds, i) for i in b) - sum(_width(ds, i) for i in b) for b in batches)
    bucketed = make_batches(ds, 32, shuffle=True, seed=0)
    rng = random.Random(0)
    order = list(range(len(ds)))
    rng.shuffle(order)
    unbucketed = [order[i : i + 32] for i in range(0, len(order), 32)]
    assert padding(bucketed) < 0.25 * padding(unbucketed)
    # pools: shuffled batching still mixes lengths across the epoch (not globally sorted)
    firsts = [ds.src_lengths[b[0]] for b in bucketed[:POOL_BATCHES]]
    assert firsts != sorted(firsts)


def test_no_shuffle_is_length_sorted_and_restrictable() -> None:
    ds = Lengths([5, 1, 3, 1, 2], [1, 2, 1, 1, 9])
    assert make_batches(ds, 2, shuffle=False) == [[3, 1], [4, 2], [0]]
    assert make_batches(ds, 10, shuffle=False, indices=[0, 4]) == [[4, 0]]
    with pytest.raises(DataError, match="batch_type"):
        make_batches(ds, 2, "words")
    with pytest.raises(DataError, match="batch_size"):
        make_batches(ds, 0)
    assert make_batches(Lengths([], []), 4) == []


def test_collate_layout() -> None:
    ds = Lengths([3, 1], [2, 4])
    b = collate(ds, [1, 0], pad_index=0, bos_index=2, eos_index=3)
    y0, y1 = ds.tgt[1], ds.tgt[0]
    assert b.indices == [1, 0] and len(b) == 2
    assert b.src.tolist() == [ds.src[1] + [0, 0], ds.src[0]]
    assert b.src_lengths.tolist() == [1, 3]
    assert b.tgt_in.tolist() == [[2] + y0, [2] + y1 + [0, 0]]
    assert b.tgt_out.tolist() == [y0 + [3], y1 + [3, 0, 0]]
    assert b.tgt_lengths.tolist() == [5, 3] and b.n_tokens == 8 and b.n_src_tokens == 4
    assert b.src_mask.tolist() == [[True, False, False], [True, True, True]]
    assert b.src.dtype == b.tgt_in.dtype == torch.long
    # teacher forcing alignment: tgt_in[:, 1:] == tgt_out[:, :-1] at real positions
    for r, n in enumerate(b.tgt_lengths.tolist()):
        assert b.tgt_in[r, 1:n].tolist() == b.tgt_out[r, : n - 1].tolist()
    moved = b.to("cpu")
    assert moved.src.device.type == "cpu" and moved.indices == b.indices
    # lengths_on_host: every tensor is moved but the source lengths (the same tensor object)
    moved = b.to("meta", lengths_on_host=True)  # the meta device: a move seen without a GPU
    assert moved.src.device.type == moved.tgt_out.device.type == "meta" and moved.src_lengths is b.src_lengths


def test_encode_sources_keeps_every_line_and_isolates_empty_ones() -> None:
    lines = ["a b c", "", "a", "   ", "c c b a a", "b"]
    field = Field(build_tokenizer({"type": "space"}), Vocabulary(["a", "b", "c"]))
    batches = encode_sources(field, lines, batch_size=2)
    assert sorted(i for b in batches for i in b.indices) == list(range(len(lines)))
    for b in batches:
        assert b.tgt_in is None and b.tgt_out is None and b.n_tokens is None
        if b.empty:
            assert b.src.shape == (len(b), 0) and b.src_lengths.tolist() == [0] * len(b)
            assert set(b.indices) <= {1, 3}
        else:
            assert min(b.src_lengths.tolist()) > 0
            for row, i in enumerate(b.indices):
                n = int(b.src_lengths[row])
                assert b.src[row, :n].tolist() == field.encode(lines[i])
                assert field.decode(b.src[row, :n]) == " ".join(lines[i].split())
    assert [b.empty for b in batches] == [False, False, True]  # 4 non-empty lines, then 2 empty
    truncated = encode_sources(field, lines, batch_size=8, max_length=2)
    assert max(int(b.src_lengths.max()) for b in truncated if not b.empty) == 2


def test_training_pools_sort_by_target_length_first() -> None:
    # sources and targets of uncorrelated lengths: sorting pools by target length first leaves
    # almost no target padding (the decoder's steps, the output layer and the loss run over it)
    rng = random.Random(3)
    ds = Lengths([rng.randint(1, 40) for _ in range(4000)], [rng.randint(1, 40) for _ in range(4000)])

    def tgt_padding(batches):
        return sum(len(b) * max(ds.tgt_lengths[i] for i in b) for b in batches) / sum(ds.tgt_lengths)
    batches = make_batches(ds, 50, shuffle=True, seed=0)
    assert sorted(i for b in batches for i in b) == list(range(len(ds)))
    assert tgt_padding(batches) < 1.05
    # within each batch the target lengths span at most a few values (a sorted pool, cut)
    assert max(max(ds.tgt_lengths[i] for i in b) - min(ds.tgt_lengths[i] for i in b) for b in batches) <= 2


def test_bucket_size_sets_the_sorted_pool() -> None:
    rng = random.Random(4)
    ds = Lengths([rng.randint(1, 60) for _ in range(3000)], [rng.randint(1, 60) for _ in range(3000)])

    def tgt_cells(batches):
        return sum(len(b) * max(ds.tgt_lengths[i] for i in b) for b in batches)
    whole = make_batches(ds, 30, shuffle=True, seed=1, bucket_size=len(ds))
    small = make_batches(ds, 30, shuffle=True, seed=1, bucket_size=90)
    assert sorted(i for b in whole for i in b) == sorted(i for b in small for i in b) == list(range(len(ds)))
    # one pool holding everything: batches are cut from one sorted list, the least padding
    assert tgt_cells(whole) < tgt_cells(small)
    order = sorted(range(len(ds)), key=lambda i: (ds.tgt_lengths[i], ds.src_lengths[i]))
    assert sorted(max(ds.tgt_lengths[i] for i in b) for b in whole) == \
        sorted(max(ds.tgt_lengths[i] for i in order[k:k + 30]) for k in range(0, len(ds), 30))
    assert whole == make_batches(ds, 30, shuffle=True, seed=1, bucket_size=len(ds))
    with pytest.raises(DataError, match="bucket_size"):
        make_batches(ds, 30, bucket_size=0)


def _reference_batches(ds: Lengths, batch_size: int, seed: int, epoch: int, pool: int, key) -> set:
    """The documented recipe written out with Python's stable ``sorted``: permute the examples
    with the (seed, epoch) generator, sort each pool of ``pool`` examples by ``key``, cut runs of
    ``batch_size``; returns the batches as a set of tuples (their shuffled order aside)."""
    import numpy as np

    permuted = np.random.default_rng([seed, epoch]).permutation(len(ds)).tolist()
    batches = set()
    for start in range(0, len(permuted), pool):
        ordered = sorted(permuted[start:start + pool], key=key)
        batches |= {tuple(ordered[k:k + batch_size]) for k in range(0, len(ordered), batch_size)}
    return batches


@pytest.mark.parametrize("pool", [None, 70, 10_000])
def test_pool_sort_orders_match_a_plain_sort_of_the_permuted_pool(pool) -> None:
    # correlated lengths, as in translation: the source about as long as the target, +-30%
    rng = random.Random(5)
    tgt = [rng.randint(1, 30) for _ in range(1500)]
    ds = Lengths([max(1, round(t * rng.uniform(0.7, 1.3))) for t in tgt], tgt)
    keys = {"target": lambda i: ds.tgt_lengths[i],
            "target_source": lambda i: (ds.tgt_lengths[i], ds.src_lengths[i]),
            "source_target": lambda i: (ds.src_lengths[i], ds.tgt_lengths[i])}
    size = 16 * POOL_BATCHES if pool is None else pool
    for name, key in keys.items():
        batches = make_batches(ds, 16, shuffle=True, seed=2, epoch=3, bucket_size=pool, pool_sort=name)
        assert set(map(tuple, batches)) == _reference_batches(ds, 16, 2, 3, size, key), name


def test_pool_sort_target_mixes_source_lengths_and_keeps_target_padding() -> None:
    """Sorting by target length alone keeps the target padding of the (target, source) sort,
    but its batches hold the length ratios of the whole corpus, not one ratio each."""
    rng = random.Random(6)
    tgt = [rng.randint(3, 30) for _ in range(6000)]
    ds = Lengths([max(1, round(t * rng.uniform(0.6, 1.4))) for t in tgt], tgt)

    def measure(batches):
        cells = sum(len(b) * max(ds.tgt_lengths[i] for i in b) for b in batches) / sum(ds.tgt_lengths)
        spread = [statistics.pstdev(ds.src_lengths[i] / ds.tgt_lengths[i] for i in b) for b in batches if len(b) > 1]
        return cells, statistics.mean(spread)

    every = statistics.pstdev(s / t for s, t in zip(ds.src_lengths, ds.tgt_lengths))
    by_target = measure(make_batches(ds, 32, seed=1, bucket_size=len(ds), pool_sort="target"))
    by_both = measure(make_batches(ds, 32, seed=1, bucket_size=len(ds), pool_sort="target_source"))
    assert by_target[0] == by_both[0] < 1.01  # the same target lengths per batch
    assert by_target[1] > 0.8 * every  # each batch: about the corpus's spread of ratios
    assert by_both[1] < 0.4 * every  # each batch: a narrow band of ratios
    with pytest.raises(DataError, match="pool_sort: expected one of target, target_source, source_target"):
        make_batches(ds, 32, pool_sort="source")


def test_the_default_pool_sort_is_the_configs() -> None:
    from nmt.config import SCHEMA
    from nmt.data.batching import DEFAULT_POOL_SORT, POOL_SORTS

    option = SCHEMA["training"]["pool_sort"]
    assert option.default == DEFAULT_POOL_SORT and option.choices == POOL_SORTS
