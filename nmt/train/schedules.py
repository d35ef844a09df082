"""Learning-rate schedules: ``plateau`` (linear warmup, halving on a validation-loss plateau),
``noam`` (linear warmup, inverse-square-root decay; Vaswani et al. 2017; ``inverse_sqrt`` is
its fairseq name) and, in :mod:`nmt.train.decay_schedules`, the step-driven ``constant``,
``linear``, ``cosine`` and ``exponential``; :func:`build_schedule` picks one from the config.

Plateau: the learning rate at step ``s`` is ``init + (base_lr * decay - init) * min(1, s / warmup_steps)``
(``init`` = ``warmup_init_lr``, 0 by default) where ``decay`` is multiplied by ``decay_factor`` (0.5 in
Peters et al. 2019) every time the validation loss fails to improve for more than
``decay_patience`` consecutive validations, and never drops the rate below ``min_lr``.
"""
from __future__ import annotations

import math

import torch

from nmt.config.lr_schedule import READS, decay_length, schedule_problem
from nmt.train.decay_schedules import STEP_SCHEDULES, StepSchedule, UpdateCountedSchedule


class PlateauWarmupSchedule:
    """Sets ``optimizer`` learning rates; call :meth:`step` after each update and
    :meth:`on_validation` after each validation."""

    def __init__(self, optimizer: torch.optim.Optimizer, base_lr: float, warmup_steps: int = 0,
                 decay_factor: float = 0.5, decay_patience: int = 0, min_lr: float = 0.0,
                 warmup_init_lr: float = 0.0) -> None:
        self.optimizer = optimizer
        self.warmup_init_lr = warmup_init_lr
        self.base_lr = base_lr
        self.warmup_steps = warmup_steps
        self.decay_factor = decay_factor
        self.decay_patience = decay_patience
        self.min_lr = min_lr
        self.decay = 1.0
        self.best_loss = math.inf
        self.bad_validations = 0
        self.n_decays = 0
        self.step_count = 0
        self._apply()

    @property
    def lr(self) -> float:
        """The current learning rate."""
        warm = min(1.0, (self.step_count + 1) / self.warmup_steps) if self.warmup_steps > 0 else 1.0
        decayed = max(self.base_lr * self.decay, min(self.min_lr, self.base_lr))
        if warm >= 1.0:
            return decayed
        return self.warmup_init_lr + (decayed - self.warmup_init_lr) * warm  # init 0: decayed * warm, to the bit

    def step(self) -> None:
        """Advance one update (warmup progress)."""
        self.step_count += 1
        self._apply()

    def on_validation(self, valid_loss: float) -> bool:
        """Record a validation loss; returns True when the learning rate was decayed."""
        if valid_loss < self.best_loss:
            self.best_loss = valid_loss
            self.bad_validations = 0
            return False
        self.bad_validations += 1
        if self.bad_validations <= self.decay_patience:
            return False
        self.bad_validations = 0
        if self.base_lr * self.decay <= self.min_lr:
            return False
        self.decay *= self.decay_factor
        self.n_decays += 1
        self._apply()
        return True

    def _apply(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr

    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("decay", "best_loss", "bad_validations", "n_decays", "step_count")}

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, value)
        self._apply()


class NoamSchedule(UpdateCountedSchedule):
    """Linear warmup to ``base_lr``, then inverse-square-root decay: for update ``s`` (1-based)
    ``lr = base_lr * min(s / warmup_steps, sqrt(warmup_steps / s))``, never below ``min_lr`` after
    the warmup; with ``warmup_init_lr`` the warmup is the line from it (at ``s = 0``) to ``base_lr``
    (at ``s = warmup_steps``): ``init + (base_lr - init) * s / warmup_steps`` (fairseq's
    ``inverse_sqrt --warmup-init-lr``, one update later: its update 1 runs at ``init``). The peak, ``base_lr``, is reached at ``s = warmup_steps`` (the Transformer paper's
    ``d_model^-0.5 * min(s^-0.5, s * w^-1.5)`` is this with ``base_lr = (d_model * w)^-0.5``).
    Validations do not change it. Same interface as :class:`PlateauWarmupSchedule`.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, base_lr: float, warmup_steps: int,
                 min_lr: float = 0.0, warmup_init_lr: float = 0.0) -> None:
        if warmup_steps < 1:
            raise ValueError(f"the noam schedule needs warmup_steps >= 1, got {warmup_steps}")
        self.optimizer = optimizer
        self.base_lr = base_lr
        self.warmup_steps = warmup_steps
        self.min_lr = min_lr
        self.warmup_init_lr = warmup_init_lr
        self.step_count = 0
        self._apply()

    @property
    def lr(self) -> float:
        """The learning rate of the next update."""
        s = self.step_count + 1
        if s < self.warmup_steps:
            return self.warmup_init_lr + (self.base_lr - self.warmup_init_lr) * s / self.warmup_steps
        return max(self.base_lr * math.sqrt(self.warmup_steps / s), min(self.min_lr, self.base_lr))


SCHEDULES = ("plateau", "noam", "inverse_sqrt") + STEP_SCHEDULES

def build_schedule(optimizer: torch.optim.Optimizer, base_lr: float, cfg: dict,
                   max_steps: int | None = None) -> PlateauWarmupSchedule | NoamSchedule | StepSchedule:
    """The schedule of the ``training.lr_schedule`` section (``type``: one of :data:`SCHEDULES`;
    ``inverse_sqrt`` is ``noam``); ``max_steps`` (``training.max_steps``) is the default decay
    length of linear / cosine.

    ValueError prefixed with the key for an impossible setting (noam without warmup, linear /
    cosine without a decay length or with a warmup as long, exponential without decay_steps).
    """
    problem = schedule_problem(cfg, max_steps, base_lr)
    if problem is not None:
        raise ValueError(": ".join(problem))
    kind = cfg.get("type", "plateau")
    if kind in ("noam", "inverse_sqrt"):
        return NoamSchedule(optimizer, base_lr, cfg["warmup_steps"], cfg["min_lr"], cfg.get("warmup_init_lr", 0.0))
    if kind == "plateau":
        return PlateauWarmupSchedule(optimizer, base_lr, cfg["warmup_steps"], cfg["decay_factor"],
                                     cfg["decay_patience"], cfg["min_lr"], cfg.get("warmup_init_lr", 0.0))
    total = decay_length(cfg, max_steps) if kind in ("linear", "cosine") else None
    return StepSchedule(optimizer, kind, base_lr, cfg["warmup_steps"], cfg.get("min_lr", 0.0), total,
                        cfg.get("decay_factor", 0.5), cfg.get("decay_steps"), cfg.get("start_decay_steps", 0),
                        cfg.get("warmup_init_lr", 0.0), cfg.get("period_steps"), cfg.get("t_mult", 1.0),
                        cfg.get("lr_shrink", 1.0))


__all__ = ["NoamSchedule", "PlateauWarmupSchedule", "READS", "SCHEDULES", "StepSchedule", "build_schedule",
           "decay_length"]
