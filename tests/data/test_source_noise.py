"""Noise on the training sources (nmt.data.source_noise): the batched, vectorised noise equals a
per-sentence Python reference that groups pieces into words with the tokenizer's own ``word_ids``
(sentencepiece, BPE, space) or takes characters (char), for every combination of the three
operations; whole words are deleted, blanked and moved, none more than ``shuffle`` places; the
rates match the probabilities; one word always remains; a source tag stays first; an example's
noise depends on (seed, epoch, example) only; rows of an un-noised corpus come back unchanged."""
from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch

from nmt.data.batching import collate
from nmt.data.field import Field
from nmt.data.source_noise import NoiseSettings, SourceNoise, noised_sources
from nmt.data.tokenizers import build_tokenizer
from nmt.utils.counter_hash import absorb

WORDS = ("the quick brown fox jumps over lazy dogs while seven tired wizards quietly mix "
         "strange potions under ancient oak trees near riverbanks").split()


def sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) for _ in range(n)]


@pytest.fixture(scope="module", params=["sentencepiece", "bpe", "space", "char"])
def field(request):
    kind = request.param
    cfg = {"sentencepiece": {"type": "sentencepiece", "vocab_size": 45, "model_type": "unigram"},
           "bpe": {"type": "bpe", "merges": 40}}.get(kind, {"type": kind})
    tokenizer = build_tokenizer(cfg)
    lines = sentences(300, seed=1)
    tokenizer.train(lines)
    field = Field.build(tokenizer, lines)
    if kind in ("sentencepiece", "bpe"):  # words of several pieces, that noise must keep together
        rows = [field.encode(line) for line in sentences(40, seed=7)]
        assert sum(len(u) > 1 for ids in rows for u in units_of(field, ids)) > 50
    return field


def units_of(field: Field, ids: list[int]) -> list[list[int]]:
    """The reference grouping: the tokenizer's word of each piece (``word_ids``), a char model's
    characters one each."""
    if field.tokenizer.type_name == "char":
        return [[i] for i in ids]
    words = field.tokenizer.word_ids([field.vocab.itos[i] for i in ids])
    assert None not in words
    groups: list[list[int]] = []
    for i, w in zip(ids, words):
        if groups and w == last:
            groups[-1].append(i)
        else:
            groups.append([i])
        last = w
    return groups


def uniform(state: int, unit: int, operation: int) -> float:
    return (absorb(absorb(state, unit), operation) >> 8) / (1 << 24)


def reference(field: Field, ids: list[int], state: int, settings: NoiseSettings, tagged: bool) -> list[int]:
    """The noise of one sentence, written from the definition, one word at a time."""
    head, body = (ids[:1], ids[1:]) if tagged else ([], ids)
    units = units_of(field, body)
    first = len(head)  # the tag is unit 0
    numbers = list(range(first, first + len(units)))
    deleted = [uniform(state, j, 1) < settings.delete for j in numbers]
    if units and all(deleted):
        draws = [uniform(state, j, 1) for j in numbers]
        deleted[draws.index(max(draws))] = False
    kept = []
    for j, unit, gone in zip(numbers, units, deleted):
        if gone:
            continue
        pieces = [field.vocab.unk_index] if uniform(state, j, 2) < settings.blank else unit
        key = j + uniform(state, j, 3) * (settings.shuffle + 1) if settings.shuffle > 0 else j
        kept.append((key, pieces))
    kept.sort(key=lambda item: item[0])
    return head + [i for _, pieces in kept for i in pieces]


class Rows:
    """A dataset of source rows (targets: one token each) for ``collate``."""

    def __init__(self, rows: list[list[int]]) -> None:
        self.src, self.tgt = rows, [[4]] * len(rows)
        self.src_lengths, self.tgt_lengths = [len(r) for r in rows], [1] * len(rows)
        self.line_numbers = list(range(1, len(rows) + 1))

    def __len__(self) -> int:
        return len(self.src)


def noise_of(field: Field, settings: NoiseSettings, tagged: bool = False, seed: int = 5) -> SourceNoise:
    return SourceNoise([(settings, tagged)], [0, 10 ** 9], field, seed)


SETTINGS = [NoiseSettings(*s) for s in itertools.product((0.0, 0.3), (0.0, 0.25), (0, 1, 3))]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: s.describe().replace(" ", ""))
def test_batched_noise_equals_the_reference_sentence_by_sentence(field, settings):
    lines = sentences(40, seed=7)
    rows = [field.encode(line) for line in lines]
    data = Rows(rows)
    noise = noise_of(field, settings)
    for epoch in (0, 3):
        batch = noise.apply(collate(data, list(range(len(rows))), 0, 2, 3), data, epoch)
        keys = noise.example_keys(epoch, list(range(len(rows))))
        for r, ids in enumerate(rows):
            expected = reference(field, ids, int(keys[r]), settings, tagged=False)
            assert batch.src[r, :int(batch.src_lengths[r])].tolist() == expected, (epoch, lines[r])
            assert (batch.src[r, int(batch.src_lengths[r]):] == 0).all()
        assert batch.src.size(1) == int(batch.src_lengths.max()) and batch.n_src_tokens == int(batch.src_lengths.sum())
        if not settings.active:
            assert torch.equal(batch.src, collate(data, list(range(len(rows))), 0, 2, 3).src)


def test_words_move_whole_and_at_most_shuffle_places(field):
    """Shuffle alone: a permutation of the sentence's words (each word's pieces together, in
    order), none more than k places from where it was, and some moved."""
    rows = [field.encode(line) for line in sentences(200, seed=3)]
    data = Rows(rows)
    for k in (1, 2, 3):
        batch = noise_of(field, NoiseSettings(shuffle=k)).apply(collate(data, list(range(len(rows))), 0, 2, 3), data, 1)
        moved = 0
        for r, ids in enumerate(rows):
            words = [tuple(u) for u in units_of(field, ids)]
            out = batch.src[r, :int(batch.src_lengths[r])].tolist()
            # read the output back as words: greedily match the remaining words (each used once)
            left, places, at = list(enumerate(words)), [], 0
            while at < len(out):
                match = next(m for m in left if tuple(out[at:at + len(m[1])]) == m[1])
                left.remove(match)
                places.append(match[0])
                at += len(match[1])
            assert not left and sorted(places) == list(range(len(words)))
            assert all(abs(new - old) <= k for new, old in enumerate(places)), (k, places)
            moved += places != sorted(places)
        assert moved > 20


def test_rates_match_the_probabilities(field):
    """Over many words the deleted share (delete alone) and the blanked share (blank alone) are
    within 4 standard errors of p (one-word sentences keep their word: allowed for)."""
    rows = [field.encode(line) for line in sentences(600, seed=11)]
    data = Rows(rows)
    everything = list(range(len(rows)))
    words = [len(units_of(field, ids)) for ids in rows]
    n, single = sum(words), sum(w == 1 for w in words)
    for delete in (0.1, 0.3):
        batch = noise_of(field, NoiseSettings(delete=delete)).apply(collate(data, everything, 0, 2, 3), data, 0)
        kept = sum(len(units_of(field, batch.src[r, :int(batch.src_lengths[r])].tolist())) for r in everything)
        error = 4 * (delete * (1 - delete) / n) ** 0.5
        assert 1 - delete - error < kept / n < 1 - delete + error + single / n
    blank = 0.2
    batch = noise_of(field, NoiseSettings(blank=blank)).apply(collate(data, everything, 0, 2, 3), data, 0)
    unk = field.vocab.unk_index
    blanked = int((batch.src == unk).sum()) - sum(ids.count(unk) for ids in rows)
    assert abs(blanked / n - blank) < 4 * (blank * (1 - blank) / n) ** 0.5


def test_one_word_always_remains_and_a_tag_stays_first(field):
    tag = field.vocab.unk_index + 3  # any id: it is the tag because the corpus is tagged
    rows = [[tag] + field.encode(line) for line in sentences(100, seed=5)]
    data = Rows(rows)
    settings = NoiseSettings(0.95, 0.3, 3)
    noise = noise_of(field, settings, tagged=True)
    batch = noise.apply(collate(data, list(range(len(rows))), 0, 2, 3), data, 2)
    keys = noise.example_keys(2, list(range(len(rows))))
    assert (batch.src[:, 0] == tag).all() and (batch.src_lengths >= 2).all()
    for r, ids in enumerate(rows):
        assert batch.src[r, :int(batch.src_lengths[r])].tolist() == reference(field, ids, int(keys[r]), settings, True)
    plain = [field.encode(line) for line in sentences(100, seed=5)]
    out = noise_of(field, NoiseSettings(0.95)).apply(collate(Rows(plain), list(range(100)), 0, 2, 3), Rows(plain), 0)
    assert (out.src_lengths >= 1).all()
    for r, ids in enumerate(plain):  # what remains is whole words of the sentence, few of them
        rest = units_of(field, out.src[r, :int(out.src_lengths[r])].tolist())
        assert {tuple(u) for u in rest} <= {tuple(u) for u in units_of(field, ids)}
    assert sum(out.src_lengths.tolist()) < 0.25 * sum(len(ids) for ids in plain)


def test_an_examples_noise_depends_on_seed_epoch_and_example_only(field):
    rows = [field.encode(line) for line in sentences(30, seed=9)]
    data = Rows(rows)
    noise = noise_of(field, NoiseSettings(0.2, 0.2, 3))
    whole = noise.apply(collate(data, list(range(30)), 0, 2, 3), data, 4)
    row = {i: whole.src[k, :int(whole.src_lengths[k])].tolist() for k, i in enumerate(range(30))}
    for part in ([7, 3, 29], [29], list(range(29, -1, -2))):  # other batches, other orders
        batch = noise.apply(collate(data, part, 0, 2, 3), data, 4)
        assert [batch.src[k, :int(batch.src_lengths[k])].tolist() for k in range(len(part))] == [row[i] for i in part]
    other_epoch = noise.apply(collate(data, list(range(30)), 0, 2, 3), data, 5)
    other_seed = noise_of(field, NoiseSettings(0.2, 0.2, 3), seed=6).apply(collate(data, list(range(30)), 0, 2, 3),
                                                                         data, 4)
    for other in (other_epoch, other_seed):
        assert sum(other.src[k, :int(other.src_lengths[k])].tolist() != row[k] for k in range(30)) > 10


def test_rows_of_a_corpus_without_noise_come_back_unchanged(field):
    """Two corpora (lines 1-20 noised, 21-40 not): the second's rows are collate's, the first's
    the reference; a batch of the second corpus alone is the batch itself."""
    rows = [field.encode(line) for line in sentences(40, seed=13)]
    data = Rows(rows)
    settings = NoiseSettings(0.3, 0.3, 2)
    noise = SourceNoise([(settings, False), (NoiseSettings(), False)], [0, 20, 40], field, 8)
    order = list(range(0, 40, 3)) + list(range(1, 40, 3))
    plain = collate(data, order, 0, 2, 3)
    batch = noise.apply(plain, data, 0)
    keys = noise.example_keys(0, order)
    for k, i in enumerate(order):
        got = batch.src[k, :int(batch.src_lengths[k])].tolist()
        assert got == (reference(field, rows[i], int(keys[k]), settings, False) if i < 20 else rows[i])
    second = collate(data, list(range(20, 40)), 0, 2, 3)
    assert noise.apply(second, data, 0) is second


def test_a_batch_of_empty_sources_passes_through(field):
    src, lengths = np.zeros((3, 0), dtype=np.int64), np.zeros(3, dtype=np.int64)
    out = noised_sources(src, lengths, np.zeros(3, dtype=np.int64), np.full(3, 0.5), np.zeros(3), np.zeros(3, np.int64),
                         np.zeros(3, dtype=bool), np.ones(8, dtype=bool), np.zeros(8, dtype=bool), 1, 0)
    assert out[0].shape == (3, 0)
