"""Several corpora's token-id caches read as one dataset: the same pairs, lengths, line numbers,
counts and <unk> counts as the list dataset of the corpora's pairs read one after the other
(read_corpora + ParallelDataset, the path without the cache)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nmt.data.corpora import Corpus, CorpusWeights, read_corpora
from nmt.data.corpus_arrays import ConcatenatedArrays
from nmt.data.dataset import ParallelDataset
from nmt.data.field import Field
from nmt.data.id_arrays import load_id_dataset
from nmt.data.tokenizers import build_tokenizer


def write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


@pytest.fixture
def corpora(tmp_path):
    rng = np.random.default_rng(0)
    words = ["ka", "ro", "mi", "sel", "tan", "bu", "ler", "qq"]
    out = []
    for k, n in enumerate((7, 12, 5)):
        d = tmp_path / f"c{k}"
        d.mkdir()
        src = [" ".join(rng.choice(words, size=rng.integers(1, 6))) for _ in range(n)]
        tgt = [" ".join(rng.choice(words, size=rng.integers(1, 6))) for _ in range(n)]
        src[2] = ""  # an empty pair in every corpus
        out.append(Corpus(f"data.train[{k}]", write(d / "s", src), write(d / "t", tgt), weight=(1, 2.5, 0.4)[k]))
    return out


def fields(corpora):
    tok = build_tokenizer({"type": "space"})
    lines = [line for c in corpora for path in (c.src, c.tgt) for line in Path(path).read_text().splitlines()]
    field = Field.build(tok, [line for line in lines if "qq" not in line])  # 'qq' is <unk>
    return field, field


def test_the_concatenated_caches_are_the_list_dataset_of_the_corpora(corpora, tmp_path):
    src, tgt = fields(corpora)
    pairs, starts = read_corpora(corpora)
    listed = ParallelDataset(pairs, src, tgt, 4, 5)
    cached = ConcatenatedArrays([load_id_dataset(c.src, c.tgt, src, tgt, 4, 5) for c in corpora])
    assert len(cached) == len(listed) and 0 < len(listed) < len(pairs)
    assert [cached.src[i] for i in range(len(cached))] == listed.src
    assert [cached.tgt[i] for i in range(len(cached))] == listed.tgt
    assert cached[3] == listed[3]
    np.testing.assert_array_equal(cached.src_lengths, listed.src_lengths)
    np.testing.assert_array_equal(cached.tgt_lengths, listed.tgt_lengths)
    np.testing.assert_array_equal(cached.line_numbers, listed.line_numbers)
    np.testing.assert_array_equal(cached.starts, starts)
    assert (cached.n_input, cached.skipped, cached.unk_tokens) == (listed.n_input, listed.skipped, listed.unk_tokens)
    assert cached.summary() == listed.summary() and "<unk>" in cached.summary()
    weights = CorpusWeights(corpora, starts)
    for epoch in range(3):  # the weighted epochs index the same pairs
        a, b = weights.for_epoch(cached, 7, epoch), weights.for_epoch(listed, 7, epoch)
        assert [a[i] for i in range(len(a))] == [b[i] for i in range(len(b))]
    assert weights.describe(cached) == weights.describe(listed)
    with pytest.raises(IndexError):
        cached.src[len(cached)]
    # one cache per corpus, beside its source file
    assert all(len(list((Path(c.src).parent / ".nmt_id_cache").iterdir())) == 1 for c in corpora)
