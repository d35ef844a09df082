"""Dropout of float32 CPU tensors with a counter-based mask in one native pass (``_dropout_mask.c``).

On the CPU ``torch.rand`` draws about 1.8 ns an entry on one thread (its Mersenne twister; 0.95 ms
at (64, 16, 512), 3.8 ms at (64, 16, 2048), 2 threads), and the mask then takes three more passes
(compare, convert, multiply): dropout is 5-8% of a CPU Transformer training step. Here each
entry's keep bit is a word of SplitMix64 at its index from a seed drawn from torch's generator
(so ``torch.manual_seed``, ``torch.random.fork_rng`` and a checkpoint's RNG state govern it as
they govern ``torch.rand``), and the mask and the product are made in one pass over the tensor,
split over torch's threads (the same bits for any split). The backward replays the mask from the
seed (nothing is kept but the seed). A dropped entry is 0 whatever its value (NaN included).

The library is built on first use like the mappings' (:func:`nmt.sparse._native.build`: the
system's C compiler, ``$NMT_CACHE_DIR``, atomic writes; ``NMT_NATIVE=0`` or no compiler: the
caller's torch path runs). No device is involved.
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Optional

import torch
from torch import Tensor

from nmt.sparse import _native

SOURCE = Path(__file__).with_name("_dropout_mask.c")
THREADS_MIN_NUMEL = 1 << 15
"""Tensors of at least this many entries split their pairs over torch's threads."""

_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
_SIGNATURE = [_P, _I64, _P, ctypes.c_uint32, ctypes.c_float, _P, _INT]

_LIBRARY = _native.NativeLibrary((SOURCE,), "dropout_mask", {"nmt_dropout_f32": (_SIGNATURE, None)},
                                "dropout mask")
build, load, library, _state = _LIBRARY.build, _LIBRARY.load, _LIBRARY.library, _LIBRARY.state
"""The library's :class:`~nmt.sparse._native.NativeLibrary` methods: ``build(directory, defines)``,
``load(path)``, ``library()`` (built on first use; None when disabled or where it cannot be built)."""


def threshold(p: float) -> int:
    """The 32-bit word below which an entry is dropped: ``round(p 2^32)`` (``0 < p < 1``)."""
    return min(max(round(p * 2.0 ** 32), 0), 2 ** 32 - 1)


def masked(x: Tensor, seed: Tensor, p: float, scale: float, out: Optional[Tensor] = None) -> Tensor:
    """``x * mask * scale`` for the mask of ``seed`` (a one-entry int64 CPU tensor, its bits the
    64-bit seed; the C code reads it: no host read here) and drop probability ``p`` (see the module
    docstring): ``x`` a contiguous float32 CPU tensor; written to ``out`` (a new tensor by default;
    ``x`` itself allowed). The library must be loaded (:func:`library`)."""
    lib = library()
    assert lib is not None, "masked needs the native library"
    assert seed.dtype is torch.int64 and seed.numel() == 1 and seed.device.type == "cpu"
    out = torch.empty_like(x) if out is None else out
    n = x.numel()
    if n:
        lib.nmt_dropout_f32(x.data_ptr(), n, seed.data_ptr(), threshold(p), scale, out.data_ptr(),
                            torch.get_num_threads() if n >= THREADS_MIN_NUMEL else 1)
    return out


def seed_tensor(value: int) -> Tensor:
    """A seed of :func:`masked` from a Python integer (its low 64 bits)."""
    value %= 2 ** 64
    return torch.tensor([value - 2 ** 64 if value >= 2 ** 63 else value], dtype=torch.int64)


def draw_seed() -> Tensor:
    """A 64-bit seed from torch's default CPU generator (one draw, as ``torch.rand`` would make), as
    the one-entry tensor :func:`masked` takes (never read on the host)."""
    return torch.randint(-2 ** 63, 2 ** 63 - 1, (1,), dtype=torch.int64)


class SeededMaskFunction(torch.autograd.Function):
    """``x * mask(seed) * scale``: linear in ``x`` for a given seed, so its backward is the same
    product of the gradient (the mask replayed from the seed), itself differentiable (double
    backward works as through ``x * mask``)."""

    @staticmethod
    def forward(ctx, x: Tensor, seed: Tensor, p: float, scale: float) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(seed)
        ctx.p, ctx.scale = p, scale
        return masked(x.contiguous(), seed, p, scale)

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        (seed,) = ctx.saved_tensors
        return SeededMaskFunction.apply(grad, seed, ctx.p, ctx.scale), None, None, None


def dropout(x: Tensor, p: float) -> Optional[Tensor]:
    """Training-mode dropout of ``x`` (CPU, float32, eager; ``0 < p < 1``) by the native mask, or
    None where it does not serve (another device or dtype, compiling, no library): the caller's
    torch path then runs. The seed is one draw of torch's generator (:func:`draw_seed`)."""
    if (x.device.type != "cpu" or x.dtype is not torch.float32 or torch.compiler.is_compiling()
            or library() is None):
        return None
    return SeededMaskFunction.apply(x, draw_seed(), p, 1.0 / (1.0 - p))


__all__ = ["SeededMaskFunction", "SOURCE", "THREADS_MIN_NUMEL", "build", "draw_seed", "dropout", "library",
           "load", "masked", "seed_tensor", "threshold"]
