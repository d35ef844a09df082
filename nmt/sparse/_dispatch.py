"""The threshold front door: one entry for every alpha-entmax threshold, choosing the algorithm.

``impl`` (every exact mapping, its threshold and its autograd Function take it):

* ``"pruned"``: the CPU algorithms. Exact thresholds of attention-sized inputs
  (:func:`nmt.sparse._threshold.prefer_sort`) by one sort and prefix sums (native code where a C
  compiler built it, :mod:`nmt.sparse._native`, with the mapping's output and backward in one
  call each on small inputs; else NumPy); the others by
  :func:`nmt.sparse._threshold.root_threshold`: pruned Newton with a checked loop and the
  verified closed-form finish. Fast on CPU; hands rows to NumPy or synchronises with the host
  a few times per call (loop tests, sizing the pruned candidates).
* ``"static"``: :mod:`nmt.sparse._static`: fixed passes, static shapes, no host synchronisation
  (forward and backward); traces under ``torch.compile(fullgraph=True)``.
* ``"triton"``: fused row-resident kernels (:mod:`nmt.sparse._triton`, optional: CUDA with
  Triton installed) for the mappings; thresholds themselves use ``"static"``.
* ``"auto"`` (default): ``"pruned"`` on the CPU, and on other devices ``"triton"`` where
  :func:`nmt.sparse._triton.is_available` accepts the input and it is not float64 (the kernels
  compute in float32), else ``"static"``. The same choice while ``torch.compile`` traces: the
  CPU algorithm and the kernels then enter the graph as custom operators
  (:mod:`nmt.sparse._compiled_ops`), one opaque call each; the static path is traced.

Both paths work *relative to the row maximum*: :func:`shifted_threshold` returns
``(tau_rel, zmax)`` with ``p = [scale * (x - zmax) - tau_rel]_+^q``, which keeps the float
precision of rows with a large common offset. A row holding NaN or ``+inf`` gets ``zmax = NaN``
(its output is all NaN, in every mapping); a row without finite entries gets ``zmax = 0`` and
``tau_rel = +inf`` (all zeros).
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Union

import torch
from torch import Tensor

from . import _compiled_ops, _static
from ._threshold import nan_rows, pruned_shifted_threshold

try:  # optional fused kernels (CUDA + Triton)
    from . import _triton
except ImportError:  # not installed / not present: the static path serves every device
    _triton = None

IMPLS = ("auto", "pruned", "static", "triton")
"""Valid values of ``impl``."""


def check_impl(impl: str) -> str:
    """``impl`` if valid, else a ValueError listing the valid values."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {', '.join(map(repr, IMPLS))}, got {impl!r}")
    return impl


def kernels() -> Any:
    """The Triton kernel wrappers to call: :mod:`nmt.sparse._triton`'s functions, or while
    ``torch.compile`` traces the same names as custom operators
    (:data:`nmt.sparse._compiled_ops.KERNEL_OPERATORS`: one opaque node of the graph each)."""
    return _compiled_ops.KERNEL_OPERATORS if torch.compiler.is_compiling() else _triton


def triton_available(x: Tensor) -> bool:
    """Whether the fused Triton kernels accept ``x`` (False when :mod:`nmt.sparse._triton` is absent)."""
    return _triton is not None and bool(_triton.is_available(x))


def resolve_impl(impl: str, x: Tensor, triton_ok: bool = True) -> str:
    """The algorithm (``"pruned"``, ``"static"`` or ``"triton"``) that ``impl`` means for ``x``.

    ``triton_ok=False`` (thresholds: the kernels return probabilities) maps ``"triton"`` to
    ``"static"``. An explicit ``"triton"`` that the kernels cannot serve raises ValueError.
    """
    check_impl(impl)
    if impl == "auto":
        if x.is_cpu:
            return "pruned"
        # the kernels compute in float32: float64 keeps the static path's precision
        return "triton" if triton_ok and x.dtype != torch.float64 and triton_available(x) else "static"
    if impl == "triton":
        if not triton_ok:
            return "static"
        if not triton_available(x):
            raise ValueError(f"impl='triton' needs Triton and a supported device/shape; got a "
                             f"{x.dtype} tensor of shape {tuple(x.shape)} on {x.device} "
                             f"(use impl='auto' or 'static')")
    return impl


def takes_half(impl: str) -> Callable[[Tensor], bool]:
    """For :func:`nmt.sparse._common.apply_last`: whether the mapping's algorithm for a (last-dim)
    float16 / bfloat16 tensor is the Triton kernels, which take it as it is (no upcast)."""
    return lambda x: resolve_impl(impl, x) == "triton"


def shifted_threshold(x: Tensor, q: Union[float, Tensor], scale: float = 1.0, impl: str = "auto",
                      tol: Optional[float] = None, n_iter: Optional[int] = None) -> tuple[Tensor, Tensor]:
    """Threshold of ``scale * x`` relative to the row maximum: ``x: (..., n)`` -> ``(tau_rel, zmax)``.

    ``p = [scale * (x - zmax) - tau_rel]_+^q`` sums to one per row. ``q``: power (sparsemax 1,
    1.5-entmax 2, alpha-entmax ``1 / (alpha - 1)``), a float or a per-row tensor broadcastable
    to ``(..., 1)``. ``tol=None`` asks for the exact threshold (``q`` in {1, 2}); otherwise the
    root is found to float precision. ``n_iter`` caps the pruned path's steps, or sets the
    static path's number of steps. ``impl``: see the module docstring. Shapes ``(..., 1)``.
    """
    kind = resolve_impl(impl, x, triton_ok=False)
    if kind == "pruned":
        if torch.compiler.is_compiling():  # one opaque operator of the graph
            return _compiled_ops.pruned_shifted_threshold(x, q, scale, tol, n_iter)
        return pruned_shifted_threshold(x, q, scale, tol, n_iter)
    tau, zmax = static_shifted_threshold(x, q, scale, tol is None, n_iter)
    return tau, nan_rows(zmax)  # a NaN or +inf score: a NaN row


def static_shifted_threshold(x: Tensor, q: Union[float, Tensor], scale: float, exact: bool,
                             n_iter: Optional[int] = None) -> tuple[Tensor, Tensor]:
    """The ``"static"`` branch of :func:`shifted_threshold` (no host synchronisation)."""
    lead, n = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.shape[0] == 0 or n == 0:
        return x.new_full((*lead, 1), float("inf")), x.new_zeros(*lead, 1)
    zmax = x2.amax(dim=-1, keepdim=True)
    empty = zmax == float("-inf")
    zmax = torch.where(empty, 0, zmax)
    z = (x2 - torch.where(zmax == float("inf"), float("nan"), zmax)) * scale
    if isinstance(q, Tensor):
        q = q.expand(*lead, 1).reshape(-1, 1)
        tau = _static.safeguarded_threshold(z, q, n_iter)
    elif exact:
        tau, _ = _static.exact_threshold(z, q, n_iter)
    elif q > 1:
        tau = _static.newton_norm_threshold(z, q, n_iter)
    else:
        tau = _static.safeguarded_threshold(z, q, n_iter)
    tau = torch.where(empty, float("inf"), tau)
    return tau.reshape(*lead, 1), zmax.reshape(*lead, 1)
