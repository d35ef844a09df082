"""Mixed-precision training: autocast of the forward pass, loss scaling for fp16.

``training.precision``: ``fp32`` (plain), ``bf16`` (autocast to bfloat16; no loss scaling;
works on CPU too) or ``fp16`` (autocast to float16 with a ``torch.amp.GradScaler``: the loss is
scaled before backward, gradients unscaled before clipping, steps with inf/NaN gradients
skipped). The probability mappings and losses compute half inputs in float32.

An fp16 update whose unscaled gradients hold inf/NaN (the loss scale was too high, as in the
scale search of the first updates) is dropped, as ``GradScaler.step`` does, and is *not an
update* (as fairseq's "gradient overflow detected, ignoring gradient"): the trainer neither
counts it as a step nor advances the lr schedule (see :mod:`nmt.train.overflow`).

Host syncs: :meth:`TrainPrecision.overflow` gives the skip decision as a device tensor, which
``nmt.train.update.update`` reads once per fp16 update (with its other flags, in one read). For
an optimizer without fused loss-scale handling (SGD) this is the read ``GradScaler.step`` makes
anyway (``found_inf.item()``), which :meth:`step` then does not repeat; for fused Adam, whose
step would skip on the device, it is one read per update that fp16 adds (a step counter that
follows applied updates needs the decision on the host). fp32 and bf16 read nothing.
"""
from __future__ import annotations

from typing import ContextManager, Iterable

import torch

from nmt.train.optimizers import clip_gradients
from nmt.utils.precision import autocast, check_precision


class TrainPrecision:
    """Autocast, backward and optimizer step at precision ``name`` on ``device``."""

    def __init__(self, name: str = "fp32", device: torch.device | str = "cpu") -> None:
        self.name = check_precision(name)
        self.device = torch.device(device)
        self.scaler = torch.amp.GradScaler(self.device.type) if name == "fp16" else None

    def autocast(self) -> ContextManager:
        """The context in which the forward pass and the loss run."""
        return autocast(self.device, self.name)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, scaled for fp16."""
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def clip(self, optimizer: torch.optim.Optimizer, params: Iterable[torch.nn.Parameter],
             clip_grad_norm: float | None) -> torch.Tensor | None:
        """Unscale the gradients (fp16) and clip their norm to ``clip_grad_norm``; returns the norm
        before clipping (a device tensor; None without clipping)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        return clip_gradients(params, clip_grad_norm)

    def overflow(self, optimizer: torch.optim.Optimizer) -> torch.Tensor | None:
        """After :meth:`clip`: a 0-d float32 device tensor, nonzero when the scaler found inf/NaN
        in the unscaled gradients of ``optimizer`` (fp16; the step must then be skipped), or None
        without a scaler. No host read. (``GradScaler``'s record of ``unscale_``, read as its own
        ``step`` and ``update`` read it.)"""
        if self.scaler is None:
            return None
        found = list(self.scaler._found_inf_per_device(optimizer).values())
        if not found:
            raise RuntimeError("TrainPrecision.overflow: call clip() (which unscales) first")
        device = self.scaler._get_scale_async().device
        total = found[0].to(device, non_blocking=True)
        for more in found[1:]:  # a model over several devices
            total = total + more.to(device, non_blocking=True)
        return total

    def scale(self) -> torch.Tensor | None:
        """The current loss scale, a 0-d float32 device tensor (no host read), or None without a scaler."""
        return self.scaler._get_scale_async() if self.scaler is not None else None

    def step(self, optimizer: torch.optim.Optimizer, overflow: bool | None = None) -> None:
        """Step the optimizer (after ``clip``); fp16: the scaler skips steps with inf/NaN gradients.

        ``overflow``: the host value of :meth:`overflow` when the caller read it (then nothing is
        read here: an overflow skips the step, as ``GradScaler.step`` would, and lowers the
        scale); None lets ``GradScaler.step`` decide (it reads the flag itself unless the
        optimizer is fused)."""
        if self.scaler is None:
            optimizer.step()
            return
        if overflow is None:
            self.scaler.step(optimizer)
        elif not overflow:  # unscaled (clip) and checked finite: GradScaler.step's own step
            optimizer.step()
        self.scaler.update()

    def skip(self, optimizer: torch.optim.Optimizer, overflow: bool | None = None) -> None:
        """An update dropped after ``clip``: only the loss scale is updated (fp16).

        ``overflow``: whether the update overflowed by the decision of all ranks (data-parallel
        training: see ``nmt.train.update.update``). The scale then follows it, not this rank's own
        finding: a rank whose scaler found no inf while another's did would keep its scale while
        the others halve theirs, and the all-reduced gradients, scaled by different factors, would
        unscale to different updates on each rank. None: this rank's finding (one process).
        Written on the device (a fill), no host read."""
        if self.scaler is None:
            return
        if overflow is not None:
            for found in self.scaler._found_inf_per_device(optimizer).values():
                found.fill_(1.0 if overflow else 0.0)
        self.scaler.update()

    def state_dict(self) -> dict:
        """The loss scaler's state (empty without one), for checkpoints."""
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)


__all__ = ["TrainPrecision"]
