"""Tokenizers: round trips, training + state_dict restore, config errors."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nmt.data import DataError, build_tokenizer, tokenizer_from_state_dict
from nmt.data.tokenizers import BPETokenizer, CharTokenizer

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a lazy dog sleeps while the quick fox jumps",
    "foxes and dogs are quick and lazy animals",
    "der schnelle braune fuchs springt über den faulen hund",
    "ein hund schläft während der fuchs springt",
] * 20 + [f"token{i} extra{i % 7} thing{i % 3}" for i in range(100)]


@given(st.text())
@settings(max_examples=100, deadline=None)
def test_char_round_trip_any_text(text: str) -> None:
    tok = CharTokenizer()
    tokens = tok.tokenize(text)
    assert tok.detokenize(tokens) == text
    assert len(tokens) == len(text) and " " not in tokens


def test_char_tokens_are_characters_and_spaces_visible() -> None:
    tok = build_tokenizer({"type": "char"})
    assert tok.tokenize("ab c") == ["a", "b", "\u2581", "c"]
    assert tok.tokenize("a\u2581") == ["a", "\u2581\u2581"]  # literal marker escaped
    assert not tok.needs_training
    restored = tokenizer_from_state_dict(tok.state_dict())
    assert restored.tokenize("x y") == tok.tokenize("x y")


def test_char_custom_space_symbol_and_bad_one() -> None:
    tok = build_tokenizer({"type": "char", "space_symbol": "_"})
    assert tok.tokenize("a b") == ["a", "_", "b"] and tok.detokenize(["a", "_", "b"]) == "a b"
    with pytest.raises(DataError, match="space_symbol"):
        build_tokenizer({"type": "char", "space_symbol": "ab"})


@given(st.lists(st.text(alphabet="abc xyzé\t", min_size=0, max_size=12), max_size=5))
@settings(max_examples=100, deadline=None)
def test_space_round_trip_normalises_whitespace(words: list[str]) -> None:
    tok = build_tokenizer({"type": "space"})
    text = "  ".join(words)
    assert tok.tokenize(text) == text.split()
    assert tok.detokenize(tok.tokenize(text)) == " ".join(text.split())


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    tok = build_tokenizer({"type": "bpe", "merges": 60, "min_frequency": 2})
    assert tok.needs_training
    tok.train(CORPUS)
    assert not tok.needs_training
    return tok


def test_bpe_segments_rejoin_to_words(bpe: BPETokenizer) -> None:
    for line in CORPUS[:5] + ["unseen wordsxyz quickest  foxes", "über schläft"]:
        pieces = bpe.tokenize(line)
        assert bpe.detokenize(pieces) == " ".join(line.split())
        # independent reconstruction: drop the continuation markers by hand
        assert "".join(p[:-2] if p.endswith("@@") else p + " " for p in pieces).strip() == " ".join(line.split())


def test_bpe_learns_frequent_words_and_splits_rare(bpe: BPETokenizer) -> None:
    assert bpe.tokenize("the quick fox") == ["the", "quick", "fox"]
    assert len(bpe.tokenize("zqxjv")) > 1  # characters never merged stay separate


def test_bpe_matches_subword_nmt_cli_semantics(bpe: BPETokenizer, tmp_path) -> None:
    # reference: subword-nmt's own BPE class applied to the same codes, line by line
    import io

    from subword_nmt.apply_bpe import BPE

    ref = BPE(io.StringIO(bpe.codes))
    for line in CORPUS[::7]:
        assert bpe.tokenize(line) == ref.process_line(line).split()


def test_bpe_state_dict_restores_identical_tokenizer(bpe: BPETokenizer, tmp_path) -> None:
    state = bpe.state_dict()
    assert isinstance(state["codes"], str) and state["codes"].startswith("#version")
    restored = tokenizer_from_state_dict(state)
    for line in CORPUS[::5] + ["completely novel words here"]:
        assert restored.tokenize(line) == bpe.tokenize(line)
    assert restored.state_dict() == state


def test_bpe_train_writes_codes_and_codes_file_loads(tmp_path) -> None:
    tok = build_tokenizer({"type": "bpe", "merges": 30})
    tok.train(CORPUS, tmp_path)
    codes = tmp_path / "bpe.codes"
    assert codes.read_text(encoding="utf-8") == tok.codes
    again = build_tokenizer({"type": "bpe", "codes_file": str(codes)})
    assert not again.needs_training
    assert again.tokenize(CORPUS[0]) == tok.tokenize(CORPUS[0])


def test_bpe_bad_codes_and_errors(tmp_path) -> None:
    bad = tmp_path / "bad.codes"
    bad.write_text("#version: 0.2\na b\nc d e\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"bad\.codes:3: BPE codes line"):
        build_tokenizer({"type": "bpe", "codes_file": str(bad)})
    with pytest.raises(DataError, match=r"missing\.codes: no such file"):
        build_tokenizer({"type": "bpe", "codes_file": str(tmp_path / "missing.codes")})
    with pytest.raises(RuntimeError, match="train"):
        build_tokenizer({"type": "bpe"}).tokenize("x")
    with pytest.raises(DataError, match="no pair"):
        build_tokenizer({"type": "bpe"}).train(["a b", "c"])


def test_sentencepiece_train_apply_restore(tmp_path) -> None:
    cfg = {"type": "sentencepiece", "vocab_size": 80, "model_type": "unigram"}
    tok = build_tokenizer(cfg)
    assert tok.needs_training
    tok.train(CORPUS, tmp_path)
    line = "the quick brown fox sleeps"
    pieces = tok.tokenize(line)
    assert pieces and pieces[0].startswith("\u2581")
    assert tok.detokenize(pieces) == line
    restored = tokenizer_from_state_dict(tok.state_dict())
    for text in CORPUS[::9] + ["unseen stuff qqq"]:
        assert restored.tokenize(text) == tok.tokenize(text)
    from_file = build_tokenizer({"type": "sentencepiece", "model_file": str(tmp_path / "sentencepiece.model")})
    assert from_file.tokenize(line) == pieces
    # seeded, single-threaded training is deterministic
    twin = build_tokenizer(cfg)
    twin.train(CORPUS)
    assert twin.state_dict()["model_proto"] == tok.state_dict()["model_proto"]


def test_sentencepiece_errors(tmp_path) -> None:
    with pytest.raises(DataError, match="model_type"):
        build_tokenizer({"type": "sentencepiece", "model_type": "bigram"})
    with pytest.raises(DataError, match="empty"):
        build_tokenizer({"type": "sentencepiece"}).train(["", "  "])
    junk = tmp_path / "junk.model"
    junk.write_bytes(b"not a model")
    with pytest.raises(DataError, match="junk.model"):
        build_tokenizer({"type": "sentencepiece", "model_file": str(junk)})


def test_build_tokenizer_config_errors_name_key_and_suggest() -> None:
    with pytest.raises(DataError, match=r"tokenizer\.type: unknown tokenizer 'bpee' \(did you mean 'bpe'\?\)"):
        build_tokenizer({"type": "bpee"})
    with pytest.raises(DataError, match=r"tokenizer\.merge: .*did you mean 'merges'"):
        build_tokenizer({"type": "bpe", "merge": 10})
    with pytest.raises(DataError, match=r"tokenizer\.codes: unknown key"):
        build_tokenizer({"type": "bpe", "codes": "x"})  # state-only key
    with pytest.raises(DataError, match=r"tokenizer\.type"):
        build_tokenizer({})


def test_tokenizer_without_options_lists_none() -> None:
    # SpaceTokenizer has no __init__ of its own: object's (*args, **kwargs) are not its options
    with pytest.raises(DataError, match=r"tokenizer\.foo: unknown key for tokenizer 'space'; valid: \(none\)$"):
        build_tokenizer({"type": "space", "foo": 1})
    with pytest.raises(DataError, match=r"tokenizer\.args: unknown key"):
        build_tokenizer({"type": "space", "args": 1})


def test_difference_names_what_segments_otherwise(bpe: BPETokenizer, tmp_path) -> None:
    """``Tokenizer.difference``: the content that decides segmentation, never paths or training-only
    settings; a short phrase naming what differs."""
    from nmt.data.tokenizers import SpaceTokenizer

    # BPE: the same codes from a file (other path, CRLF line ends) and with another ``merges`` agree
    (tmp_path / "copy.codes").write_bytes(bpe.codes.replace("\n", "\r\n").encode("utf-8"))
    same = BPETokenizer(merges=5, codes_file=tmp_path / "copy.codes")
    assert bpe.difference(same) is None and same.difference(bpe) is None
    fewer = BPETokenizer(codes="\n".join(bpe.codes.splitlines()[:-3]) + "\n")
    assert bpe.difference(fewer) == f"bpe codes: {bpe_merges(bpe)} vs {bpe_merges(bpe) - 3} merges"
    lines = bpe.codes.splitlines()
    lines[2] = "q u"
    swapped = BPETokenizer(codes="\n".join(lines) + "\n")
    assert bpe.difference(swapped).startswith("bpe codes line 3: ")
    assert bpe.difference(BPETokenizer(separator="##", codes=bpe.codes)) == "bpe separator: '@@' vs '##'"
    assert bpe.difference(SpaceTokenizer()) == "tokenizer type: bpe vs space"
    assert CharTokenizer().difference(CharTokenizer("_")) == "char space_symbol: '\u2581' vs '_'"
    assert SpaceTokenizer().difference(SpaceTokenizer()) is None


def bpe_merges(tok: BPETokenizer) -> int:
    return sum(1 for line in tok.codes.splitlines() if line and not line.startswith("#version:"))


def test_sentencepiece_difference_is_by_content_not_path(tmp_path) -> None:
    """The same sentencepiece model at two paths agrees, also when it records other training
    paths and threads (spm_train run on a copy of the data); another model is named by what differs."""
    from sentencepiece import sentencepiece_model_pb2

    from nmt.data.tokenizers import SentencePieceTokenizer

    tok = SentencePieceTokenizer(vocab_size=60)
    tok.train(CORPUS)
    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(tok.model_proto)
    model.trainer_spec.input.append("/elsewhere/copy_of_train.txt")
    model.trainer_spec.model_prefix = "/elsewhere/spm"
    model.trainer_spec.num_threads = 16
    (tmp_path / "a.model").write_bytes(tok.model_proto)
    (tmp_path / "b.model").write_bytes(model.SerializeToString())
    a = SentencePieceTokenizer(vocab_size=8000, model_file=tmp_path / "a.model")
    b = SentencePieceTokenizer(model_file=tmp_path / "b.model")
    assert a.model_proto != b.model_proto and a.difference(b) is None and a.difference(tok) is None
    smaller = SentencePieceTokenizer(vocab_size=50)
    smaller.train(CORPUS)
    assert a.difference(smaller) == "sentencepiece pieces: 60 vs 50"
    surface = model.trainer_spec.unk_surface
    model.trainer_spec.unk_surface = "<?>"  # what decoding writes for <unk>: a real difference
    other = SentencePieceTokenizer(model_proto=model.SerializeToString())
    assert a.difference(other) == f"sentencepiece trainer_spec.unk_surface: {surface!r} vs '<?>'"
    other_type = SentencePieceTokenizer(vocab_size=60, model_type="bpe")
    other_type.train(CORPUS)
    assert a.difference(other_type) == "sentencepiece model_type: unigram vs bpe"
