"""An exponential moving average of the weights during training (``training.ema``).

After every *applied* optimizer update ``t`` (an fp16 overflow skip or a non-finite skip is no
update: the trainer calls :meth:`WeightAverage.update` only for applied ones, once per update
also with gradient accumulation):

- ``t <= start_step``: the average is a copy of the parameters (it tracks them);
- else, when ``t % every == 0``: ``ema = d * ema + (1 - d) * param`` for every parameter, with
  ``d = decay``, or with ``warmup`` ``d = min(decay, (1 + n) / (10 + n))`` where ``n`` counts the
  averaging updates made before (TensorFlow's ``ExponentialMovingAverage(num_updates=)`` rule,
  which OpenNMT-py's ``-average_decay`` approximates): early averages then forget the random
  initialisation quickly.

The average is kept in float32 whatever the parameters' dtype and updated with
``torch._foreach_*`` operations: no host synchronisation (the decay is a host float computed
from host counters). Buffers are not averaged: the averaged model uses the model's own buffers
(fairseq copies them). Under data parallelism every rank holds the same parameters, so every
rank computes the same average; only rank 0 writes it.

:meth:`WeightAverage.swapped` puts the average into the model's parameters for the length of a
``with`` block (validation) and restores the trained weights bit for bit afterwards, in place:
no second model object, and compiled graphs see the same parameter tensors.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch import nn


class WeightAverage:
    """The exponential moving average of ``model``'s parameters (see the module docstring).

    model: the (unwrapped) model; decay in [0, 1); start_step >= 0; every >= 1; warmup: the
    ``min(decay, (1 + n) / (10 + n))`` rule. Starts as a float32 copy of the current parameters.
    """

    def __init__(self, model: nn.Module, decay: float, start_step: int = 0, every: int = 1,
                 warmup: bool = False) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay!r}")
        self.decay, self.start_step, self.every, self.warmup = float(decay), int(start_step), int(every), bool(warmup)
        named = list(model.named_parameters())  # unique parameters (a tied weight once), in a fixed order
        self.names = [name for name, _ in named]
        self.params = [p for _, p in named]
        self.average = [p.detach().to(torch.float32, copy=True) for p in self.params]
        self.averaged_updates = 0  # averaging updates made (the n of the warmup rule)
        # the parameters in float32: themselves when they are float32 (no copy per update)
        self._float32 = all(p.dtype == torch.float32 for p in self.params)

    def decay_at(self, n: int) -> float:
        """The decay of the averaging update made after ``n`` others."""
        return min(self.decay, (1.0 + n) / (10.0 + n)) if self.warmup else self.decay

    def _sources(self) -> list[torch.Tensor]:
        """The parameters in float32, read under no_grad (themselves when float32: no copy)."""
        return self.params if self._float32 else [p.detach().to(torch.float32) for p in self.params]

    @torch.no_grad()
    def update(self, step: int) -> None:
        """After the applied update number ``step`` (1-based): copy (``step <= start_step``), average
        (``step % every == 0``) or nothing. Device operations only, no host read."""
        if step <= self.start_step:
            torch._foreach_copy_(self.average, self._sources())
            return
        if step % self.every:
            return
        weight = 1.0 - self.decay_at(self.averaged_updates)  # ema + w (param - ema) = d ema + (1 - d) param
        torch._foreach_lerp_(self.average, self._sources(), weight)
        self.averaged_updates += 1

    @torch.no_grad()
    def reset(self) -> None:
        """Start again from the current parameters (a resume of a run without an average)."""
        torch._foreach_copy_(self.average, self._sources())
        self.averaged_updates = 0

    @contextmanager
    def swapped(self) -> Iterator[None]:
        """Inside the block the model's parameters hold the average (cast to their dtype); after
        it the trained weights, restored bit for bit from a copy (also on an exception)."""
        with torch.no_grad():
            kept = [p.detach().clone() for p in self.params]
            torch._foreach_copy_([p.detach() for p in self.params], self.average)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_([p.detach() for p in self.params], kept)

    def model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """``model.state_dict()`` with every parameter entry (tied names included) replaced by the
        average cast to the parameter's dtype: the weights to translate with. Buffers: the model's.
        Like ``state_dict()`` it holds the live tensors (no copy where the dtype matches; a tied
        weight's names share one, saved once): save it before the next :meth:`update`."""
        by_id = {id(p): a for p, a in zip(self.params, self.average)}
        cast: dict[int, torch.Tensor] = {}  # one tensor per parameter, for all its names
        state = model.state_dict()
        for name, p in model.named_parameters(remove_duplicate=False):
            if id(p) not in cast:
                cast[id(p)] = by_id[id(p)].detach().to(p.dtype)
            state[name] = cast[id(p)]
        return state

    def state_dict(self) -> dict[str, Any]:
        """The settings and counters, and the float32 average of the parameters that are not
        float32 (a float32 one is exactly the checkpoint's ``model`` entry, not stored twice)."""
        return {"decay": self.decay, "start_step": self.start_step, "every": self.every, "warmup": self.warmup,
                "averaged_updates": self.averaged_updates,
                "average": {n: a.clone() for n, p, a in zip(self.names, self.params, self.average)
                            if p.dtype != torch.float32}}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any], model_state: dict[str, torch.Tensor]) -> None:
        """Restore from :meth:`state_dict` and the checkpoint's ``model`` entry (the average as
        :meth:`model_state` wrote it). The settings are this run's (a changed decay applies from here)."""
        self.averaged_updates = int(state.get("averaged_updates", 0))
        stored = state.get("average", {})
        for name, average in zip(self.names, self.average):
            average.copy_(stored[name] if name in stored else model_state[name])


__all__ = ["WeightAverage"]
