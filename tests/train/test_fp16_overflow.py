"""fp16 loss-scale overflows: a dropped update is not an update (step, schedule, optimizer as if
its batch were absent), it is counted and saved, a resume inside a row of them is exact, and an
endless row stops with one line. One host read per fp16 update."""
from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
from pathlib import Path

import pytest
import torch

from nmt.config import resolve_config
from nmt.sparse import get_loss
from nmt.train.checkpoint import load_checkpoint
from nmt.train.nonfinite import NonFiniteLossError
from nmt.train.overflow import GradientOverflowError
from nmt.train.precision import TrainPrecision
from nmt.train.trainer import Trainer
from nmt.train.update import update
from nmt.utils.sync_audit import SyncAudit

sys.path.insert(0, str(Path(__file__).parent))
from test_precision_compile import PAD, copy_batch, model  # noqa: E402
from tiny_task import tiny_config, write_task  # noqa: E402

NO_DROPOUT = {"embeddings": {"src_size": 8, "tgt_size": 8, "dropout": 0.0},
              "decoder": {"layers": 1, "hidden_size": 12, "dropout": 0.0}}


@pytest.mark.parametrize("optimizer_name", ["fused adam", "sgd"])
def test_fp16_update_reads_the_host_once_and_an_overflow_changes_nothing_but_the_scale(optimizer_name):
    """One ``tolist`` per fp16 update (GradScaler's own ``found_inf.item()`` in SGD's step is not
    repeated); an inf gradient leaves weights and optimizer state untouched, halves the scale
    and is reported as "overflow"."""
    m = model(torch.float32)
    optimizer = (torch.optim.Adam(m.parameters(), lr=1e-2, fused=True) if optimizer_name == "fused adam"
                 else torch.optim.SGD(m.parameters(), lr=1e-2, momentum=0.9))
    train = TrainPrecision("fp16", "cpu")
    weight = next(m.parameters())
    poison = [False]
    weight.register_hook(lambda g: g * math.inf if poison[0] else g)
    loss_fn = get_loss("softmax")
    for step in range(2):  # the second with an optimizer state to keep
        batch = copy_batch(step)
        with SyncAudit() as audit:
            _, _, skipped = update(m, loss_fn, optimizer, batch, PAD, 1.0, precision=train)
        assert skipped is None and dict(audit.counts) == {"Tensor.tolist": 1}, audit.report()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    state = {id(p): {k: v.clone() for k, v in s.items()} for p, s in optimizer.state.items()}
    scale = train.scaler.get_scale()
    poison[0] = True
    batch = copy_batch(5)
    with SyncAudit() as audit:
        loss, _, skipped = update(m, loss_fn, optimizer, batch, PAD, 1.0, precision=train)
    assert skipped == "overflow" and torch.isfinite(loss) and dict(audit.counts) == {"Tensor.tolist": 1}
    assert train.scaler.get_scale() == scale / 2
    assert all(torch.equal(v, before[k]) for k, v in m.state_dict().items())
    for p, s in optimizer.state.items():
        assert all(torch.equal(v, state[id(p)][k]) for k, v in s.items())
    assert all(p.grad is None for p in m.parameters())


def test_fp16_nan_loss_is_nonfinite_not_overflow():
    m = model(torch.float32)
    optimizer = torch.optim.Adam(m.parameters(), lr=1e-2, fused=True)

    def nan_loss(*args, **kwargs):
        return get_loss("softmax")(*args, **kwargs) * math.nan

    _, _, skipped = update(m, nan_loss, optimizer, copy_batch(0), PAD, 1.0, precision=TrainPrecision("fp16", "cpu"))
    assert skipped == "nonfinite"


def make_trainer(tmp_path: Path, run: str, overflow_at: set, interrupt_at: tuple | None = None,
                 **training) -> Trainer:
    """A tiny fp16 CPU run without dropout whose gradients are inf on the batches at the data
    positions ``overflow_at`` ((epoch, batch_in_epoch), whatever the session); SIGINT during the
    update at ``interrupt_at``."""
    data = write_task(tmp_path / "data")
    config = tiny_config(data, tmp_path / run, precision="fp16", device="cpu", **training)
    for section, values in NO_DROPOUT.items():  # an absent batch draws no dropout masks
        config["model"][section] = values
    trainer = Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml")

    def hook(grad):
        position = (trainer.progress.epoch, trainer.progress.batch_in_epoch)
        if position == interrupt_at:
            os.kill(os.getpid(), signal.SIGINT)  # seen after this update
        return grad * math.inf if position in overflow_at else grad

    next(trainer.model.parameters()).register_hook(hook)
    return trainer


def leave_out(monkeypatch, absent: set) -> None:
    """The trainer's data order without the batches at the positions ``absent``."""
    import nmt.train.trainer as trainer_module

    real = trainer_module.make_batch_order

    def without(dataset, *args, epoch, **kwargs):
        return [b for i, b in enumerate(real(dataset, *args, epoch=epoch, **kwargs)) if (epoch, i) not in absent]

    monkeypatch.setattr(trainer_module, "make_batch_order", without)


def fp32_arithmetic(trainer: Trainer) -> None:
    """Autocast off (the loss scaler stays): the gradients at two power-of-two loss scales are
    then exactly proportional, so a run whose scale was halved by overflows computes bit for bit
    the updates of one whose scale was not; what is compared is the bookkeeping."""
    trainer.precision.autocast = contextlib.nullcontext


def same_tensors(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_overflowed_updates_are_as_if_their_batches_were_absent(tmp_path, monkeypatch):
    """Step counter, lr schedule, Adam state and weights of a run with 3 overflowed updates equal
    those of a run where those 3 batches are not in the data order at all; the scale is 2^16 / 2^3
    (GradScaler's closed form: halved per overflow, no growth within 2000 updates)."""
    bad = {(0, 1), (0, 2), (1, 4)}  # 5 batches per epoch
    hit = make_trainer(tmp_path, "hit", bad, lr_schedule={"warmup_steps": 6})
    fp32_arithmetic(hit)
    summary = hit.train()
    reference = make_trainer(tmp_path, "reference", set(), lr_schedule={"warmup_steps": 6})
    leave_out(monkeypatch, bad)
    fp32_arithmetic(reference)
    assert reference.train().step == summary.step == 12
    assert hit.overflows.total == 3 and hit.overflows.in_a_row == 0 and reference.overflows.total == 0
    assert hit.schedule.step_count == reference.schedule.step_count == 12
    assert hit.schedule.lr == reference.schedule.lr
    assert same_tensors(hit.model.state_dict(), reference.model.state_dict())
    hit_state, ref_state = hit.optimizer.state_dict(), reference.optimizer.state_dict()
    for key in ref_state["state"]:
        assert same_tensors(hit_state["state"][key], ref_state["state"][key])
    assert hit.precision.scaler.get_scale() == 2.0 ** 16 / 2 ** 3
    assert reference.precision.scaler.get_scale() == 2.0 ** 16
    last = load_checkpoint(tmp_path / "hit" / "last.pt")
    assert last["trainer"]["overflow_skips"] == {"total": 3, "in_a_row": 0}
    assert last["grad_scaler"]["scale"] == 2.0 ** 13
    import json

    records = [json.loads(line) for line in (tmp_path / "hit" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["overflow_skips"], r["loss_scale"]) for r in records] == [
        (4, 2, 2.0 ** 14), (8, 3, 2.0 ** 13), (12, 3, 2.0 ** 13)]


def test_scale_search_with_real_fp16_autocast(tmp_path):
    """A loss scale far too high for fp16 (2^40): the first updates overflow until the scale fits;
    none of them is a step, and the scale left is 2^40 halved once per counted overflow."""
    trainer = make_trainer(tmp_path, "run", set())
    trainer.precision.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 40)
    summary = trainer.train()
    k = trainer.overflows.total
    assert k >= 10  # gradients of this task at scale 2^30 still overflow float16 (max 65504)
    assert summary.step == trainer.schedule.step_count == 12
    assert trainer.precision.scaler.get_scale() == 2.0 ** (40 - k)
    p = trainer.progress  # 5 batches per epoch: 12 applied and k dropped went by
    assert p.epoch * 5 + p.batch_in_epoch == 12 + k
    assert all(torch.isfinite(v).all() for v in trainer.model.state_dict().values())


def test_a_resume_inside_a_row_of_overflows_is_exact(tmp_path):
    """SIGINT inside a row of overflows saves last.pt there; the resumed run reaches the weights,
    optimizer state, scale and counts of the uninterrupted run."""
    bad = {(0, 1), (0, 2), (0, 3), (1, 2)}
    straight = make_trainer(tmp_path, "straight", bad)
    straight.train()
    first = make_trainer(tmp_path, "resumed", bad, interrupt_at=(0, 2))
    assert first.train().stopped_by == "SIGINT"
    assert (first.progress.step, first.overflows.total, first.overflows.in_a_row) == (1, 2, 2)
    last = load_checkpoint(tmp_path / "resumed" / "last.pt")
    assert last["trainer"]["overflow_skips"] == {"total": 2, "in_a_row": 2} and last["grad_scaler"]["scale"] == 2.0 ** 14
    second = make_trainer(tmp_path, "resumed", bad)
    assert second.overflows.total == 2 and second.precision.scaler.get_scale() == 2.0 ** 14
    assert second.train().step == 12
    assert second.overflows == straight.overflows and straight.overflows.total == 4
    assert second.precision.scaler.get_scale() == straight.precision.scaler.get_scale() == 2.0 ** 12
    assert second.schedule.step_count == straight.schedule.step_count == 12
    assert same_tensors(second.model.state_dict(), straight.model.state_dict())
    a, b = second.optimizer.state_dict()["state"], straight.optimizer.state_dict()["state"]
    assert all(same_tensors(a[k], b[k]) for k in b)


def test_an_endless_row_of_overflows_stops_with_one_line_also_after_a_resume(tmp_path, monkeypatch):
    """Not a non-finite loss: nonfinite: stop does not stop it; MAX_CONSECUTIVE_OVERFLOWS in a row
    do (here 3), counting the row across a resume."""
    import nmt.train.overflow as overflow_module

    monkeypatch.setattr(overflow_module, "MAX_CONSECUTIVE_OVERFLOWS", 3)
    bad = {(0, 2), (0, 3), (0, 4), (1, 0)}
    message = (r"^step 3: 3 updates in a row skipped for inf/NaN fp16 gradients \(loss scale now 2\^13\); stopped "
               r"\(no checkpoint was written\); the gradients overflow at any loss scale: set training.precision: "
               r"bf16 or fp32, lower training.optimizer.lr, or set training.clip_grad_norm$")
    straight = make_trainer(tmp_path, "straight", bad)
    with pytest.raises(GradientOverflowError, match=message):
        straight.train()
    assert isinstance(GradientOverflowError("x"), NonFiniteLossError)  # nmt-train: one line, exit 1
    first = make_trainer(tmp_path, "resumed", bad, interrupt_at=(0, 3))
    assert first.train().stopped_by == "SIGINT" and first.overflows.in_a_row == 2
    second = make_trainer(tmp_path, "resumed", bad)
    with pytest.raises(GradientOverflowError, match=r"^step 3: 3 updates in a row .*\(last.pt keeps step 2"):
        second.train()
    assert (second.progress.epoch, second.progress.batch_in_epoch) == (0, 4)


@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_fp16_nan_loss_follows_training_nonfinite(tmp_path, policy):
    """A NaN loss under fp16 is a non-finite loss (training.nonfinite decides), not an overflow."""
    trainer = make_trainer(tmp_path, "run", set(), nonfinite=policy)
    loss_fn = trainer.loss_fn

    def poisoned(*args, **kwargs):
        p = trainer.progress
        nan = trainer.model.training and (p.epoch, p.batch_in_epoch) == (0, 3)
        return loss_fn(*args, **kwargs) * (math.nan if nan else 1.0)

    trainer.loss_fn = poisoned
    if policy == "stop":
        with pytest.raises(NonFiniteLossError, match=r"^step 4: training loss is nan"):
            trainer.train()
    else:
        assert trainer.train().step == 12 and trainer.skipped_updates == 1
    assert trainer.overflows.total == 0
