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


def rng_state(device: torch.device | str | None = None) -> dict:
    """The current state of every generator (a dict of tensors / ints / lists). With a CUDA
    ``device`` (the training device) also its own generator's state (``cuda_device``), which a
    resume restores onto its training device, whatever that device's index (see
    :func:`set_rng_state`)."""
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
        if device is not None and torch.device(device).type == "cuda":
            state["cuda_device"] = torch.cuda.get_rng_state(torch.device(device))
    return state


def set_rng_state(state: dict, device: torch.device | str | None = None) -> None:
    """Restore generators saved by :func:`rng_state`: the CUDA ones by index (those this machine
    has; a resume may see fewer), then, with a CUDA ``device``, the saved training device's state
    onto ``device``: a run resumed on another GPU (cuda:1 -> cuda:0, fewer GPUs) continues its
    random stream instead of restarting it from the seed."""
    torch.set_rng_state(state["torch"].cpu())
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state((npy["kind"], npy["keys"].numpy().astype(np.uint32), npy["pos"],
                         npy["has_gauss"], npy["cached"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"][:torch.cuda.device_count()]])
    if "cuda_device" in state and device is not None and torch.device(device).type == "cuda":
        torch.cuda.set_rng_state(state["cuda_device"].cpu(), torch.device(device))


__all__ = ["seed_everything", "rng_state", "set_rng_state"]
