"""Mixed-precision training: autocast of the forward pass, loss scaling for fp16.

``training.precision``: ``fp32`` (plain), ``bf16`` (autocast to bfloat16; no loss scaling;
works on CPU too) or ``fp16`` (autocast to float16 with a ``torch.amp.GradScaler``: the loss is
scaled before backward, gradients unscaled before clipping, steps with inf/NaN gradients
skipped). The probability mappings and losses compute half inputs in float32.

Host syncs: none of its own. With fp16 the scaler's skip decision stays on the device when the
optimizer supports it (fused Adam does); otherwise ``GradScaler.step`` reads one flag.
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

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Step the optimizer (after ``clip``); fp16: the scaler skips steps with inf/NaN gradients."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()

    def skip(self, optimizer: torch.optim.Optimizer) -> None:
        """An update dropped after ``clip``: only the loss scale is updated (fp16)."""
        if self.scaler is not None:
            self.scaler.update()

    def state_dict(self) -> dict:
        """The loss scaler's state (empty without one), for checkpoints."""
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)


__all__ = ["TrainPrecision"]
