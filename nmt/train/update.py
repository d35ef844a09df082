"""One optimisation step on one batch, or on several with gradient accumulation (shared by the
trainer and the training benchmark)."""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Callable

import torch
from torch import nn

from nmt.data.batching import Batch
from nmt.train.optimizers import clip_gradients


def update(model: nn.Module, loss_fn: Callable, optimizer: torch.optim.Optimizer, batch: Batch | Sequence[Batch],
           pad_index: int, clip_grad_norm: float | None = None, label_smoothing: float = 0.0,
           skip_nonfinite: bool = False, loss_scale: float | Sequence[float] | None = None,
           all_ranks: Callable[[torch.Tensor], torch.Tensor] | None = None) -> tuple[torch.Tensor, int, bool]:
    """Forward, Fenchel-Young loss, backward (per batch), clip, step (once).

    ``batch`` is one batch or a sequence of N batches whose gradients are accumulated. The
    loss is summed over target tokens and divided by the number of target tokens of ALL the
    batches before each backward, so N batches give exactly the gradient of one batch
    holding all their sentences (a per-token mean). Returns ``(summed loss, detached 0-d
    tensor; number of target tokens; skipped)``. With ``skip_nonfinite`` an update whose loss
    (or clipped gradient norm) is NaN / inf is dropped: no optimizer step, ``skipped`` True;
    deciding that reads one flag from the device. Otherwise nothing here synchronises with the
    device besides reading the batches' ``n_tokens`` (ints), and ``skipped`` is False.

    Data-parallel training (``nmt.train.distributed``) passes ``model`` wrapped in
    DistributedDataParallel (gradients are all-reduced only in the last batch's backward, the
    others run under ``no_sync``), ``loss_scale`` (each batch's summed loss is multiplied by it,
    or by its own entry, instead of divided by the local token count: ``world_size / global
    target tokens``; a batch of scale 0, a rank's stand-in for an empty part, adds nothing to
    the returned loss) and ``all_ranks``, which makes the skip decision the same on every rank.
    """
    batches = [batch] if isinstance(batch, Batch) else list(batch)
    if not batches:
        raise ValueError("update needs at least one batch")
    n_tokens = sum(int(b.n_tokens) for b in batches)
    scales = (list(loss_scale) if isinstance(loss_scale, Sequence) else [loss_scale] * len(batches))
    total: torch.Tensor | None = None
    for i, (b, scale) in enumerate(zip(batches, scales)):
        last = i == len(batches) - 1
        with nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync():
            logits, _ = model(b.src, b.src_lengths, b.tgt_in)
            loss = loss_fn(logits.reshape(-1, logits.size(-1)), b.tgt_out.reshape(-1), ignore_index=pad_index,
                           reduction="sum", label_smoothing=label_smoothing)
            (loss / max(n_tokens, 1) if scale is None else loss * scale).backward()
        loss = loss.detach() if scale != 0 else torch.zeros_like(loss.detach())
        total = loss if total is None else total + loss
    norm = clip_gradients(model.parameters(), clip_grad_norm)
    if skip_nonfinite:
        finite = torch.isfinite(total) if norm is None else torch.isfinite(total) & torch.isfinite(norm)
        if all_ranks is not None:
            finite = all_ranks(finite)
        if not bool(finite):  # the one host read of skip mode
            optimizer.zero_grad(set_to_none=True)
            return total, n_tokens, True
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total, n_tokens, False


__all__ = ["update"]
