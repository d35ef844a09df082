"""model.output.copy in training and translation: the run's table maps each source type to the
target type of the same spelling (<unk> where the target vocabulary lacks it, specials nothing) and
the checkpoint carries it; a killed run resumes to the same weights; nmt-translate of the
checkpoint gives the in-process search's outputs and certificates, and score mode the log of the
teacher-forced marginal; a copying teacher distils its token distribution, a copying student is a
one-line error; fine-tuning from a parent that does not copy names the key, and an extended
vocabulary gets its own table; two Gloo ranks train as one process."""
from __future__ import annotations

import json
import logging

import pytest
import torch

from nmt.config import ConfigError, resolve_config
from nmt.data.vocabulary import SPECIALS
from nmt.models.copy_attention import NOT_COPIED
from nmt.models.seq2seq import length_mask
from nmt.train.checkpoint import load_checkpoint
from nmt.train.trainer import Trainer
from tiny_task import as_transformer, assert_resumes_exactly, cli_translation_matches_search, tiny_config, write_task


@pytest.fixture
def task(tmp_path):
    return write_task(tmp_path / "task", n_train=40)


def config(data, save_dir, transformer: bool = False, copy: bool = True, **training) -> dict:
    cfg = tiny_config(data, save_dir, device="cpu", **training)
    cfg["model"]["output"]["copy"] = copy
    return as_transformer(cfg) if transformer else cfg


def make(data, save_dir, **kwargs) -> Trainer:
    return Trainer(resolve_config(config(data, save_dir, **kwargs), "c.yaml"), "c.yaml")


def test_the_table_maps_each_source_type_to_the_target_type_of_its_spelling(task, tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("nmt"), "propagate", True)  # a CLI run in this worker may have set it off
    with caplog.at_level(logging.INFO, logger="nmt"):
        trainer = make(task, tmp_path / "run", max_steps=4)
    trainer.train()
    src, tgt = trainer.data.src_field.vocab, trainer.data.tgt_field.vocab
    table = trainer.model.generator.copy.source_to_target.tolist()
    for i, token in enumerate(src.itos):
        if token in ("<pad>", "<bos>", "<eos>"):
            assert table[i] == NOT_COPIED
        else:
            assert table[i] == tgt.stoi.get(token, tgt.unk_index)
    assert sum(t >= len(SPECIALS) for t in table) == 6  # the six letters are both sides' types
    saved = load_checkpoint(tmp_path / "run" / "last.pt")["model"]
    assert saved["generator.copy.source_to_target"].tolist() == table
    assert "output entmax15 copying source tokens" in caplog.text  # the model line says so


@pytest.mark.parametrize("transformer", [False, True], ids=["lstm", "transformer"])
def test_a_killed_copying_run_resumes_to_the_same_weights(task, tmp_path, transformer):
    assert_resumes_exactly(lambda d: make(task, d, transformer=transformer, max_steps=10), tmp_path)


def test_nmt_translate_and_score_mode_of_a_copying_checkpoint(task, tmp_path):
    from nmt.cli.translate import main as translate_main

    make(task, tmp_path / "run", max_steps=150, valid_every=150).train()
    sources = task["valid"]["src"]
    loaded, src, lengths = cli_translation_matches_search(tmp_path / "run" / "last.pt", sources, tmp_path)
    model, tgt_field = loaded.model, loaded.tgt_field
    vocab = tgt_field.vocab
    # score mode: each reference's log-probability is the log of the teacher-forced marginal's
    scores_path = tmp_path / "scores.jsonl"
    assert translate_main(["-model", str(tmp_path / "run" / "last.pt"), "-src", sources, "-tgt",
                           task["valid"]["tgt"], "-score_output", str(scores_path), "-device", "cpu"]) in (0, None)
    scored = [json.loads(line) for line in scores_path.read_text(encoding="utf-8").splitlines()]
    refs = [tgt_field.encode(t) for t in open(task["valid"]["tgt"], encoding="utf-8").read().splitlines()]
    for b, ref in enumerate(refs):
        tgt_in = torch.tensor([[vocab.bos_index] + ref])
        with torch.no_grad():
            scores, _ = model(src[b:b + 1, :lengths[b]], lengths[b:b + 1], tgt_in)
            probs = model.output_probs(scores, src[b:b + 1, :lengths[b]], length_mask(lengths[b:b + 1], int(lengths[b]),
                                                                                        src.device))
        expected = probs[0].gather(-1, torch.tensor(ref + [vocab.eos_index])[:, None]).log().sum()
        assert scored[b]["logprob"] == pytest.approx(float(expected), abs=1e-4)


def test_a_copying_teacher_distils_its_token_distribution_a_copying_student_is_refused(task, tmp_path):
    from nmt.train.distill import teacher_distribution

    make(task, tmp_path / "teacher", max_steps=6).train()
    student = Trainer(resolve_config({**config(task, tmp_path / "student", copy=False, max_steps=4),
                                      "training": {**config(task, tmp_path / "student", copy=False,
                                                            max_steps=4)["training"],
                                                   "distill": {"teacher": str(tmp_path / "teacher" / "last.pt")}}},
                                     "d.yaml"), "d.yaml")
    assert student.train().step == 4
    teacher = student.teacher.model
    src = torch.tensor([[5, 6, 7, 0], [6, 5, 0, 0]])
    lengths = torch.tensor([3, 2])
    tgt_in = torch.tensor([[2, 5, 6], [2, 6, 5]])
    q = teacher_distribution(teacher, student.teacher.mapping, 1.0, src, lengths, tgt_in)
    with torch.no_grad():
        scores, _ = teacher(src, lengths, tgt_in)
        expected = teacher.output_probs(scores, src, length_mask(lengths, 4, src.device))
    assert q.shape == (2, 3, len(student.data.tgt_field.vocab))
    torch.testing.assert_close(q, expected)
    cfg = config(task, tmp_path / "copying-student", max_steps=4)
    cfg["training"]["distill"] = {"teacher": str(tmp_path / "teacher" / "last.pt")}
    with pytest.raises(ConfigError, match="model.output.copy") as info:
        Trainer(resolve_config(cfg, "d.yaml"), "d.yaml")
    assert "\n" not in str(info.value)


def test_fine_tuning_a_parent_that_does_not_copy_names_the_key_and_extend_gets_its_own_table(task, tmp_path):
    make(task, tmp_path / "plain", copy=False, max_steps=4).train()
    cfg = config(task, tmp_path / "child", max_steps=6)
    cfg["training"]["init_from"] = str(tmp_path / "plain" / "last.pt")
    with pytest.raises(ConfigError, match="model.output.copy"):
        Trainer(resolve_config(cfg, "f.yaml"), "f.yaml")
    make(task, tmp_path / "parent", max_steps=4).train()
    more = write_task(tmp_path / "more", n_train=40, seed=5)
    (tmp_path / "more" / "train.src").write_text("g h a\nh g\n" * 5, encoding="utf-8")
    (tmp_path / "more" / "train.tgt").write_text("ahg\ngh\n" * 5, encoding="utf-8")
    cfg = config(more, tmp_path / "extended", max_steps=6)
    cfg["training"].update(init_from=str(tmp_path / "parent" / "last.pt"), init_vocab="extend")
    child = Trainer(resolve_config(cfg, "f.yaml"), "f.yaml")
    src, tgt = child.data.src_field.vocab, child.data.tgt_field.vocab
    table = child.model.generator.copy.source_to_target.tolist()
    assert table[src.stoi["g"]] == tgt.stoi["g"] and table[src.stoi["h"]] == tgt.stoi["h"]
    assert child.train().step == 6


@pytest.mark.slow
def test_two_processes_with_a_copying_model_train_as_one_process(task, tmp_path, ranks):
    from ddp_workers import gloo_config

    def copying(save_dir, batch):
        cfg = gloo_config(task, save_dir, batch, max_steps=6, valid_every=3)
        cfg["model"]["output"]["copy"] = True
        return cfg

    Trainer(resolve_config(copying(tmp_path / "one", 8), "t"), "t").train()
    results = ranks.run(copying(tmp_path / "two", 4))
    assert [r[2:4] for r in results] == [("max_steps", 6)] * 2
    a, b = load_checkpoint(tmp_path / "one" / "last.pt")["model"], load_checkpoint(tmp_path / "two" / "last.pt")["model"]
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=2e-6, msg=name)
