"""Vocabulary files (nmt.data.vocab_file): round trips, OpenNMT-py / fairseq forms, min_freq /
max_size against Vocabulary.build and a brute-force rule, one-line errors with FILE:LINE."""
from __future__ import annotations

import logging
import random
from collections import Counter

import pytest

from nmt.data import DataError, Vocabulary
from nmt.data.vocab_file import parse_vocab_line, read_vocab_file, write_vocab_file


def random_corpus(seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    alphabet = ["a", "b", "é", "\u2581", "\t", "42", "x y", "<s>", "ab", "<unk>", "\u3000", "zz"]
    return [[rng.choice(alphabet) for _ in range(rng.randint(0, 9))] for _ in range(80)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_written_vocabulary_reads_back_identical(tmp_path, seed):
    vocab = Vocabulary.build(random_corpus(seed))
    write_vocab_file(tmp_path / "v", vocab)
    back = read_vocab_file(tmp_path / "v")
    assert back == vocab and back.itos == vocab.itos  # ids, specials included
    assert back.counts == vocab.counts and vocab.counts is not None
    lines = (tmp_path / "v").read_text(encoding="utf-8").split("\n")
    assert lines[0] == f"{vocab.itos[4]}\t{vocab.counts[vocab.itos[4]]}"  # line n holds id n + 3
    # without counts (a vocabulary rebuilt from a checkpoint): tokens only, same vocabulary
    bare = Vocabulary.from_state_dict(vocab.state_dict())
    assert bare.counts is None
    write_vocab_file(tmp_path / "bare", bare)
    assert read_vocab_file(tmp_path / "bare") == vocab
    assert read_vocab_file(tmp_path / "bare").counts is None


@pytest.mark.parametrize("min_freq,max_size", [(1, None), (2, None), (3, 4), (1, 0), (2, 3), (1, 100)])
def test_min_freq_and_max_size_of_a_counted_file_equal_building_from_the_data(tmp_path, min_freq, max_size):
    corpus = random_corpus(min_freq * 7 + (max_size or 0))
    write_vocab_file(tmp_path / "v", Vocabulary.build(corpus))  # every token with its count
    assert read_vocab_file(tmp_path / "v", min_freq, max_size) == Vocabulary.build(corpus, min_freq, max_size)


@pytest.mark.parametrize("seed", range(4))
def test_min_freq_and_max_size_of_an_unsorted_file_by_a_brute_force_rule(tmp_path, seed):
    rng = random.Random(seed)
    entries = [(f"t{i}", rng.randint(0, 6)) for i in range(25)]
    (tmp_path / "v").write_text("".join(f"{t} {c}\n" for t, c in entries), encoding="utf-8")
    min_freq, max_size = rng.randint(1, 3), rng.randint(0, 12)
    # a token is kept when counted min_freq times and fewer than max_size candidates beat it
    # (a higher count, or the same count on an earlier line); ids follow the file order
    candidates = [(i, t, c) for i, (t, c) in enumerate(entries) if c >= min_freq]
    kept = [t for i, t, c in candidates
            if sum(1 for j, _, d in candidates if d > c or (d == c and j < i)) < max_size]
    vocab = read_vocab_file(tmp_path / "v", min_freq, max_size)
    assert vocab.itos[4:] == kept
    assert vocab.counts == {t: c for t, c in entries if t in kept}


def test_opennmt_and_fairseq_forms_and_our_specials(tmp_path):
    onmt = tmp_path / "onmt.vocab"
    onmt.write_bytes("\ufeffthe\t120\r\n<unk>\t3\nHaus\t7\n\t\t2\n".encode("utf-8"))  # BOM, CRLF, a tab token
    vocab = read_vocab_file(onmt)
    assert vocab.itos == ["<pad>", "<unk>", "<bos>", "<eos>", "the", "Haus", "\t"]
    assert vocab.counts == {"the": 120, "Haus": 7, "\t": 2}
    fairseq = tmp_path / "dict.txt"
    fairseq.write_text("<eos> 1 #fairseq:overwrite\n, 10\n</s> 9\nmadeupword0000 0\n", encoding="utf-8")
    vocab = read_vocab_file(fairseq)  # min_freq 1 drops fairseq's count-0 padding words
    assert vocab.itos[4:] == [",", "</s>"] and vocab.eos_index == 3 and vocab.lookup(["<eos>"]) == [3]
    plain = tmp_path / "joey.txt"
    plain.write_text("<pad>\n<unk>\n<bos>\n<eos>\nb\na\n", encoding="utf-8")
    assert read_vocab_file(plain, max_size=1).itos == ["<pad>", "<unk>", "<bos>", "<eos>", "b"]
    assert parse_vocab_line("x 1") == ("x", 1) and parse_vocab_line("x  1\t") == ("x", 1)
    assert parse_vocab_line("a b 3") == ("a b", 3) and parse_vocab_line("-3.5") == ("-3.5", None)


def test_min_freq_without_counts_is_ignored_with_a_warning(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("nmt"), "propagate", True)  # the CLI's setup_logging turns it off
    (tmp_path / "v").write_text("a\nb\nc\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        vocab = read_vocab_file(tmp_path / "v", min_freq=5, key="data.tgt")
    assert vocab.itos[4:] == ["a", "b", "c"]
    assert any("data.tgt.min_freq=5 ignored" in r.getMessage() and "has no counts" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("text,message", [
    ("a 3\nb 2\na 1\n", r"v:3: duplicate token 'a' \(first on line 1\)"),
    ("a\n\nb\n", r"v:2: empty token"),
    ("a 3\nb\n", r"v:2: no count while line 1 has one"),
    ("a\nb 4\n", r"v:2: a count while line 1 has none"),
    ("<unk>\n<unk>\n", r"v:2: duplicate token '<unk>'"),
    ("<pad>\n<eos>\n", r"v: no tokens"),
    ("", r"v: no tokens"),
])
def test_errors_name_file_and_line(tmp_path, text, message):
    (tmp_path / "v").write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match=message) as info:
        read_vocab_file(tmp_path / "v")
    assert "\n" not in str(info.value)


def test_unreadable_files_are_named(tmp_path):
    with pytest.raises(DataError, match=r"nope\.txt: no such file"):
        read_vocab_file(tmp_path / "nope.txt")
    # a path that names no file is named with its setting: the message alone reads like a data file's
    with pytest.raises(DataError) as info:
        read_vocab_file(tmp_path / "nope.txt", key="data.tgt")
    assert str(info.value) == f"data.tgt.vocab_file: {tmp_path / 'nope.txt'}: no such file"
    with pytest.raises(DataError, match=r"^data\.src\.vocab_file: .*"):
        read_vocab_file(tmp_path, key="data.src")  # a directory
    (tmp_path / "bad").write_bytes(b"a 1\nb\xff 2\n")
    with pytest.raises(DataError, match=r"bad:2: not valid UTF-8"):
        read_vocab_file(tmp_path / "bad")


def test_a_token_that_would_read_back_with_a_count_is_not_written_without_counts(tmp_path):
    with pytest.raises(DataError, match=r"v: token 'x 1' cannot be written"):
        write_vocab_file(tmp_path / "v", Vocabulary(["a", "x 1"]))
    write_vocab_file(tmp_path / "w", Vocabulary(["a", "x 1"], {"a": 2, "x 1": 1}))  # with counts it can
    assert read_vocab_file(tmp_path / "w").itos[4:] == ["a", "x 1"]


@pytest.mark.parametrize("tokens,counts", [
    (["a\r", "b"], None),  # the reader drops a line's trailing carriage return
    (["\r", "b"], None),  # ... leaving an empty line
    (["\ufeffx", "b"], None),  # and a byte-order mark at the start of line 1
    (["\ufeff", "b"], {"\ufeff": 5, "b": 3}),  # with a count too: line 1 would read as the token "\t5"
])
def test_a_written_file_reads_back_as_the_vocabulary_or_is_refused(tmp_path, tokens, counts):
    """The writer's promise, checked by the reader itself: whatever it writes reads back to the same
    tokens (and counts); a vocabulary it cannot write so is a DataError naming the file and the
    token, never a file that reads as another vocabulary (or fails to read)."""
    vocab = Vocabulary(tokens, counts)
    try:
        write_vocab_file(tmp_path / "v", vocab)
    except DataError as exc:
        assert str(exc).startswith(f"{tmp_path / 'v'}: token {tokens[0]!r} cannot be written") and "\n" not in str(exc)
        assert not (tmp_path / "v").exists()
        return
    back = read_vocab_file(tmp_path / "v")
    assert back.itos == vocab.itos and back.counts == vocab.counts


def test_counts_follow_the_data(tmp_path):
    corpus = [["b", "a", "b"], ["c", "b"]]
    vocab = Vocabulary.build(corpus)
    assert vocab.counts == dict(Counter(t for line in corpus for t in line))
