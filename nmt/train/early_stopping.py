"""Best-metric tracking and early stopping with patience."""
from __future__ import annotations

import math
from collections.abc import Iterable


class EarlyStopping:
    """Tracks the best value of one validation metric.

    higher_is_better: direction of the metric; patience: validations without improvement
    after which :attr:`should_stop` becomes True (None: never).

    ``best`` / ``best_step`` cover every validation (best.pt); the patience counts against
    ``counted_best``, the best of the counted validations only, so an uncounted one (the
    extra validation at the end of a run) neither resets the patience nor raises its bar.
    """

    def __init__(self, higher_is_better: bool, patience: int | None = None) -> None:
        self.higher_is_better = higher_is_better
        self.patience = patience
        self.best = -math.inf if higher_is_better else math.inf
        self.best_step = -1
        self.counted_best = self.best
        self.bad_validations = 0

    def is_better(self, value: float, than: float | None = None) -> bool:
        """Whether ``value`` improves on ``than`` (default: the best so far)."""
        than = self.best if than is None else than
        return value > than if self.higher_is_better else value < than

    def update(self, value: float, step: int, count: bool = True) -> bool:
        """Record ``value`` at ``step``; returns True when it is a new best.

        count=False records a new best but leaves the patience alone (used for the
        off-schedule validation at the end of a run, which a longer run would not have made).
        """
        improved = self.is_better(value)
        if improved:
            self.best, self.best_step = value, step
        if count:
            if self.is_better(value, self.counted_best):
                self.counted_best, self.bad_validations = value, 0
            else:
                self.bad_validations += 1
        return improved

    @property
    def should_stop(self) -> bool:
        return self.patience is not None and self.bad_validations >= self.patience

    def state_dict(self) -> dict:
        return {"best": self.best, "best_step": self.best_step, "bad_validations": self.bad_validations,
                "counted_best": self.counted_best}

    def replay(self, validations: Iterable[tuple[int, float]]) -> None:
        """Start afresh and record ``validations`` ((step, value) pairs in the order they ran), each
        counted: the state a run with this metric from its first step would hold (used when a resume
        changes ``validation.metric``). A NaN value is never a best, as in :meth:`update`."""
        self.__init__(self.higher_is_better, self.patience)
        for step, value in validations:
            self.update(value, step)

    def load_state_dict(self, state: dict) -> None:
        self.best, self.best_step, self.bad_validations = state["best"], state["best_step"], state["bad_validations"]
        self.counted_best = state.get("counted_best", self.best)  # checkpoints written before it was kept


__all__ = ["EarlyStopping"]
