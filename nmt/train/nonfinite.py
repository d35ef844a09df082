"""Non-finite training losses (NaN / inf): stop with a one-line error, or skip the update.

``training.nonfinite: stop`` (default) ends the run at the first update whose loss is not
finite; nothing is saved after it, so ``last.pt`` keeps the last finite state.
``training.nonfinite: skip`` drops such an update (no optimizer step) and goes on. A dropped
update is not counted (as in fairseq): the step counter, and so ``max_steps``, ``valid_every``,
``log_every`` and the ``step_N.pt`` names, and the learning-rate schedule follow the applied
updates only; the batches it used are consumed (the data position moves on). After
:data:`MAX_CONSECUTIVE_SKIPS` dropped updates in a row the run stops as with ``stop``: nothing
would ever end a run whose every update is dropped but ``max_epochs`` / ``max_minutes``.

Host synchronisation: on CPU the loss is checked after every update. On an accelerator
(``stop``) the step of the first non-finite loss is kept in a device tensor and read only
where the trainer reads the device anyway: at the logging interval, before validating and
before saving. ``skip`` must decide before the optimizer step, so it reads one flag per
update on any device.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable

import torch

POLICIES = ("stop", "skip")
MAX_CONSECUTIVE_SKIPS = 100
"""``nonfinite: skip`` stops (NonFiniteLossError) after this many dropped updates in a row: a
sign that the weights or the data, not a rare batch, make every loss non-finite. (fp16 updates
dropped for gradient overflow at the loss scale are counted apart: :mod:`nmt.train.overflow`.)"""


class NonFiniteLossError(RuntimeError):
    """Training met a NaN / inf loss (or parameters) with ``nonfinite: stop``; one line."""


class NonFiniteGuard:
    """Records the first step with a non-finite loss without synchronising (except on CPU).

    device: where losses live; sync_each_step: check after every update (default: CPU only).
    """

    def __init__(self, device: torch.device, sync_each_step: bool | None = None) -> None:
        self.sync_each_step = device.type == "cpu" if sync_each_step is None else sync_each_step
        self._first_bad = torch.full((), -1, dtype=torch.long, device=device)  # 0-d: step or -1
        self._first_value = torch.zeros((), dtype=torch.float64, device=device)  # 0-d: that loss

    def observe(self, loss: torch.Tensor, step: int) -> None:
        """Note the (0-d, detached) loss of update ``step`` (no host read; see :meth:`check`)."""
        bad = ~torch.isfinite(loss) & (self._first_bad < 0)
        self._first_bad = torch.where(bad, torch.full_like(self._first_bad, step), self._first_bad)
        self._first_value = torch.where(bad, loss.to(torch.float64), self._first_value)

    def check(self, last_saved_step: int | None = None) -> None:
        """Raise NonFiniteLossError if a non-finite loss was seen (one host read)."""
        step = int(self._first_bad)
        if step >= 0:
            raise NonFiniteLossError(
                f"step {step}: training loss is {float(self._first_value)}; stopped "
                f"({kept_state(last_saved_step)}); lower training.optimizer.lr, set training.clip_grad_norm, "
                "or set training.nonfinite: skip")


@dataclass
class DroppedUpdates:
    """Counts of the updates dropped for one reason (a non-finite loss here; an fp16 overflow:
    :class:`nmt.train.overflow.OverflowSkips`): ``total`` over all sessions of the run,
    ``in_a_row`` since the last applied update (a checkpoint may fall inside such a row)."""

    total: int = 0
    in_a_row: int = 0

    def drop(self) -> None:
        """One more update dropped."""
        self.total += 1
        self.in_a_row += 1

    def applied(self) -> None:
        """An update was applied: the row ends."""
        self.in_a_row = 0

    def state_dict(self) -> dict[str, int]:
        """``{"total", "in_a_row"}`` for checkpoints."""
        return asdict(self)

    def load_state_dict(self, state: dict | None) -> None:
        """Restore from :meth:`state_dict` (None or missing keys: 0, a checkpoint of an older nmt)."""
        state = state or {}
        self.total = int(state.get("total", 0))
        self.in_a_row = int(state.get("in_a_row", 0))


def check_parameters_finite(parameters: Iterable[torch.Tensor], step: int, last_saved_step: int | None) -> None:
    """Raise NonFiniteLossError when any parameter holds NaN / inf (one host read); called before saving."""
    flags = [torch.isfinite(p.detach()).all() for p in parameters]
    if flags and not bool(torch.stack(flags).all()):
        raise NonFiniteLossError(f"step {step}: model parameters are not finite; stopped ({kept_state(last_saved_step)}); "
                                 "lower training.optimizer.lr or set training.clip_grad_norm")


def kept_state(last_saved_step: int | None) -> str:
    """What the run directory keeps, for the stop message: the step ``last.pt`` holds."""
    if last_saved_step is None:
        return "no checkpoint was written"
    return f"last.pt keeps step {last_saved_step}, the last finite state"


__all__ = ["POLICIES", "MAX_CONSECUTIVE_SKIPS", "kept_state", "DroppedUpdates", "NonFiniteLossError", "NonFiniteGuard",
           "check_parameters_finite"]
