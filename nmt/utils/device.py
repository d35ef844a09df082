"""Device names: ``"auto"`` resolution and the check that a device can hold tensors.

Shared by training (``training.device``), decoding (``-device``) and the Python API; each caller
words its own error around the one-line reason returned here.
"""
from __future__ import annotations

import torch


def auto_device(name: str | torch.device) -> str:
    """``"auto"`` -> ``"cuda"`` when CUDA is available, else ``"cpu"``; any other name unchanged."""
    name = str(name)
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def device_problem(device: str | torch.device) -> str | None:
    """Why no tensor can be allocated on ``device`` (one line), or None when it can.

    Allocates an empty tensor there (on CUDA this initialises the context once; no host sync).
    """
    try:
        if torch.device(device).type == "meta":
            return "the meta device holds no data"
        torch.empty(0, device=torch.device(device))
    except Exception as exc:  # RuntimeError, NotImplementedError (no backend), AssertionError (not compiled)
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


__all__ = ["auto_device", "device_problem"]
