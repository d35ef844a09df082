"""Dynamically quantized int8 products for CPU inference (``-precision int8``).

A weight ``W`` (O, I) is quantized once, symmetrically per output row: ``s_o = max_i |W_oi| / 127``,
``Q_oi = round(W_oi / s_o)`` in [-127, 127]. At every product each input row ``x_n`` (I,) is
quantized on its own, symmetrically: ``a_n = max_i |x_ni| / 127``, ``q_ni = round(x_ni / a_n)`` in
[-127, 127], and the product is

    y_no = a_n s_o sum_i q_ni Q_oi (+ b_o)

the integer dot product exact (``torch._int_mm``: int8 x int8 with int32 accumulation, checked
against int64 arithmetic in the tests, extreme values included), scaled back in float32. Each row is
quantized alone (CTranslate2's choice, not fbgemm's one scale per batch), so a row's result never
depends on the other rows of its batch: the int8 model is one function of the source and the
prefix, whatever the batch, the beam or the search loop, and a search's scores are the scorer's.
(A zero row has ``a_n = 0`` and gives ``b``; an all-zero weight row likewise; a row holding a NaN
or an infinity gives NaN, never finite values.)

Error against the exact product, per output: at most ``s_o / 2 * sum_i |a_n q_ni|`` (weight
rounding) plus ``a_n / 2 * sum_i |W_oi|`` (input rounding), plus float32 rounding of the scaling
(exact below 2^24 = 127^2 * 1040 for the integer sum); the tests check the formula and the bound.

CPU only: on this project's AMD EPYC (AVX-512 VNNI, 2 threads) the products, input quantization
included, took 0.3-0.6x oneDNN's float32 time from 8 rows at the decoder's shapes. No autograd, no
host synchronisation. A thread-local switch, :func:`int8_products`, tells
:class:`nmt.utils.packed_linear.FrozenWeight` (decoding's products) to take this path.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Optional

import torch
from torch import Tensor

_STATE = threading.local()

LEVELS = 127
"""Largest absolute quantized value, of weights and inputs alike (symmetric int8 without -128)."""


def available() -> bool:
    """Whether this torch has the int8 matrix product the path needs (``torch._int_mm``)."""
    return hasattr(torch, "_int_mm")


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """``(q, scale)``: each row of ``x`` (N, I) as int8 ``q`` (N, I) in [-127, 127] and its float32
    ``scale`` (N, 1) = max |x_n| / 127 (0 for a zero row), so that ``x ~ scale * q``."""
    scale = x.abs().amax(dim=1, keepdim=True) / LEVELS
    divisor = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(x / divisor).clamp_(-LEVELS, LEVELS).to(torch.int8)
    return q, scale


class Int8Weight:
    """A weight (O, I) quantized once per output row (:func:`quantize_rows`); ``int8(x, bias)`` =
    ``x @ W^T (+ bias)`` with each row of the float32 input ``x`` (..., I) quantized on its own:
    (..., O) float32. See the module docstring for the arithmetic and its error."""

    __slots__ = ("_q_t", "_scale", "out_features")

    def __init__(self, weight: Tensor) -> None:
        q, scale = quantize_rows(weight.detach().float())
        self._q_t = q.t()  # (I, O): the product's right factor, a view of the row-major rows
        self._scale = scale.view(-1)  # (O,)
        self.out_features = q.shape[0]

    def __call__(self, x: Tensor, bias: Optional[Tensor] = None) -> Tensor:
        width = x.shape[-1]
        rows = x.reshape(-1, width)
        if rows.shape[0] == 0 or width == 0:
            out = rows.new_zeros(rows.shape[0], self.out_features)
        else:
            q, scale = quantize_rows(rows)
            out = torch._int_mm(q, self._q_t).float().mul_(scale).mul_(self._scale)
        if bias is not None:
            out.add_(bias)
        return out if x.dim() == 2 else out.view(*x.shape[:-1], self.out_features)


def int8_active() -> bool:
    """Whether an :func:`int8_products` region is open in this thread."""
    return getattr(_STATE, "depth", 0) > 0


@contextlib.contextmanager
def int8_products() -> Iterator[None]:
    """A region (this thread, nestable) in which the decoding products of
    :class:`nmt.utils.packed_linear.FrozenWeight` run in int8 (:class:`Int8Weight`)."""
    if not available():
        raise RuntimeError(f"int8 products need torch._int_mm, which torch {torch.__version__} lacks")
    _STATE.depth = getattr(_STATE, "depth", 0) + 1
    try:
        yield
    finally:
        _STATE.depth -= 1


__all__ = ["LEVELS", "Int8Weight", "available", "int8_active", "int8_products", "quantize_rows"]
