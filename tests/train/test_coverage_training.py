"""model.attention.coverage and training.coverage_loss in training and translation: a killed run
resumes to the same weights; the trainer's update loss is the output loss plus the weighted coverage
loss of the pass's attention (the LSTM's, a Transformer's alignment heads', a distilling student's);
nmt-translate of the checkpoint gives the in-process search's outputs and certificates; a Transformer
with coverage attention and either with guided alignment are one-line errors naming the key."""
from __future__ import annotations

import pytest
import torch

from nmt.config import ConfigError, resolve_config
from nmt.data.batching import collate
from nmt.train.coverage_loss import coverage_loss
from nmt.train.trainer import Trainer
from nmt.train.update import loss_forward
from tiny_task import as_transformer, assert_resumes_exactly, cli_translation_matches_search, tiny_config, write_task


@pytest.fixture
def task(tmp_path):
    return write_task(tmp_path / "task", n_train=40)


def config(data, save_dir, transformer: bool = False, coverage: bool = True, weight: float = 1.0, **training):
    cfg = tiny_config(data, save_dir, device="cpu", coverage_loss=weight, **training)
    cfg["model"]["attention"]["coverage"] = coverage
    return as_transformer(cfg) if transformer else cfg


def make(data, save_dir, **kwargs) -> Trainer:
    return Trainer(resolve_config(config(data, save_dir, **kwargs), "c.yaml"), "c.yaml")


def test_a_killed_run_with_coverage_resumes_to_the_same_weights(task, tmp_path):
    straight, _ = assert_resumes_exactly(lambda d: make(task, d, max_steps=10), tmp_path)
    assert straight.model.decoder.attention.coverage


def batch_of(trainer: Trainer):
    data = trainer.data.train
    return collate(data, list(range(6)), trainer.pad, trainer.bos, trainer.eos)


@pytest.mark.parametrize("kind", ["lstm", "transformer", "distilling"])
def test_the_update_loss_adds_the_weighted_coverage_loss(task, tmp_path, kind):
    if kind == "distilling":
        make(task, tmp_path / "teacher", coverage=False, weight=0.0, max_steps=3).train()
        cfg = config(task, tmp_path / "run", weight=0.5, max_steps=3)
        cfg["training"]["distill"] = {"teacher": str(tmp_path / "teacher" / "last.pt"), "weight": 0.5}
        trainer = Trainer(resolve_config(cfg, "c.yaml"), "c.yaml")
    else:
        trainer = make(task, tmp_path / "run", transformer=kind == "transformer", coverage=kind == "lstm",
                       weight=0.5, max_steps=3)
    model = trainer.model.eval()  # no dropout: the same pass twice
    b = batch_of(trainer)
    args = (model, trainer.loss_fn, b.src, b.src_lengths, b.tgt_in, b.tgt_out, trainer.pad, 0.0)
    with torch.no_grad():
        total = trainer.loss_forward(*args)
        if kind == "distilling":
            from nmt.train.distill import distill_loss_forward

            t = trainer.teacher
            plain = distill_loss_forward(*args, None, t.model, t.mapping, t.weight, t.temperature)
        else:
            plain = loss_forward(*args)
        _, attention = model(b.src, b.src_lengths, b.tgt_in)
        expected = plain + 0.5 * coverage_loss(attention, b.tgt_out, trainer.pad)
    assert float(coverage_loss(attention, b.tgt_out, trainer.pad)) > 0
    torch.testing.assert_close(total, expected, rtol=1e-6, atol=1e-6)


def test_nmt_translate_of_a_coverage_checkpoint(task, tmp_path):
    make(task, tmp_path / "run", max_steps=150, valid_every=150).train()
    loaded, _, _ = cli_translation_matches_search(tmp_path / "run" / "last.pt", task["valid"]["src"], tmp_path)
    assert loaded.model.decoder.attention.coverage


@pytest.mark.parametrize("case, key", [("transformer", "model.attention.coverage"),
                                        ("guided-coverage", "model.attention.coverage"),
                                        ("guided-loss", "training.coverage_loss")])
def test_config_errors_name_the_key(task, tmp_path, case, key):
    cfg = config(task, tmp_path / "run", transformer=case == "transformer", coverage=case != "guided-loss",
                 weight=1.0 if case == "guided-loss" else 0.0, max_steps=2)
    if case.startswith("guided"):
        align = tmp_path / "train.align"
        n = len(open(task["train"]["src"], encoding="utf-8").read().splitlines())
        align.write_text("0-0\n" * n, encoding="utf-8")
        cfg["data"]["train"] = {**cfg["data"]["train"], "align": str(align)}
        cfg["training"]["guided_alignment"] = {"weight": 0.5}
    with pytest.raises(ConfigError) as info:
        Trainer(resolve_config(cfg, "c.yaml"), "c.yaml")
    message = str(info.value)
    assert message.startswith(f"c.yaml: {key}") and "\n" not in message
