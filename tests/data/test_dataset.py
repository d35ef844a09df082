"""Reading files (one-line errors naming file and line) and building parallel datasets."""
from __future__ import annotations

import pytest

from nmt.data import DataError, Field, ParallelDataset, build_tokenizer, read_lines, read_parallel


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_read_lines_terminators_bom_and_unicode_separators(tmp_path) -> None:
    p = _write(tmp_path / "a.txt", "\ufeffone\r\ntwo\u2028still two\n\nlast".encode())
    assert read_lines(p) == ["one", "two\u2028still two", "", "last"]
    assert read_lines(_write(tmp_path / "e.txt", b"")) == []
    assert read_lines(_write(tmp_path / "n.txt", b"x\n")) == ["x"]


def test_bad_utf8_names_file_and_line(tmp_path) -> None:
    p = _write(tmp_path / "train.de", b"ok\nfine\n" * 8 + b"ok\nbad \xff byte\n")
    with pytest.raises(DataError) as e:
        read_lines(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}:18: not valid UTF-8") and "\n" not in msg


def test_missing_file_and_directory(tmp_path) -> None:
    with pytest.raises(DataError, match=r"nope\.en: no such file"):
        read_parallel(_write(tmp_path / "x.de", b"a\n"), tmp_path / "nope.en")
    with pytest.raises(DataError, match="is a directory"):
        read_lines(tmp_path)


def test_line_count_mismatch(tmp_path) -> None:
    de = _write(tmp_path / "train.de", b"a\n" * 120)
    en = _write(tmp_path / "train.en", b"b\n" * 119)
    with pytest.raises(DataError) as e:
        read_parallel(de, en)
    assert str(e.value) == f"{de} has 120 lines but {en} has 119"


def test_parallel_dataset_skips_and_counts(tmp_path) -> None:
    src = ["a b c", "", "a b", "a " * 10, "c", "   "]
    tgt = ["xyz", "x", "", "xy", "y" * 9, "y"]
    de = _write(tmp_path / "s.txt", "\n".join(src).encode() + b"\n")
    en = _write(tmp_path / "t.txt", "\n".join(tgt).encode() + b"\n")
    sf = Field.build(build_tokenizer({"type": "space"}), src)
    tf = Field.build(build_tokenizer({"type": "char"}), tgt)
    ds = ParallelDataset.from_files(de, en, sf, tf, max_src_length=5, max_tgt_length=8)
    # kept: line 1 only; line 2, 3, 6 empty; line 4 (10 src tokens) and 5 (9 tgt chars) too long
    assert ds.line_numbers == [1]
    assert ds.skipped == {"empty": 3, "too_long": 2}
    assert ds.n_input == 6 and len(ds) == 1
    assert ds[0] == (sf.encode("a b c"), tf.encode("xyz"))
    assert ds.src_lengths == [3] and ds.tgt_lengths == [3]
    assert ds.summary() == "kept 1 of 6 pairs (skipped 3 empty, 2 too long)"
    unlimited = ParallelDataset(list(zip(src, tgt)), sf, tf)
    assert unlimited.line_numbers == [1, 4, 5]
    with pytest.raises(DataError, match="data.src.max_length: expected a positive integer or null, got 0"):
        ParallelDataset([], sf, tf, max_src_length=0)
