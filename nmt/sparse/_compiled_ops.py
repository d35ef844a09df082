"""Custom operators (``torch.library``, namespace ``nmt``) through which compiled graphs call
nmt's own algorithms as single opaque nodes.

While ``torch.compile`` traces, a mapping can neither run the CPU algorithm (its candidate sets
have data-dependent sizes) nor launch the Triton kernels through their Python wrappers; traced
instead, the static path puts its fixed solver steps into the graph at every call site (a
compiled 1.5-entmax LSTM step took four times softmax's compile time for them). Registered as
custom operators, dynamo and AOT autograd see only their output shapes (the fake implementations
below) and the compiled graph calls the eager implementation at run time:

* :func:`pruned_shifted_threshold`: the CPU algorithm of the threshold front door
  (:func:`nmt.sparse._threshold.pruned_shifted_threshold`), which ``impl="auto"`` picks for CPU
  tensors while compiling, as it does in eager mode;
* the Triton kernels (:mod:`nmt.sparse._triton`, when importable), which ``impl="auto"`` picks
  on CUDA while compiling as in eager mode: one launch per mapping, loss or backward, captured
  by CUDA graphs (``mode="reduce-overhead"``) like any kernel; no host synchronisation.

Each operator computes what the function it wraps computes (the same values, bit for bit); the
gradients stay with the mappings' and losses' autograd Functions, which call the backward
operators. :func:`nmt.sparse._dispatch.kernels` returns the namespace the Functions call: these
operators while compiling, the plain functions otherwise (an operator's dispatch costs
microseconds per eager call).
"""
from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from . import _threshold

try:  # optional fused kernels (CUDA + Triton)
    from . import _triton
except ImportError:
    _triton = None


def _operator(name: str, schema: str, impl: Callable[..., Any], fake: Callable[..., Any]) -> Any:
    """``impl`` registered as the custom operator ``nmt::name`` with ``schema`` and its fake
    (shape-only) implementation; returns the callable operator."""
    op = torch.library.custom_op(f"nmt::{name}", impl, mutates_args=(), schema=schema)
    op.register_fake(fake)
    return op


def _rows_1(x: Tensor) -> Tensor:
    return x.new_empty((*x.shape[:-1], 1))


def _pruned_impl(x: Tensor, q_rows: Optional[Tensor], q: float, scale: float, tol: Optional[float],
                 n_iter: Optional[int]) -> tuple[Tensor, Tensor]:
    return _threshold.pruned_shifted_threshold(x, q if q_rows is None else q_rows, scale, tol, n_iter)


_pruned_op = _operator(
    "pruned_shifted_threshold",
    "(Tensor x, Tensor? q_rows, float q, float scale, float? tol, SymInt? n_iter) -> (Tensor, Tensor)",
    _pruned_impl, lambda x, q_rows, q, scale, tol, n_iter: (_rows_1(x), _rows_1(x)))


def pruned_shifted_threshold(x: Tensor, q: _threshold.Power, scale: float, tol: Optional[float],
                             n_iter: Optional[int]) -> tuple[Tensor, Tensor]:
    """:func:`nmt.sparse._threshold.pruned_shifted_threshold` as one operator of a compiled graph:
    ``x: (..., n)`` -> ``(tau_rel, zmax)``, both ``(..., 1)``; ``q`` a float or per-row powers
    broadcastable to ``(..., 1)``. Synchronises with the host as the CPU algorithm does."""
    if isinstance(q, Tensor):
        q_rows = q.expand(*x.shape[:-1], 1).contiguous()
        return _pruned_op(x, q_rows, 0.0, float(scale), tol, n_iter)
    return _pruned_op(x, None, float(q), float(scale), tol, n_iter)


def _kernel_operators() -> Optional[SimpleNamespace]:
    """The Triton kernels' wrappers as operators, under the names of :mod:`nmt.sparse._triton`
    (None without it)."""
    if _triton is None:
        return None
    t = _triton

    def like(x: Tensor, dtype: Optional[torch.dtype] = None) -> Tensor:
        return x.new_empty(x.shape, dtype=dtype or x.dtype)

    def per_row(x: Tensor, dtype: torch.dtype) -> Tensor:  # one value per row of x: (..., n)
        return x.new_empty((x.numel() // x.shape[-1] if x.shape[-1] else math.prod(x.shape[:-1]),), dtype=dtype)

    def loss(x: Tensor, reduction: str) -> Tensor:
        dtype = torch.promote_types(x.dtype, torch.float32)
        return per_row(x, dtype) if reduction == "none" else x.new_empty((), dtype=dtype)

    def work(x: Tensor, reduction: str, per_row_values: int) -> Tensor:  # see _triton._index_loss_outputs
        blocks = per_row_values + (reduction != "none")
        return x.new_empty((2 + blocks * x.shape[0],), dtype=torch.promote_types(x.dtype, torch.float32))

    def grad_like(p: Tensor, g: Tensor) -> Tensor:
        return like(g, torch.promote_types(p.dtype, g.dtype))

    ops = {
        "sparsemax_forward": ("(Tensor x2d) -> Tensor", t.sparsemax_forward, lambda x: like(x)),
        "entmax15_forward": ("(Tensor x2d) -> Tensor", t.entmax15_forward, lambda x: like(x)),
        "entmax_forward": ("(Tensor x2d, Tensor alpha_rows) -> Tensor", t.entmax_forward,
                           lambda x, a: like(x)),
        "entmax_forward_scalar": ("(Tensor x2d, float alpha) -> Tensor", t.entmax_forward_scalar,
                                  lambda x, a: like(x)),
        "sparsemax_backward": ("(Tensor p, Tensor g) -> Tensor", t.sparsemax_backward, grad_like),
        "entmax15_backward": ("(Tensor p, Tensor g) -> Tensor", t.entmax15_backward, grad_like),
        "entmax_backward": ("(Tensor p, Tensor g, Tensor alpha_rows) -> Tensor", t.entmax_backward,
                            lambda p, g, a: grad_like(p, g)),
        "entmax_backward_scalar": ("(Tensor p, Tensor g, float alpha) -> Tensor", t.entmax_backward_scalar,
                                   lambda p, g, a: grad_like(p, g)),
        "entmax_backward_alpha": ("(Tensor p, Tensor g, Tensor alpha_rows) -> (Tensor, Tensor)",
                                  t.entmax_backward_alpha,
                                  lambda p, g, a: (grad_like(p, g), per_row(p, torch.float32))),
        "tsallis_probs_conj": ("(Tensor x2d, float alpha) -> (Tensor, Tensor, Tensor)", t.tsallis_probs_conj,
                               lambda x, alpha: (like(x), per_row(x, x.dtype), per_row(x, x.dtype))),
        "tsallis_index_loss": (
            "(Tensor x2d, Tensor target, int ignore_index, float eps, float alpha, str reduction)"
            " -> (Tensor, Tensor, Tensor)",
            t.tsallis_index_loss,
            lambda x, tg, ii, eps, alpha, red: (like(x), loss(x, red), work(x, red, 1))),
        "cross_entropy_forward": (
            "(Tensor x2d, Tensor target, int ignore_index, float eps, str reduction) -> (Tensor, Tensor)",
            t.cross_entropy_forward,
            lambda x, tg, ii, eps, red: (loss(x, red), work(x, red, 2))),
        "cross_entropy_backward": (
            "(Tensor x2d, Tensor target, Tensor work, Tensor g, int ignore_index, float eps) -> Tensor",
            t.cross_entropy_backward, lambda x, tg, work, g, ii, eps: like(x)),
    }
    return SimpleNamespace(**{name: _operator(f"triton_{name}", schema, impl, fake)
                              for name, (schema, impl, fake) in ops.items()})


KERNEL_OPERATORS = _kernel_operators()
"""The Triton wrappers as operators (None without :mod:`nmt.sparse._triton`)."""

