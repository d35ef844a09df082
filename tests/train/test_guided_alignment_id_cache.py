"""Guided alignment with data.id_cache: the references streamed into cached token-pair arrays
(nmt/data/alignment_arrays.py) against the text path's (independently tested in
tests/data/test_word_alignments.py): the same reference grid for every kept pair (two corpora, one
with a source tag, length rules skipping pairs), the same trained weights bit for bit, the cache
reused and rebuilt when the alignment file changes, one-line errors naming file and line, and the
refusal of subword sampling."""
from __future__ import annotations

import logging
import random
import sys
from pathlib import Path

import pytest
import torch

from nmt.config import ConfigError, resolve_config
from nmt.data.errors import DataError
from nmt.train.data_setup import load_training_data

sys.path.insert(0, str(Path(__file__).parent))
from tiny_task import joined_source, tiny_config, write_task  # noqa: E402


def aligned_task(root: Path, empty_every: int = 7) -> dict:
    """The tiny task in two corpora: the first with an alignment file (random source words with the
    target's one word, every ``empty_every``-th line empty: no reference) and a source tag, the second
    without; max_length 4 on the source skips some pairs of each."""
    first = write_task(root / "a", n_train=40, seed=1)
    second = write_task(root / "b", n_train=30, seed=2)
    rng = random.Random(3)
    lines = Path(first["train"]["src"]).read_text(encoding="utf-8").splitlines()
    align = root / "a" / "train.align"
    align.write_text("".join(("" if n % empty_every == 0 else
                              " ".join(f"{i}-0" for i in sorted(rng.sample(range(len(s.split())),
                                                                           rng.randint(1, len(s.split())))))) + "\n"
                             for n, s in enumerate(lines, 1)), encoding="utf-8")
    return {"train": [{**first["train"], "align": str(align), "src_tag": "<A>"}, {**second["train"], "weight": 0.5}],
            "valid": first["valid"]}


def config(data: dict, save_dir: Path, id_cache: bool, **training) -> dict:
    cfg = tiny_config(data, save_dir, device="cpu", guided_alignment={"weight": 0.4}, **training)
    cfg["data"]["id_cache"] = id_cache
    cfg["data"]["src"]["max_length"] = 4
    return cfg


def test_the_cached_references_are_the_text_paths_and_so_are_the_trained_weights(tmp_path):
    data = aligned_task(tmp_path / "data")
    loaded = {}
    for cached in (False, True):
        cfg = resolve_config(config(data, tmp_path / f"run{cached}", cached), "g.yaml")
        loaded[cached] = load_training_data(cfg["data"], tmp_path / f"work{cached}", alignments=True)
    text, cache = loaded[False], loaded[True]
    assert type(cache.alignments).__name__ == "ArrayAlignments"
    lines = [int(n) for n in cache.train.line_numbers]
    assert lines == [int(n) for n in text.train.line_numbers] and cache.train.n_input > len(lines)  # some skipped
    assert len(cache.alignments) == len(text.alignments) > 0
    assert cache.alignments.describe(len(cache.train)).split(" (")[0] == text.alignments.describe(len(text.train)).split(" (")[0]
    grid_text = text.alignments.reference(lines, 7, 6)
    grid_cache = cache.alignments.reference(lines, 7, 6)
    assert torch.equal(grid_cache, grid_text) and float(grid_text.sum()) > 0
    # the aligned corpus is tagged: its sources' words start at position 1, the tag's position 0 has none
    assert not bool(grid_text[:, :, 0].any()) and bool(grid_text[:, :, 1].any())
    # the same batches and references: the same weights after 12 guided updates
    from nmt.train.trainer import Trainer

    trained = {}
    for cached in (False, True):
        trainer = Trainer(resolve_config(config(data, tmp_path / f"train{cached}", cached), "g.yaml"), "g.yaml")
        trainer.train()
        assert trainer.guide is not None and len(trainer.data.alignments) == len(text.alignments)
        trained[cached] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    for name, value in trained[False].items():
        assert torch.equal(trained[True][name], value), name


def test_the_cache_is_reused_and_rebuilt_when_the_alignment_file_changes(tmp_path, caplog, monkeypatch):
    data = aligned_task(tmp_path / "data")
    cfg = resolve_config(config(data, tmp_path / "run", True), "g.yaml")
    monkeypatch.setattr(logging.getLogger("nmt"), "propagate", True)
    with caplog.at_level(logging.INFO, logger="nmt"):
        first = load_training_data(cfg["data"], tmp_path / "work", alignments=True)
        assert "alignment cache written: " in caplog.text
        caplog.clear()
        again = load_training_data(cfg["data"], tmp_path / "work", alignments=True)
        assert "alignment cache: " in caplog.text and "alignment cache written" not in caplog.text
    lines = [int(n) for n in first.train.line_numbers]
    assert torch.equal(again.alignments.reference(lines, 7, 6), first.alignments.reference(lines, 7, 6))
    align = Path(data["train"][0]["align"])
    rows = align.read_text(encoding="utf-8").splitlines()
    rows[0] = "0-0"  # line 1 now aligns its first word only
    align.write_text("".join(r + "\n" for r in rows), encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="nmt"):
        caplog.clear()
        changed = load_training_data(cfg["data"], tmp_path / "work", alignments=True)
        assert "alignment cache written: " in caplog.text
    one = changed.alignments.pairs_of(1)
    target = Path(data["train"][0]["tgt"]).read_text(encoding="utf-8").splitlines()[0]
    assert 1 in lines and one is not None
    assert one.tolist() == [[1, j] for j in range(len(target))]  # word 0 after the tag, with every character


def test_bad_alignment_files_are_one_line_errors_naming_file_and_line(tmp_path):
    data = aligned_task(tmp_path / "data")
    align = Path(data["train"][0]["align"])
    rows = align.read_text(encoding="utf-8").splitlines()
    cfg = resolve_config(config(data, tmp_path / "run", True), "g.yaml")
    kept = [int(n) for n in load_training_data(cfg["data"], tmp_path / "work").train.line_numbers if n <= 40]
    skipped = min(set(range(1, 41)) - set(kept))  # a pair the length rule skips: parsed, not mapped
    n = kept[2]
    for bad, message in (("0-0 x-1", "'x-1' is not an alignment pair"), ("0-0 9-0", "source word 9 does not exist")):
        align.write_text("".join(r + "\n" for r in rows[:n - 1] + [bad] + rows[n:]), encoding="utf-8")
        with pytest.raises(DataError, match=rf"^{align}:{n}: {message}"):
            load_training_data(cfg["data"], tmp_path / "work", alignments=True)
    align.write_text("".join(r + "\n" for r in rows[:skipped - 1] + ["0-0 x-1"] + rows[skipped:]), encoding="utf-8")
    with pytest.raises(DataError, match=rf"^{align}:{skipped}: 'x-1' is not an alignment pair"):
        load_training_data(cfg["data"], tmp_path / "work", alignments=True)
    align.write_text("".join(r + "\n" for r in rows[:-1]), encoding="utf-8")
    with pytest.raises(DataError, match=rf"{align.name} has 39 lines but .*train.src has 40 "
                                        r"\(data.train\[0\].align: one alignment line per training pair\)"):
        load_training_data(cfg["data"], tmp_path / "work", alignments=True)
    align.write_text("".join(r + "\n" for r in rows + ["0-0"]), encoding="utf-8")
    with pytest.raises(DataError, match=r"has 41 lines but .*train.src has 40"):
        load_training_data(cfg["data"], tmp_path / "work", alignments=True)
    assert not list((tmp_path / "data" / "a" / ".nmt_id_cache").glob("align-*"))  # nothing half-written


def test_each_sampled_epoch_gets_the_text_paths_references_and_the_same_weights(tmp_path):
    """BPE-dropout on the source with a source tag and data.id_cache: each epoch's references (the
    files streamed again, the epoch's pieces read back from its ids) equal the text path's for the
    same segmentation, and so do the trained weights, bit for bit."""
    from nmt.train.trainer import Trainer

    data = write_task(tmp_path / "data", n_train=40)
    lines = Path(data["train"]["src"]).read_text(encoding="utf-8").splitlines()
    joined = joined_source(data, tmp_path / "data")
    align = tmp_path / "data" / "train.align"
    align.write_text("".join(("0-0" if n % 3 else "1-0 0-0") + "\n" for n in range(len(lines))), encoding="utf-8")
    train = {"src": str(joined), "tgt": data["train"]["tgt"], "align": str(align), "src_tag": "<T>"}

    def trainer(cached: bool) -> Trainer:
        cfg = tiny_config({**data, "train": [train], "valid": {**data["valid"], "src_tag": "<T>"}},
                          tmp_path / f"run{cached}", device="cpu", guided_alignment={"weight": 0.2})
        cfg["data"]["src"] = {"tokenizer": {"type": "bpe", "merges": 30}, "subword_sampling": {"dropout": 0.5}}
        cfg["data"]["id_cache"] = cached
        return Trainer(resolve_config(cfg, "tiny.yaml"), "tiny.yaml")

    text, cache = trainer(False), trainer(True)
    assert type(cache.data.alignments).__name__ == "ArrayAlignments"
    seen = []
    for epoch in (1, 2):
        grids = []
        for t in (text, cache):
            t.train_set = t._epoch_train_set(epoch)
            rows = [int(n) for n in t.train_set.line_numbers]
            grids.append((rows, t.alignments.reference(rows, 8, 12)))
        assert grids[0][0] == grids[1][0] and torch.equal(grids[0][1], grids[1][1])
        assert len(cache.alignments) == len(text.alignments) > 30 and cache.alignments.n_mismatched == 0
        seen.append(grids[1][1])
    assert not torch.equal(seen[0], seen[1])  # another segmentation, other token pairs
    for t in (text, cache):
        t.train_set = t.data.train
        t.lock.release()
    text = trainer(False)  # each built and trained in turn (the run's random stream is the process's)
    text.train()
    cache = trainer(True)
    cache.train()
    for (name, a), (_, b) in zip(text.model.state_dict().items(), cache.model.state_dict().items()):
        assert torch.equal(a, b), name
