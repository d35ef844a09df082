"""Key/value caches that grow in place: the filled prefix of a larger buffer.

A decoding step's self-attention cache of t positions is a tensor (N, heads, t, d_head). Appending
a position with ``torch.cat`` copies the whole cache at every step, and beam search's reordering by
parent (:func:`nmt.models.protocol.select_state`) copies it again. Here the cache is instead the
view ``buffer[:, :, :t]`` of a buffer (N, heads, capacity, d_head): :func:`append` writes the new
positions into the buffer at t (no copy of the prefix) and :func:`select_rows` gathers the rows of
the filled prefix into a new buffer of the same capacity (one copy, as before, and the room stays).
A buffer that is full is replaced by one of twice the capacity (at least :data:`MIN_CAPACITY`),
so a cache of t positions holds at most ``max(MIN_CAPACITY, 2 t)`` (a copy of the prefix at each
doubling: about one more copy of the final cache over the whole search).

Everyone else sees an ordinary (N, heads, t, d_head) tensor: its shape is the cache length (read
without a host sync), ``index_select`` / ``repeat_interleave`` of it give plain tensors, and what
it holds never changes. That last point is kept by an ownership mark on the buffer, the number of
positions written (a Python attribute): :func:`append` writes in place only into a buffer whose
mark equals the view's length, i.e. from the newest view of that buffer; a second step from the
same (older) view finds the mark moved on and copies into a new buffer, as ``cat`` would.

Outside eager inference the plain operations run: under ``torch.compile`` tracing (a graph would
not see the mark) and where autograd records (an in-place write would clobber saved tensors).
"""
from __future__ import annotations

import torch
from torch import Tensor

MIN_CAPACITY = 16
"""Positions of the first buffer a cache gets (decoding steps of short sentences never regrow)."""

_FILLED = "_nmt_filled"


def _owner(cache: Tensor) -> Tensor | None:
    """The buffer (N, heads, capacity, d_head) whose newest filled prefix ``cache`` is, or None."""
    base = cache._base
    if base is None or cache.dim() != 4 or base.dim() != 4 or getattr(base, _FILLED, -1) != cache.size(2):
        return None
    if (cache.storage_offset() != base.storage_offset() or cache.stride() != base.stride()
            or cache.shape[:2] != base.shape[:2] or cache.size(3) != base.size(3)):
        return None
    return base


def _plain(*tensors: Tensor) -> bool:
    """Whether to use the plain operations (tracing, or autograd recording through these tensors)."""
    return torch.compiler.is_compiling() or (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def capacity_for(length: int) -> int:
    """Positions of a new buffer that must hold ``length``: the next power of two, at least
    :data:`MIN_CAPACITY`."""
    return max(MIN_CAPACITY, 1 << max(length - 1, 0).bit_length())


def _prefix(buffer: Tensor, length: int) -> Tensor:
    """Mark ``buffer`` as filled to ``length`` and return that prefix, (N, heads, length, d_head)."""
    setattr(buffer, _FILLED, length)
    return buffer[:, :, :length]


def append(cache: Tensor, new: Tensor) -> Tensor:
    """cache (N, heads, t, d_head), new (N, heads, T, d_head) -> the cache of t + T positions:
    equal to ``torch.cat([cache, new], dim=2)``, written in place into ``cache``'s buffer where it
    is the newest prefix of one with room (else into a new buffer of :func:`capacity_for` (t + T))."""
    if _plain(cache, new):
        return torch.cat([cache, new], dim=2)
    t, length = cache.size(2), cache.size(2) + new.size(2)
    buffer = _owner(cache)
    if buffer is None or buffer.size(2) < length:
        buffer = cache.new_empty(cache.size(0), cache.size(1), capacity_for(length), cache.size(3))
        buffer[:, :, :t].copy_(cache)
    buffer[:, :, t:length].copy_(new)
    return _prefix(buffer, length)


def select_rows(x: Tensor, index: Tensor) -> Tensor:
    """``x.index_select(0, index)`` (index (M,)); where ``x`` is a growing cache, the result is one
    too, of the same capacity: the filled prefix alone is gathered (one copy) into a new buffer."""
    buffer = _owner(x)
    if buffer is None or _plain(x):
        return x.index_select(0, index)
    rows, heads, capacity, width = buffer.shape
    t = x.size(2)
    out = buffer.new_empty(index.size(0), heads, capacity, width)
    # rows x heads blocks of (t, d_head): one index_select over dim 0 of (N * heads, capacity, d_head)
    # views (over the 4-d views it runs about 1.4x slower on the CPU, measured)
    blocks = (index.unsqueeze(1) * heads + torch.arange(heads, device=index.device)).view(-1)
    torch.index_select(buffer.view(rows * heads, capacity, width)[:, :t], 0, blocks,
                       out=out.view(-1, capacity, width)[:, :t])
    return _prefix(out, t)


__all__ = ["MIN_CAPACITY", "append", "capacity_for", "select_rows"]
