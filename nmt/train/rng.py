"""Capture and restore every random-number generator a training run touches.

torch (CPU and, when present, every CUDA device), Python's ``random`` and numpy's global
generator. States are stored as tensors, ints and lists only, so checkpoints load with
``torch.load(weights_only=True)``.
"""
from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed torch (all devices), python ``random`` and numpy."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """The current state of every generator (a dict of tensors / ints / lists)."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": {"version": version, "internal": list(internal), "gauss": gauss},
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached": float(cached)},
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore generators saved by :func:`rng_state`."""
    torch.set_rng_state(state["torch"].cpu())
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state((npy["kind"], npy["keys"].numpy().astype(np.uint32), npy["pos"],
                         npy["has_gauss"], npy["cached"]))
    if "cuda" in state and torch.cuda.is_available():  # the devices this machine has (a resume may see fewer)
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"][:torch.cuda.device_count()]])


__all__ = ["seed_everything", "rng_state", "set_rng_state"]
