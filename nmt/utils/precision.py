"""Numeric precision of model computations: names, dtypes and the autocast context.

``"fp32"`` runs everything in float32; ``"bf16"`` and ``"fp16"`` run the model under
``torch.autocast`` (matrix products in half precision, reductions and losses in float32; the
probability mappings compute half inputs in float32). fp16 needs loss scaling in training
(``torch.amp.GradScaler``); bf16 does not. bf16 autocast works on CPU too.
"""
from __future__ import annotations

import contextlib
from typing import ContextManager

import torch

PRECISIONS = ("fp32", "bf16", "fp16")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_precision(name: str) -> str:
    """``name`` if it is one of ``PRECISIONS``; ValueError naming the valid ones otherwise."""
    if name not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {name!r}")
    return name


def autocast_dtype(name: str) -> torch.dtype | None:
    """The autocast dtype of a precision name (None for fp32)."""
    return _DTYPES.get(check_precision(name))


def autocast(device: torch.device | str, name: str) -> ContextManager:
    """``torch.autocast`` for ``device``'s type at precision ``name`` (a no-op context for fp32)."""
    dtype = autocast_dtype(name)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


__all__ = ["PRECISIONS", "autocast", "autocast_dtype", "check_precision"]
