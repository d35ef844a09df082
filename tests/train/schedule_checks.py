"""What the learning-rate schedule tests (test_step_schedules, test_warmup_init_and_restarts) share:
a schedule's lr sequence driven alone, a config's one-line error, and
the lr sequence of a killed-and-resumed tiny run against the uninterrupted one."""
from pathlib import Path

import pytest
import torch

from nmt.config import ConfigError, resolve_config
from nmt.train.schedules import build_schedule
from tiny_task import lr_run, tiny_config

BASE = 0.01
DEFAULTS = {"type": "plateau", "warmup_steps": 0, "decay_factor": 0.5, "decay_patience": 0, "min_lr": 0.0,
            "decay_steps": None, "start_decay_steps": 0, "warmup_init_lr": 0.0, "period_steps": None,
            "t_mult": 1.0, "lr_shrink": 1.0}
"""Every ``lr_schedule`` key at its default (the config schema's)."""


def lrs(cfg: dict, n: int, max_steps=None, base: float = BASE) -> list[float]:
    """The lr of updates 1..n as the optimizer holds it before each (``cfg`` over :data:`DEFAULTS`)."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)
    schedule = build_schedule(optimizer, base, {**DEFAULTS, **cfg}, max_steps)
    seen = []
    for _ in range(n):
        seen.append(optimizer.param_groups[0]["lr"])
        assert seen[-1] == schedule.lr
        schedule.step()
    return seen


def assert_config_error(data: dict, save_dir: Path, schedule: dict, training: dict, message: str) -> None:
    """The tiny config with ``lr_schedule: schedule`` (and ``training``) is refused at load with one
    line naming the file and holding ``message``."""
    config = tiny_config(data, save_dir, lr_schedule=schedule, **training)
    with pytest.raises(ConfigError) as err:
        resolve_config(config, "tiny.yaml")
    text = str(err.value)
    assert "\n" not in text and "tiny.yaml" in text and message in text, text


def resumed_lrs_equal_straight(data: dict, root: Path, schedule: dict) -> list[tuple[int, float]]:
    """Trains the tiny task (12 updates) under ``lr_schedule: schedule`` straight through in
    ``root / "straight"``, and killed after update 7 then resumed in ``root / "resumed"``; asserts
    the two runs' ``(step, lr)`` sequences are equal and returns the straight run's."""
    _, _, straight = lr_run(data, root / "straight", schedule)
    _, summary, first = lr_run(data, root / "resumed", schedule, kill_at=7)
    assert summary.stopped_by == "SIGINT" and summary.step == 7
    trainer, summary, second = lr_run(data, root / "resumed", schedule)
    assert trainer.resumed and summary.step == 12
    assert first + second == straight
    return straight
