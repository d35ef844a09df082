"""Step-driven learning-rate schedules: ``constant``, ``linear``, ``cosine`` (optionally with
restarts) and ``exponential`` (the ones of Hugging Face / fairseq / OpenNMT-py), each after an
optional linear warmup.

All are a pure function of ``t``, the number of applied updates so far (the trainer's step):
:attr:`StepSchedule.lr` is the learning rate of update ``t + 1`` (and the one logged at step
``t``). With ``w = warmup_steps``, ``base = optimizer.lr`` and ``init = warmup_init_lr`` (default 0):

- warmup (``t < w``): ``init + (peak - init) * (t + 1) / w``, ``peak`` the rate the schedule has at
  that update after the warmup (``base``; exponential: its decayed rate), so ``base * (t + 1) / w``
  with ``init = 0`` (update ``w`` is the first at the peak; no update runs at lr 0, as the
  ``plateau`` and ``noam`` schedules; fairseq's ``--warmup-init-lr`` ramp, one update later: its
  update 1 runs at ``init`` itself);
- ``constant``: ``base`` afterwards;
- ``linear``: ``min_lr + (base - min_lr) * (1 - p)`` with ``p = min(1, (t - w) / (T - w))`` for
  ``t >= w``, ``T`` the decay length (``training.max_steps`` or ``lr_schedule.decay_steps``):
  ``min_lr`` at step ``T``, and after it (Hugging Face's ``linear`` with its warmup shifted by
  one update);
- ``cosine``: ``min_lr + (base - min_lr) * (1 + cos(pi * p)) / 2``, same ``p`` (Hugging Face's
  ``cosine`` / fairseq's ``cosine`` without restarts); with restarts (``period_steps = P``,
  fairseq's ``lr_period_updates``; SGDR, Loshchilov & Hutter 2017): ``u = t - w`` updates after
  the warmup fall in cycle ``i`` of length ``P * t_mult ** i`` (cycle ``i`` starts at ``u = P *
  (t_mult ** i - 1) / (t_mult - 1)``, at ``i * P`` for ``t_mult = 1``), ``c`` updates into it, and
  the rate is ``lo + (hi - lo) * (1 + cos(pi * c / length)) / 2`` with ``hi = base * lr_shrink ** i``,
  ``lo = min_lr * lr_shrink ** i`` (fairseq's ``cosine`` with ``t_mult`` / ``lr_shrink``; PyTorch's
  ``CosineAnnealingWarmRestarts`` for integer ``t_mult`` and no shrink): the first update of each
  cycle runs at its peak, and the schedule never ends;
- ``exponential``: ``max(base * decay_factor ** k, min(min_lr, base))`` after the warmup,
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


def cosine_cycle(u: int, period: int, t_mult: float = 1.0) -> tuple[int, float, float]:
    """``(i, c, length)``: update ``u`` after the warmup (``u >= 0``) is ``c`` updates into cycle
    ``i`` (0-based) of ``length = period * t_mult ** i`` updates (cosine with restarts; cycle ``i``
    starts at ``period * (t_mult ** i - 1) / (t_mult - 1)``, ``i * period`` for ``t_mult = 1``).
    The cycle is found in closed form (fairseq's logarithm), then moved to the one whose start,
    by that same formula, is the last at or before ``u``: a start that rounding puts a hair after
    ``u`` (the logarithm of an exact power) does not leave ``u`` at the end of the previous cycle."""
    if t_mult == 1.0:
        i = u // period
        return i, float(u - i * period), float(period)

    def start(k: int) -> float:
        return period * (t_mult ** k - 1.0) / (t_mult - 1.0)

    i = max(0, math.floor(math.log(1.0 + u * (t_mult - 1.0) / period, t_mult)))
    while i > 0 and start(i) > u:
        i -= 1
    while start(i + 1) <= u:
        i += 1
    return i, u - start(i), period * t_mult ** i


def step_lr(kind: str, t: int, base_lr: float, warmup_steps: int = 0, min_lr: float = 0.0,
            total_steps: int | None = None, decay_factor: float = 0.5, decay_steps: int | None = None,
            start_decay_steps: int = 0, warmup_init_lr: float = 0.0, period_steps: int | None = None,
            t_mult: float = 1.0, lr_shrink: float = 1.0) -> float:
    """The learning rate of update ``t + 1`` (``t`` updates done) under schedule ``kind``
    (one of :data:`STEP_SCHEDULES`); ``total_steps`` is ``T`` of linear / cosine, ``decay_steps``
    the interval of exponential; ``warmup_init_lr`` where the warmup's line starts (at update 0);
    ``period_steps`` (cosine): the first cycle of restarts (None: no restarts), ``t_mult`` each
    next cycle's growth, ``lr_shrink`` each next cycle's factor of ``base_lr`` and ``min_lr``.
    Returns a float."""
    warm = (t + 1) / warmup_steps if t < warmup_steps else None
    if kind == "constant":
        peak = base_lr
    elif kind == "cosine" and period_steps is not None:
        if warm is not None:  # the first cycle's peak, u = 0
            peak = base_lr
        else:
            i, c, length = cosine_cycle(t - warmup_steps, period_steps, t_mult)
            shrink = lr_shrink ** i
            hi, lo = base_lr * shrink, min_lr * shrink
            return lo + (hi - lo) * (1.0 + math.cos(math.pi * c / length)) / 2.0
    elif kind in ("linear", "cosine"):
        if total_steps is None:
            raise ValueError(f"training.lr_schedule.decay_steps: the {kind} schedule needs a decay length")
        if warm is not None:
            peak = base_lr
        else:
            p = min(1.0, (t - warmup_steps) / (total_steps - warmup_steps))
            shape = 1.0 - p if kind == "linear" else (1.0 + math.cos(math.pi * p)) / 2.0
            return min_lr + (base_lr - min_lr) * shape
    elif kind == "exponential":
        if decay_steps is None:
            raise ValueError("training.lr_schedule.decay_steps: the exponential schedule needs decay_steps")
        s = t + 1
        # decays at updates start_decay_steps, + decay_steps, ... (update 0 is none: start 0 = every decay_steps)
        k = 0 if s < start_decay_steps else (s - start_decay_steps) // decay_steps + (start_decay_steps > 0)
        peak = max(base_lr * decay_factor ** k, min(min_lr, base_lr))
    else:
        raise ValueError(f"training.lr_schedule.type: unknown step schedule {kind!r}")
    if warm is None:
        return peak
    return warmup_init_lr + (peak - warmup_init_lr) * warm  # init 0: peak * warm, as without it


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
                 decay_steps: int | None = None, start_decay_steps: int = 0, warmup_init_lr: float = 0.0,
                 period_steps: int | None = None, t_mult: float = 1.0, lr_shrink: float = 1.0) -> None:
        if kind not in STEP_SCHEDULES:
            raise ValueError(f"training.lr_schedule.type: unknown step schedule {kind!r}")
        self.optimizer = optimizer
        self.kind = kind
        self.settings = dict(base_lr=base_lr, warmup_steps=warmup_steps, min_lr=min_lr, total_steps=total_steps,
                             decay_factor=decay_factor, decay_steps=decay_steps,
                             start_decay_steps=start_decay_steps, warmup_init_lr=warmup_init_lr,
                             period_steps=period_steps, t_mult=t_mult, lr_shrink=lr_shrink)
        self.step_count = 0
        self._apply()

    @property
    def lr(self) -> float:
        """The learning rate of the next update."""
        return step_lr(self.kind, self.step_count, **self.settings)


__all__ = ["STEP_SCHEDULES", "StepSchedule", "UpdateCountedSchedule", "cosine_cycle", "step_lr"]
