"""NaN injection into training: stop naming the step (last.pt keeps finite weights), or skip."""
import math

import pytest
import torch

from nmt.cli.train import main as train_main
from nmt.train.checkpoint import load_checkpoint
from nmt.train.nonfinite import NonFiniteGuard, NonFiniteLossError
from nmt.train.trainer import Trainer
from nmt.config import resolve_config
from tiny_task import tiny_config, write_task


def trainer_with_nan_at(tmp_path, bad_steps, **training) -> Trainer:
    data = write_task(tmp_path / "data")
    trainer = Trainer(resolve_config(tiny_config(data, tmp_path / "run", **training), "tiny.yaml"), "tiny.yaml")
    loss_fn, calls = trainer.loss_fn, []

    def poisoned(*args, **kwargs):  # the loss of update number len(calls) is NaN when asked
        loss = loss_fn(*args, **kwargs)
        if not trainer.model.training:  # validation
            return loss
        calls.append(None)
        return loss * math.nan if len(calls) in bad_steps else loss

    trainer.loss_fn = poisoned
    return trainer


def all_finite(state: dict) -> bool:
    return all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())


def test_nan_loss_stops_naming_the_step_and_last_keeps_finite_weights(tmp_path):
    trainer = trainer_with_nan_at(tmp_path, {6})  # valid_every 4: last.pt written at step 4
    with pytest.raises(NonFiniteLossError, match=r"^step 6: training loss is nan; stopped \(last.pt keeps step 4"):
        trainer.train()
    last = load_checkpoint(tmp_path / "run" / "last.pt")
    assert last["step"] == 4 and all_finite(last["model"])
    assert load_checkpoint(tmp_path / "run" / "best.pt")["step"] == 4
    assert not (tmp_path / "run" / "step_8.pt").exists()


def test_deferred_check_as_on_accelerators_reports_the_first_bad_step(tmp_path):
    """Without a per-step sync the flag is read at the next log point; the step named is still the first bad one."""
    trainer = trainer_with_nan_at(tmp_path, {5, 6, 7}, log_every=4)
    trainer.nonfinite = NonFiniteGuard(trainer.device, sync_each_step=False)
    with pytest.raises(NonFiniteLossError, match=r"^step 5: training loss is nan"):
        trainer.train()
    assert trainer.progress.step == 8  # noticed at the log/validation point, before validating or saving
    last = load_checkpoint(tmp_path / "run" / "last.pt")
    assert last["step"] == 4 and all_finite(last["model"])


def test_nan_parameters_are_never_saved(tmp_path):
    data = write_task(tmp_path / "data")
    trainer = Trainer(resolve_config(tiny_config(data, tmp_path / "run"), "tiny.yaml"), "tiny.yaml")

    def poison(step):
        if step == 3:  # the loss of step 3 was finite; the weights after it are not
            with torch.no_grad():
                next(trainer.model.parameters()).fill_(math.nan)

    with pytest.raises(NonFiniteLossError, match=r"^step 4: (model parameters are not finite|training loss is nan)"):
        trainer.train(step_hook=poison)
    assert not (tmp_path / "run" / "last.pt").exists()


def test_skip_policy_drops_nan_updates_and_finishes(tmp_path, caplog, monkeypatch):
    """A dropped update is not counted (as in fairseq): the step, and so max_steps, the validation
    grid and the lr schedule, follow the applied updates; its batch is consumed."""
    import json
    import logging

    monkeypatch.setattr(logging.getLogger("nmt"), "propagate", True)  # the CLI's setup_logging turns it off
    trainer = trainer_with_nan_at(tmp_path, {2, 6}, nonfinite="skip")
    summary = trainer.train()
    assert summary.step == 12 and trainer.skipped_updates == 2
    assert trainer.schedule.step_count == 12  # the warmup / decay position: applied updates only
    p = trainer.progress  # 14 batches of 5 per epoch went by: 12 applied, 2 dropped
    assert (p.epoch, p.batch_in_epoch) == (2, 4)
    # the 6th batch was the 5th attempt at an update: 4 applied, 1 dropped before it
    assert "step 5: non-finite training loss (nan) or gradient norm; update skipped and not counted" in caplog.text
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [4, 8, 12]
    last = load_checkpoint(tmp_path / "run" / "last.pt")
    assert last["step"] == 12 and all_finite(last["model"]) and last["trainer"]["skipped_updates"] == 2
    assert last["scheduler"]["step_count"] == 12


def poison_positions(trainer: Trainer, positions: set) -> None:
    """NaN training losses on the batches at these (epoch, batch_in_epoch) data positions, whatever
    the session (a resumed run meets them at the same places)."""
    loss_fn = trainer.loss_fn

    def poisoned(*args, **kwargs):
        loss = loss_fn(*args, **kwargs)
        p = trainer.progress
        return loss * math.nan if trainer.model.training and (p.epoch, p.batch_in_epoch) in positions else loss

    trainer.loss_fn = poisoned


def test_a_resumed_run_with_skipped_updates_equals_an_uninterrupted_one(tmp_path):
    import os
    import signal

    data = write_task(tmp_path / "data")
    bad = {(0, 2), (1, 3)}  # 5 batches per epoch: dropped before step 3 and before step 8

    def make(run):  # on the CPU wherever CUDA is: bit-identical weights need deterministic kernels
        config = tiny_config(data, tmp_path / run, nonfinite="skip", lr_schedule={"warmup_steps": 6}, device="cpu")
        trainer = Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml")
        poison_positions(trainer, bad)
        return trainer

    straight = make("straight")
    straight.train()

    def interrupt_at_4(step):  # after the first dropped update, before the second
        if step == 4:
            os.kill(os.getpid(), signal.SIGINT)

    first = make("resumed")
    assert first.train(step_hook=interrupt_at_4).step == 4 and first.skipped_updates == 1
    second = make("resumed")
    assert second.progress.step == 4 and second.skipped_updates == 1  # the count is kept in last.pt
    assert second.train().step == 12 and second.skipped_updates == straight.skipped_updates == 2
    assert second.schedule.step_count == straight.schedule.step_count == 12
    assert second.schedule.lr == straight.schedule.lr
    for (name, a), (_, b) in zip(straight.model.state_dict().items(), second.model.state_dict().items()):
        assert torch.equal(a, b), name


def test_skip_stops_when_every_update_is_dropped(tmp_path, monkeypatch):
    """Nothing would end a run whose every update is dropped (steps no longer advance): a run of
    MAX_CONSECUTIVE_SKIPS dropped updates stops it with the one-line error of ``stop``."""
    import nmt.train.trainer as trainer_module

    monkeypatch.setattr(trainer_module, "MAX_CONSECUTIVE_SKIPS", 3)
    trainer = trainer_with_nan_at(tmp_path, set(range(5, 1000)), nonfinite="skip")
    with pytest.raises(NonFiniteLossError, match=r"^step 5: 3 updates in a row skipped for a non-finite loss or "
                                                 r"gradient norm; stopped \(last.pt keeps step 4, the last finite state\)"):
        trainer.train()
    assert trainer.progress.step == 4 and trainer.skipped_updates == 3


def test_cli_one_line_error_and_exit_1(tmp_path, monkeypatch, capsys):
    import yaml

    import nmt.train.trainer as trainer_module

    real_get_loss = trainer_module.get_loss

    def nan_from_step_3(*args, **kwargs):
        loss_fn, calls = real_get_loss(*args, **kwargs), []

        def loss(*a, **k):
            calls.append(None)
            return loss_fn(*a, **k) * (math.nan if len(calls) == 3 else 1.0)
        return loss

    monkeypatch.setattr(trainer_module, "get_loss", nan_from_step_3)
    data = write_task(tmp_path / "data")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(tiny_config(data, tmp_path / "run")))
    assert train_main(["-config", str(tmp_path / "c.yaml"), "-quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["nmt-train: error: step 3: training loss is nan; stopped (no checkpoint was written); lower "
                   "training.optimizer.lr, set training.clip_grad_norm, or set training.nonfinite: skip"]
    assert not (tmp_path / "run" / "last.pt").exists()


def test_an_interrupt_inside_a_row_of_dropped_updates_keeps_the_row(tmp_path, monkeypatch):
    """SIGINT between two dropped updates saves last.pt there; the resumed run stops where the
    uninterrupted one does (the count of updates dropped in a row is kept in last.pt: it restarted
    at 0, so the resumed run went on for MAX_CONSECUTIVE_SKIPS more)."""
    import os
    import signal

    import nmt.train.trainer as trainer_module

    monkeypatch.setattr(trainer_module, "MAX_CONSECUTIVE_SKIPS", 3)
    data = write_task(tmp_path / "data")
    bad = {(0, 2), (0, 3), (0, 4), (1, 0)}  # 5 batches per epoch: 3 in a row stop before step 3

    def make(interrupt_at=None):
        config = tiny_config(data, tmp_path / "run", nonfinite="skip")
        trainer = Trainer(resolve_config(config, "tiny.yaml"), "tiny.yaml")
        loss_fn = trainer.loss_fn

        def poisoned(*args, **kwargs):
            loss = loss_fn(*args, **kwargs)
            p = trainer.progress
            if trainer.model.training and (p.epoch, p.batch_in_epoch) in bad:
                if (p.epoch, p.batch_in_epoch) == interrupt_at:
                    os.kill(os.getpid(), signal.SIGINT)  # seen after this (dropped) update
                return loss * math.nan
            return loss

        trainer.loss_fn = poisoned
        return trainer

    first = make(interrupt_at=(0, 3))
    assert first.train().stopped_by == "SIGINT" and first.consecutive_skips == 2
    second = make()
    with pytest.raises(NonFiniteLossError, match=r"^step 3: 3 updates in a row skipped"):
        second.train()
    assert (second.progress.epoch, second.progress.batch_in_epoch) == (0, 4)  # at the third in a row
