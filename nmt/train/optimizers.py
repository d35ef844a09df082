"""Optimizer construction from the ``training.optimizer`` config section."""
from __future__ import annotations

from typing import Iterable

import torch

from nmt.train.adafactor import Adafactor


OPTIMIZERS = ("adam", "adamw", "sgd", "adafactor")
"""``training.optimizer.name``'s values."""


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: dict) -> torch.optim.Optimizer:
    """The optimizer of the ``training.optimizer`` section ``cfg`` over the trainable ``params``:
    Adam or AdamW (fused: one kernel per step and no host read of the step counters), SGD (with
    ``momentum``, ``nesterov``), or :class:`nmt.train.adafactor.Adafactor` (``cfg["adafactor"]``'s
    settings). None of them reads the device from the host in its step. With ``decay_vectors``
    false (and a weight decay), two parameter groups: the matrices and embeddings (2-D and up)
    with ``weight_decay``, the vectors (biases, norm gains: 1-D and scalars) without; else one group."""
    params = [p for p in params if p.requires_grad]
    name = cfg["name"]
    if not cfg.get("decay_vectors", True) and cfg["weight_decay"] > 0:
        params = parameter_groups(params)
    if name in ("adam", "adamw"):
        adam = torch.optim.Adam if name == "adam" else torch.optim.AdamW
        return adam(params, lr=cfg["lr"], betas=tuple(cfg["betas"]), eps=cfg["eps"],
                    weight_decay=cfg["weight_decay"], fused=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=cfg["lr"], momentum=cfg["momentum"], weight_decay=cfg["weight_decay"],
                               nesterov=cfg.get("nesterov", False))
    if name == "adafactor":  # the section's keys, Adafactor's defaults for those left out
        return Adafactor(params, lr=cfg["lr"], weight_decay=cfg["weight_decay"], **cfg.get("adafactor", {}))
    raise ValueError(f"training.optimizer.name: unknown optimizer {name!r}; valid: {', '.join(OPTIMIZERS)}")


def parameter_groups(params: Iterable[torch.nn.Parameter]) -> list[dict]:
    """``[{"params": matrices}, {"params": vectors, "weight_decay": 0.0}]``: the parameters of two
    dimensions and more (weight matrices, embeddings), which take the optimizer's weight decay, and
    those of fewer (biases, norm gains, scalars such as learned alphas), which take none; each
    group in the order given (a group left empty is kept: the groups' count is the state's)."""
    params = list(params)
    return [{"params": [p for p in params if p.dim() >= 2]},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def clip_gradients(params: Iterable[torch.nn.Parameter], max_norm: float | None) -> torch.Tensor | None:
    """Clip the global gradient norm in place; returns the norm before clipping (a tensor, no sync)."""
    if max_norm is None:
        return None
    return torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], max_norm)


__all__ = ["OPTIMIZERS", "build_optimizer", "clip_gradients", "parameter_groups"]
