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


DEVICE_FORMS = "auto, cpu, cuda, cuda:N"
"""The device names the programs document (torch's other device types are accepted where usable)."""


def device_name_problem(name: str | torch.device) -> str | None:
    """Why ``name`` is not a device name at all (``gpu``, ``cuda:x``; one line listing
    :data:`DEVICE_FORMS`, not torch's list of every device type), or None when torch parses it."""
    if str(name) == "auto":
        return None
    try:
        torch.device(name)
    except (RuntimeError, ValueError, TypeError):
        return f"not a device name; valid: {DEVICE_FORMS}"
    return None


def indexed(device: str | torch.device) -> torch.device:
    """``device`` by an explicit index: a bare ``cuda`` (the current device of whichever thread
    uses it, at each use) as the current CUDA device now (``cuda:0``); other devices unchanged."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


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


def make_current(device: str | torch.device) -> None:
    """Make a CUDA ``device`` the process's current device (other devices: nothing). For the
    programs that run on one device (nmt-train, nmt-translate, the benchmarks): code that reads
    the current device (Triton launches, CUDA events, streams and graphs, ``synchronize()``) then
    works on it, not on ``cuda:0``. Not for the library API, where it would be a side effect."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is not None:  # a bare "cuda" is the current device already
        torch.cuda.set_device(device)  # (torch.cuda.set_device refuses a device without an index)


def host_to_device(tensor: torch.Tensor, device: str | torch.device, non_blocking: bool = False) -> torch.Tensor:
    """``tensor.to(device)`` without making the host wait where that is possible.

    A host tensor bound for CUDA is staged in pinned memory and copied with ``non_blocking``: a
    plain copy from pageable memory synchronises the host with the stream after it (torch waits
    for the copy, hence for all queued work), which drains the GPU's queue once per call. The
    copy is ordered on the current stream like any kernel, so later kernels see the data; torch's
    caching host allocator keeps the pinned stage until the copy has run. Any other pair of
    devices, and while ``torch.compile`` traces (the graph copies its host inputs itself):
    ``tensor.to(device, non_blocking=non_blocking)``. Returns the tensor on ``device``.
    """
    device = torch.device(device)
    if device.type == "cuda" and tensor.device.type == "cpu" and not torch.compiler.is_compiling():
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device, non_blocking=non_blocking)


__all__ = ["DEVICE_FORMS", "auto_device", "device_name_problem", "device_problem", "host_to_device", "indexed", "make_current"]
