"""Training with subword sampling end to end: each epoch its own segmentation (the same after a
kill and resume, on every rank of a data-parallel job, and via nmt-train), validation and the
vocabulary on the deterministic one, config errors naming the key."""
from __future__ import annotations

import os
import random
import re
import signal
from pathlib import Path

import pytest
import torch
import yaml

from nmt.config import ConfigError, resolve_config
from nmt.data.dataset import read_parallel
from nmt.train.data_setup import resampled_pairs
from nmt.data.subword_sampling import epoch_random
from nmt.train.checkpoint import load_checkpoint
from nmt.train.trainer import Trainer
from ddp_workers import gloo_config
from tiny_task import assert_same_run

SYLLABLES = ["ka", "ro", "mi", "sel", "tan", "bu", "ler", "st", "ei", "ung"]


def write_words_task(root: Path, n_train: int = 48, n_valid: int = 6, seed: int = 0) -> dict:
    """Word reversal: source 'karo misel', target 'orak lesim' (words of syllables)."""
    rng = random.Random(seed)
    vocab = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(40)]
    root.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, n in (("train", n_train), ("valid", n_valid)):
        lines = [[rng.choice(vocab) for _ in range(rng.randint(1, 3))] for _ in range(n)]
        (root / f"{split}.src").write_text("".join(" ".join(ws) + "\n" for ws in lines), encoding="utf-8")
        (root / f"{split}.tgt").write_text("".join(" ".join(w[::-1] for w in ws) + "\n" for ws in lines),
                                           encoding="utf-8")
        paths[split] = {"src": str(root / f"{split}.src"), "tgt": str(root / f"{split}.tgt")}
    return paths


SAMPLING = {"src": {"tokenizer": {"type": "bpe", "merges": 30}, "subword_sampling": {"dropout": 0.3},
                    "max_length": 12},
            "tgt": {"tokenizer": {"type": "sentencepiece", "vocab_size": 40},
                    "subword_sampling": {"alpha": 0.5, "nbest": -1}, "max_length": 12}}


def words_config(data: dict, save_dir: Path, sides: dict | None = None, **training) -> dict:
    return {
        "data": {**data, **(sides or SAMPLING)},
        "model": {"embeddings": {"src_size": 8, "tgt_size": 8, "dropout": 0.2},
                  "encoder": {"layers": 1, "hidden_size": 12, "dropout": 0.0},
                  "decoder": {"layers": 1, "hidden_size": 12, "dropout": 0.2},
                  "attention": {"mapping": "entmax15"}, "output": {"mapping": "sparsemax"}},
        "training": {"save_dir": str(save_dir), "batch_size": 8, "max_steps": 14, "valid_every": 5,
                     "log_every": 2, "keep_last": 2, "progress": False, "threads": 1, "tensorboard": False,
                     "device": "cpu", **training},
        "validation": {"metric": "loss", "batch_size": 4, "max_length": 12, "n_heatmaps": 0},
    }


@pytest.fixture
def task(tmp_path):
    return write_words_task(tmp_path / "data")


def trainer(task, save_dir, **training) -> Trainer:
    return Trainer(resolve_config(words_config(task, save_dir, **training), "w.yaml"), "w.yaml")


def test_each_epoch_has_its_own_segmentation_and_validation_the_deterministic_one(task, tmp_path):
    t = trainer(task, tmp_path / "run", max_steps=13)
    seen = []
    original = t._epoch_train_set
    t._epoch_train_set = lambda epoch: seen.append(original(epoch)) or seen[-1]
    t.train()
    assert len(seen) == 3  # 48 pairs in batches of 8 (or fewer, as lengths vary): epochs 0, 1, 2
    pairs = read_parallel(task["train"]["src"], task["train"]["tgt"])
    # the data's deterministic segmentation stays for validation and the vocabulary
    src, tgt = t.data.src_field, t.data.tgt_field
    assert t.data.valid.src == [src.encode(s) for s, _ in read_parallel(task["valid"]["src"], task["valid"]["tgt"])]
    assert t.data.train.src == [src.encode(s) for s, _ in pairs]
    for epoch, ds in enumerate(seen):
        assert ds.src != t.data.train.src and ds.tgt != t.data.train.tgt  # sampled, both sides
        # recomputed apart: fresh samplers over the run's fields, the epoch's generators
        again = resampled_pairs(pairs, src, tgt, t.config["data"]).for_epoch(t.config["training"]["seed"], epoch)
        assert (again.src, again.tgt, again.line_numbers) == (ds.src, ds.tgt, ds.line_numbers)
    assert seen[0].src != seen[1].src != seen[2].src
    for ds in seen:  # detokenized, every sampled pair is its line (where no piece fell outside the vocabulary)
        whole = [i for i in range(len(ds)) if src.vocab.unk_index not in ds.src[i] + ds.tgt[i]]
        assert len(whole) >= 5
        for i in whole:
            line = ds.line_numbers[i]
            assert src.decode(ds.src[i]) == " ".join(pairs[line - 1][0].split())
            assert tgt.decode(ds.tgt[i]) == pairs[line - 1][1]


def test_interrupted_and_resumed_equals_uninterrupted(task, tmp_path):
    straight = trainer(task, tmp_path / "straight")
    straight.train()

    def interrupt_at_9(step):  # mid-epoch 1 (about 6 batches an epoch), between validations
        if step == 9:
            os.kill(os.getpid(), signal.SIGINT)

    first = trainer(task, tmp_path / "resumed")
    assert first.train(step_hook=interrupt_at_9).stopped_by == "SIGINT"
    second = trainer(task, tmp_path / "resumed")
    assert second.resumed and second.progress.step == 9
    assert second.train().step == 14
    assert_same_run(straight, second, tmp_path / "straight", tmp_path / "resumed")


@pytest.mark.parametrize("corpora", [1, 2])
def test_id_cache_trains_on_the_segmentations_and_weights_of_the_list_dataset(tmp_path, monkeypatch, corpora):
    """With data.id_cache the cache holds the deterministic ids and each epoch's segmentation is made
    by streaming the files (ResampledFiles): the same epochs (pairs, ids, line numbers), batches and
    bit-equal weights as ResampledPairs over the text held in memory; with two weighted corpora too.
    A resumed run (fields from its checkpoint: the text never read as a list) continues alike."""
    import nmt.train.trainer as trainer_module
    from nmt.data.epoch_segmentation import ResampledFiles, ResampledPairs

    a = write_words_task(tmp_path / "a", n_train=40, seed=1)
    data = dict(a)
    if corpora == 2:
        b = write_words_task(tmp_path / "b", n_train=20, seed=2)
        data["train"] = [{**a["train"], "weight": 1.5}, {**b["train"], "weight": 0.5}]
    seen: list[list[tuple]] = []
    collate = trainer_module.collate

    def recording(dataset, indices, *args):
        seen[-1].append([(int(dataset.line_numbers[int(i)]), tuple(dataset.src[int(i)]), tuple(dataset.tgt[int(i)]))
                         for i in indices])
        return collate(dataset, indices, *args)
    monkeypatch.setattr(trainer_module, "collate", recording)
    runs = {}
    for cached in (False, True):
        seen.append([])
        cfg = words_config({**data, "id_cache": cached}, tmp_path / f"run_{cached}", max_steps=16)
        runs[cached] = Trainer(resolve_config(cfg, "w.yaml"), "w.yaml")
        assert isinstance(runs[cached].data.resampled, ResampledFiles if cached else ResampledPairs)
        runs[cached].train()
    assert seen[0] == seen[1] and len(seen[1]) == 16
    for epoch in range(3):
        listed, streamed = (runs[c].data.resampled.for_epoch(1234, epoch) for c in (False, True))
        assert [streamed.src[i] for i in range(len(streamed))] == listed.src
        assert [streamed.tgt[i] for i in range(len(streamed))] == listed.tgt
        assert list(streamed.line_numbers) == list(listed.line_numbers)
        assert streamed.summary() == listed.summary()
    for (name, x), (_, y) in zip(runs[False].model.state_dict().items(), runs[True].model.state_dict().items()):
        assert torch.equal(x, y), name
    cfg = words_config({**data, "id_cache": True}, tmp_path / "run_True", max_steps=20)
    resumed = Trainer(resolve_config(cfg, "w.yaml"), "w.yaml")
    assert resumed.resumed and resumed.train().step == 20


def test_the_log_counts_each_epochs_skips_and_unknown_pieces(task, tmp_path, caplog, monkeypatch):
    import logging
    monkeypatch.setattr(logging.getLogger("nmt"), "propagate", True)  # off after a CLI test's setup_logging
    monkeypatch.setattr(logging.getLogger("nmt"), "handlers", [])  # theirs may hold a closed stream
    caplog.set_level(logging.INFO, logger="nmt")
    sides = {"src": {**SAMPLING["src"], "max_length": 3, "max_size": 12}, "tgt": SAMPLING["tgt"]}
    config = words_config(task, tmp_path / "run", sides, max_steps=4)
    t = Trainer(resolve_config(config, "w.yaml"), "w.yaml")
    t.train()
    lines = [r.getMessage() for r in caplog.records if "segmentation (subword sampling" in r.getMessage()]
    assert lines and lines[0].startswith("epoch 0 segmentation (subword sampling, ")
    ds = t.train_set
    assert f"kept {len(ds)} of 48 pairs (skipped 0 empty, {ds.skipped['too_long']} too long)" in lines[-1]
    assert ds.skipped["too_long"] > 0 and "<unk>: source" in lines[-1]
    assert any("subword sampling: source: BPE-dropout 0.3; target: sentencepiece sampling (alpha 0.5, nbest -1)"
               in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("sides,key,match", [
    ({"src": {"tokenizer": {"type": "char"}, "subword_sampling": {"alpha": 0.1}}}, "data.src.subword_sampling.alpha",
     "needs a bpe or sentencepiece tokenizer, not 'char'"),
    ({"tgt": {"tokenizer": {"type": "space"}, "subword_sampling": {"dropout": 0.1}}},
     "data.tgt.subword_sampling.dropout", "not 'space'"),
    ({"src": {"tokenizer": {"type": "bpe"}, "subword_sampling": {"dropout": 1.0}}},
     "data.src.subword_sampling.dropout", r"must be in \[0, 1\), got 1.0"),
    ({"src": {"tokenizer": {"type": "sentencepiece"}, "subword_sampling": {"alpha": -0.1}}},
     "data.src.subword_sampling.alpha", ">= 0"),
    ({"src": {"tokenizer": {"type": "sentencepiece"}, "subword_sampling": {"alpha": 0.1, "nbest": 0}}},
     "data.src.subword_sampling.nbest", "-1 .* or >= 1"),
    ({"src": {"tokenizer": {"type": "bpe"}, "subword_sampling": {"alpha": 0.1}}},
     "data.src.subword_sampling.alpha", "bpe tokenizer samples with subword_sampling.dropout"),
    ({"src": {"tokenizer": {"type": "sentencepiece"}, "subword_sampling": {"dropout": 0.1}}},
     "data.src.subword_sampling.dropout", "sentencepiece tokenizer samples with subword_sampling.alpha"),
    ({"src": {"tokenizer": {"type": "sentencepiece", "model_type": "bpe"}, "subword_sampling": {"alpha": 0.1}}},
     "data.src.subword_sampling.alpha", "unigram"),
    # shared vocabulary: the target side uses the source's tokenizer
    ({"src": {"tokenizer": {"type": "char"}}, "tgt": {"tokenizer": {"type": "bpe"}, "subword_sampling":
                                                      {"dropout": 0.1}}, "shared_vocab": True},
     "data.tgt.subword_sampling.dropout", "not 'char'"),
])
def test_config_errors_name_the_key(task, tmp_path, sides, key, match):
    config = words_config(task, tmp_path / "run", {})
    config["data"].update(sides)
    with pytest.raises(ConfigError, match=match) as err:
        resolve_config(config, "w.yaml")
    assert str(err.value).startswith(f"w.yaml: {key}") and "\n" not in str(err.value)


def test_nmt_train_cli_trains_and_resumes_with_sampling(task, tmp_path, monkeypatch):
    """nmt-train's main() (in this process: the entry point as a user's process runs it is
    tests/cli/test_train_cli.py's smoke test) trains with sampling, then resumes into epoch 1."""
    from nmt.cli.train import main

    config = words_config(task, tmp_path / "run", max_steps=4, valid_every=4)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    run = lambda *extra: main(["-config", str(tmp_path / "c.yaml"), *extra])
    assert run() == 0
    log = (tmp_path / "run" / "train.log").read_text()
    assert "epoch 0 segmentation (subword sampling" in log
    assert run("-set", "training.max_steps=8") == 0
    log = (tmp_path / "run" / "train.log").read_text()
    assert "resumed from" in log and "epoch 1 segmentation (subword sampling" in log
    assert load_checkpoint(tmp_path / "run" / "last.pt")["step"] == 8


def test_a_checkpoint_of_an_nmt_without_subword_sampling_resumes(task, tmp_path):
    """A run written before data.<side>.subword_sampling existed resumes (off is what it did); one
    whose config now turns sampling on is refused (another data order)."""
    from nmt.train.checkpoint import save_checkpoint

    plain = {"src": {"tokenizer": {"type": "bpe", "merges": 30}}, "tgt": {"tokenizer": {"type": "char"}}}
    Trainer(resolve_config(words_config(task, tmp_path / "run", plain, max_steps=2), "w.yaml"), "w.yaml").train()
    last = tmp_path / "run" / "last.pt"
    checkpoint = load_checkpoint(last)
    for side in ("src", "tgt"):
        del checkpoint["config"]["data"][side]["subword_sampling"]
    save_checkpoint(last, checkpoint)
    on = {**plain, "src": {**plain["src"], "subword_sampling": {"dropout": 0.1}}}
    with pytest.raises(ConfigError, match=r"data.src.subword_sampling: differs from the run"):
        Trainer(resolve_config(words_config(task, tmp_path / "run", on, max_steps=3), "w.yaml"), "w.yaml")
    resumed = Trainer(resolve_config(words_config(task, tmp_path / "run", plain, max_steps=3), "w.yaml"), "w.yaml")
    assert resumed.resumed and resumed.train().step == 3


@pytest.mark.slow
@pytest.mark.parametrize("cached", [False, True])
def test_two_processes_see_the_segmentation_of_one_process(tmp_path, ranks, cached):
    """Two ranks of batch 4 equal one process of batch 8 only if both ranks cut the global
    batches from the same segmentation of every epoch (with data.id_cache: each rank streams the
    files; the one process holds the text)."""
    data = write_words_task(tmp_path / "data", n_train=40)

    def config(save_dir, batch_size, id_cache=False):
        c = gloo_config({**data, "id_cache": id_cache}, save_dir, batch_size, max_steps=8, valid_every=4)
        c["data"].update(SAMPLING)
        return c
    Trainer(resolve_config(config(tmp_path / "one", 8), "t"), "t").train()
    results = ranks.run(config(tmp_path / "two", 4, cached))
    assert (tmp_path / "data" / ".nmt_id_cache").is_dir() == cached
    assert [r[2:4] for r in results] == [("max_steps", 8)] * 2
    a, b = load_checkpoint(tmp_path / "one" / "last.pt")["model"], load_checkpoint(tmp_path / "two" / "last.pt")["model"]
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=2e-6, msg=name)


def test_tokens_per_second_leaves_out_the_epochs_segmentation_time(task, tmp_path, caplog, monkeypatch):
    """The logged tokens/s is the window's tokens over its training time: an epoch's segmentation
    (made slow here: 2 s an epoch) between two steps of a window is not counted, as validation is
    not. Truth: the window's tokens (summed from train_step's own counts) over the logged speed is
    the time the log divided by; it must stay within 1.5 s of the steps' own measured time (the
    window holds at least two slowed segmentations, 4 s)."""
    import logging
    import time as time_module
    from nmt.data.epoch_segmentation import ResampledPairs
    monkeypatch.setattr(logging.getLogger("nmt"), "propagate", True)
    monkeypatch.setattr(logging.getLogger("nmt"), "handlers", [])
    caplog.set_level(logging.INFO, logger="nmt")
    for_epoch = ResampledPairs.for_epoch

    def slow(self, seed, epoch):
        if epoch > 0:
            time_module.sleep(2.0)
        return for_epoch(self, seed, epoch)
    monkeypatch.setattr(ResampledPairs, "for_epoch", slow)
    t = trainer(task, tmp_path / "run", max_steps=7, log_every=7, valid_every=100, batch_size=16)
    tokens, seconds = [], []
    step = t.train_step

    def timed(groups):
        start = time_module.perf_counter()
        result = step(groups)
        seconds.append(time_module.perf_counter() - start)
        tokens.append(result[1])
        return result
    monkeypatch.setattr(t, "train_step", timed)
    t.train()
    assert t.progress.epoch >= 2  # the window of 7 steps (3 an epoch) spans two slowed segmentations
    speeds = [float(m.group(1)) for r in caplog.records
              if (m := re.search(r"step 7 \(epoch \d+\): .*, ([0-9.]+) tokens/s", r.getMessage()))]
    assert len(speeds) == 1 and len(tokens) == 7
    assert sum(tokens) / speeds[0] < sum(seconds) + 1.5, (sum(tokens), speeds, sum(seconds))


def test_the_previous_epochs_segmentation_is_freed_before_the_next_is_made(task, tmp_path, monkeypatch):
    """At most one sampled copy of the training set besides the deterministic one: when an epoch's
    segmentation is made, no earlier epoch's dataset is still referenced (checked by weak
    references after a full garbage collection)."""
    import gc
    import weakref
    from nmt.data.epoch_segmentation import ResampledPairs
    for_epoch = ResampledPairs.for_epoch
    made: list[weakref.ref] = []
    alive_at_each_call: list[int] = []

    def tracked(self, seed, epoch):
        gc.collect()
        alive_at_each_call.append(sum(ref() is not None for ref in made))
        dataset = for_epoch(self, seed, epoch)
        made.append(weakref.ref(dataset))
        return dataset
    monkeypatch.setattr(ResampledPairs, "for_epoch", tracked)
    t = trainer(task, tmp_path / "run", max_steps=12, batch_size=16)
    t.train()
    assert t.progress.epoch >= 2 and len(alive_at_each_call) >= 3
    assert alive_at_each_call == [0] * len(alive_at_each_call)
