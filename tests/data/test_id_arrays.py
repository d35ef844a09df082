"""The array-backed (memory-mapped) dataset against the list dataset it replaces."""
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from nmt.data.batching import collate, make_batch_order, make_batches
from nmt.data.dataset import ParallelDataset, read_parallel
from nmt.data.errors import DataError
from nmt.data.field import Field
from nmt.data.id_arrays import CACHE_DIRNAME, load_id_dataset
from nmt.data.tokenizers import build_tokenizer


def _corpus(tmp_path, n=300, seed=0):
    rng = np.random.default_rng(seed)
    words = ["a", "b", "c", "dd", "ee", "f"]
    src, tgt = [], []
    for i in range(n):
        if i % 37 == 0:
            src.append("")  # empty pair: skipped
        else:
            src.append(" ".join(rng.choice(words, rng.integers(1, 14))))
        tgt.append(" ".join(rng.choice(words, rng.integers(1, 12))))
    (tmp_path / "c.src").write_text("\ufeff" + "\n".join(src) + "\n", encoding="utf-8")
    (tmp_path / "c.tgt").write_text("\r\n".join(tgt), encoding="utf-8")  # CRLF, no final newline
    return tmp_path / "c.src", tmp_path / "c.tgt"


def _fields(src, tgt):
    pairs = read_parallel(src, tgt)
    tok = build_tokenizer({"type": "space"})
    return (Field.build(tok, [s for s, _ in pairs]), Field.build(build_tokenizer({"type": "char"}),
                                                                 [t for _, t in pairs]))


@pytest.mark.parametrize("batch_type,batch_size", [("sentences", 7), ("tokens", 60)])
def test_same_batches_and_tensors_as_list_dataset(tmp_path, batch_type, batch_size):
    src, tgt = _corpus(tmp_path)
    sf, tf = _fields(src, tgt)
    lists = ParallelDataset(read_parallel(src, tgt), sf, tf, 10, 20)
    arrays = load_id_dataset(src, tgt, sf, tf, 10, 20)
    assert len(arrays) == len(lists) and arrays.skipped == lists.skipped and arrays.n_input == lists.n_input
    assert arrays.skipped["empty"] > 0 and arrays.skipped["too_long"] > 0
    assert arrays.line_numbers.tolist() == lists.line_numbers
    assert arrays.summary() == lists.summary()
    for epoch in (0, 1):
        expected = make_batches(lists, batch_size, batch_type, seed=5, epoch=epoch)
        order = make_batch_order(arrays, batch_size, batch_type, seed=5, epoch=epoch)
        assert order.lists() == expected
        for k in (0, len(order) - 1):
            a, b = collate(arrays, order[k], 0, 2, 3), collate(lists, expected[k], 0, 2, 3)
            for name in ("src", "src_lengths", "tgt_in", "tgt_out", "tgt_lengths"):
                assert torch.equal(getattr(a, name), getattr(b, name))
            assert a.n_tokens == b.n_tokens and a.indices == b.indices


def test_cache_is_reused_memory_mapped_and_keyed_by_file_state(tmp_path):
    src, tgt = _corpus(tmp_path)
    sf, tf = _fields(src, tgt)
    first = load_id_dataset(src, tgt, sf, tf, 10, 20)
    cache_dirs = list((tmp_path / CACHE_DIRNAME).iterdir())
    assert len(cache_dirs) == 1
    assert isinstance(first.src.ids, np.memmap)
    assert load_id_dataset(src, tgt, sf, tf, 10, 20, build=False) is not None  # cache hit
    assert load_id_dataset(src, tgt, sf, tf, 10, 19, build=False) is None  # other limits: other key
    stat = os.stat(src)
    os.utime(src, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched file: other key
    assert load_id_dataset(src, tgt, sf, tf, 10, 20, build=False) is None
    load_id_dataset(src, tgt, sf, tf, 10, 20)
    assert len(list((tmp_path / CACHE_DIRNAME).iterdir())) == 2
    assert not [p for p in (tmp_path / CACHE_DIRNAME).iterdir() if p.name.endswith(".tmp")]


def test_a_cache_build_killed_by_sigkill_leaves_nothing_the_next_build_keeps(tmp_path):
    """A builder killed mid-write leaves its temporary directory (named for its pid); the next
    build (another process) removes it and writes the cache, whose files were flushed first."""
    import subprocess
    import sys
    import textwrap

    src, tgt = _corpus(tmp_path)
    script = textwrap.dedent(f"""
        import os, signal, numpy as np
        import nmt.data.id_arrays as ia
        from nmt.data.dataset import read_parallel
        from nmt.data.field import Field
        from nmt.data.tokenizers import build_tokenizer
        pairs = read_parallel({str(src)!r}, {str(tgt)!r})
        sf = Field.build(build_tokenizer({{"type": "space"}}), [s for s, _ in pairs])
        tf = Field.build(build_tokenizer({{"type": "char"}}), [t for _, t in pairs])
        real_save = np.save
        def save(path, array):
            real_save(path, array)
            os.kill(os.getpid(), signal.SIGKILL)  # killed after the first file
        ia.np.save = save
        ia.load_id_dataset({str(src)!r}, {str(tgt)!r}, sf, tf, 10, 20)
    """)
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == -9
    (left,) = [p for p in (tmp_path / CACHE_DIRNAME).iterdir()]
    assert left.name.endswith(".tmp") and [p.name for p in left.iterdir()] == ["src_ids.npy"]
    sf, tf = _fields(src, tgt)
    built = load_id_dataset(src, tgt, sf, tf, 10, 20)
    assert built is not None
    names = [p.name for p in (tmp_path / CACHE_DIRNAME).iterdir()]
    assert len(names) == 1 and not names[0].endswith(".tmp")


def test_bad_input_is_one_line_error(tmp_path):
    src, tgt = _corpus(tmp_path, n=20)
    sf, tf = _fields(src, tgt)
    (tmp_path / "short.tgt").write_text("a\nb\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"c.src has 20 lines but .*short.tgt has 2$"):
        load_id_dataset(src, tmp_path / "short.tgt", sf, tf)
    (tmp_path / "bad.src").write_bytes(b"a\n" * 19 + b"b \xff\n")
    with pytest.raises(DataError, match=r"bad.src:20: not valid UTF-8"):
        load_id_dataset(tmp_path / "bad.src", tgt, sf, tf)


def test_file_replaced_with_same_size_and_mtime_rebuilds(tmp_path):
    """Content rewritten to the same size with the old mtime put back (``cp -p``, ``rsync -a``,
    ``touch -r``, an archive's stored times) must not reuse the old ids: the key has the ctime."""
    src, tgt = tmp_path / "s.txt", tmp_path / "t.txt"
    src.write_text("a b\nb a\n", encoding="utf-8")
    tgt.write_text("x\ny\n", encoding="utf-8")
    tok = build_tokenizer({"type": "space"})
    sf = tf = Field.build(tok, ["a b", "x y"])
    before = load_id_dataset(src, tgt, sf, tf)
    assert before.src[0] == sf.encode("a b")
    stat = os.stat(src)
    src.write_text("b b\na a\n", encoding="utf-8")  # same size
    os.utime(src, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert os.stat(src).st_size == stat.st_size and os.stat(src).st_mtime_ns == stat.st_mtime_ns
    after = load_id_dataset(src, tgt, sf, tf)
    assert after.src[0] == sf.encode("b b") and after.src[1] == sf.encode("a a")


def test_unk_counts_are_the_tokens_outside_the_vocabulary_recounted_from_the_text(tmp_path):
    """Both datasets count, over the kept pairs only, the tokens the vocabularies lack (the truth
    here: the text split by the tokenizers' own rules, space and character, each token looked up
    in the vocabulary's token list), and name the sides that have any in the data line; the cache records its counts when built and gives them back when reused."""
    src, tgt = _corpus(tmp_path)
    pairs = read_parallel(src, tgt)
    sf = Field.build(build_tokenizer({"type": "space"}), [s for s, _ in pairs], max_size=3)  # 3 of 6 words
    tf = Field.build(build_tokenizer({"type": "char"}), ["a b c"])  # no d, e, f
    lists = ParallelDataset(pairs, sf, tf, 10, 20)
    known_src, known_tgt = set(sf.vocab.itos[4:]), set(tf.vocab.itos[4:])
    kept = [pairs[line - 1] for line in lists.line_numbers]
    src_tokens = [token for s, _ in kept for token in s.split()]
    tgt_tokens = [("▁" if ch == " " else ch) for _, t in kept for ch in t]
    truth = {"src": (sum(token not in known_src for token in src_tokens), len(src_tokens)),
             "tgt": (sum(token not in known_tgt for token in tgt_tokens), len(tgt_tokens))}
    assert 0 < truth["src"][0] < truth["src"][1] and 0 < truth["tgt"][0] < truth["tgt"][1]
    assert lists.unk_tokens == truth
    (s_unk, s_all), (t_unk, t_all) = truth["src"], truth["tgt"]
    assert lists.summary().endswith(f"too long); <unk>: source {s_unk} of {s_all} tokens "
                                    f"({100 * s_unk / s_all:.1f}%), target {t_unk} of {t_all} tokens "
                                    f"({100 * t_unk / t_all:.1f}%)")
    built = load_id_dataset(src, tgt, sf, tf, 10, 20)
    reused = load_id_dataset(src, tgt, sf, tf, 10, 20)
    assert built.unk_tokens == reused.unk_tokens == truth
    assert built.summary() == reused.summary() == lists.summary()
    full = Field.build(build_tokenizer({"type": "char"}), [t for _, t in pairs])
    assert ParallelDataset(pairs, sf, full, 10, 20).summary().endswith(
        f"too long); <unk>: source {s_unk} of {s_all} tokens ({100 * s_unk / s_all:.1f}%)")
    everything = ParallelDataset(pairs, Field.build(build_tokenizer({"type": "space"}), [s for s, _ in pairs]), full)
    assert everything.unk_tokens["src"][0] == everything.unk_tokens["tgt"][0] == 0
    assert "<unk>" not in everything.summary()
