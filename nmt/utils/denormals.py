"""Subnormal floats flushed to zero for CPU training (the x86 FTZ and DAZ modes).

A softmax output layer's gradient, ``softmax(z) - y``, holds probabilities below float32's
smallest normal number (1.2e-38) once the model is confident; a product that reads such subnormal
inputs runs through the processor's slow path: (900, 3963) x (3963, 256) of subnormal inputs took
1,000 ms against 5.4 ms with the modes on (Intel Xeon, 2 threads, torch 2.13), and a softmax
training step of the Multi30k LSTM 142 -> 137-139 ms (its backward 80 -> 72-74 ms; the 1.5-entmax
gradient has exact zeros instead). With the modes on, results below 1.2e-38 become 0 and such
inputs read as 0: nothing a training step can tell apart.

The modes belong to each thread, and a new thread copies its creator's: they reach torch's
OpenMP workers (which run the products) only when set before that pool starts, i.e. at the start
of a program. ``nmt-train`` sets them first thing and clears them on the way out (its own thread);
decoding leaves them off (certificates count probabilities down to the smallest subnormal).
``NMT_FLUSH_DENORMAL=0`` leaves them off. No effect where the processor lacks them (not x86).
"""
from __future__ import annotations

import os

import torch

_state = {"set": False}


def flush_denormals() -> bool:
    """Turn FTZ / DAZ on for this thread (and the threads it creates later) unless
    ``NMT_FLUSH_DENORMAL=0``; returns True when they are on now by this call."""
    if os.environ.get("NMT_FLUSH_DENORMAL", "1") == "0" or _state["set"]:
        return False
    _state["set"] = bool(torch.set_flush_denormal(True))
    return _state["set"]


def restore_denormals() -> None:
    """Turn the modes off again on this thread if :func:`flush_denormals` turned them on."""
    if _state["set"]:
        torch.set_flush_denormal(False)
        _state["set"] = False


__all__ = ["flush_denormals", "restore_denormals"]
