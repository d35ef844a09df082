"""Training on several weighted corpora (data.train as a list): the batches a run trains on hold
each corpus weight x kept pairs per epoch (counted from the files), one mapping batches exactly as
a plain dataset, kill and resume equals an uninterrupted run, two ranks equal one process, subword
sampling re-weights each epoch's segmentation, a changed corpus file is named on resume, and
nmt-train / nmt-translate run end to end."""
from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml

import nmt.train.trainer as trainer_module
from nmt.config import ConfigError, resolve_config
from nmt.data.batching import make_batch_order
from nmt.data.dataset import ParallelDataset, read_parallel
from nmt.train.trainer import Trainer
from ddp_workers import gloo_config
from tiny_task import assert_same_run, interrupt_at, tiny_config, write_task


@pytest.fixture
def corpora(tmp_path):
    """Two corpora of the reversal task: 'real' (24 pairs, weight 2) and 'bt' (30 pairs, weight 0.5);
    every pair is kept (at most 5 tokens a side)."""
    real = write_task(tmp_path / "real", n_train=24, seed=1)
    bt = write_task(tmp_path / "bt", n_train=30, seed=2)
    return {"train": [{**real["train"], "weight": 2, "name": "real"}, {**bt["train"], "weight": 0.5}],
            "valid": real["valid"]}


def config(data, save_dir, **training):
    return tiny_config(data, save_dir, device="cpu", **training)


def make(data, save_dir, **training) -> Trainer:
    return Trainer(resolve_config(config(data, save_dir, **training), "c.yaml"), "c.yaml")


def record_batches(monkeypatch) -> list[list[int]]:
    """The input line (1-based, over the corpora one after the other) of every example collated for training."""
    seen: list[list[int]] = []
    collate = trainer_module.collate

    def recording(dataset, indices, *args):
        seen.append([int(dataset.line_numbers[int(i)]) for i in indices])
        return collate(dataset, indices, *args)
    monkeypatch.setattr(trainer_module, "collate", recording)
    return seen


def test_each_epoch_trains_on_every_corpus_weight_times(corpora, monkeypatch):
    seen = record_batches(monkeypatch)
    run = make(corpora, Path(corpora["valid"]["src"]).parent.parent / "run", max_steps=None, max_epochs=2)
    assert run.train().epoch == 2
    sizes = [len(Path(c["src"]).read_text().splitlines()) for c in corpora["train"]]
    assert sizes == [24, 30]
    lines = Counter(line for batch in seen for line in batch)
    # two epochs: real 2 x 24 (every line 4 times), bt round(0.5 x 30) = 15 of 30 per epoch
    assert all(lines[line] == 4 for line in range(1, 25))
    bt = [lines.get(line, 0) for line in range(25, 55)]
    assert sum(bt) == 2 * 15 and set(bt) <= {0, 1, 2}
    assert sum(lines.values()) == 2 * (2 * 24 + 15)


@pytest.mark.parametrize("cached", [False, True])
def test_a_sampling_temperature_trains_each_corpus_its_tempered_share(corpora, tmp_path, monkeypatch, cached):
    """data.sampling_temperature 4 (with and without data.id_cache): an epoch holds each corpus's
    examples_per_epoch of its tempered weight (real 2 x 24 = 48 and bt 0.5 x 30 = 15 weighted pairs
    move toward (48^(1/4), 15^(1/4)) shares of the same 63), counted from the collated batches."""
    from nmt.data.corpora import examples_per_epoch, tempered_weights

    seen = record_batches(monkeypatch)
    run = make({**corpora, "sampling_temperature": 4.0, "id_cache": cached}, tmp_path / "run", max_steps=None,
               max_epochs=1)
    run.train()
    lines = Counter(line for batch in seen for line in batch)
    tempered = tempered_weights([2.0, 0.5], [24, 30], 4.0)
    real = sum(n for line, n in lines.items() if line <= 24)
    bt = sum(n for line, n in lines.items() if line > 24)
    assert (real, bt) == (examples_per_epoch(24, tempered[0]), examples_per_epoch(30, tempered[1]))
    assert bt > 15 and real < 48  # the small corpus up, the large one down


def test_a_single_mapping_batches_as_a_plain_dataset(corpora, tmp_path, monkeypatch):
    """One {src, tgt} trains on exactly the batches of ParallelDataset(read_parallel(files)) (as
    before data.train lists existed), and a list of that one corpus of weight 1 trains the same weights."""
    seen = record_batches(monkeypatch)
    files = {k: corpora["train"][0][k] for k in ("src", "tgt")}
    plain = make({**corpora, "train": files}, tmp_path / "plain", max_steps=8)
    assert plain._epoch_train_set(0) is plain.data.train
    plain.train()
    data = ParallelDataset(read_parallel(files["src"], files["tgt"]), plain.data.src_field, plain.data.tgt_field, 50, 50)
    expected = [batch for epoch in range(3) for batch in make_batch_order(data, 8, seed=1234, epoch=epoch).lists()]
    assert seen == [[data.line_numbers[i] for i in batch] for batch in expected][:8]
    listed = make({**corpora, "train": [{**files, "weight": 1}]}, tmp_path / "listed", max_steps=8)
    listed.train()
    for (name, a), (_, b) in zip(plain.model.state_dict().items(), listed.model.state_dict().items()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("cached", [False, True])
def test_interrupted_and_resumed_equals_uninterrupted(corpora, tmp_path, cached):
    """Also with data.id_cache (one cache per corpus; the resumed run reads the caches only)."""
    corpora = {**corpora, "id_cache": cached}
    straight = make(corpora, tmp_path / "straight", max_steps=14)  # 8 batches an epoch (63 examples)
    straight.train()
    first = make(corpora, tmp_path / "resumed", max_steps=14)
    assert first.train(step_hook=interrupt_at(12)).stopped_by == "SIGINT"
    second = make(corpora, tmp_path / "resumed", max_steps=14)
    assert second.resumed and second.progress.step == 12 and second.progress.epoch == 1
    assert second.train().step == 14
    assert_same_run(straight, second, tmp_path / "straight", tmp_path / "resumed")


@pytest.mark.parametrize("tokenizer", ["space", "bpe"])
def test_id_cache_trains_on_the_batches_and_weights_of_the_list_dataset(corpora, tmp_path, monkeypatch, tokenizer):
    """data.id_cache with two weighted corpora: one cache per corpus, the same examples in the same
    batches and bit-equal weights as without the cache (space: the fields streamed from the files;
    bpe: the text read once to learn the codes)."""
    from nmt.data.corpus_arrays import ConcatenatedArrays

    seen = record_batches(monkeypatch)
    runs = {}
    for cached in (False, True):
        cfg = config({**corpora, "id_cache": cached}, tmp_path / f"run_{cached}", max_steps=12)
        if tokenizer == "bpe":
            cfg["data"]["tgt"]["tokenizer"] = {"type": "bpe", "merges": 12}
        runs[cached] = Trainer(resolve_config(cfg, "c.yaml"), "c.yaml")
        assert isinstance(runs[cached].data.train, ConcatenatedArrays) == cached
        start = len(seen)
        runs[cached].train()
        runs[cached].batches = seen[start:]
    assert runs[True].batches == runs[False].batches and len(runs[True].batches) == 12
    for (name, a), (_, b) in zip(runs[False].model.state_dict().items(), runs[True].model.state_dict().items()):
        assert torch.equal(a, b), name
    for c in corpora["train"]:
        assert len(list((Path(c["src"]).parent / ".nmt_id_cache").iterdir())) == 1


@pytest.mark.parametrize("cached", [False, True])
def test_one_corpus_with_a_weight_is_weighted_with_the_cache_too(corpora, tmp_path, monkeypatch, cached):
    """data.train one mapping of weight 0.5: half the pairs an epoch, with or without data.id_cache
    (the cache once ignored the weight when the fields were streamed, and on ranks > 0)."""
    seen = record_batches(monkeypatch)
    one = {**corpora, "train": {**corpora["train"][1], "weight": 0.5}, "id_cache": cached}
    run = make(one, tmp_path / "run", max_steps=None, max_epochs=2)
    assert run.data.weights is not None
    run.train()
    assert sum(len(batch) for batch in seen) == 2 * 15  # round(0.5 x 30) a epoch


def test_with_id_cache_a_missing_or_bad_corpus_file_is_named_by_its_key(corpora, tmp_path):
    from nmt.data.errors import DataError

    missing = {**corpora, "id_cache": True,
               "train": [corpora["train"][0], {**corpora["train"][1], "src": str(tmp_path / "nope.src")}]}
    with pytest.raises(DataError, match=r"^data.train\[1\].src: .*nope.src: file not found$"):
        make(missing, tmp_path / "run")
    short = tmp_path / "short.tgt"
    short.write_text("a\n", encoding="utf-8")
    uneven = {**corpora, "id_cache": True, "train": [corpora["train"][0], {**corpora["train"][1], "tgt": str(short)}]}
    with pytest.raises(DataError, match=r"^data.train\[1\]: .*has 30 lines but .*short.tgt has 1$"):
        make(uneven, tmp_path / "run2")


def test_a_changed_corpus_file_is_named_on_resume(corpora, tmp_path):
    make(corpora, tmp_path / "run", max_steps=2).train()
    bt = Path(corpora["train"][1]["tgt"])
    bt.write_text(bt.read_text().replace("a", "b"))
    with pytest.raises(ConfigError, match=r"data.train\[1\].tgt: .*bt/train.tgt changed since"):
        make(corpora, tmp_path / "run", max_steps=4)


def test_subword_sampling_weights_each_epochs_segmentation(tmp_path, monkeypatch):
    from test_subword_sampling_training import SAMPLING, words_config, write_words_task

    a, b = write_words_task(tmp_path / "a", n_train=30, seed=1), write_words_task(tmp_path / "b", n_train=20, seed=2)
    data = {"train": [{**a["train"], "weight": 1.5}, {**b["train"], "weight": 1}], "valid": a["valid"]}
    run = Trainer(resolve_config(words_config(data, tmp_path / "run", SAMPLING, max_steps=None, max_epochs=2),
                                 "w.yaml"), "w.yaml")
    seen = record_batches(monkeypatch)
    run.train()
    start = 0
    for epoch in range(2):
        segmentation = run.data.resampled.for_epoch(1234, epoch)  # kept pairs differ by epoch (length limits)
        kept = [sum(1 for n in segmentation.line_numbers if n <= 30), sum(1 for n in segmentation.line_numbers if n > 30)]
        extra = math.floor(0.5 * kept[0] + 0.5)  # round half up of frac(1.5) x kept
        size = kept[0] + extra + kept[1]
        n_batches = math.ceil(size / 8)
        lines = Counter(line for batch in seen[start:start + n_batches] for line in batch)
        start += n_batches
        assert sum(lines.values()) == size
        assert all(lines[n] == 1 for n in segmentation.line_numbers if n > 30)
        assert sorted(Counter(lines[n] for n in segmentation.line_numbers if n <= 30).items()) == \
               [(1, kept[0] - extra), (2, extra)]
    assert start == len(seen)


def test_nmt_train_and_translate_with_two_corpora(corpora, tmp_path, capsys, monkeypatch):
    """nmt-train's and nmt-translate's main() (in this process: tests/cli's smoke tests run the
    entry points as a user's processes do) with two weighted corpora; a missing second corpus is
    one line naming data.train[1].src."""
    from nmt.cli import train as train_cli
    from nmt.cli import translate as translate_cli

    cfg = config(corpora, tmp_path / "run", max_steps=None, max_epochs=2)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert train_cli.main(["-config", str(tmp_path / "c.yaml")]) == 0, capsys.readouterr().err[-2000:]
    log = (tmp_path / "run" / "train.log").read_text()
    bt = corpora["train"][1]
    assert "train corpus real: kept 24 of 24 pairs (skipped 0 empty, 0 too long), weight 2, 48 examples per epoch" in log
    assert f"train corpus {bt['src']}, {bt['tgt']}: kept 30 of 30 pairs (skipped 0 empty, 0 too long), weight 0.5, 15 examples per epoch" in log
    assert "training finished (max_epochs) at step 16 (epoch 2)" in log  # 63 examples: 8 batches of 8
    capsys.readouterr()
    code = translate_cli.main(["-model", str(tmp_path / "run" / "best.pt"), "-src", corpora["valid"]["src"]])
    translated = capsys.readouterr()
    assert code == 0, translated.err[-2000:]
    assert len(translated.out.splitlines()) == len(Path(corpora["valid"]["src"]).read_text().splitlines())
    cfg["data"]["train"][1]["src"] = str(tmp_path / "missing.src")
    cfg["training"]["save_dir"] = str(tmp_path / "other")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    assert train_cli.main(["-config", str(tmp_path / "c.yaml")]) != 0
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "data.train[1].src: " in error[0] and "missing.src: file not found" in error[0]


@pytest.mark.slow
@pytest.mark.parametrize("cached", [False, True])
def test_two_processes_train_on_the_epoch_list_of_one_process(tmp_path, ranks, cached):
    """Two ranks of batch 4 equal one process of batch 8 only if both ranks cut the global
    batches from the same weighted list of every epoch (with data.id_cache: rank 1 reads the
    caches rank 0 wrote; the one process reads the text)."""
    real = write_task(tmp_path / "real", n_train=24, seed=1)
    bt = write_task(tmp_path / "bt", n_train=30, seed=2)
    data = {"train": [{**real["train"], "weight": 1.5}, {**bt["train"], "weight": 0.7}], "valid": real["valid"]}
    Trainer(resolve_config(gloo_config(data, tmp_path / "one", 8, max_steps=10, valid_every=5), "t"), "t").train()
    results = ranks.run(gloo_config({**data, "id_cache": cached}, tmp_path / "two", 4, max_steps=10, valid_every=5))
    assert [r[2:4] for r in results] == [("max_steps", 10)] * 2
    from nmt.train.checkpoint import load_checkpoint
    a, b = load_checkpoint(tmp_path / "one" / "last.pt")["model"], load_checkpoint(tmp_path / "two" / "last.pt")["model"]
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=2e-6, msg=name)


def test_a_checkpoint_of_an_nmt_without_corpus_weights_resumes(corpora, tmp_path):
    """A run whose checkpoint's config has no data.train.weight / name (an older nmt) resumes: the
    defaults are what it did; one whose config now sets a weight is refused (another data order)."""
    from nmt.train.checkpoint import load_checkpoint, save_checkpoint

    files = {k: corpora["train"][0][k] for k in ("src", "tgt")}
    data = {**corpora, "train": files}
    make(data, tmp_path / "run", max_steps=2).train()
    last = tmp_path / "run" / "last.pt"
    checkpoint = load_checkpoint(last)
    assert checkpoint["config"]["data"]["train"] == {**files, "weight": 1.0, "name": None, "src_tag": None, "align": None,
                                                    "noise": {"delete": 0.0, "blank": 0.0, "shuffle": 0}}
    del checkpoint["config"]["data"]["train"]["weight"], checkpoint["config"]["data"]["train"]["name"]
    save_checkpoint(last, checkpoint)
    with pytest.raises(ConfigError, match=r"data.train.weight: differs from the run"):
        make({**corpora, "train": {**files, "weight": 2}}, tmp_path / "run", max_steps=4)
    resumed = make(data, tmp_path / "run", max_steps=4)
    assert resumed.resumed and resumed.train().step == 4
