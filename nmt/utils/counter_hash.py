"""A counter-based 32-bit hash: random bits that are a pure function of a key, on any device.

Chris Wellons' ``lowbias32`` mixing function (two xor-shift-multiply rounds; a measured bias of
0.17 in his avalanche test), and keys absorbed one at a time: ``absorb(h, v) = mix(h ^ mix(v))``.
Every value stays in [0, 2^32) inside int64 (a torch tensor, a numpy array or a Python int: the
operators are the same) and the 32-bit products are formed from 16-bit halves of the constant, so
no operation overflows (signed overflow is not defined behaviour on every backend). Integer
arithmetic is exact everywhere, so the same bits come out on the CPU, CUDA or inside a compiled
graph; nothing here reads a tensor's value or synchronises with the host.

Users: sampling's Gumbel noise (``nmt.translate.counter_noise``) and the training sources' noise
(``nmt.data.source_noise``).
"""
from __future__ import annotations

from typing import TypeVar

Int = TypeVar("Int")

MASK32 = 0xFFFFFFFF
_M1, _M2 = 0x7FEB352D, 0x846CA68B  # lowbias32's multipliers


def _mul32(x, c: int):
    """``x * c mod 2^32`` for ``x`` in [0, 2^32) without int64 overflow: the constant in 16-bit halves."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & MASK32


def mix32(x: Int) -> Int:
    """``lowbias32(x)`` of values in [0, 2^32) (an int64 tensor or array, or a Python int), same type back."""
    x = x ^ (x >> 16)
    x = _mul32(x, _M1)
    x = x ^ (x >> 15)
    x = _mul32(x, _M2)
    return x ^ (x >> 16)


def absorb(h: Int, value) -> Int:
    """The hash state ``h`` (values in [0, 2^32)) after taking in ``value`` (its low 32 bits)."""
    return mix32(h ^ mix32(value & MASK32))


def seed_state(seed: int) -> int:
    """The hash state of a seed in [0, 2^64): its low then its high 32 bits absorbed."""
    return absorb(absorb(0, seed & MASK32), (seed >> 32) & MASK32)


__all__ = ["MASK32", "absorb", "mix32", "seed_state"]
