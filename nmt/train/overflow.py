"""fp16 loss-scale overflows: updates dropped because their gradients hold inf/NaN at the
current loss scale (``training.precision: fp16``).

``torch.amp.GradScaler`` skips the optimizer step of such an update and halves the scale; nmt
does not count it as an update either (as fairseq: "gradient overflow detected, ignoring
gradient"): the step counter, and so ``max_steps``, ``valid_every``, ``log_every`` and the
``step_N.pt`` names, and the learning-rate schedule follow the applied updates only; the
batches it used are consumed (the data position moves on). The scale search of the first
updates (the scale starts at 2^16) drops a few updates this way; that is normal and is not a
non-finite loss (``training.nonfinite`` is not involved).

The counts (:class:`OverflowSkips`: in total, and since the last applied update) are saved in
``last.pt``, so a resumed run stops where an uninterrupted one would. After
:data:`MAX_CONSECUTIVE_OVERFLOWS` dropped in a row the run stops (:class:`GradientOverflowError`):
by then the scale has been halved that many times (from 2^16 to 2^-48), so the gradients are
not finite at any scale.
"""
from __future__ import annotations

import logging
import math
from typing import Callable

from nmt.train.nonfinite import DroppedUpdates, NonFiniteLossError, kept_state

logger = logging.getLogger(__name__)

MAX_CONSECUTIVE_OVERFLOWS = 64
"""Updates dropped for fp16 overflow in a row (with no applied update between) that stop a run."""


class GradientOverflowError(NonFiniteLossError):
    """:data:`MAX_CONSECUTIVE_OVERFLOWS` fp16 updates in a row overflowed; one line."""


class OverflowSkips(DroppedUpdates):
    """Counts of updates dropped for fp16 overflow: ``total`` over all sessions of the run,
    ``in_a_row`` since the last applied update (a checkpoint may fall inside such a row)."""

    def record(self, step: int, last_saved_step: int | None,
               current_scale: Callable[[], float] | None = None) -> None:
        """Note one dropped update, attempted as step ``step``; log it (no host read). Raises
        GradientOverflowError at the :data:`MAX_CONSECUTIVE_OVERFLOWS`-th in a row, naming the
        loss scale ``current_scale()`` reads then."""
        self.drop()
        logger.info("step %d: fp16 gradient overflow (inf/NaN gradients); update skipped and not counted, "
                    "loss scale halved (%d overflow skips so far)", step, self.total)
        if self.in_a_row >= MAX_CONSECUTIVE_OVERFLOWS:
            now = f" (loss scale now {scale_text(current_scale())})" if current_scale is not None else ""
            raise GradientOverflowError(
                f"step {step}: {self.in_a_row} updates in a row skipped for inf/NaN fp16 gradients{now}; "
                f"stopped ({kept_state(last_saved_step)}); the gradients overflow at any loss scale: set "
                "training.precision: bf16 or fp32, lower training.optimizer.lr, or set training.clip_grad_norm")


def scale_text(scale: float) -> str:
    """A loss scale as a power of two when it is one (they are, from 2^16 by halving and doubling)."""
    if scale > 0 and math.isfinite(scale):
        exponent = math.log2(scale)
        if exponent == int(exponent):
            return f"2^{int(exponent)}"
    return f"{scale:g}"


__all__ = ["MAX_CONSECUTIVE_OVERFLOWS", "GradientOverflowError", "OverflowSkips", "scale_text"]
