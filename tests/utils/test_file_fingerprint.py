"""The cheap fingerprint of a data file: what it reads and which changes it sees."""
import os

from nmt.utils.file_fingerprint import BLOCK, EDGE, SAMPLES, describe_change, fingerprint


def _rewrite(path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)


def test_changes_anywhere_hashed_are_seen_and_named(tmp_path):
    path = tmp_path / "corpus.txt"
    size = 2 * EDGE + 64 * BLOCK  # the middle is sampled, not read whole
    path.write_bytes(bytes(i % 251 for i in range(size)))
    base = fingerprint(path)
    assert base["size"] == size and describe_change(base, fingerprint(path)) is None
    os.utime(path, ns=(5, 5))  # mtime alone: no change
    assert describe_change(base, fingerprint(path)) is None
    cases = {0: "first MiB", size - 1: "last MiB", EDGE: "middle (sampled blocks)",
             size - EDGE - 1: "middle (sampled blocks)"}
    for offset, where in cases.items():
        original = path.read_bytes()[offset:offset + 1]
        _rewrite(path, offset, b"\xff" if original != b"\xff" else b"\x00")
        assert describe_change(base, fingerprint(path)) == f"same size ({size} bytes), other content in its {where}"
        _rewrite(path, offset, original)
    with open(path, "ab") as handle:
        handle.write(b"one more line\n")
    assert describe_change(base, fingerprint(path)) == f"size {size} -> {size + 14} bytes"


def test_a_small_file_is_hashed_whole(tmp_path):
    path = tmp_path / "small.txt"
    size = 2 * EDGE + SAMPLES * BLOCK  # every byte in the two ends or the middle read whole
    path.write_bytes(b"a" * size)
    base = fingerprint(path)
    for offset in range(0, size, size // 50):
        _rewrite(path, offset, b"b")
        assert describe_change(base, fingerprint(path)) is not None, offset
        _rewrite(path, offset, b"a")
