"""Shared plumbing for the mapping kernels: dtype upcast, masking, moving ``dim`` last.

Every mapping kernel works on a float32/float64 tensor whose last dimension is the one
being normalised. Masked entries (``mask`` False) become ``-inf`` scores, which every
kernel turns into exact zeros; a row with no finite score maps to all zeros.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor

_UPCAST = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype used internally: half precisions are computed in float32."""
    return torch.float32 if dtype in _UPCAST else dtype


def log_probs_of(probs: Tensor) -> Tensor:
    """``log(probs)`` with exactly ``-inf`` where ``probs == 0`` (same shape and dtype).

    Never evaluates ``log(0)``: on CPU the vectorised log takes about 5x longer on zeros,
    which a sparse distribution is mostly made of. NaN stays NaN (never an exact zero).
    Elementwise only: no host synchronisation, static shapes, ``torch.compile(fullgraph=True)``
    friendly; differentiable with gradient ``1 / probs`` on the support and 0 at the zeros.
    """
    zero = probs <= 0
    return torch.where(zero, 1, probs).log_().masked_fill_(zero, float("-inf"))


def fresh_output(t: Tensor) -> Tensor:
    """``t`` as an autograd.Function's forward returns (and saves) it: ``t`` itself in eager mode,
    a copy while ``torch.compile`` traces.

    torch 2.11 computes wrong gradients under compile when a Function's forward returns a tensor
    that it modified in place (pytorch/pytorch#180642: the pre-mutation alias becomes an extra
    output and takes the returned tensor's gradient slot; measured here: softmax, sparsemax and
    alpha-entmax gradients off by 0.2-0.7). The copy costs nothing in eager mode and one fused
    copy in a compiled graph."""
    return t.clone() if torch.compiler.is_compiling() else t


_AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps", "hpu", "xla", "mtia", "maia", "ipu")
"""Device types that torch's autocast knows (asking about another one raises)."""


def autocast_device(t: Tensor) -> Optional[str]:
    """The device type of ``t`` where autocast is on there, else None (see :func:`own_precision`)."""
    device_type = "cuda" if t.is_cuda else "cpu" if t.is_cpu else t.device.type  # no device object
    if device_type in _AUTOCAST_DEVICES and torch.is_autocast_enabled(device_type):
        return device_type
    return None


def own_precision(t: Tensor) -> Any:
    """A context in which autocast is off on ``t``'s device where it is on there (else a null
    context). The mappings and losses compute in the dtype they chose (float32 for half-precision
    scores: their solvers' sums need it); autocast would lower their matrix and vector products
    (``matmul``, ``linalg.vecdot``) to half precision again (measured: 1.5-entmax rows summing to
    1 +- 8e-3 under bfloat16 autocast). No host synchronisation; traced by ``torch.compile``."""
    device_type = autocast_device(t)
    return contextlib.nullcontext() if device_type is None else torch.autocast(device_type, enabled=False)


def rows(t: Tensor) -> Tensor:
    """``t: (..., n)`` as a contiguous ``(R, n)`` tensor: ``t`` itself where it is one already (no
    view operation, nor its autograd node: host time of every eager kernel call)."""
    if t.dim() == 2 and t.is_contiguous():
        return t
    return t.reshape(-1, t.shape[-1]).contiguous()


def row_exponent(e: Tensor, like: Tensor) -> Tensor:
    """A per-row exponent ``e`` (broadcastable to ``like: (..., n)``, size 1 along the rows) as
    ``torch.pow`` over ``like`` takes it fastest: expanded to ``like``'s shape (one contiguous
    copy) for rows shorter than 64 entries on the CPU, else ``e`` itself. torch's CPU pow with
    an exponent broadcast along short rows leaves its vectorised loop: 1.3-1.9x slower a pass at
    (R, 16-63) than with the full exponent, 2 threads, equal from 64 entries (2026-11-27). A
    solver that raises to it at every step copies it once. No host synchronisation."""
    if like.is_cpu and like.shape[-1] < 64 and e.shape != like.shape:
        return e.expand(like.shape).contiguous()
    return e


def shaped(t: Tensor, shape: Sequence[int]) -> Tensor:
    """``t.view(shape)``, or ``t`` itself where it has that shape already."""
    return t if t.shape == shape else t.view(shape)


def apply_mask(scores: Tensor, mask: Optional[Tensor]) -> Tensor:
    """Return ``scores`` with ``-inf`` where ``mask`` is False (``mask`` broadcasts, True = keep)."""
    if mask is None:
        return scores
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor (True = keep), got {type(mask).__name__} "
                         f"{getattr(mask, 'dtype', '')}".rstrip())
    if not broadcasts_to(mask.shape, scores.shape):
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to scores of "
                         f"shape {tuple(scores.shape)}")
    return torch.where(mask, scores, float("-inf"))  # one operation where masked_fill(~mask) takes two


def broadcasts_to(shape: Sequence[int], target: Sequence[int]) -> bool:
    """Whether a tensor of ``shape`` broadcasts to ``target`` (every trailing size 1 or equal).

    Plain Python on the sizes: ``torch.broadcast_shapes`` goes through symbolic-shape helpers
    that cost 0.1-0.6 ms per call in torch 2.13, more than the mapping of an attention step."""
    if len(shape) > len(target):
        return False
    return all(a == 1 or a == b for a, b in zip(reversed(shape), reversed(target)))


def check_scores(scores: Tensor, dim: int) -> int:
    """Validate ``scores`` / ``dim``; return ``dim`` as a non-negative index."""
    if not isinstance(scores, Tensor):
        raise ValueError(f"scores must be a torch.Tensor, got {type(scores).__name__}")
    if not scores.is_floating_point():
        raise ValueError(f"scores must be a floating point tensor, got {scores.dtype}")
    if scores.dim() == 0:
        raise ValueError("scores must have at least one dimension")
    if not -scores.dim() <= dim < scores.dim():
        raise ValueError(f"dim={dim} is out of range for scores with {scores.dim()} dimensions")
    return dim % scores.dim()


def apply_last(kernel: Callable[[Tensor], Tensor], scores: Tensor, dim: int,
               mask: Optional[Tensor], takes_half: Optional[Callable[[Tensor], bool]] = None) -> Tensor:
    """Run ``kernel`` (on a last-dim, float32/64 tensor) over ``scores`` along ``dim``.

    Handles validation, masking, the half-precision upcast and the cast back. All steps
    are differentiable views/casts, so the kernel's own backward is used. An empty input
    (zero rows or a zero-width ``dim``) gives an empty result of the same shape.
    ``takes_half(x)``: True where ``kernel`` takes the float16 / bfloat16 last-dim tensor ``x``
    itself (the Triton kernels: they compute in float32 and store the input dtype, as the
    upcast would round), saving the two casts' passes, launches and autograd nodes.
    """
    dim = check_scores(scores, dim)
    dtype = scores.dtype
    if scores.numel() == 0:
        apply_mask(scores, mask)  # still validates the mask
        return scores.clone()
    x = apply_mask(scores, mask)
    last = dim == scores.dim() - 1  # already last: no permute (nor its autograd node)
    x = x if last else x.movedim(dim, -1)
    if dtype in _UPCAST and not (takes_half is not None and takes_half(x)):
        x = x.to(torch.float32)
    autocast = autocast_device(x)
    if autocast is None:  # (no null context's three calls at every attention step: host time)
        y = kernel(x)
    else:
        with torch.autocast(autocast, enabled=False):
            y = kernel(x)
    y = y if last else y.movedim(-1, dim)
    return y if y.dtype == dtype else y.to(dtype)
