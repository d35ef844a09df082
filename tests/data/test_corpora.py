"""Weighted corpora (nmt.data.corpora): an epoch's examples against counts computed by hand from
the weights and sizes, the fractional share seeded by (seed, epoch, corpus), the batches' share of
each corpus, the view against the dataset it indexes, the sampling temperature's shares, and the
one-line errors."""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from nmt.config import ConfigError, resolve_config
from nmt.data.batching import collate, make_batch_order
from nmt.data.corpora import (Corpus, CorpusWeights, EpochExamples, epoch_indices, examples_per_epoch,
                              read_corpora, tempered_weights, training_corpora)
from nmt.data.dataset import ParallelDataset
from nmt.data.errors import DataError
from nmt.data.field import Field
from nmt.data.tokenizers import build_tokenizer
from nmt.data.vocabulary import Vocabulary


def ids_of(sizes: list[int]) -> np.ndarray:
    return np.concatenate([np.full(n, k) for k, n in enumerate(sizes)])


@pytest.mark.parametrize("weights, sizes", [([3, 1], [5, 7]), ([2.5, 0.4, 1.0], [10, 20, 3]),
                                            ([0.5], [9]), ([1.25, 2, 0.1], [8, 4, 30])])
def test_epoch_multiset_is_floor_copies_plus_the_rounded_fraction(weights, sizes):
    corpus_ids = ids_of(sizes)
    for epoch in range(4):
        counts = Counter(epoch_indices(corpus_ids, weights, seed=7, epoch=epoch).tolist())
        for k, (w, n) in enumerate(zip(weights, sizes)):
            members = np.flatnonzero(corpus_ids == k)
            whole = math.floor(w)
            got = [counts.get(int(i), 0) for i in members]
            assert set(got) <= {whole, whole + 1}
            # by hand: round half up of frac x n (2.5 x 10 -> 5 extra, 0.4 x 20 -> 8, 0.1 x 30 -> 3, 0.5 x 9 -> 5)
            assert sum(c == whole + 1 for c in got) == math.floor((w - whole) * n + 0.5)
            if float(w).is_integer():
                assert got == [int(w)] * n


def test_the_fraction_is_seeded_and_varies_by_epoch_and_corpus():
    corpus_ids = ids_of([40, 40])
    draw = lambda seed, epoch: epoch_indices(corpus_ids, [0.5, 0.5], seed, epoch)
    assert np.array_equal(draw(3, 2), draw(3, 2))
    assert not np.array_equal(draw(3, 2), draw(3, 5))
    assert not np.array_equal(draw(3, 2), draw(4, 2))
    first, second = draw(3, 2)[:20], draw(3, 2)[20:] - 40
    assert not np.array_equal(first, second)  # corpus 1 draws from its own generator


def test_the_fraction_picks_every_example_alike():
    """Over 400 epochs each of 10 examples of weight 0.3 is picked Binomial(400, 0.3) times
    (3 of 10 per epoch, uniformly): mean 120, sd 9.2; every count within 5 sd."""
    picked = Counter()
    for epoch in range(400):
        picked.update(epoch_indices(np.zeros(10, dtype=np.int64), [0.3], seed=1, epoch=epoch).tolist())
    assert sorted(picked) == list(range(10))
    assert all(abs(c - 120) < 5 * math.sqrt(400 * 0.3 * 0.7) for c in picked.values())


def _field(kind: str) -> Field:
    tokenizer = build_tokenizer({"type": kind})
    return Field(tokenizer, Vocabulary.build([list("abcdefgh")], 1, None))


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


@pytest.fixture
def two_corpora(tmp_path):
    real = [("a b c", "cba"), ("d e", "ed"), ("a a a a a a a", "aaaaaaa"), ("f", "f")]  # one too long (max 5)
    bt = [(" ".join("abcdefgh"[(i + j) % 8] for j in range(1 + i % 4)), "x" * (1 + i % 4)) for i in range(9)]
    cfg = [{"src": write(tmp_path / "real.src", [s for s, _ in real]), "tgt": write(tmp_path / "real.tgt", [t for _, t in real]),
            "weight": 3.0, "name": "real"},
           {"src": write(tmp_path / "bt.src", [s for s, _ in bt]), "tgt": write(tmp_path / "bt.tgt", [t for _, t in bt]),
            "weight": 0.5, "name": None}]
    return cfg, real, bt


def test_batches_hold_each_corpus_weight_times_its_kept_pairs(two_corpora):
    cfg, real, bt = two_corpora
    corpora = training_corpora(cfg)
    pairs, starts = read_corpora(corpora)
    assert pairs == real + bt and starts.tolist() == [0, 4, 13]
    data = ParallelDataset(pairs, _field("space"), _field("char"), 5, 5)
    weights = CorpusWeights(corpora, starts)
    assert weights.describe(data) == [
        "real: kept 3 of 4 pairs (skipped 0 empty, 1 too long), weight 3, 9 examples per epoch",
        f"{cfg[1]['src']}, {cfg[1]['tgt']}: kept 9 of 9 pairs (skipped 0 empty, 0 too long), weight 0.5, 5 examples per epoch"]
    for epoch in range(3):
        examples = weights.for_epoch(data, seed=11, epoch=epoch)
        order = make_batch_order(examples, 4, "sentences", shuffle=True, seed=11, epoch=epoch)
        lines = [int(examples.line_numbers[i]) for batch in order.lists() for i in batch]
        per_corpus = Counter("real" if line <= 4 else "bt" for line in lines)
        assert per_corpus == {"real": 3 * 3, "bt": 5}  # weight x kept pairs (0.5 x 9 = 4.5, half up)
        assert Counter(line for line in lines if line <= 4) == {1: 3, 2: 3, 4: 3}  # line 3 is too long
        for batch in order.lists():  # the view collates what the dataset holds at the mapped positions
            mine = collate(examples, batch, 0, 2, 3)
            theirs = collate(data, [int(examples.dataset_index[i]) for i in batch], 0, 2, 3)
            assert all(np.array_equal(getattr(mine, k), getattr(theirs, k)) for k in ("src", "tgt_in", "tgt_out"))


def test_a_list_of_one_corpus_of_weight_one_is_the_dataset_itself(two_corpora):
    cfg, real, _ = two_corpora
    corpora = training_corpora([{**cfg[0], "weight": 1.0}])
    pairs, starts = read_corpora(corpora)
    data = ParallelDataset(pairs, _field("space"), _field("char"), 5, 5)
    examples = CorpusWeights(corpora, starts).for_epoch(data, seed=1, epoch=0)
    assert isinstance(examples, EpochExamples)
    assert make_batch_order(examples, 2, seed=1, epoch=0).lists() == make_batch_order(data, 2, seed=1, epoch=0).lists()


def test_missing_and_unequal_files_name_the_key(two_corpora, tmp_path):
    cfg, _, _ = two_corpora
    with pytest.raises(DataError, match=r"^data.train\[1\].src: .*nowhere.src: file not found$"):
        read_corpora(training_corpora([cfg[0], {**cfg[1], "src": str(tmp_path / "nowhere.src")}]))
    with pytest.raises(DataError, match=r"^data.train\[1\]: .*bt.src has 9 lines but .*real.tgt has 4$"):
        read_corpora(training_corpora([cfg[0], {**cfg[1], "tgt": cfg[0]["tgt"]}]))
    with pytest.raises(DataError, match="leave no training example"):
        data = ParallelDataset([("a", "a")], _field("space"), _field("char"))
        CorpusWeights([Corpus("data.train[0]", "x", "y", 0.4)], np.array([0, 1])).for_epoch(data, 0, 0)


MINIMAL = {"data": {"valid": {"src": "v.src", "tgt": "v.tgt"}}, "training": {"save_dir": "run", "max_steps": 1}}


@pytest.mark.parametrize("train, key, problem", [
    ([{"src": "a", "tgt": "b"}, {"src": "c"}], "data.train[1].tgt", "is required but missing"),
    ([{"src": "a", "tgt": "b", "weight": 0}], "data.train[0].weight", "must be > 0, got 0.0"),
    ([{"src": "a", "tgt": "b", "weight": -2}], "data.train[0].weight", "must be > 0"),
    ([{"src": "a", "tgt": "b", "wieght": 2}], "data.train[0].wieght", "weight"),
    (["a.src"], "data.train[0]", "must be a section"),
    ([], "data.train", "non-empty list"),
    ({"src": "a", "tgt": "b", "weight": 0}, "data.train.weight", "must be > 0"),
])
def test_config_errors_name_the_key(train, key, problem):
    raw = {**MINIMAL, "data": {**MINIMAL["data"], "train": train}}
    with pytest.raises(ConfigError) as err:
        resolve_config(raw, "c.yaml")
    message = str(err.value)
    assert message.startswith(f"c.yaml: {key}") and problem in message and "\n" not in message


@pytest.mark.parametrize("extra, key", [({"generate": "quickstart"}, "data.generate")])
def test_a_list_with_generate_is_a_config_error(extra, key):
    raw = {**MINIMAL, "data": {**MINIMAL["data"], "train": [{"src": "a", "tgt": "b"}], **extra}}
    with pytest.raises(ConfigError) as err:
        resolve_config(raw, "c.yaml")
    assert str(err.value).startswith(f"c.yaml: {key}") and "\n" not in str(err.value)


def test_a_list_with_id_cache_is_accepted():
    """One token-id cache per corpus (nmt.data.corpus_arrays)."""
    raw = {**MINIMAL, "data": {**MINIMAL["data"], "train": [{"src": "a", "tgt": "b"}], "id_cache": True}}
    assert resolve_config(raw, "c.yaml")["data"]["id_cache"] is True


NO_NOISE = {"delete": 0.0, "blank": 0.0, "shuffle": 0}


def test_resolved_configs():
    one = resolve_config({**MINIMAL, "data": {**MINIMAL["data"], "train": {"src": "a", "tgt": "b"}}}, "c")
    assert one["data"]["train"] == {"src": "a", "tgt": "b", "weight": 1.0, "name": None, "src_tag": None, "align": None,
                                    "noise": NO_NOISE}
    many = resolve_config({**MINIMAL, "data": {**MINIMAL["data"], "train": [
        {"src": "a", "tgt": "b", "weight": 3}, {"src": "c", "tgt": "d", "name": "bt"}]}}, "c")
    assert many["data"]["train"] == [
        {"src": "a", "tgt": "b", "weight": 3.0, "name": None, "src_tag": None, "align": None, "noise": NO_NOISE},
        {"src": "c", "tgt": "d", "weight": 1.0, "name": "bt", "src_tag": None, "align": None, "noise": NO_NOISE}]


@pytest.mark.parametrize("temperature", [1.0, 2.0, 5.0, 100.0, 0.5])
def test_tempered_weights_give_shares_of_the_tempered_sizes_in_an_epoch_of_the_same_size(temperature):
    """Corpus k's share of the epoch is (w_k n_k)^(1/T) / sum_j (w_j n_j)^(1/T) (by hand below), the
    epoch's size sum_k w_k n_k; T = 1 gives the weights back; a corpus that kept nothing keeps its weight."""
    weights, kept = [1.0, 2.0, 0.5, 3.0], [1000, 50, 400, 0]
    tempered = tempered_weights(weights, kept, temperature)
    sizes = [w * n for w, n in zip(weights, kept)]
    powered = [s ** (1 / temperature) for s in sizes]
    for k in range(3):
        assert tempered[k] * kept[k] / sum(sizes) == pytest.approx(powered[k] / sum(powered), rel=1e-12)
    assert sum(t * n for t, n in zip(tempered, kept)) == pytest.approx(sum(sizes), rel=1e-12)
    assert tempered[3] == 3.0
    if temperature == 1.0:
        assert tempered == weights
    if temperature == 100.0:  # nearly equal shares
        assert max(t * n for t, n in zip(tempered, kept)) / min(t * n for t, n in zip(tempered[:3], kept[:3])) < 1.1


def test_an_epoch_at_a_sampling_temperature_holds_the_tempered_counts(two_corpora):
    """CorpusWeights with temperature 3: each corpus's examples in an epoch are
    examples_per_epoch(kept, tempered weight), the data log says the tempered weight."""
    cfg, real, bt = two_corpora
    corpora = training_corpora(cfg)
    pairs, starts = read_corpora(corpora)
    data = ParallelDataset(pairs, _field("space"), _field("char"), 5, 5)
    weights = CorpusWeights(corpora, starts, 3.0)
    tempered = tempered_weights([3.0, 0.5], [3, 9], 3.0)
    assert weights.weights(weights.kept(weights.corpus_ids(data))) == tempered
    lines = weights.describe(data)
    assert lines[0] == (f"real: kept 3 of 4 pairs (skipped 0 empty, 1 too long), weight 3 ({tempered[0]:.4g} at "
                        f"sampling temperature 3), {examples_per_epoch(3, tempered[0])} examples per epoch")
    for epoch in range(3):
        examples = weights.for_epoch(data, seed=5, epoch=epoch)
        per_corpus = Counter("real" if int(line) <= 4 else "bt" for line in examples.line_numbers)
        assert per_corpus == {"real": examples_per_epoch(3, tempered[0]), "bt": examples_per_epoch(9, tempered[1])}
    # the small corpus (9 x 3 = 9 weighted) rose against the large one (4.5): 4.5^(1/3) / 9^(1/3) of it
    assert examples_per_epoch(9, tempered[1]) > 5


def test_sampling_temperature_config():
    raw = {**MINIMAL, "data": {**MINIMAL["data"], "train": [{"src": "a", "tgt": "b"}], "sampling_temperature": 5}}
    assert resolve_config(raw, "c.yaml")["data"]["sampling_temperature"] == 5.0
    with pytest.raises(ConfigError) as err:
        resolve_config({**raw, "data": {**raw["data"], "sampling_temperature": 0}}, "c.yaml")
    assert str(err.value).startswith("c.yaml: data.sampling_temperature") and "\n" not in str(err.value)
