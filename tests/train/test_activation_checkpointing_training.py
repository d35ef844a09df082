"""``training.checkpoint_activations`` in real training: runs of the Trainer on the tiny task (a
Transformer with dropout on) give bit-equal parameters with and without it (alone, with
accumulation, bf16 autocast, a resume, torch.compile, 2 Gloo processes); no host sync in the update
step; a one-line error for the RNN."""
from __future__ import annotations

import copy
import os
import signal

import pytest
import torch
from ddp_workers import gloo_config
from test_precision_compile import PAD, VOCAB, copy_batch
from tiny_task import assert_same_run, write_task

from nmt.config import ConfigError, resolve_config
from nmt.models import build_model
from nmt.models.transformer.checkpointing import set_activation_checkpointing
from nmt.sparse import get_loss
from nmt.train.checkpoint import load_checkpoint
from nmt.train.compile import compile_loss_forward
from nmt.train.precision import TrainPrecision
from nmt.train.trainer import Trainer
from nmt.train.update import update
from nmt.utils.sync_audit import SyncAudit

TRANSFORMER = {
    "type": "transformer",
    "embeddings": {"dropout": 0.1},
    "transformer": {"encoder_layers": 2, "decoder_layers": 2, "d_model": 8, "heads": 2, "d_ff": 16,
                    "dropout": 0.2, "attention_dropout": 0.1, "activation_dropout": 0.1},
    "attention": {"mapping": "entmax15", "cross": {"mapping": "entmax_bisect", "params": {"alpha": "learned"}}},
    "output": {"mapping": "entmax15"},
}


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return write_task(tmp_path_factory.mktemp("data"))


def config(task: dict, save_dir, checkpointed: bool, **training) -> dict:
    from tiny_task import tiny_config

    cfg = tiny_config(task, save_dir, device="cpu", max_steps=6, valid_every=3,
                      checkpoint_activations=checkpointed, **training)
    cfg["model"] = copy.deepcopy(TRANSFORMER)
    return cfg


def trained(cfg: dict, step_hook=None) -> Trainer:
    trainer = Trainer(resolve_config(cfg, "t.yaml"), "t.yaml")
    trainer.train(step_hook=step_hook)
    return trainer


def assert_equal_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("training", [{}, {"accumulate": 2}, {"precision": "bf16"}, {"label_smoothing": 0.1}],
                         ids=["plain", "accumulate", "bf16", "smoothing"])
def test_runs_with_and_without_checkpointing_are_bit_equal(task, tmp_path, training):
    plain = trained(config(task, tmp_path / "plain", False, **training))
    ckpt = trained(config(task, tmp_path / "ckpt", True, **training))
    assert all(s.checkpoint_activations for s in (ckpt.model.encoder, ckpt.model.decoder))
    assert_same_run(plain, ckpt, tmp_path / "plain", tmp_path / "ckpt")  # weights and metrics.jsonl
    start = load_checkpoint(tmp_path / "plain" / "step_3.pt")["model"]
    assert any(not torch.equal(start[k], v) for k, v in plain.model.state_dict().items())  # it trained


@pytest.mark.parametrize("first,second", [(True, True), (False, True), (True, False)])
def test_resume_equals_the_straight_run(task, tmp_path, first, second):
    """Killed at step 4 and resumed (checkpointing switched on or off at the resume: it changes no
    number, so the resume allows it): the weights and metrics of a straight run without it."""
    straight = trained(config(task, tmp_path / "straight", False))

    def kill(step: int) -> None:
        if step == 4:
            os.kill(os.getpid(), signal.SIGINT)

    trained(config(task, tmp_path / "resumed", first), kill)
    assert load_checkpoint(tmp_path / "resumed" / "last.pt")["step"] == 4
    resumed = trained(config(task, tmp_path / "resumed", second))
    assert_same_run(straight, resumed, tmp_path / "straight", tmp_path / "resumed")


def test_compiled_step_equals_eager_with_checkpointing():
    """torch.compile (backend aot_eager: dynamo's capture of the checkpoint and AOT autograd, without
    inductor's minutes of C++ code generation on a loaded machine) of the checkpointed step: the
    loss and gradients of the compiled step without checkpointing, bit for bit."""
    compiled = compile_loss_forward("cpu", backend="aot_eager")
    results = []
    for checkpointed in (False, True):
        torch.manual_seed(0)
        model = _model()
        set_activation_checkpointing(model, checkpointed)
        batch = copy_batch(1)
        torch.manual_seed(3)
        loss = compiled(model, get_loss("entmax15"), batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out,
                        PAD, 0.1)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (la, ga), (lb, gb) = results
    assert torch.equal(la, lb)
    assert all(torch.equal(a, b) for a, b in zip(ga, gb))


def _model(**sections) -> torch.nn.Module:
    """The Transformer of TRANSFORMER (some sections replaced), its config resolved, in train mode."""
    files = {"src": "x", "tgt": "y"}
    cfg = resolve_config({"data": {"train": files, "valid": files},
                          "model": {**copy.deepcopy(TRANSFORMER), **sections},
                          "training": {"save_dir": "unused", "max_steps": 1}}, "t.yaml")["model"]
    torch.manual_seed(0)
    return build_model(cfg, VOCAB, VOCAB, PAD).train()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_checkpointed_update_step_makes_no_host_sync(precision, monkeypatch):
    """Forward, recomputation, backward, clipping and fused Adam of a checkpointed Transformer:
    no synchronising call (the static 1.5-entmax path, sync-free, everywhere; the encoder in the
    padded layout, as off the CPU: its packed rows read the mask on the CPU only)."""
    import nmt.models.transformer.packed_rows as packed_rows

    monkeypatch.setattr(packed_rows, "PACKED_ENCODER", False)
    static = {"mapping": "entmax15", "params": {"impl": "static"}}
    model = _model(attention=static, output=static)
    set_activation_checkpointing(model, True)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    for step in range(2):
        batch = copy_batch(step)  # built on the host, as collate does
        with SyncAudit() as audit:
            update(model, get_loss("entmax15", impl="static"), optimizer, batch, PAD, 1.0,
                   precision=TrainPrecision(precision, "cpu"))
        assert audit.total == 0, audit.report()


def test_rnn_is_refused_naming_the_key(task, tmp_path):
    from tiny_task import tiny_config

    cfg = tiny_config(task, tmp_path / "rnn", device="cpu", checkpoint_activations=True)
    with pytest.raises(ConfigError, match=r"training\.checkpoint_activations: recomputes Transformer layers; "
                                          r"model\.type is 'rnn'"):
        Trainer(resolve_config(cfg, "t.yaml"), "t.yaml")
    assert not (tmp_path / "rnn").exists()


@pytest.mark.slow
def test_two_processes_with_checkpointing_equal_two_without(task, tmp_path, ranks):
    """DistributedDataParallel (2 Gloo processes) over checkpointed layers: the gradients are
    all-reduced as the recomputing backward produces them; the weights equal those of the same
    2-process run without checkpointing, bit for bit (each rank draws its own dropout masks)."""
    weights = {}
    for checkpointed in (False, True):
        cfg = gloo_config(task, tmp_path / str(checkpointed), 4, max_steps=4, valid_every=2,
                          checkpoint_activations=checkpointed)
        cfg["model"] = copy.deepcopy(TRANSFORMER)
        results = ranks.run(cfg)
        assert [r[2:4] for r in results] == [("max_steps", 4)] * 2
        weights[checkpointed] = load_checkpoint(tmp_path / str(checkpointed) / "last.pt")["model"]
    assert_equal_weights(weights[False], weights[True])
