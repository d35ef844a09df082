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


def _reason(exc: BaseException, limit: int = 160) -> str:
    """The first line of an error, shortened to its first sentence when long (torch's dispatcher
    errors run on for a paragraph)."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    if len(line) > limit and ". " in line[:limit]:
        line = line[: line.index(". ") + 1]
    return line if len(line) <= limit else line[: limit - 3] + "..."


def device_problem(device: str | torch.device) -> str | None:
    """Why no tensor can be allocated on ``device`` (one line), or None when it can.

    A CUDA device asks CUDA's device count first (``cuda:1`` on a one-GPU machine: "this machine
    has 1 CUDA device (cuda:0)", not CUDA's "invalid device ordinal"), a device type whose torch
    module says it is unavailable (``mps``, ``xpu``) says so; then an empty tensor is allocated
    there (on CUDA this initialises the context once; no host sync).
    """
    try:
        device = torch.device(device)
        if device.type == "meta":
            return "the meta device holds no data"
        if device.type == "cuda":
            if not torch.cuda.is_available():
                return "CUDA is not available on this machine"
            count = torch.cuda.device_count()
            if device.index is not None and device.index >= count:
                last = "cuda:0" if count == 1 else f"cuda:0 to cuda:{count - 1}"
                return f"this machine has {count} CUDA device{'s' if count != 1 else ''} ({last})"
        elif device.type != "cpu":
            available = getattr(getattr(torch, device.type, None), "is_available", None)
            if callable(available) and not available():
                return f"no {device.type} device is available on this machine"
        torch.empty(0, device=device)
    except Exception as exc:  # RuntimeError, NotImplementedError (no backend), AssertionError (not compiled)
        return _reason(exc)
    return None


def checked_device(device: str | torch.device, what: str) -> str | torch.device:
    """``device`` unchanged when tensors can be allocated there; otherwise ValueError, one line naming
    the option ``what``: for the classes given a model's device (``Translator``, ``Scorer``), where
    ``"auto"`` is no answer (it is resolved where the model is loaded: ``nmt.load``, ``-device``)."""
    named = DEVICE_FORMS.replace("auto, ", "")
    if str(device) == "auto":
        raise ValueError(f"{what} auto: name the model's device ({named}); "
                         "auto is resolved when loading (nmt.load, -device)")
    if device_name_problem(device) is not None:
        raise ValueError(f"{what} {device}: not a device name; valid: {named}")
    problem = device_problem(device)
    if problem is not None:
        raise ValueError(f"{what} {device}: {problem}")
    return device


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


__all__ = ["DEVICE_FORMS", "auto_device", "checked_device", "device_name_problem", "device_problem", "host_to_device",
           "indexed", "make_current"]
