"""model.embeddings.pretrained through the real trainer (tiny task, CPU): the rows of the types a
vectors file holds are its values, every other row is that of a same-seed run without vectors;
frozen tables stay bit-identical through training (weight decay, EMA and checkpoint averaging
included) while the rest moves; a resume keeps the freeze and never reads the file again; init_from's
weights win; share / tie_output rules; one-line errors naming key, file and line."""
from __future__ import annotations

import logging
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from nmt.config import ConfigError, resolve_config
from nmt.train.checkpoint import load_checkpoint
from nmt.train.model_release import average_checkpoints
from nmt.train import trainer as trainer_module
from nmt.train.trainer import Trainer
from tiny_task import assert_same_run, tiny_config

TRANSFORMER = {
    "type": "transformer",
    "embeddings": {"dropout": 0.1},
    "transformer": {"encoder_layers": 1, "decoder_layers": 1, "d_model": 8, "heads": 2, "d_ff": 16},
    "attention": {"mapping": "entmax15"},
    "output": {"mapping": "entmax15"},
}


@pytest.fixture
def log(caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("nmt"), "propagate", True)  # the CLI's setup_logging turns it off
    caplog.set_level(logging.INFO, logger="nmt")
    return caplog


def write_vectors(path: Path, vectors: dict[str, list[float]], header: bool = False) -> Path:
    lines = [f"{token} {' '.join(repr(v) for v in values)}\n" for token, values in vectors.items()]
    dim = len(next(iter(vectors.values())))
    path.write_text((f"{len(lines)} {dim}\n" if header else "") + "".join(lines), encoding="utf-8")
    return path


def random_vectors(tokens: list[str], dim: int = 8, seed: int = 0) -> dict[str, list[float]]:
    rng = np.random.default_rng(seed)
    return {t: rng.normal(0, 1, dim).tolist() for t in tokens}


def as_float32(values: list[float]) -> torch.Tensor:
    return torch.from_numpy(np.asarray(values, dtype=np.float64).astype(np.float32))


def config_for(tiny_task, save_dir, model_type: str, pretrained: dict | None = None, **training) -> dict:
    config = tiny_config(tiny_task, save_dir, device="cpu", **training)
    if model_type == "transformer":
        config["model"] = {**TRANSFORMER, "embeddings": dict(TRANSFORMER["embeddings"])}
    if pretrained is not None:
        config["model"]["embeddings"]["pretrained"] = pretrained
    return config


def make(config: dict) -> Trainer:
    return Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml")


def split_rows(vocab, vectors: dict) -> tuple[list[int], list[int]]:
    found = [i for i, t in enumerate(vocab.itos) if t in vectors and t != "<pad>"]
    return found, [i for i in range(len(vocab)) if i not in found]


@pytest.mark.parametrize("model_type", ["rnn", "transformer"])
@pytest.mark.parametrize("header", [False, True])
def test_found_rows_are_the_files_vectors_and_the_others_a_same_seed_initialisation(tiny_task, tmp_path, model_type,
                                                                                    header, log):
    # source: space tokens a..f, target: characters; the file also holds tokens of neither, <pad> and <unk>
    src = write_vectors(tmp_path / "src.txt", random_vectors(["b", "zz", "<pad>", "e", "<unk>", "a"], seed=1), header)
    tgt = write_vectors(tmp_path / "tgt.txt", random_vectors(["f", "c", "qq"], seed=2), header)
    plain = make(config_for(tiny_task, tmp_path / "plain", model_type))
    loaded = make(config_for(tiny_task, tmp_path / "loaded", model_type, {"src": str(src), "tgt": str(tgt)}))
    for side, path, seed, tokens in (("src", src, 1, ["b", "zz", "<pad>", "e", "<unk>", "a"]),
                                     ("tgt", tgt, 2, ["f", "c", "qq"])):
        vectors = random_vectors(tokens, seed=seed)
        vocab = getattr(loaded.data, f"{side}_field").vocab
        table = getattr(loaded.model, f"{side}_embeddings").weight.detach()
        reference = getattr(plain.model, f"{side}_embeddings").weight.detach()
        found, others = split_rows(vocab, vectors)
        assert len(found) == len([t for t in tokens if t in vocab.stoi and t != "<pad>"]) >= 2
        for i in found:
            assert torch.equal(table[i], as_float32(vectors[vocab.itos[i]])), vocab.itos[i]
        assert torch.equal(table[others], reference[others])
        assert not table[vocab.pad_index].any()  # <pad> is in the file, its row stays zero
        what = "source" if side == "src" else "target"
        assert (f"pretrained {what} embeddings: {len(found)} of {len(vocab)} types found in {path} (dimension 8)"
                in log.messages)
    # nothing else differs: the vectors consume no random numbers
    for (name, a), (_, b) in zip(plain.model.state_dict().items(), loaded.model.state_dict().items()):
        if "embeddings" not in name:
            assert torch.equal(a, b), name


def run_cli(config: dict, path: Path) -> int:
    from nmt.cli.train import main

    path.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")
    return main(["-config", str(path), "-quiet"])


@pytest.mark.parametrize("model_type", ["rnn", "transformer"])
def test_a_frozen_table_stays_fixed_through_training_while_the_rest_moves(tiny_task, tmp_path, model_type):
    """nmt-train with weight decay (which would shrink a table the optimizer held) and a weight
    average (whose average of a constant must be that constant, bit for bit); best.pt and step
    checkpoints, and their average (nmt-average), hold the initial table."""
    src = write_vectors(tmp_path / "src.txt", random_vectors(["a", "b", "c", "d"], seed=3))
    pretrained = {"src": str(src), "freeze_src": True}
    config = config_for(tiny_task, tmp_path / "run", model_type, pretrained, max_steps=8, keep_last=5,
                        optimizer={"weight_decay": 0.1}, ema={"decay": 0.9})
    initial = make(config_for(tiny_task, tmp_path / "initial", model_type, pretrained)).model.state_dict()
    assert run_cli(config, tmp_path / "c.yaml") == 0
    last = load_checkpoint(tmp_path / "run" / "last.pt")
    for weights in (last["raw_model"], last["model"], load_checkpoint(tmp_path / "run" / "best.pt")["model"],
                    average_checkpoints([tmp_path / "run" / "step_4.pt", tmp_path / "run" / "step_8.pt"])["model"]):
        assert torch.equal(weights["src_embeddings.lut.weight"], initial["src_embeddings.lut.weight"])
        assert not torch.equal(weights["tgt_embeddings.lut.weight"], initial["tgt_embeddings.lut.weight"])
        moved = [n for n in initial if not n.startswith("src_embeddings") and not torch.equal(weights[n], initial[n])]
        assert len(moved) >= len(initial) - 3  # all but the frozen table (and a parameter-free buffer or two)
    n_trainable = sum(1 for n, p in make(config_for(tiny_task, tmp_path / "other", model_type)).model.named_parameters())
    assert len(last["optimizer"]["param_groups"][0]["params"]) == n_trainable - 1  # the table is not in the optimizer


def test_resume_keeps_the_freeze_and_never_reads_the_file(tiny_task, tmp_path, log):
    """Mirrors test_interrupted_and_resumed_equals_uninterrupted: killed at step 7 and resumed after the
    vectors file was deleted (and the config names another, absent one), the run equals the
    uninterrupted one, and its frozen table is still the file's."""
    vectors = random_vectors(["a", "b", "c", "d", "e", "f"], seed=4)
    tgt_vectors = random_vectors(["a", "b"], seed=5)

    def config(save_dir, src_path, tgt_path):
        return config_for(tiny_task, save_dir, "rnn", {"src": str(src_path), "tgt": str(tgt_path), "freeze_src": True})

    straight = make(config(tmp_path / "straight", write_vectors(tmp_path / "s.txt", vectors),
                           write_vectors(tmp_path / "t.txt", tgt_vectors)))
    straight.train()

    def interrupt_at_7(step):
        if step == 7:
            os.kill(os.getpid(), signal.SIGINT)

    src, tgt = write_vectors(tmp_path / "s2.txt", vectors), write_vectors(tmp_path / "t2.txt", tgt_vectors)
    first = make(config(tmp_path / "resumed", src, tgt))
    table = first.model.src_embeddings.weight.detach().clone()
    assert first.train(step_hook=interrupt_at_7).stopped_by == "SIGINT"
    src.unlink()
    tgt.write_text("this is not a vectors file\n", encoding="utf-8")
    second = make(config(tmp_path / "resumed", tmp_path / "gone.txt", tgt))
    assert second.resumed and second.progress.step == 7
    assert any("model.embeddings.pretrained.src, model.embeddings.pretrained.tgt: not read: the run resumes" in m
               for m in log.messages)
    assert not second.model.src_embeddings.weight.requires_grad
    assert all(p is not second.model.src_embeddings.weight for g in second.optimizer.param_groups for p in g["params"])
    assert second.train().step == 12
    assert_same_run(straight, second, tmp_path / "straight", tmp_path / "resumed")
    assert torch.equal(second.model.src_embeddings.weight, table)


def test_resume_with_another_freeze_is_refused(tiny_task, tmp_path, log):
    make(config_for(tiny_task, tmp_path / "run", "rnn", {"freeze_tgt": True}, max_steps=2)).train()
    assert ("model.embeddings.pretrained: freezing a randomly initialised table (no vectors given, no "
            "training.init_from)" in log.messages)
    with pytest.raises(ConfigError, match=r"^tiny\.yaml: model\.embeddings\.pretrained\.freeze_tgt: differs from the "
                                          r"run in .* \(True there\)"):
        make(config_for(tiny_task, tmp_path / "run", "rnn", {"freeze_tgt": False}, max_steps=4))


def test_init_from_weights_win_over_the_vectors_and_the_freeze_applies(tiny_task, tmp_path, log):
    make(config_for(tiny_task, tmp_path / "parent", "rnn", max_steps=4)).train()
    parent = load_checkpoint(tmp_path / "parent" / "best.pt")["model"]
    vectors = write_vectors(tmp_path / "v.txt", random_vectors(["a", "b", "c"], seed=6))
    config = config_for(tiny_task, tmp_path / "child", "rnn", {"src": str(vectors), "freeze_src": True}, max_steps=4,
                        init_from=str(tmp_path / "parent"))
    child = make(config)
    assert any("model.embeddings.pretrained.src: not read: training.init_from's weights win" in m
               for m in log.messages)
    assert torch.equal(child.model.src_embeddings.weight.detach(), parent["src_embeddings.lut.weight"])
    child.train()
    assert torch.equal(child.model.src_embeddings.weight.detach(), parent["src_embeddings.lut.weight"])
    assert not torch.equal(child.model.tgt_embeddings.weight.detach(), parent["tgt_embeddings.lut.weight"])
    # the parent's optimizer state holds the source table: it does not fit a run that freezes it
    config["training"].update(init_optimizer=True, save_dir=str(tmp_path / "child2"))
    with pytest.raises(ConfigError, match=r"^tiny\.yaml: model\.embeddings\.pretrained\.freeze_src: True in the "
                                          r"config, False in the parent: training\.init_optimizer"):
        make(config)


def shared_config(tiny_task, save_dir, pretrained: dict, **model) -> dict:
    config = config_for(tiny_task, save_dir, "rnn", pretrained, max_steps=4)
    config["data"]["tgt"] = {"tokenizer": {"type": "space"}}
    config["data"]["shared_vocab"] = True
    config["model"]["embeddings"].update(share=True, **model)
    return config


def test_shared_table_is_filled_by_src_and_frozen_by_freeze_src(tiny_task, tmp_path):
    for split in ("train", "valid"):  # a joint vocabulary: both sides space-separated letters
        Path(tiny_task[split]["tgt"]).write_text(
            "".join(" ".join(line) + "\n" for line in Path(tiny_task[split]["tgt"]).read_text().split()), "utf-8")
    vectors = random_vectors(["a", "c", "e"], seed=7)
    path = write_vectors(tmp_path / "v.txt", vectors)
    trainer = make(shared_config(tiny_task, tmp_path / "run", {"src": str(path), "freeze_src": True}))
    model = trainer.model
    assert model.src_embeddings is model.tgt_embeddings
    vocab = trainer.data.src_field.vocab
    for token in vectors:
        assert torch.equal(model.src_embeddings.weight[vocab.stoi[token]].detach(), as_float32(vectors[token]))
    table = model.src_embeddings.weight.detach().clone()
    trainer.train()
    assert torch.equal(model.tgt_embeddings.weight.detach(), table)
    for key, value in (("tgt", str(path)), ("freeze_tgt", True)):
        with pytest.raises(ConfigError, match=rf"^tiny\.yaml: model\.embeddings\.pretrained\.{key}: with "
                                              r"model\.embeddings\.share one table serves both sides"):
            make(shared_config(tiny_task, tmp_path / "other", {"src": str(path), key: value}))


def test_freeze_tgt_with_tie_output_freezes_the_output_weight_but_not_its_bias(tiny_task, tmp_path, log):
    vectors = random_vectors(["a", "b", "c"], dim=12, seed=8)
    path = write_vectors(tmp_path / "v.txt", vectors)
    config = config_for(tiny_task, tmp_path / "run", "rnn", {"tgt": str(path), "freeze_tgt": True}, max_steps=4)
    config["model"]["embeddings"].update(tgt_size=12, tie_output=True)
    trainer = make(config)
    assert any("the target embeddings (tgt_embeddings.lut.weight) are frozen; tied to it "
               "(model.embeddings.tie_output), generator.proj.weight is frozen too" in m for m in log.messages)
    model = trainer.model
    assert model.generator.proj.weight is model.tgt_embeddings.weight
    frozen = model.tgt_embeddings.weight.numel()  # counted once: one tensor
    assert any(m.startswith("model: rnn, ") and f" parameters ({frozen} frozen); " in m for m in log.messages)
    vocab = trainer.data.tgt_field.vocab
    assert torch.equal(model.generator.proj.weight[vocab.stoi["b"]].detach(), as_float32(vectors["b"]))
    weight, bias = model.generator.proj.weight.detach().clone(), model.generator.proj.bias.detach().clone()
    trainer.train()
    assert torch.equal(model.generator.proj.weight.detach(), weight)
    assert not torch.equal(model.generator.proj.bias.detach(), bias)


@pytest.mark.parametrize("model_type, size_key", [("rnn", "model.embeddings.src_size"),
                                                  ("transformer", "model.transformer.d_model")])
def test_errors_are_one_line_naming_key_file_and_line(tiny_task, tmp_path, capsys, monkeypatch, model_type,
                                                      size_key):
    key = "model.embeddings.pretrained.src"
    cases = [
        (tmp_path / "missing.txt", None, f"{key}: {tmp_path / 'missing.txt'}: no such file"),
        (tmp_path / "wide.txt", "a 1 2 3 4 5 6 7 8 9\n",
         f"{key}: {tmp_path / 'wide.txt'} holds 9-dimensional vectors, but the source embeddings have 8 ({size_key})"),
        (tmp_path / "bad.txt", "a 1 2 3 4 5 6 7 8\nb 1 2 3 4 5 6 7 x\n",
         f"{key}: {tmp_path / 'bad.txt'}:2: 'x' is not a number"),
        (tmp_path / "short.txt", "a 1 2 3 4 5 6 7 8\nzz 1 2\n",
         f"{key}: {tmp_path / 'short.txt'}:2: 8 values expected after the token, found 2"),
    ]
    for n, (path, text, message) in enumerate(cases):
        if text is not None:
            path.write_text(text, encoding="utf-8")
        config = config_for(tiny_task, tmp_path / f"run{n}", model_type, {"src": str(path)})
        assert run_cli(config, tmp_path / "c.yaml") == 2
        assert capsys.readouterr().err == f"nmt-train: error: {tmp_path / 'c.yaml'}: {message}\n"
        if n < 2:  # found from the config and the file's first line: before the run directory is made
            assert not (tmp_path / f"run{n}").exists()
    # the setup's own check, for a file that changed after the config check (nmt-train's is skipped here)
    (tmp_path / "wide.txt").write_text("a 1 2 3 4 5 6 7 8\n", encoding="utf-8")
    late = resolve_config(config_for(tiny_task, tmp_path / "late", model_type, {"src": str(tmp_path / "wide.txt")}),
                          "tiny.yaml")
    (tmp_path / "wide.txt").write_text("2 9\na 1 2 3 4 5 6 7 8 9\nb 1 2 3 4 5 6 7 8 9\n", encoding="utf-8")
    monkeypatch.setattr(trainer_module.pretrained_embeddings, "check_vector_files", lambda config, source: None)
    with pytest.raises(ConfigError) as info:
        Trainer(late, "tiny.yaml")
    assert str(info.value) == (f"tiny.yaml: {key}: {tmp_path / 'wide.txt'} holds 9-dimensional vectors, but the "
                               f"source embeddings have 8 ({size_key})")


def test_pretrained_null_or_absent_means_no_vectors_and_nothing_frozen(tiny_task, tmp_path):
    defaults = {"src": None, "tgt": None, "freeze_src": False, "freeze_tgt": False}
    for value in (None, {}):
        config = config_for(tiny_task, tmp_path / "run", "rnn", value)
        assert resolve_config(config, "tiny.yaml")["model"]["embeddings"]["pretrained"] == defaults
    with pytest.raises(ConfigError, match=r"^tiny\.yaml: model\.embeddings\.pretrained\.freeze: unknown key 'freeze' "
                                          r".*; valid: freeze_src, freeze_tgt, src, tgt$"):
        resolve_config(config_for(tiny_task, tmp_path / "run", "rnn", {"freeze": True}), "tiny.yaml")
