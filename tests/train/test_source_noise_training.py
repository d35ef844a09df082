"""Training with noise on a corpus's sources (data.train[i].noise): the batches the update sees
carry the noised sources of that corpus (the others' and every target untouched), drawn anew each
epoch; kill and resume equals an uninterrupted run, two ranks equal one process, with
data.id_cache the run equals the text path's; a noised corpus with align is a one-line config
error; an older run's checkpoint (no noise key) resumes; nmt-train logs the noise."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import nmt.train.trainer as trainer_module
from nmt.config import ConfigError, resolve_config
from nmt.data.batching import collate
from nmt.train.trainer import Trainer
from ddp_workers import gloo_config
from tiny_task import assert_same_run, interrupt_at, tiny_config, write_task

NOISE = {"delete": 0.2, "blank": 0.2, "shuffle": 2}


@pytest.fixture
def corpora(tmp_path):
    """'real' (24 pairs, no noise) and 'bt' (30 pairs, tagged <BT>, noised): space-token sources."""
    real = write_task(tmp_path / "real", n_train=24, seed=1)
    bt = write_task(tmp_path / "bt", n_train=30, seed=2)
    return {"train": [{**real["train"], "name": "real"}, {**bt["train"], "src_tag": "<BT>", "noise": NOISE}],
            "valid": real["valid"]}


def make(data, save_dir, **training) -> Trainer:
    return Trainer(resolve_config(tiny_config(data, save_dir, device="cpu", **training), "n.yaml"), "n.yaml")


def record_updates(monkeypatch) -> list:
    """The batches every update of the trainer takes, appended to the returned list as they come."""
    seen: list = []
    update = trainer_module.update

    def recording(model, loss_fn, optimizer, batches, *args, **kwargs):
        seen.extend(batches)
        return update(model, loss_fn, optimizer, batches, *args, **kwargs)
    monkeypatch.setattr(trainer_module, "update", recording)
    return seen


def test_the_update_sees_the_noised_sources_of_the_noised_corpus_only(corpora, tmp_path, monkeypatch):
    seen = record_updates(monkeypatch)
    run = make(corpora, tmp_path / "run", max_steps=16)  # 7 batches an epoch: epochs 0, 1 and 2
    run.train()
    data = run.data.train
    bt_tag = run.data.src_field.vocab.stoi["<BT>"]
    noised = changed = 0
    epochs: dict[int, list[list[int]]] = {}
    for step, batch in enumerate(seen):
        plain = collate(data, batch.indices, run.pad, run.bos, run.eos)
        assert torch.equal(batch.tgt_in, plain.tgt_in) and torch.equal(batch.tgt_out, plain.tgt_out)
        for k, i in enumerate(batch.indices):
            got = batch.src[k, :int(batch.src_lengths[k])].tolist()
            original = data.src[i]
            if original[0] != bt_tag:  # the real corpus: as collate made it
                assert got == original
                continue
            noised += 1
            changed += got != original
            assert got[0] == bt_tag and 2 <= len(got) <= len(original)
            assert set(got[1:]) <= set(original[1:]) | {run.data.src_field.vocab.unk_index}
            epochs.setdefault(i, []).append(got)
    assert noised > 40 and changed > noised // 3
    # an example seen in several epochs is noised anew (most differ between epochs)
    repeated = [rows for rows in epochs.values() if len(rows) > 1]
    assert repeated and sum(rows[0] != rows[1] for rows in repeated) > len(repeated) // 3


@pytest.mark.parametrize("cached", [False, True])
def test_interrupted_and_resumed_equals_uninterrupted(corpora, tmp_path, cached):
    corpora = {**corpora, "id_cache": cached}
    straight = make(corpora, tmp_path / "straight", max_steps=14)
    straight.train()
    first = make(corpora, tmp_path / "resumed", max_steps=14)
    assert first.train(step_hook=interrupt_at(10)).stopped_by == "SIGINT"
    second = make(corpora, tmp_path / "resumed", max_steps=14)
    assert second.resumed and second.progress.step == 10 and second.progress.epoch == 1
    assert second.train().step == 14
    assert_same_run(straight, second, tmp_path / "straight", tmp_path / "resumed")
    if cached:  # the cached corpora train the weights the text does
        text = make({**corpora, "id_cache": False}, tmp_path / "text", max_steps=14)
        text.train()
        for (name, a), (_, b) in zip(text.model.state_dict().items(), second.model.state_dict().items()):
            assert torch.equal(a, b), name


@pytest.mark.slow
def test_two_processes_train_as_one_process(corpora, tmp_path, ranks):
    """Two ranks of batch 4 equal one process of batch 8: each rank noises its part of the global
    batch as the one process noises it (the draws are keyed by the example's place in the epoch)."""
    Trainer(resolve_config(gloo_config(corpora, tmp_path / "one", 8, max_steps=10, valid_every=5), "t"), "t").train()
    results = ranks.run(gloo_config(corpora, tmp_path / "two", 4, max_steps=10, valid_every=5))
    assert [r[2:4] for r in results] == [("max_steps", 10)] * 2
    from nmt.train.checkpoint import load_checkpoint
    a, b = load_checkpoint(tmp_path / "one" / "last.pt")["model"], load_checkpoint(tmp_path / "two" / "last.pt")["model"]
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=2e-6, msg=name)


def test_noise_with_align_and_bad_values_are_one_line_config_errors(corpora, tmp_path):
    aligned = tmp_path / "bt.align"
    aligned.write_text("0-0\n" * 30, encoding="utf-8")
    bad = {**corpora, "train": [corpora["train"][0], {**corpora["train"][1], "align": str(aligned)}]}
    with pytest.raises(ConfigError, match=r"n\.yaml: data\.train\[1\]\.noise: noise moves and removes the source words"):
        resolve_config(tiny_config(bad, tmp_path / "a"), "n.yaml")
    for key, value in (("delete", 1.0), ("blank", -0.1), ("shuffle", -1)):
        wrong = {**corpora, "train": [corpora["train"][0], {**corpora["train"][1], "noise": {key: value}}]}
        with pytest.raises(ConfigError, match=rf"data\.train\[1\]\.noise\.{key}"):
            resolve_config(tiny_config(wrong, tmp_path / "b"), "n.yaml")


def test_a_checkpoint_of_an_nmt_without_source_noise_resumes(corpora, tmp_path):
    """A run whose checkpoint's corpora have no noise key (an older nmt) resumes; one whose config
    now noises a corpus is refused (other training data)."""
    from nmt.train.checkpoint import load_checkpoint, save_checkpoint

    plain = {**corpora, "train": [corpora["train"][0], {k: v for k, v in corpora["train"][1].items() if k != "noise"}]}
    make(plain, tmp_path / "run", max_steps=2).train()
    last = tmp_path / "run" / "last.pt"
    checkpoint = load_checkpoint(last)
    for corpus in checkpoint["config"]["data"]["train"]:
        assert corpus.pop("noise") == {"delete": 0.0, "blank": 0.0, "shuffle": 0}
    save_checkpoint(last, checkpoint)
    with pytest.raises(ConfigError, match=r"data\.train.*differs from the run"):
        make(corpora, tmp_path / "run", max_steps=4)
    resumed = make(plain, tmp_path / "run", max_steps=4)
    assert resumed.resumed and resumed.train().step == 4


def test_nmt_train_logs_the_noise_and_translates(corpora, tmp_path, monkeypatch, capsys):
    import yaml

    from nmt.cli import train as train_cli
    from nmt.cli import translate as translate_cli

    cfg = tiny_config(corpora, tmp_path / "run", device="cpu", max_steps=6)
    (tmp_path / "n.yaml").write_text(yaml.safe_dump(cfg), encoding="utf-8")
    assert train_cli.main(["-config", str(tmp_path / "n.yaml")]) == 0
    log = (tmp_path / "run" / "train.log").read_text(encoding="utf-8")
    assert "source noise: " in log and "delete 0.2, blank 0.2, shuffle 2, anew every epoch" in log
    out = tmp_path / "out.txt"
    assert translate_cli.main(["-model", str(tmp_path / "run" / "last.pt"), "-src", corpora["valid"]["src"],
                               "-output", str(out), "-src_tag", "<BT>", "-quiet"]) == 0
    assert len(out.read_text(encoding="utf-8").splitlines()) == len(Path(corpora["valid"]["src"]).read_text().splitlines())


def test_with_bpe_dropout_each_epochs_segmentation_is_noised_by_whole_words(tmp_path, monkeypatch):
    """Subword sampling (BPE-dropout on the source) and noise together: the update's sources are
    the epoch's segmentation with whole BPE words deleted, blanked and moved (each remaining word's
    pieces together, in order), and a killed run resumes to the weights of an uninterrupted one."""
    from tiny_task import joined_source

    task = write_task(tmp_path / "task", n_train=40)
    joined = joined_source(task, tmp_path)
    data = {"train": {"src": str(joined), "tgt": task["train"]["tgt"], "noise": {"delete": 0.2, "blank": 0.1,
                                                                                  "shuffle": 2}},
            "valid": task["valid"]}

    def run(save_dir, **training):
        cfg = tiny_config(data, save_dir, device="cpu", max_steps=12, **training)
        cfg["data"]["src"] = {"tokenizer": {"type": "bpe", "merges": 20}, "subword_sampling": {"dropout": 0.2}}
        return Trainer(resolve_config(cfg, "n.yaml"), "n.yaml")

    seen = record_updates(monkeypatch)
    straight = run(tmp_path / "straight")
    straight.train()
    monkeypatch.undo()
    itos = straight.data.src_field.vocab.itos
    tokenizer = straight.data.src_field.tokenizer
    lines = joined.read_text(encoding="utf-8").splitlines()  # every pair kept: example i is line i + 1
    changed = 0
    for batch in seen:
        for k, i in enumerate(batch.indices):
            pieces = [itos[t] for t in batch.src[k, :int(batch.src_lengths[k])].tolist()]
            # the pieces between blanks detokenize to whole words of the example's line
            for segment in " ".join(pieces).split("<unk>"):
                assert set(tokenizer.detokenize(segment.split()).split()) <= set(lines[i].split()), (pieces, lines[i])
            changed += "<unk>" in pieces or len(tokenizer.detokenize(pieces).split()) < 2
    assert changed > 10
    first = run(tmp_path / "resumed")
    assert first.train(step_hook=interrupt_at(8)).stopped_by == "SIGINT"
    second = run(tmp_path / "resumed")
    assert second.resumed and second.train().step == 12
    assert_same_run(straight, second, tmp_path / "straight", tmp_path / "resumed")

