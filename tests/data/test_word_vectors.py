"""Reading pretrained word vectors (nmt.data.word_vectors): GloVe and word2vec-text files written
here from known values; the rows kept equal those values rounded to float32 (numpy's rounding of
the same doubles), only the asked-for tokens are kept, and bad files are one-line errors naming
the file and line."""
from __future__ import annotations

import gzip
import random

import numpy as np
import pytest
import torch

from nmt.data.errors import DataError
from nmt.data.word_vectors import VectorDimensionError, read_word_vectors, vectors_dimension

TOKENS = ["the", "Straße", "日本", "New York", "a", "<unk>", "x"]


def known_vectors(dim: int = 5, seed: int = 0) -> dict[str, list[float]]:
    rng = random.Random(seed)
    return {t: [rng.uniform(-3, 3) * 10 ** rng.randint(-5, 2) for _ in range(dim)] for t in TOKENS}


def glove_lines(vectors: dict[str, list[float]]) -> list[str]:
    return [token + " " + " ".join(repr(v) for v in values) for token, values in vectors.items()]


def expected(vectors: dict[str, list[float]], tokens: list[str]) -> torch.Tensor:
    return torch.from_numpy(np.array([vectors[t] for t in tokens], dtype=np.float64).astype(np.float32))


@pytest.mark.parametrize("form", ["glove", "word2vec", "fasttext_gz"])
def test_kept_rows_are_the_files_values_in_float32(tmp_path, form):
    vectors = known_vectors()
    lines = glove_lines(vectors)
    path = tmp_path / "v.txt"
    if form == "glove":
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    elif form == "word2vec":
        path.write_text(f"{len(lines)} 5\n" + "\n".join(lines) + "\n", encoding="utf-8")
    else:  # fastText .vec.gz: a header, a trailing space on every line
        path = tmp_path / "v.vec.gz"
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(f"{len(lines)} 5\n" + "".join(line + " \n" for line in lines))
    wanted = ["日本", "New York", "Straße", "absent", "x"]
    got = read_word_vectors(path, wanted, dim=5)
    assert got.tokens == ["Straße", "日本", "New York", "x"]  # file order; "absent" is not in the file
    assert got.dim == 5 and got.lines == len(TOKENS) and got.header == (form != "glove")
    assert got.vectors.dtype == torch.float32
    assert torch.equal(got.vectors, expected(vectors, got.tokens))
    assert got.duplicates == []


def test_crlf_bom_tabs_and_blank_lines(tmp_path):
    vectors = known_vectors(dim=3)
    text = "\ufeff" + "\r\n".join(t + "\t" + " ".join(repr(v) for v in vs) for t, vs in vectors.items()) + "\r\n\r\n"
    (tmp_path / "v.txt").write_text(text, encoding="utf-8")
    got = read_word_vectors(tmp_path / "v.txt", ["the", "x"])
    assert got.tokens == ["the", "x"] and got.dim == 3
    assert torch.equal(got.vectors, expected(vectors, ["the", "x"]))


def test_a_token_listed_twice_keeps_its_first_vector(tmp_path):
    (tmp_path / "v.txt").write_text("a 1 2\nb 3 4\na 5 6\nc 7 8\nb 9 10\na 11 12\n", encoding="utf-8")
    got = read_word_vectors(tmp_path / "v.txt", ["a", "c"])
    assert got.tokens == ["a", "c"] and got.vectors.tolist() == [[1, 2], [7, 8]]
    assert got.duplicates == [("a", 3), ("a", 6)]  # only the asked-for tokens are tracked
    assert got.lines == 6


def test_rows_of_other_tokens_are_counted_but_not_parsed(tmp_path):
    """Streaming a multi-gigabyte file: the values of rows nobody asked for are never converted
    (their field count is still checked)."""
    (tmp_path / "v.txt").write_text("a 1 2\nskip x y\nb 3 4\n", encoding="utf-8")
    got = read_word_vectors(tmp_path / "v.txt", ["b"])
    assert got.tokens == ["b"] and got.vectors.tolist() == [[3, 4]] and got.lines == 3


def test_no_token_found_is_an_empty_table_of_the_files_dimension(tmp_path):
    (tmp_path / "v.txt").write_text("a 1 2 3\n", encoding="utf-8")
    got = read_word_vectors(tmp_path / "v.txt", ["zz"])
    assert got.tokens == [] and got.vectors.shape == (0, 3)


@pytest.mark.parametrize("text, wanted, message", [
    ("a 1 2 3\nb 1 2\n", ["a"], "v.txt:2: 3 values expected after the token, found 2"),
    ("a 1 2 3\nb\n", ["a"], "v.txt:2: 3 values expected after the token, found 0"),
    ("a 1 2 3\nb 1 2 3 4\n", ["a"], "v.txt:2: 3 values expected after the token, found more"),
    ("2 3\na 1 2 3\nb 1 2 x\n", ["b"], "v.txt:3: 'x' is not a number"),
    ("a 1 2 3\nb 1 nan 3\n", ["b"], "v.txt:2: 'nan' is not a finite number"),
    ("a 1 2 3\nb 1 inf 3\n", ["b"], "v.txt:2: 'inf' is not a finite number"),
    ("3 3\na 1 2 3\nb 1 2 3\n", ["b"], "v.txt: the word2vec header announces 3 vectors, the file holds 2"),
    ("2 0\n", ["b"], "v.txt:1: the word2vec header 'N D' gives dimension 0; at least 1"),
    ("onlytoken\n", ["b"], "v.txt:1: a token followed by its values expected, found one field"),
    ("\n\n", ["b"], "v.txt: no vectors in the file"),
])
def test_malformed_files_are_one_line_errors_naming_file_and_line(tmp_path, text, wanted, message):
    (tmp_path / "v.txt").write_text(text, encoding="utf-8")
    with pytest.raises(DataError) as info:
        read_word_vectors(tmp_path / "v.txt", wanted)
    assert str(info.value) == f"{tmp_path}/{message}"
    assert "\n" not in str(info.value)


def test_a_binary_word2vec_file_gets_a_hint(tmp_path):
    body = b"2 3\nab " + np.array([1.5, -2.0, 0.25], dtype=np.float32).tobytes() + b"\n"
    (tmp_path / "v.bin").write_bytes(body)
    with pytest.raises(DataError, match=r"v\.bin:2: 3 values expected .*a binary word2vec file\?"):
        read_word_vectors(tmp_path / "v.bin", ["ab"])


def test_another_dimension_is_raised_before_the_rest_is_read(tmp_path):
    # line 3 is malformed: the dimension error of line 1 comes first (a huge file is not read through)
    for text in ("a 1 2 3\nb 1 2 3\nc 1\n", "2 3\na 1 2 3\nc 1\n"):
        (tmp_path / "v.txt").write_text(text, encoding="utf-8")
        with pytest.raises(VectorDimensionError) as info:
            read_word_vectors(tmp_path / "v.txt", ["a"], dim=4)
        assert (info.value.dim, info.value.expected) == (3, 4)
        assert str(info.value) == f"{tmp_path}/v.txt holds 3-dimensional vectors, 4 expected"


def test_a_missing_file_names_the_path(tmp_path):
    with pytest.raises(DataError, match=f"^{tmp_path}/nope.txt: no such file$"):
        read_word_vectors(tmp_path / "nope.txt", ["a"])


@pytest.mark.parametrize("text, dim", [("a 1 2 3\nthen anything\n", 3), ("\ufeff\n\nword 1 2 3 4\n7 4\n", 4),
                                       ("\ufeff12 300\n", 300), ("a\t1 2\r\n", 2)])
def test_the_dimension_is_read_from_the_header_or_first_vector_line_alone(tmp_path, text, dim):
    (tmp_path / "v.txt").write_text(text, encoding="utf-8")
    assert vectors_dimension(tmp_path / "v.txt") == dim


@pytest.mark.parametrize("text, message", [("", "v.txt: no vectors in the file"),
                                           ("5 0\n", "v.txt:1: the word2vec header 'N D' gives dimension 0; at least 1"),
                                           ("\nword\n", "v.txt:2: a token followed by its values expected, found one "
                                                        "field")])
def test_the_dimension_errors_name_file_and_line(tmp_path, text, message):
    (tmp_path / "v.txt").write_text(text, encoding="utf-8")
    with pytest.raises(DataError) as info:
        vectors_dimension(tmp_path / "v.txt")
    assert str(info.value) == f"{tmp_path}/{message}"
    with pytest.raises(DataError, match="no such file"):
        vectors_dimension(tmp_path / "missing.txt")
