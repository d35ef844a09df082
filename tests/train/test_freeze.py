"""training.freeze: the named parts' weights are those the run started from after training (the
others moved), the optimizer holds none of them, a table shared or tied with a frozen part is frozen
with it, a killed run resumes to the same weights, fine-tuning freezes over the parent's weights
and init_optimizer needs the parent's list; bad lists and freezing everything are one-line errors."""
from __future__ import annotations

import logging

import pytest
import torch

from nmt.config import ConfigError, resolve_config
from nmt.train.trainer import Trainer
from tiny_task import assert_same_run, interrupt_at, tiny_config, write_task


@pytest.fixture
def task(tmp_path):
    return write_task(tmp_path / "task", n_train=40)


def make(data, save_dir, model: dict | None = None, **training) -> Trainer:
    cfg = tiny_config(data, save_dir, device="cpu", **training)
    for section, values in (model or {}).items():
        cfg["model"].setdefault(section, {}).update(values)
    return Trainer(resolve_config(cfg, "f.yaml"), "f.yaml")


def start_and_end(trainer: Trainer) -> tuple[dict, dict]:
    start = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    return start, trainer.model.state_dict()


@pytest.mark.parametrize("parts", [["encoder"], ["decoder", "generator"], ["src_embeddings", "tgt_embeddings"]])
def test_frozen_parts_keep_their_weights_and_the_others_train(task, tmp_path, parts):
    trainer = make(task, tmp_path / "run", max_steps=8, freeze=parts)
    optimized = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    start, end = start_and_end(trainer)
    for name, value in end.items():
        frozen = name.split(".")[0] in parts
        assert torch.equal(value, start[name]) == frozen, name
    for name, p in trainer.model.named_parameters():
        assert (id(p) in optimized) != (name.split(".")[0] in parts), name


def test_a_tied_or_shared_table_is_frozen_with_the_part_that_names_it(task, tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("nmt"), "propagate", True)
    caplog.set_level(logging.INFO, logger="nmt")
    tied = {"embeddings": {"tgt_size": 12, "tie_output": True}}
    trainer = make(task, tmp_path / "tied", tied, max_steps=6, freeze=["generator"])
    start, end = start_and_end(trainer)
    assert torch.equal(end["tgt_embeddings.lut.weight"], start["tgt_embeddings.lut.weight"])
    assert any(not torch.equal(end[k], start[k]) for k in end if k.startswith("decoder."))
    assert "training.freeze: generator frozen" in caplog.text and "shared with it, tgt_embeddings.lut.weight too" \
        in caplog.text


def test_freezing_every_part_or_a_bad_list_is_a_one_line_config_error(task, tmp_path):
    with pytest.raises(ConfigError, match=r"f\.yaml: training\.freeze: .*nothing is left to train"):
        make(task, tmp_path / "all", max_steps=2,
             freeze=["src_embeddings", "tgt_embeddings", "encoder", "decoder", "generator"])
    with pytest.raises(ConfigError, match=r"training\.freeze\[1\]: unknown model part 'decodr'; valid: src_embeddings"):
        make(task, tmp_path / "bad", max_steps=2, freeze=["encoder", "decodr"])
    with pytest.raises(ConfigError, match=r"training\.freeze\[1\]: 'encoder' is listed twice"):
        make(task, tmp_path / "twice", max_steps=2, freeze=["encoder", "encoder"])
    assert not (tmp_path / "all" / "last.pt").exists()


def test_a_killed_run_with_a_frozen_part_resumes_to_the_same_weights(task, tmp_path):
    straight = make(task, tmp_path / "straight", max_steps=10, freeze=["encoder"])
    straight.train()
    first = make(task, tmp_path / "resumed", max_steps=10, freeze=["encoder"])
    assert first.train(step_hook=interrupt_at(6)).stopped_by == "SIGINT"
    second = make(task, tmp_path / "resumed", max_steps=10, freeze=["encoder"])
    assert second.resumed and second.train().step == 10
    assert_same_run(straight, second, tmp_path / "straight", tmp_path / "resumed")


def test_fine_tuning_freezes_over_the_parents_weights_and_init_optimizer_needs_its_list(task, tmp_path):
    from nmt.train.checkpoint import load_checkpoint

    make(task, tmp_path / "parent", max_steps=6, freeze=["decoder"]).train()
    parent = load_checkpoint(tmp_path / "parent" / "last.pt")["model"]
    child = make(task, tmp_path / "child", max_steps=4, init_from=str(tmp_path / "parent"), freeze=["encoder"])
    child.train()
    end = child.model.state_dict()
    assert all(torch.equal(end[k], parent[k]) for k in parent if k.startswith("encoder."))
    assert any(not torch.equal(end[k], parent[k]) for k in parent if k.startswith("decoder."))
    with pytest.raises(ConfigError, match=r"training\.freeze: \['encoder'\] in the config, \['decoder'\] in the parent"):
        make(task, tmp_path / "child2", max_steps=4, init_from=str(tmp_path / "parent"), init_optimizer=True,
             freeze=["encoder"])
    same = make(task, tmp_path / "child3", max_steps=8, init_from=str(tmp_path / "parent"), init_optimizer=True,
                freeze=["decoder"])
    assert same.train().step == 8


def test_a_transformer_trains_with_its_decoder_frozen(task, tmp_path):
    cfg_model = {"type": "transformer", "transformer": {"encoder_layers": 1, "decoder_layers": 1, "d_model": 16,
                                                          "heads": 2, "d_ff": 32}}
    cfg = tiny_config(task, tmp_path / "tf", device="cpu", max_steps=6, freeze=["decoder"])
    cfg["model"] = {**cfg_model, "embeddings": {"dropout": 0.0}, "attention": {"mapping": "entmax15"},
                    "output": {"mapping": "entmax15"}}
    trainer = Trainer(resolve_config(cfg, "f.yaml"), "f.yaml")
    start, end = start_and_end(trainer)
    assert all(torch.equal(end[k], start[k]) == k.startswith("decoder.") for k in end)


@pytest.mark.parametrize("frozen", [("decoder",), ("decoder", "generator"), ("generator",), ("encoder",)])
def test_the_trained_parts_gradients_equal_those_of_the_model_without_a_frozen_part(frozen):
    """float32 on the CPU (where the decoder's step products run packed through oneDNN): freezing a
    part changes no other parameter's gradient (a frozen step weight whose input needs a gradient
    once cut it: oneDNN's packed product records no autograd)."""
    from test_precision_compile import PAD, copy_batch, model

    from nmt.sparse import get_loss
    from nmt.train.update import loss_forward

    grads = []
    for parts in ((), frozen):
        m = model(torch.float32).train()
        for part in parts:
            getattr(m, part).requires_grad_(False)
        b = copy_batch(1)
        loss_forward(m, get_loss("entmax15"), b.src, b.src_lengths, b.tgt_in, b.tgt_out, PAD, 0.0).backward()
        grads.append({n: p.grad for n, p in m.named_parameters() if n.split(".")[0] not in frozen})
    assert grads[1] and all(g is not None and float(g.abs().sum()) > 0 for g in grads[1].values())
    for name, g in grads[1].items():
        torch.testing.assert_close(g, grads[0][name], rtol=1e-5, atol=1e-7, msg=name)


def test_nmt_train_takes_the_list_on_the_command_line(task, tmp_path):
    import yaml

    from nmt.cli import train as train_cli

    (tmp_path / "f.yaml").write_text(yaml.safe_dump(tiny_config(task, tmp_path / "cli", device="cpu", max_steps=3)),
                                     encoding="utf-8")
    assert train_cli.main(["-config", str(tmp_path / "f.yaml"), "-set", "training.freeze=[encoder, src_embeddings]"]) == 0
    log = (tmp_path / "cli" / "train.log").read_text(encoding="utf-8")
    assert "training.freeze: encoder frozen" in log and "training.freeze: src_embeddings frozen" in log
    assert " frozen)" in log  # the model line counts them


@pytest.mark.slow
def test_two_processes_with_a_frozen_encoder_train_as_one_process(task, tmp_path, ranks):
    """DistributedDataParallel is built after the freeze: two Gloo ranks of batch 4 train the weights one
    process of batch 8 does, the encoder untouched in both."""
    from ddp_workers import gloo_config

    from nmt.train.checkpoint import load_checkpoint

    one = gloo_config(task, tmp_path / "one", 8, max_steps=6, valid_every=3, freeze=["encoder"])
    Trainer(resolve_config(one, "t"), "t").train()
    results = ranks.run(gloo_config(task, tmp_path / "two", 4, max_steps=6, valid_every=3, freeze=["encoder"]))
    assert [r[2:4] for r in results] == [("max_steps", 6)] * 2
    a, b = load_checkpoint(tmp_path / "one" / "last.pt")["model"], load_checkpoint(tmp_path / "two" / "last.pt")["model"]
    start = make(task, tmp_path / "fresh", max_steps=1).model.state_dict()  # the seeded initialisation
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-5, atol=2e-6, msg=name)
        if name.startswith("encoder."):
            assert torch.equal(a[name], start[name]), name
