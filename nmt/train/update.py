"""One optimisation step on one batch (shared by the trainer and the training benchmark)."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from nmt.data.batching import Batch
from nmt.train.optimizers import clip_gradients


def update(model: nn.Module, loss_fn: Callable, optimizer: torch.optim.Optimizer, batch: Batch, pad_index: int,
           clip_grad_norm: float | None = None, label_smoothing: float = 0.0,
           skip_nonfinite: bool = False) -> tuple[torch.Tensor, int, bool]:
    """Forward, Fenchel-Young loss, backward, clip, step.

    The loss is summed over target tokens and divided by their number before backward (a
    per-token mean). Returns ``(summed loss, detached 0-d tensor; number of target tokens;
    skipped)``. With ``skip_nonfinite`` an update whose loss (or clipped gradient norm) is
    NaN / inf is dropped: no optimizer step, ``skipped`` True; deciding that reads one flag
    from the device. Otherwise nothing here synchronises with the device besides reading
    ``batch.n_tokens`` (an int), and ``skipped`` is False.
    """
    logits, _ = model(batch.src, batch.src_lengths, batch.tgt_in)
    loss = loss_fn(logits.reshape(-1, logits.size(-1)), batch.tgt_out.reshape(-1), ignore_index=pad_index,
                   reduction="sum", label_smoothing=label_smoothing)
    n_tokens = int(batch.n_tokens)
    (loss / max(n_tokens, 1)).backward()
    norm = clip_gradients(model.parameters(), clip_grad_norm)
    if skip_nonfinite:
        finite = torch.isfinite(loss) if norm is None else torch.isfinite(loss) & torch.isfinite(norm)
        if not bool(finite):  # the one host read of skip mode
            optimizer.zero_grad(set_to_none=True)
            return loss.detach(), n_tokens, True
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach(), n_tokens, False


__all__ = ["update"]
