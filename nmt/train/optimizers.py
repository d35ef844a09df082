"""Optimizer construction from the ``training.optimizer`` config section."""
from __future__ import annotations

from typing import Iterable

import torch


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: dict) -> torch.optim.Optimizer:
    """Adam (fused) or SGD from ``cfg`` = ``{name, lr, betas, eps, momentum, weight_decay}``."""
    params = [p for p in params if p.requires_grad]
    name = cfg["name"]
    if name == "adam":
        # fused: one kernel per step and no host read of the step counters (sync-free)
        return torch.optim.Adam(params, lr=cfg["lr"], betas=tuple(cfg["betas"]), eps=cfg["eps"],
                                weight_decay=cfg["weight_decay"], fused=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=cfg["lr"], momentum=cfg["momentum"], weight_decay=cfg["weight_decay"])
    raise ValueError(f"training.optimizer.name: unknown optimizer {name!r}; valid: adam, sgd")


def clip_gradients(params: Iterable[torch.nn.Parameter], max_norm: float | None) -> torch.Tensor | None:
    """Clip the global gradient norm in place; returns the norm before clipping (a tensor, no sync)."""
    if max_norm is None:
        return None
    return torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], max_norm)


__all__ = ["build_optimizer", "clip_gradients"]
