"""Vocabulary (specials, min_freq/max_size against a brute-force count) and Field."""
from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from nmt.data import DataError, Field, Vocabulary, build_tokenizer


def test_specials_at_fixed_ids() -> None:
    v = Vocabulary(["x"])
    assert (v.pad_index, v.unk_index, v.bos_index, v.eos_index) == (0, 1, 2, 3)
    assert v.tokens([0, 1, 2, 3, 4]) == ["<pad>", "<unk>", "<bos>", "<eos>", "x"]
    assert len(v) == 5


@pytest.mark.parametrize("min_freq,max_size", [(1, None), (2, None), (3, 5), (1, 0), (2, 100)])
def test_build_matches_brute_force(min_freq: int, max_size: int | None) -> None:
    rng = random.Random(min_freq * 10 + (max_size or 0))
    data = [[rng.choice("abcdefghij") * rng.randint(1, 2) for _ in range(rng.randint(0, 8))] for _ in range(60)]
    data.append(["<unk>", "<eos>"])  # spelled like specials: never a second id
    v = Vocabulary.build(data, min_freq=min_freq, max_size=max_size)
    counts = Counter(t for line in data for t in line if t not in ("<unk>", "<eos>"))
    expected = [t for t, c in counts.items() if c >= min_freq]
    expected.sort(key=lambda t: (-counts[t], t))
    if max_size is not None:
        expected = expected[:max_size]
    assert v.itos[4:] == expected
    assert v.lookup(["<unk>", "<eos>"]) == [1, 3]


def test_lookup_unknown_and_out_of_range() -> None:
    v = Vocabulary.build([["a", "b", "a"]])
    assert v.lookup(["a", "b", "zzz"]) == [4, 5, 1]
    with pytest.raises(IndexError, match="id 9"):
        v.tokens([9])


def test_state_dict_and_file_round_trip(tmp_path) -> None:
    v = Vocabulary.build([["é", "b", "b", "\u2581"]])
    assert Vocabulary.from_state_dict(v.state_dict()) == v
    v.save(tmp_path / "vocab.txt")
    assert Vocabulary.load(tmp_path / "vocab.txt") == v
    (tmp_path / "bad.txt").write_text("<pad>\n<unk>\n<bos>\n<eos>\na\nb\na\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"bad\.txt:7: duplicate token 'a' \(first on line 5\)"):
        Vocabulary.load(tmp_path / "bad.txt")
    (tmp_path / "nospec.txt").write_text("a\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"nospec\.txt:1"):
        Vocabulary.load(tmp_path / "nospec.txt")
    with pytest.raises(DataError, match="itos"):
        Vocabulary.from_state_dict({"itos": ["a", "<pad>"]})


def test_field_encode_decode_and_state() -> None:
    lines = ["walked", "talks", "a b"]
    f = Field.build(build_tokenizer({"type": "char"}), lines)
    ids = f.encode("walks")
    assert f.decode(ids) == "walks"
    assert f.encode("wQ") == [f.vocab.lookup(["w"])[0], f.vocab.unk_index]
    v = f.vocab
    # decode stops at EOS and drops pad/BOS; tensors accepted
    seq = torch.tensor([v.bos_index] + f.encode("a b") + [v.eos_index] + f.encode("x") + [v.pad_index])
    assert f.decode(seq) == "a b"
    assert f.decode_tokens([v.bos_index, v.unk_index, v.pad_index]) == ["<unk>"]
    g = Field.from_state_dict(f.state_dict())
    assert g.encode("talked") == f.encode("talked") and g.vocab == f.vocab
    with pytest.raises(DataError, match="field state"):
        Field.from_state_dict({"vocab": {}})


def test_field_survives_checkpoint_serialization(tmp_path) -> None:
    """Fields with learned tokenizers round-trip through torch.save/torch.load(weights_only=True)."""
    lines = ["ein hund und eine katze", "der hund schläft", "die katze springt und der hund schläft"] * 10
    for cfg in ({"type": "bpe", "merges": 20}, {"type": "sentencepiece", "vocab_size": 30}):
        tok = build_tokenizer(cfg)
        tok.train(lines)
        field = Field.build(tok, lines)
        torch.save({"src_field": field.state_dict()}, tmp_path / "ckpt.pt")
        state = torch.load(tmp_path / "ckpt.pt", weights_only=True)["src_field"]
        restored = Field.from_state_dict(state)
        for text in lines[:3] + ["ein unbekanntes wort"]:
            assert restored.encode(text) == field.encode(text)
            assert restored.decode(restored.encode(text)) == field.decode(field.encode(text))


def test_text_spelling_a_special_encodes_as_unknown() -> None:
    """A word ``<pad>`` / ``<bos>`` / ``<eos>`` in the text is unknown, not the control symbol:
    as padding it was masked out of the source and dropped from the loss, as EOS it ended a target."""
    from nmt.data import ParallelDataset

    f = Field.build(build_tokenizer({"type": "space"}), ["a b", "a <eos> <pad> b"])
    v = f.vocab
    assert f.encode("a <pad> <bos> <eos> <unk> b") == [v.stoi["a"]] + [v.unk_index] * 4 + [v.stoi["b"]]
    assert f.decode(f.encode("a <eos> b")) == "a <unk> b"
    data = ParallelDataset([("a <pad> b", "b <eos> a")], f, f)
    assert min(data.src[0]) > v.pad_index and v.eos_index not in data.tgt[0]
    assert data.src_lengths == [3] and data.tgt_lengths == [3]


def test_extended_keeps_every_id_and_appends_the_new_tokens_by_frequency():
    from nmt.data.vocabulary import SPECIALS, Vocabulary

    base = Vocabulary.build([["b", "a", "b"], ["c"]])
    data = [["x", "a", "y", "x"], ["z", "y", "x", "<eos>", "<unk>"], ["w"]]
    grown = base.extended(data)
    assert grown.itos[: len(base)] == base.itos and all(grown.stoi[t] == i for i, t in enumerate(base.itos))
    assert grown.itos[len(base):] == ["x", "y", "w", "z"]  # 3, 2, then 1 each by the string; specials never
    assert grown.counts == {"b": 0, "a": 1, "c": 0, "x": 3, "y": 2, "w": 1, "z": 1}
    assert base.extended(data, min_freq=2).itos[len(base):] == ["x", "y"]
    assert base.extended(data, max_size=len(base) - len(SPECIALS) + 1).itos[len(base):] == ["x"]
    assert base.extended(data, max_size=1).itos == base.itos  # already above the cap: nothing new
    assert base.extended([]).itos == base.itos
