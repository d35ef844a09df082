"""Best-metric tracking and early stopping with patience."""
from __future__ import annotations

import math


class EarlyStopping:
    """Tracks the best value of one validation metric.

    higher_is_better: direction of the metric; patience: validations without improvement
    after which :attr:`should_stop` becomes True (None: never).
    """

    def __init__(self, higher_is_better: bool, patience: int | None = None) -> None:
        self.higher_is_better = higher_is_better
        self.patience = patience
        self.best = -math.inf if higher_is_better else math.inf
        self.best_step = -1
        self.bad_validations = 0

    def is_better(self, value: float) -> bool:
        """Whether ``value`` improves on the best so far."""
        return value > self.best if self.higher_is_better else value < self.best

    def update(self, value: float, step: int, count: bool = True) -> bool:
        """Record ``value`` at ``step``; returns True when it is a new best.

        count=False records a new best but never counts against the patience (used for
        the off-schedule validation at the end of a run).
        """
        improved = self.is_better(value)
        if improved:
            self.best, self.best_step, self.bad_validations = value, step, 0
        elif count:
            self.bad_validations += 1
        return improved

    @property
    def should_stop(self) -> bool:
        return self.patience is not None and self.bad_validations >= self.patience

    def state_dict(self) -> dict:
        return {"best": self.best, "best_step": self.best_step, "bad_validations": self.bad_validations}

    def load_state_dict(self, state: dict) -> None:
        self.best, self.best_step, self.bad_validations = state["best"], state["best_step"], state["bad_validations"]


__all__ = ["EarlyStopping"]
