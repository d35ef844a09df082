"""Counter-based uniform and Gumbel noise: the same bits on every device, for every batching.

Sampling (``nmt.translate.sampling``) draws token ``v`` of step ``t`` of sample ``n`` of input
sentence ``i`` from noise that is a pure function of ``(seed, i, n, t, v)``: a 32-bit hash of the
key, computed with torch's int64 operations. Nothing depends on a generator's state, so a
sentence's samples are the same whatever its batch, its place in the batch or the number of
sentences sampled before it, and the same bits come out on the CPU, CUDA or inside a compiled
graph (integer arithmetic is exact everywhere; ``torch.multinomial`` and ``torch.rand`` draw from
one stream per device whose order depends on the batch).

The mixing function is Chris Wellons' ``lowbias32`` (two xor-shift-multiply rounds; a measured
bias of 0.17 in his avalanche test). Every value stays in [0, 2^32) inside an int64 tensor and
the 32-bit products are formed from 16-bit halves of the constant, so no operation overflows
(signed overflow is not defined behaviour on every backend). Keys are absorbed one at a time:
``absorb(h, v) = mix(h ^ mix(v))``; the per-token hashes ``mix(v ^ TOKEN_SALT)`` are computed once
per search.

No operation here synchronises with the host, reads a tensor's value or depends on data for a
shape: the functions run unchanged under ``torch.compile(fullgraph=True)``.
"""
from __future__ import annotations

import torch
from torch import Tensor

MASK32 = 0xFFFFFFFF
TOKEN_SALT = 0x9E3779B9
"""Xored into token ids before they are hashed (the golden ratio's 32 bits), so that token ids and
the other keys never share a hash input by construction."""
_M1, _M2 = 0x7FEB352D, 0x846CA68B  # lowbias32's multipliers


def _mul32(x: Tensor | int, c: int) -> Tensor | int:
    """``x * c mod 2^32`` for ``x`` in [0, 2^32) without int64 overflow: the constant in 16-bit halves."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & MASK32


def mix32(x: Tensor | int) -> Tensor | int:
    """``lowbias32(x)`` of values in [0, 2^32) (an int64 tensor, or a Python int), same type back."""
    x = x ^ (x >> 16)
    x = _mul32(x, _M1)
    x = x ^ (x >> 15)
    x = _mul32(x, _M2)
    return x ^ (x >> 16)


def absorb(h: Tensor | int, value: Tensor | int) -> Tensor | int:
    """The hash state ``h`` (values in [0, 2^32)) after taking in ``value`` (its low 32 bits)."""
    return mix32(h ^ mix32(value & MASK32))


def seed_state(seed: int) -> int:
    """The hash state of a seed in [0, 2^64): its low then its high 32 bits absorbed."""
    return absorb(absorb(0, seed & MASK32), (seed >> 32) & MASK32)  # type: ignore[return-value]


def row_keys(seed: int, sentences: Tensor, samples: Tensor) -> Tensor:
    """(R,) int64 hash states of rows: ``seed`` with each row's sentence index and sample number
    absorbed. sentences, samples: (R,) int64 (indices below 2^32)."""
    return absorb(absorb(seed_state(seed), sentences), samples)  # type: ignore[return-value]


def token_keys(vocab: int, device: torch.device | str) -> Tensor:
    """(V,) int64 hashes of the token ids 0..V-1 (computed once per search)."""
    return mix32(torch.arange(vocab, dtype=torch.int64, device=device) ^ TOKEN_SALT)  # type: ignore[return-value]


def uniform_bits(keys: Tensor, step: int, tokens: Tensor) -> Tensor:
    """(R, V) int64 in [0, 2^32): the noise bits of each row at ``step`` for each token.

    keys: (R,) from :func:`row_keys`; tokens: (V,) from :func:`token_keys`."""
    at_step = absorb(keys, step)  # (R,)
    return mix32(at_step.unsqueeze(1) ^ tokens.unsqueeze(0))  # type: ignore[return-value]


def gumbel(bits: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Standard Gumbel noise ``-log(-log U)`` of the bits (R, V): ``U = (2m + 1) / 2^24`` with ``m``
    the top 23 bits, exactly representable in float32 and strictly inside (0, 1), so the noise is
    finite (in [-2.8, 16.6]; the clipped tails hold about 1e-7 of the mass)."""
    m = bits >> 9  # [0, 2^23)
    u = (m * 2 + 1).to(dtype) * (1.0 / (1 << 24))
    return -torch.log(-torch.log(u))


__all__ = ["MASK32", "TOKEN_SALT", "absorb", "gumbel", "mix32", "row_keys", "seed_state", "token_keys",
           "uniform_bits"]
