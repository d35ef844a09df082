"""Counter-based uniform and Gumbel noise: the same bits on every device, for every batching.

Sampling (``nmt.translate.sampling``) draws token ``v`` of step ``t`` of sample ``n`` of input
sentence ``i`` from noise that is a pure function of ``(seed, i, n, t, v)``: a 32-bit hash of the
key, computed with torch's int64 operations. Nothing depends on a generator's state, so a
sentence's samples are the same whatever its batch, its place in the batch or the number of
sentences sampled before it, and the same bits come out on the CPU, CUDA or inside a compiled
graph (integer arithmetic is exact everywhere; ``torch.multinomial`` and ``torch.rand`` draw from
one stream per device whose order depends on the batch).

The hash is :mod:`nmt.utils.counter_hash`'s (``lowbias32``, keys absorbed one at a time); the
per-token hashes ``mix(v ^ TOKEN_SALT)`` are computed once per search.

No operation here synchronises with the host, reads a tensor's value or depends on data for a
shape: the functions run unchanged under ``torch.compile(fullgraph=True)``.
"""
from __future__ import annotations

import torch
from torch import Tensor

from nmt.utils.counter_hash import MASK32, absorb, mix32, seed_state

TOKEN_SALT = 0x9E3779B9
"""Xored into token ids before they are hashed (the golden ratio's 32 bits), so that token ids and
the other keys never share a hash input by construction."""


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
