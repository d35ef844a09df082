"""One optimisation step on one batch, or on several with gradient accumulation (shared by the
trainer and the training benchmark)."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from typing import Callable, Literal

import torch
from torch import Tensor, nn

from nmt.data.batching import Batch
from nmt.models.seq2seq import length_mask
from nmt.train.coverage_loss import coverage_loss
from nmt.train.precision import TrainPrecision
from nmt.utils.precision import float32_if_half

SkipReason = Literal["nonfinite", "overflow"]
"""Why :func:`update` dropped an update: a non-finite loss (or gradient norm), or fp16 gradients
that overflowed at the current loss scale."""
LossForward = Callable[[nn.Module, Callable, Tensor, Tensor, Tensor, Tensor, int, float, Tensor | None], Tensor]


def loss_forward(model: nn.Module, loss_fn: Callable, src: Tensor, src_lengths: Tensor, tgt_in: Tensor,
                 tgt_out: Tensor, pad_index: int, label_smoothing: float,
                 src_mask: Tensor | None = None, coverage_weight: float = 0.0) -> Tensor:
    """Teacher-forced forward and summed Fenchel-Young loss (a 0-d tensor, float32 or wider
    under autocast too); what ``training.compile`` compiles. src: (B, L); src_lengths: (B,);
    tgt_in, tgt_out: (B, T); ``src_mask``: the lengths' mask (B, L) on src's device, made by the
    caller (see :func:`update`), or None (the model makes it). ``coverage_weight`` > 0 adds that
    times the summed coverage loss of the pass's attention (``training.coverage_loss``)."""
    logits, attention = model(src, src_lengths, tgt_in, src_mask=src_mask)
    target = output_target(model, logits, tgt_out, src, src_lengths, src_mask)
    loss = summed_output_loss(loss_fn, logits, tgt_out, pad_index, label_smoothing, target)
    if coverage_weight > 0:
        loss = loss + coverage_weight * coverage_loss(attention, tgt_out, pad_index)
    return loss


def output_target(model: nn.Module, scores: Tensor, tgt_out: Tensor, src: Tensor, src_lengths: Tensor,
                  src_mask: Tensor | None) -> Tensor:
    """What the output loss of the teacher-forced ``scores`` takes: ``tgt_out`` (B, T) itself, or
    where the model copies source tokens (``model.output.copy``) the distribution (B, T, V + L) of
    ``model.output_target`` (``model`` may be wrapped by DistributedDataParallel)."""
    inner = getattr(model, "module", model)
    if not getattr(inner, "copies", False):
        return tgt_out
    mask = length_mask(src_lengths, src.size(1), src.device) if src_mask is None else src_mask
    return inner.output_target(scores, tgt_out, src, mask)


def summed_output_loss(loss_fn: Callable, logits: Tensor, tgt_out: Tensor, pad_index: int,
                       label_smoothing: float, target: Tensor | None = None) -> Tensor:
    """``loss_fn`` of the teacher-forced ``logits`` (B, T, V) at ``tgt_out`` (B, T), summed over the
    target tokens (``pad_index`` ignored); half logits summed in float32 (0-d). ``target``: a
    distribution (B, T, C) to take instead of ``tgt_out``'s tokens (:func:`output_target` of a
    copying model; ``tgt_out`` then only says which rows are padding), or None / ``tgt_out``.
    Label smoothing ``e`` then mixes the losses, ``(1 - e) L(z; target) + e L(z; uniform over the
    finite scores)``, not the targets: a copying model's target is the minimiser of the set loss
    (:func:`nmt.sparse.set_target`), so the gradient ``p - (1 - e) target - e uniform`` is the
    exact gradient of that mixture (of mixed targets it would not be)."""
    logits = float32_if_half(logits)  # a float32 sum
    if target is not None and target.is_floating_point():
        scores, dist = logits.reshape(-1, logits.size(-1)), target.reshape(-1, logits.size(-1))
        rows = loss_fn(scores, dist, reduction="none")
        if label_smoothing > 0:  # (1 - e) L(z; q) + e L(z; uniform): exact gradient where q is a minimiser
            rows = (1 - label_smoothing) * rows + label_smoothing * loss_fn(scores, dist, reduction="none",
                                                                            label_smoothing=1.0)
        return torch.where(tgt_out.reshape(-1) != pad_index, rows, 0).sum()
    return loss_fn(logits.reshape(-1, logits.size(-1)), tgt_out.reshape(-1), ignore_index=pad_index,
                   reduction="sum", label_smoothing=label_smoothing)


def separate_gradients(params: Iterable[nn.Parameter]) -> None:
    """Give every parameter a ``.grad`` of its own where two share one tensor.

    Inductor's compiled backward returns one tensor for equal gradients (an LSTM cell's
    ``bias_ih`` and ``bias_hh``), and autograd stores that tensor as the ``.grad`` of both; the
    in-place steps that follow (the next accumulated batch's ``+=``, clipping, the fp16 unscale)
    would then act on it twice. Host metadata only (a few us), no sync. ``params``: best a list
    the caller walked once (:func:`update` passes the one it clips): each ``model.parameters()``
    walks the modules, some 300 Python calls for the Multi30k LSTM, host time of an eager GPU step."""
    seen: set[int] = set()
    for p in params:
        grad = p.grad
        if grad is None or grad.numel() == 0:
            continue
        if grad.data_ptr() in seen:
            p.grad = grad.clone()
        else:
            seen.add(grad.data_ptr())


def update(model: nn.Module, loss_fn: Callable, optimizer: torch.optim.Optimizer, batch: Batch | Sequence[Batch],
           pad_index: int, clip_grad_norm: float | None = None, label_smoothing: float = 0.0,
           skip_nonfinite: bool = False, loss_scale: float | Sequence[float] | None = None,
           all_ranks: Callable[[Tensor], Tensor] | None = None, *, precision: TrainPrecision | None = None,
           forward: LossForward = loss_forward, normalization: str = "tokens") -> tuple[Tensor, int, SkipReason | None]:
    """Forward (under ``precision``'s autocast), Fenchel-Young loss, backward (per batch), clip,
    step (once).

    ``batch`` is one batch or a sequence of N batches whose gradients are accumulated. The
    loss is summed over target tokens and divided by the number of target tokens of ALL the
    batches before each backward (``normalization="tokens"``: a per-token mean; ``"sents"``: by
    the number of their sentences, OpenNMT-py's ``normalization: sents``), so N batches give
    exactly the gradient of one batch holding all their sentences. ``forward`` computes the summed loss
    (``loss_forward``, or its compiled form). Returns ``(summed loss, a detached 0-d tensor
    left on the device; number of target tokens, a host int known from the batches;
    skipped)``: the caller reads the loss only when it logs. ``skipped`` is None when the
    optimizer stepped, else why the update was dropped (no optimizer step):

    - ``"nonfinite"``: with ``skip_nonfinite``, the loss (or the clipped gradient norm) is NaN /
      inf; with fp16 also without it (the scaler drops the step anyway; the caller's
      ``nonfinite: stop`` then stops);
    - ``"overflow"``: fp16 only, the loss is finite but the unscaled gradients hold inf/NaN at
      the current loss scale; the scale is lowered (``GradScaler``).

    Host syncs: fp32 / bf16 without ``skip_nonfinite`` none here; otherwise one read of a few
    flags per update (see :mod:`nmt.train.precision` for fp16: the read GradScaler makes anyway
    unless the optimizer is fused). The model's encoder needs the source lengths on the host
    (keep ``batch.src_lengths`` there, as the trainer does), and the loss and optimizer must be
    sync-free (the losses are; fused Adam or SGD).

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
    precision = precision or TrainPrecision("fp32", batches[0].src.device)
    n_tokens = sum(int(b.n_tokens) for b in batches)
    if normalization not in ("tokens", "sents"):
        raise ValueError(f"normalization: expected 'tokens' or 'sents', got {normalization!r}")
    divisor = max(n_tokens if normalization == "tokens" else sum(len(b) for b in batches), 1)
    scales = (list(loss_scale) if isinstance(loss_scale, Sequence) else [loss_scale] * len(batches))
    total: Tensor | None = None
    params = list(model.parameters())  # one walk of the modules per update, for both uses below
    for i, (b, scale) in enumerate(zip(batches, scales)):
        last = i == len(batches) - 1
        with nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync():
            # the source mask made here, outside a compiled forward: from host lengths a graph
            # would copy them itself (a sync), and CUDA graphs skip a graph with a host input
            src_mask = length_mask(b.src_lengths, b.src.size(1), b.src.device)
            extra = {} if b.align is None else {"align": b.align}  # guided alignment's references
            with precision.autocast():
                loss = forward(model, loss_fn, b.src, b.src_lengths, b.tgt_in, b.tgt_out, pad_index,
                               label_smoothing, src_mask, **extra)
            precision.backward(loss / divisor if scale is None else loss * scale)
        separate_gradients(params)
        loss = loss.detach() if scale != 0 else torch.zeros_like(loss.detach())
        total = loss if total is None else total + loss
    norm = precision.clip(optimizer, params, clip_grad_norm)
    overflow = precision.overflow(optimizer)  # None unless fp16
    if not skip_nonfinite and overflow is None:  # fp32 / bf16 with nonfinite: stop: no host read
        precision.step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        return total, n_tokens, None
    zero = torch.zeros((), dtype=torch.bool, device=total.device)
    flags = torch.stack([~torch.isfinite(total),  # bad: loss, gradient norm (skip mode), loss-scale overflow
                         ~torch.isfinite(norm) if skip_nonfinite and norm is not None else zero,
                         overflow.to(total.device) > 0 if overflow is not None else zero])
    if all_ranks is not None:  # bad on any rank (gradients are all-reduced: an overflow is on all)
        flags = ~all_ranks(~flags)
    loss_bad, norm_bad, overflowed = flags.tolist()  # the one host read (see the docstring)
    skipped: SkipReason | None = None
    if loss_bad:  # under nonfinite: stop too (fp16): the caller stops on it
        skipped = "nonfinite"
    elif overflowed:  # the unscaled gradients hold inf/NaN at this loss scale
        skipped = "overflow"
    elif norm_bad:
        skipped = "nonfinite"
    if skipped is None:
        precision.step(optimizer, overflow=False if overflow is not None else None)
    else:  # fp16: the scale is lowered when any rank overflowed, on every rank alike
        precision.skip(optimizer, overflow=overflowed if overflow is not None else None)
    optimizer.zero_grad(set_to_none=True)
    return total, n_tokens, skipped

__all__ = ["SkipReason", "loss_forward", "output_target", "separate_gradients", "summed_output_loss", "update"]
