"""Learning-rate schedule, early stopping, optimizer construction, interrupt handling."""
import math
import os
import signal

import pytest
import torch

from nmt.train.early_stopping import EarlyStopping
from nmt.train.interrupt import GracefulInterrupt
from nmt.train.optimizers import build_optimizer, clip_gradients
from nmt.train.schedules import PlateauWarmupSchedule

OPT = {"name": "adam", "lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8, "momentum": 0.0, "weight_decay": 0.0}


def make(lr=0.01, **kwargs):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    return optimizer, PlateauWarmupSchedule(optimizer, lr, **kwargs)


def test_warmup_is_linear_then_constant():
    optimizer, schedule = make(warmup_steps=4)
    seen = []
    for _ in range(6):
        seen.append(optimizer.param_groups[0]["lr"])
        schedule.step()
    assert seen == pytest.approx([0.0025, 0.005, 0.0075, 0.01, 0.01, 0.01])


def test_plateau_halving_with_patience_and_floor():
    optimizer, schedule = make(decay_factor=0.5, decay_patience=1, min_lr=0.002)
    losses = [3.0, 2.0, 2.5, 2.4, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6]
    lrs = []
    for loss in losses:
        schedule.on_validation(loss)
        lrs.append(optimizer.param_groups[0]["lr"])
    # patience 1: decays at the 2nd consecutive non-improvement, then counting restarts
    assert lrs == pytest.approx([0.01, 0.01, 0.01, 0.005, 0.005, 0.005, 0.0025, 0.0025, 0.002, 0.002, 0.002])
    state = schedule.state_dict()
    optimizer2, schedule2 = make(decay_factor=0.5, decay_patience=1, min_lr=0.002)
    schedule2.load_state_dict(state)
    assert optimizer2.param_groups[0]["lr"] == pytest.approx(0.002)


def test_paper_default_halves_every_non_improving_validation():
    optimizer, schedule = make()
    for loss in (2.0, 2.1, 2.2, 1.0):
        schedule.on_validation(loss)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.0025)


def test_early_stopping():
    stopper = EarlyStopping(higher_is_better=True, patience=2)
    assert stopper.update(50.0, 100) and not stopper.should_stop
    assert not stopper.update(40.0, 200)
    assert not stopper.update(60.0, 300, count=False) is False  # a new best even when not counted
    assert stopper.best == 60.0 and stopper.best_step == 300
    # ... but the patience is left alone: 40 and 10 are two counted validations that do not
    # beat 50, the counted best, as in a run that never made the uncounted one
    assert not stopper.update(10.0, 400) and stopper.should_stop
    assert not stopper.update(55.0, 500) and not stopper.should_stop  # beats 50: counts as progress
    restored = EarlyStopping(higher_is_better=True, patience=2)
    restored.load_state_dict(stopper.state_dict())
    assert (restored.best, restored.counted_best, restored.bad_validations) == (60.0, 55.0, 0)
    lower = EarlyStopping(higher_is_better=False)
    assert lower.best == math.inf and lower.update(3.0, 1) and not lower.update(4.0, 2)
    assert not lower.should_stop


def test_build_optimizer_and_clipping():
    model = torch.nn.Linear(4, 3)
    assert isinstance(build_optimizer(model.parameters(), OPT), torch.optim.Adam)
    sgd = build_optimizer(model.parameters(), {**OPT, "name": "sgd", "momentum": 0.9})
    assert isinstance(sgd, torch.optim.SGD) and sgd.param_groups[0]["momentum"] == 0.9
    with pytest.raises(ValueError, match="training.optimizer.name"):
        build_optimizer(model.parameters(), {**OPT, "name": "adagrad"})
    (model(torch.randn(2, 4)) * 100).sum().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    norm = clip_gradients(model.parameters(), 1.0)
    assert norm == pytest.approx(grads.norm().item(), rel=1e-5)
    assert torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item() == pytest.approx(1.0, rel=1e-4)


def test_graceful_interrupt_sets_flag_and_restores_handler():
    before = signal.getsignal(signal.SIGTERM)
    with GracefulInterrupt() as interrupt:
        os.kill(os.getpid(), signal.SIGTERM)
        assert interrupt.requested == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


def test_noam_warms_up_linearly_then_decays_as_inverse_square_root():
    from nmt.train.schedules import NoamSchedule

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    schedule = NoamSchedule(optimizer, 0.004, warmup_steps=4, min_lr=0.0)
    seen = []
    for _ in range(16):
        seen.append(optimizer.param_groups[0]["lr"])
        schedule.step()
    expected = [0.004 * min(s / 4, math.sqrt(4 / s)) for s in range(1, 17)]
    assert seen == pytest.approx(expected, rel=1e-12)
    assert max(seen) == pytest.approx(0.004) and seen.index(max(seen)) == 3
    # the Transformer paper's formula with base_lr = (d_model * warmup)^-0.5
    d_model, w = 512, 4
    paper = [d_model ** -0.5 * min(s ** -0.5, s * w ** -1.5) for s in range(1, 17)]
    ratio = [a / b for a, b in zip(expected, paper)]
    assert ratio == pytest.approx([0.004 / (d_model * w) ** -0.5] * 16)
    assert schedule.on_validation(1.0) is False and schedule.on_validation(2.0) is False  # no plateau decay
    state = schedule.state_dict()
    again = NoamSchedule(optimizer, 0.004, warmup_steps=4)
    again.load_state_dict(state)
    assert again.lr == schedule.lr


def test_noam_floor_and_config_errors():
    from nmt.train.schedules import NoamSchedule, build_schedule

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    schedule = NoamSchedule(optimizer, 0.01, warmup_steps=1, min_lr=0.004)
    for _ in range(100):
        schedule.step()
    assert schedule.lr == pytest.approx(0.004)
    cfg = {"type": "noam", "warmup_steps": 0, "decay_factor": 0.5, "decay_patience": 0, "min_lr": 0.0}
    with pytest.raises(ValueError, match="training.lr_schedule.warmup_steps: the noam schedule needs"):
        build_schedule(optimizer, 0.01, cfg)
    assert isinstance(build_schedule(optimizer, 0.01, {**cfg, "type": "plateau"}), PlateauWarmupSchedule)
