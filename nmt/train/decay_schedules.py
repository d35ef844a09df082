"""Step-driven learning-rate schedules: ``constant``, ``linear``, ``cosine`` and ``exponential``
(the ones of Hugging Face / fairseq / OpenNMT-py), each after an optional linear warmup.

All are a pure function of ``t``, the number of applied updates so far (the trainer's step):
:attr:`StepSchedule.lr` is the learning rate of update ``t + 1`` (and the one logged at step
``t``). With ``w = warmup_steps`` and ``base = optimizer.lr``:

- warmup (``t < w``): ``base * (t + 1) / w`` (update ``w`` is the first at the peak; no update
  runs at lr 0, as the ``plateau`` and ``noam`` schedules);
- ``constant``: ``base`` afterwards;
- ``linear``: ``min_lr + (base - min_lr) * (1 - p)`` with ``p = min(1, (t - w) / (T - w))`` for
  ``t >= w``, ``T`` the decay length (``training.max_steps`` or ``lr_schedule.decay_steps``):
  ``min_lr`` at step ``T``, and after it (Hugging Face's ``linear`` with its warmup shifted by
  one update);
- ``cosine``: ``min_lr + (base - min_lr) * (1 + cos(pi * p)) / 2``, same ``p`` (Hugging Face's
  ``cosine`` / fairseq's ``cosine`` without restarts);
- ``exponential``: ``max(base * decay_factor ** k, min(min_lr, base))`` times the warmup factor,
  ``k`` the number of decay updates up to update ``s = t + 1``: ``start_decay_steps``, then one
  every ``decay_steps`` updates (OpenNMT-py's ``exponential_decay``: ``k = 0`` for
  ``s < start_decay_steps``, else ``(s - start_decay_steps) // decay_steps + 1``); with
  ``start_decay_steps: 0`` (no update 0) the decays are at ``decay_steps``, ``2 * decay_steps``, ...

Validations do not change them; the state is ``t`` alone, so resuming restores the sequence.
"""
from __future__ import annotations

import math

import torch

STEP_SCHEDULES = ("constant", "linear", "cosine", "exponential")


def step_lr(kind: str, t: int, base_lr: float, warmup_steps: int = 0, min_lr: float = 0.0,
            total_steps: int | None = None, decay_factor: float = 0.5, decay_steps: int | None = None,
            start_decay_steps: int = 0) -> float:
    """The learning rate of update ``t + 1`` (``t`` updates done) under schedule ``kind``
    (one of :data:`STEP_SCHEDULES`); ``total_steps`` is ``T`` of linear / cosine, ``decay_steps``
    the interval of exponential. Returns a float."""
    if t < warmup_steps:
        warm = (t + 1) / warmup_steps
        if kind in ("constant", "linear", "cosine"):
            return base_lr * warm
    else:
        warm = 1.0
    if kind == "constant":
        return base_lr
    if kind in ("linear", "cosine"):
        if total_steps is None:
            raise ValueError(f"training.lr_schedule.decay_steps: the {kind} schedule needs a decay length")
        p = min(1.0, (t - warmup_steps) / (total_steps - warmup_steps))
        shape = 1.0 - p if kind == "linear" else (1.0 + math.cos(math.pi * p)) / 2.0
        return min_lr + (base_lr - min_lr) * shape
    if kind == "exponential":
        if decay_steps is None:
            raise ValueError("training.lr_schedule.decay_steps: the exponential schedule needs decay_steps")
        s = t + 1
        # decays at updates start_decay_steps, + decay_steps, ... (update 0 is none: start 0 = every decay_steps)
        k = 0 if s < start_decay_steps else (s - start_decay_steps) // decay_steps + (start_decay_steps > 0)
        return max(base_lr * decay_factor ** k, min(min_lr, base_lr)) * warm
    raise ValueError(f"training.lr_schedule.type: unknown step schedule {kind!r}")


class UpdateCountedSchedule:
    """A schedule whose rate is a function of the applied updates alone (``lr``, set by the
    subclass): :meth:`step` after each applied update, validations change nothing, and the state
    is the update count. Same interface as :class:`nmt.train.schedules.PlateauWarmupSchedule`."""

    optimizer: torch.optim.Optimizer
    step_count: int

    @property
    def lr(self) -> float:
        """The learning rate of the next update."""
        raise NotImplementedError

    def step(self) -> None:
        """Advance one applied update."""
        self.step_count += 1
        self._apply()

    def on_validation(self, valid_loss: float) -> bool:
        """Validations do not change these schedules: always False."""
        return False

    def _apply(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr

    def state_dict(self) -> dict:
        return {"step_count": self.step_count}

    def load_state_dict(self, state: dict) -> None:
        self.step_count = state["step_count"]
        self._apply()


class StepSchedule(UpdateCountedSchedule):
    """Sets ``optimizer`` learning rates to :func:`step_lr` of the updates done; call :meth:`step`
    after each applied update. Same interface as :class:`nmt.train.schedules.PlateauWarmupSchedule`."""

    def __init__(self, optimizer: torch.optim.Optimizer, kind: str, base_lr: float, warmup_steps: int = 0,
                 min_lr: float = 0.0, total_steps: int | None = None, decay_factor: float = 0.5,
                 decay_steps: int | None = None, start_decay_steps: int = 0) -> None:
        if kind not in STEP_SCHEDULES:
            raise ValueError(f"training.lr_schedule.type: unknown step schedule {kind!r}")
        self.optimizer = optimizer
        self.kind = kind
        self.settings = dict(base_lr=base_lr, warmup_steps=warmup_steps, min_lr=min_lr, total_steps=total_steps,
                             decay_factor=decay_factor, decay_steps=decay_steps,
                             start_decay_steps=start_decay_steps)
        self.step_count = 0
        self._apply()

    @property
    def lr(self) -> float:
        """The learning rate of the next update."""
        return step_lr(self.kind, self.step_count, **self.settings)


__all__ = ["STEP_SCHEDULES", "StepSchedule", "UpdateCountedSchedule", "step_lr"]
