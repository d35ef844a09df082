"""One optimisation step on one batch, or on several with gradient accumulation (shared by the
trainer and the training benchmark)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Callable

import torch
from torch import nn

from nmt.data.batching import Batch
from nmt.train.optimizers import clip_gradients


def update(model: nn.Module, loss_fn: Callable, optimizer: torch.optim.Optimizer, batch: Batch | Sequence[Batch],
           pad_index: int, clip_grad_norm: float | None = None, label_smoothing: float = 0.0,
           skip_nonfinite: bool = False) -> tuple[torch.Tensor, int, bool]:
    """Forward, Fenchel-Young loss, backward (per batch), clip, step (once).

    ``batch`` is one batch or a sequence of N batches whose gradients are accumulated. The
    loss is summed over target tokens and divided by the number of target tokens of ALL the
    batches before each backward, so N batches give exactly the gradient of one batch
    holding all their sentences (a per-token mean). Returns ``(summed loss, detached 0-d
    tensor; number of target tokens; skipped)``. With ``skip_nonfinite`` an update whose loss
    (or clipped gradient norm) is NaN / inf is dropped: no optimizer step, ``skipped`` True;
    deciding that reads one flag from the device. Otherwise nothing here synchronises with the
    device besides reading the batches' ``n_tokens`` (ints), and ``skipped`` is False.
    """
    batches = [batch] if isinstance(batch, Batch) else list(batch)
    if not batches:
        raise ValueError("update needs at least one batch")
    n_tokens = sum(int(b.n_tokens) for b in batches)
    total: torch.Tensor | None = None
    for b in batches:
        logits, _ = model(b.src, b.src_lengths, b.tgt_in)
        loss = loss_fn(logits.reshape(-1, logits.size(-1)), b.tgt_out.reshape(-1), ignore_index=pad_index,
                       reduction="sum", label_smoothing=label_smoothing)
        (loss / max(n_tokens, 1)).backward()
        total = loss.detach() if total is None else total + loss.detach()
    norm = clip_gradients(model.parameters(), clip_grad_norm)
    if skip_nonfinite:
        finite = torch.isfinite(total) if norm is None else torch.isfinite(total) & torch.isfinite(norm)
        if not bool(finite):  # the one host read of skip mode
            optimizer.zero_grad(set_to_none=True)
            return total, n_tokens, True
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total, n_tokens, False


__all__ = ["update"]
