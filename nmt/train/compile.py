"""``training.compile`` and ``training.pad_to_multiple``: captured training and validation steps
with few shapes.

``compile_for_device(fn, device)`` wraps a step function in ``torch.compile``: on CUDA
``mode="reduce-overhead"`` (CUDA graphs: the decoder's many small kernels are replayed as one
graph) with static shapes, on CPU inductor's default mode. ``compile_loss_forward(device)`` is
that of ``nmt.train.update.loss_forward`` (model forward and summed loss); the trainer compiles
``nmt.train.validation.batch_statistics`` (teacher-forced validation sums) the same way. The
RNN encoder packs its batch and runs eagerly between graphs (cuDNN's call per layer, its lengths
on the host); with ``training.compile_encoder`` an LSTM encoder instead runs inside the graph over
the padded batch with its padding made inert (given the source mask, which the update step and
validation make): one graph for the whole forward pass, on CUDA one CUDA graph, at the cost of a
longer compilation (the LSTM is unrolled over time). Every distinct batch shape is a graph of
its own, so
``pad_to_multiple`` pads source and target lengths up to a multiple of k (padding is masked
in attention and ignored by the loss: same loss, same gradients).
"""
from __future__ import annotations

import os
import shutil
import sys
from dataclasses import replace
from typing import Callable, TypeVar

import torch
import torch.nn.functional as F

from nmt.data.batching import Batch
from nmt.train.update import LossForward, loss_forward

F_ = TypeVar("F_", bound=Callable)

MAX_GRAPHS = 64
"""Recompilation limit raised to this many shapes (buckets x batch sizes) per compiled step."""


COMPILE_OFF = "set training.compile: false to train without compiling"


def compiler_problem(device: torch.device | str) -> str | None:
    """Why inductor (``training.compile``) cannot build its code for ``device`` here, one line
    naming what is missing and the ways out, or None when the compiler it needs is found.

    On the CPU inductor writes C++ and compiles it with the first of ``torch._inductor.config
    .cpp.cxx`` it finds (``$CXX``, else ``g++``); on CUDA Triton compiles its kernel launchers
    with ``$CC``, else ``gcc`` or ``clang``. Both are looked up on ``PATH`` as inductor and
    Triton do (without running them): a missing compiler otherwise fails at the first training
    step, deep inside inductor, after the data and model were built. Other device types, and
    Windows (MSVC's own lookup), are left to torch."""
    kind = torch.device(device).type
    if sys.platform == "win32" or kind not in ("cpu", "cuda"):
        return None
    if kind == "cpu":
        from torch._inductor import config

        names = config.cpp.cxx if isinstance(config.cpp.cxx, (list, tuple)) else (config.cpp.cxx,)
        if os.environ.get("TORCH_INDUCTOR_INSTALL_GXX") and None in names:
            return None  # inductor installs g++ through conda itself
        wanted = [name for name in names if name is not None]
        if any(shutil.which(name) for name in wanted):
            return None
        cxx = os.environ.get("CXX")
        where = (f"CXX={cxx} is not an executable" if cxx and cxx in wanted
                 else f"{' or '.join(wanted) or 'g++'} is not on PATH")
        return (f"torch.compile (inductor) needs a C++ compiler for CPU training and finds none "
                f"({where}); install one (e.g. apt-get install g++, or point CXX at it) or {COMPILE_OFF}")
    cc = os.environ.get("CC")
    if cc:
        if shutil.which(cc):
            return None
        where = f"CC={cc} is not an executable"
    elif shutil.which("gcc") or shutil.which("clang"):
        return None
    else:
        where = "CC is unset and neither gcc nor clang is on PATH"
    return (f"torch.compile (inductor) needs a C compiler for Triton's CUDA kernels and finds none "
            f"({where}); install one (e.g. apt-get install gcc, or point CC at it) or {COMPILE_OFF}")


def compiler_failure(exc: BaseException) -> str | None:
    """The one-line reason when ``exc`` (raised by a compiled step) is inductor or Triton failing to
    find a compiler (one removed after :func:`compiler_problem` looked, or a path it could not
    judge); None for any other error."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text = str(exc)
        if type(exc).__name__ == "InvalidCxxCompiler" or "InvalidCxxCompiler" in text:
            return ("torch.compile (inductor) found no working C++ compiler (torch._inductor.config.cpp.cxx: "
                    f"$CXX, else g++); install one or {COMPILE_OFF}")
        if "Failed to find C compiler" in text:
            return f"torch.compile: Triton found no C compiler ($CC, else gcc or clang); install one or {COMPILE_OFF}"
        exc = exc.__cause__ or exc.__context__
    return None


def compile_for_device(fn: F_, device: torch.device | str, backend: str = "inductor",
                       encoder_in_graph: bool = False, cuda_graphs: bool = True) -> F_:
    """``fn`` compiled for ``device`` (CUDA graphs on CUDA, inductor default on CPU); ``backend``
    another ``torch.compile`` backend (tests use "aot_eager": same capture and autograd, no code
    generation). ``encoder_in_graph`` (``training.compile_encoder``): an LSTM encoder given the
    source mask runs inside the graph (dynamo's ``allow_rnn``, a process-wide setting, switched
    on; see :func:`nmt.models.inert_padding_lstm.traceable`); otherwise it packs between graphs.
    Compilation happens at the first call of each new shape. ``cuda_graphs=False``: inductor's
    default mode on CUDA too. Accumulated batches need it (measured on an H200): a replay
    overwrites the outputs of the batch before, whose loss and first gradients are still held."""
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, MAX_GRAPHS)
    torch._dynamo.config.allow_rnn = encoder_in_graph
    if torch.device(device).type == "cuda" and backend == "inductor" and cuda_graphs:
        return torch.compile(fn, mode="reduce-overhead", dynamic=False)
    return torch.compile(fn, backend=backend)


def compile_loss_forward(device: torch.device | str, backend: str = "inductor",
                         encoder_in_graph: bool = False, cuda_graphs: bool = True) -> LossForward:
    """``loss_forward`` compiled for ``device`` (see ``compile_for_device``)."""
    return compile_for_device(loss_forward, device, backend, encoder_in_graph, cuda_graphs)


def pad_to_multiple(batch: Batch, multiple: int, pad_index: int) -> Batch:
    """``batch`` with src (B, L) and tgt_in/tgt_out (B, T) padded with ``pad_index`` to lengths
    that are multiples of ``multiple`` (1: unchanged). Lengths and token counts are unchanged."""
    if multiple <= 1 or batch.tgt_in is None:
        return batch

    def widen(x: torch.Tensor) -> torch.Tensor:
        extra = -x.size(1) % multiple
        return F.pad(x, (0, extra), value=pad_index) if extra else x

    return replace(batch, src=widen(batch.src), tgt_in=widen(batch.tgt_in), tgt_out=widen(batch.tgt_out))


__all__ = ["MAX_GRAPHS", "compile_for_device", "compile_loss_forward", "compiler_failure", "compiler_problem",
           "pad_to_multiple"]
