"""constant / linear / cosine / exponential / inverse_sqrt learning-rate schedules: every
update's lr against the closed forms recomputed here in float64 (linear against an evenly spaced
grid, exponential against a simulation that multiplies the rate at the decay updates), config
errors naming the key, and in training: applied updates with accumulation, resume equality."""
import json
import math

import numpy as np
import pytest
import torch

from nmt.config import resolve_config
from nmt.train.schedules import NoamSchedule, build_schedule
from nmt.train.trainer import Trainer
from schedule_checks import BASE, DEFAULTS, assert_config_error, lrs, resumed_lrs_equal_straight
from tiny_task import make_trainer, tiny_config


def warmup(w: int) -> list[float]:
    return [BASE * s / w for s in range(1, w + 1)]  # update s of the warmup, peak at s = w


@pytest.mark.parametrize("w", [0, 1, 4])
def test_constant(w):
    assert lrs({"type": "constant", "warmup_steps": w}, 12) == pytest.approx(warmup(w) + [BASE] * (12 - w), rel=1e-12)


@pytest.mark.parametrize("w,total,min_lr,explicit", [(0, 10, 0.0, False), (3, 10, 0.0, False), (3, 10, 0.002, True),
                                                     (1, 2, 0.001, False)])
def test_linear_decays_to_min_lr_at_the_last_step_and_stays(w, total, min_lr, explicit):
    cfg = {"type": "linear", "warmup_steps": w, "min_lr": min_lr}
    if explicit:
        cfg["decay_steps"] = total
    seen = lrs(cfg, total + 6, max_steps=None if explicit else total)
    # update s for s > w: the grid from the peak (step w) to min_lr (step T), one point per update
    grid = list(np.linspace(BASE, min_lr, total - w + 1, dtype=np.float64))
    expected = warmup(w) + grid[:-1] + [min_lr] * 6  # updates w+1..T, then past the end: min_lr
    assert seen == pytest.approx(expected, rel=1e-12, abs=1e-15)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    schedule = build_schedule(optimizer, BASE, {**DEFAULTS, **cfg}, None if explicit else total)
    for _ in range(total):
        schedule.step()
    assert schedule.lr == pytest.approx(min_lr, abs=1e-15)  # logged at the last step: min_lr


@pytest.mark.parametrize("w,total,min_lr", [(0, 8, 0.0), (2, 9, 0.0), (5, 13, 0.001)])
def test_cosine(w, total, min_lr):
    seen = lrs({"type": "cosine", "warmup_steps": w, "min_lr": min_lr}, total + 4, max_steps=total)
    expected = warmup(w)
    for t in range(w, total + 4):  # t updates done: the lr of update t + 1
        p = min(1.0, (t - w) / (total - w))
        expected.append(min_lr + 0.5 * (BASE - min_lr) * (1 + math.cos(math.pi * p)))
    assert seen == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert seen[w] == pytest.approx(BASE)  # update w + 1: still the peak (p = 0)
    half = w + (total - w) // 2
    if (total - w) % 2 == 0:
        assert seen[half] == pytest.approx((BASE + min_lr) / 2)


@pytest.mark.parametrize("w,start,every,factor,min_lr", [(0, 0, 3, 0.5, 0.0), (0, 5, 2, 0.7, 0.0),
                                                         (2, 4, 3, 0.5, 0.002), (0, 1, 1, 0.5, 0.0)])
def test_exponential_multiplies_at_the_start_then_every_decay_steps(w, start, every, factor, min_lr):
    seen = lrs({"type": "exponential", "warmup_steps": w, "start_decay_steps": start, "decay_steps": every,
                "decay_factor": factor, "min_lr": min_lr}, 20)
    rate, expected = BASE, []
    for s in range(1, 21):  # simulate OpenNMT-py: a decay at update start, start + every, ...
        if s >= start and (s - start) % every == 0:
            rate *= factor
        expected.append(max(rate, min_lr) * min(1.0, s / w if w else 1.0))
    assert seen == pytest.approx(expected, rel=1e-12)


def test_inverse_sqrt_is_noam():
    cfg = {"warmup_steps": 4, "min_lr": 0.001}
    assert lrs({"type": "inverse_sqrt", **cfg}, 40) == lrs({"type": "noam", **cfg}, 40)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    assert isinstance(build_schedule(optimizer, BASE, {**DEFAULTS, "type": "inverse_sqrt", **cfg}), NoamSchedule)


def test_state_is_the_step_count():
    cfg = {**DEFAULTS, "type": "cosine", "warmup_steps": 2}
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    schedule = build_schedule(optimizer, BASE, cfg, 10)
    for _ in range(6):
        schedule.step()
    other = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    again = build_schedule(other, BASE, cfg, 10)
    again.load_state_dict(schedule.state_dict())
    assert other.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"] == schedule.lr
    assert schedule.on_validation(1.0) is False and schedule.on_validation(2.0) is False


@pytest.mark.parametrize("schedule,training,message", [
    ({"type": "linear"}, {"max_steps": None, "max_epochs": 2},
     "training.lr_schedule.decay_steps: the linear schedule needs a decay length: set it (or training.max_steps)"),
    ({"type": "cosine", "warmup_steps": 12}, {},
     "training.lr_schedule.warmup_steps: 12 must be below the decay length 12 of the cosine schedule"),
    ({"type": "cosine", "decay_steps": 5, "warmup_steps": 5}, {},
     "training.lr_schedule.warmup_steps: 5 must be below the decay length 5 of the cosine schedule"),
    ({"type": "exponential"}, {},
     "training.lr_schedule.decay_steps: the exponential schedule needs decay_steps (updates between decays)"),
    ({"type": "cosine", "decay_patience": 2}, {},
     "training.lr_schedule.decay_patience: the cosine schedule does not read it (only plateau): remove it"),
    ({"type": "constant", "min_lr": 0.001}, {}, "training.lr_schedule.min_lr: the constant schedule does not read it"),
    ({"type": "linear", "start_decay_steps": 3}, {},
     "training.lr_schedule.start_decay_steps: the linear schedule does not read it (only exponential)"),
    ({"type": "noam", "warmup_steps": 2, "decay_factor": 0.7}, {},
     "training.lr_schedule.decay_factor: the noam schedule does not read it (only plateau, exponential)"),
    ({"type": "inverse_sqrt"}, {}, "training.lr_schedule.warmup_steps: the inverse_sqrt schedule needs warmup_steps >= 1"),
    ({"type": "linear", "min_lr": 0.5}, {}, "training.lr_schedule.min_lr: 0.5 is above training.optimizer.lr 0.001"),
    ({"type": "linear", "decay_steps": -3}, {}, "training.lr_schedule.decay_steps: must be"),
    ({"type": "exponential", "decay_steps": 2, "start_decay_steps": -1}, {},
     "training.lr_schedule.start_decay_steps: must be"),
    ({"type": "warmup"}, {}, "training.lr_schedule.type:"),
])
def test_config_errors_are_one_line_naming_the_key(tiny_task, tmp_path, schedule, training, message):
    assert_config_error(tiny_task, tmp_path / "run", schedule, training, message)


def test_plateau_keys_stay_valid_for_plateau_and_decay_steps_with_epochs(tiny_task, tmp_path):
    resolve_config(tiny_config(tiny_task, tmp_path / "a", lr_schedule={"decay_patience": 2, "decay_factor": 0.7}),
                   "tiny.yaml")
    resolve_config(tiny_config(tiny_task, tmp_path / "b", max_steps=None, max_epochs=3,
                               lr_schedule={"type": "cosine", "decay_steps": 15}), "tiny.yaml")


def test_training_counts_updates_not_batches(tiny_task, tmp_path):
    """accumulate 2 (5 batches an epoch: one update of an epoch takes its odd last batch): the lr
    before update s is the closed form at s - 1 updates done, and metrics.jsonl logs the one at the step."""
    w, total = 3, 12
    trainer = make_trainer(tiny_task, tmp_path / "run", accumulate=2, max_steps=total, valid_every=4,
                           lr_schedule={"type": "cosine", "warmup_steps": w, "min_lr": 0.0002}, device="cpu")
    seen = []
    trainer.train(step_hook=lambda step: seen.append((step, trainer.optimizer.param_groups[0]["lr"])))

    def closed(t):
        if t < w:
            return 1e-3 * (t + 1) / w
        return 0.0002 + 0.5 * (1e-3 - 0.0002) * (1 + math.cos(math.pi * min(1.0, (t - w) / (total - w))))

    assert [s for s, _ in seen] == list(range(1, total + 1))
    assert [lr for _, lr in seen] == pytest.approx([closed(s) for s, _ in seen], rel=1e-12)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [4, 8, 12]
    assert [r["lr"] for r in records] == pytest.approx([closed(4), closed(8), 0.0002], rel=1e-12)


@pytest.mark.parametrize("schedule", [{"type": "linear", "warmup_steps": 2, "min_lr": 1e-4},
                                      {"type": "exponential", "start_decay_steps": 3, "decay_steps": 2}])
def test_killed_and_resumed_lr_sequence_equals_uninterrupted(tiny_task, tmp_path, schedule):
    straight = resumed_lrs_equal_straight(tiny_task, tmp_path, schedule)
    assert len({lr for _, lr in straight}) > 3  # it did change


def test_a_config_changed_after_its_checks_is_build_schedules_error_naming_the_key(tiny_task, tmp_path):
    """The trainer builds the schedule from the run's own config, checked at load (nmt-train,
    load_config, resolve_config; neither a resumed checkpoint's stored config nor an init_from
    parent's reaches build_schedule), so it adds no check of its own: a dict made impossible after
    resolve_config is build_schedule's one-line ValueError naming the key."""
    config = resolve_config(tiny_config(tiny_task, tmp_path / "run", device="cpu"), "tiny.yaml")
    config["training"]["lr_schedule"]["type"] = "exponential"  # no decay_steps: refused at load
    with pytest.raises(ValueError) as err:
        Trainer(config, "tiny.yaml")
    assert str(err.value) == ("training.lr_schedule.decay_steps: the exponential schedule needs decay_steps "
                              "(updates between decays)")
