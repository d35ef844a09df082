"""Rotary position embeddings (RoPE; Su et al. 2021, RoFormer) of the Transformer's self-attentions.

No vector is added to the embeddings; every head's queries and keys are rotated by their
positions instead: frequency ``i`` (of ``d_head / 2``) turns the pair of coordinates it owns by
the angle ``p * theta_i``, ``theta_i = base^(-2i / d_head)`` (base 10000 as in the paper). A
rotation preserves dot products up to the difference of the angles, so the score of a query at
position m and a key at position n depends on the positions only through ``n - m``.

Convention: the pair of frequency ``i`` is the coordinates ``(i, i + d_head / 2)`` (the two halves
of the head, GPT-NeoX / Llama), not the paper's interleaved ``(2i, 2i + 1)``: the two are the same
family of models up to a fixed permutation of each head's coordinates, which the learned query and
key projections absorb, and halves rotate with contiguous slices (``x * cos + rotate_half(x) *
sin``) where interleaved pairs need strided views or a reshape. As a complex number, frequency
``i`` of a head vector ``x`` is ``x[i] + 1j * x[i + d_head / 2]``, and the rotation multiplies it
by ``exp(1j * p * theta_i)``.

Positions are Python ints: the stack's offset during incremental decoding is the length of the
self-attention cache (a shape), so nothing is read back from the device. Cross-attention is not
rotated: its queries (target positions) and keys (source positions) lie in different sequences,
whose offsets mean nothing (OpenNMT-py and the rotary MT models rotate self-attention only).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

Rotation = tuple[Tensor, Tensor]
"""The ``(cos, sin)`` of each position's angles, each (T, d_head) (both halves repeat the d_head / 2
frequencies), in the dtype of the vectors they rotate."""


def rotary_angles(length: int, d_head: int, base: float) -> Tensor:
    """(length, d_head / 2) float64: ``p * base^(-2i / d_head)`` for positions p < length, frequency i."""
    frequency = base ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)
    return torch.arange(length, dtype=torch.float64).unsqueeze(1) * frequency


def rotate_half(x: Tensor) -> Tensor:
    """(..., d) -> (..., d): ``(-x2, x1)`` for the halves ``x = (x1, x2)``: ``1j`` times each frequency."""
    half = x.size(-1) // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def rotate(x: Tensor, rotation: Rotation) -> Tensor:
    """x: (B, heads, T, d_head) at the positions of ``rotation`` ((cos, sin), each (T, d_head))
    -> the rotated vectors, same shape and dtype (the table is cast to x's dtype where it differs:
    under autocast the projections may be bfloat16 / float16 while the stack's inputs are float32)."""
    cos, sin = (t.to(x.dtype) for t in rotation)
    return x * cos + rotate_half(x) * sin


class RotaryPositions(nn.Module):
    """The ``positions`` module of a rotary stack: adds nothing to the embeddings (``forward`` is the
    identity) and gives each forward pass the :data:`Rotation` of its positions (:meth:`rotation`),
    which the stack hands to every self-attention. The float64 cos / sin table grows on demand
    (shapes only, no device sync) and holds no parameter: any length, no ``max_positions``."""

    def __init__(self, d_head: int, base: float = 10000.0, initial_length: int = 256) -> None:
        super().__init__()
        if d_head % 2:
            raise ValueError(f"rotary positions turn pairs of coordinates and need an even d_head "
                             f"(d_model / heads), got {d_head}")
        if not base > 1.0:
            raise ValueError(f"the rotary base must be > 1, got {base}")
        self.d_head, self.base = d_head, float(base)
        self._fill(initial_length, None)

    def _fill(self, length: int, device: torch.device | None) -> None:
        angles = rotary_angles(length, self.d_head, self.base).repeat(1, 2)  # (length, d_head)
        if device is not None:
            angles = angles.to(device)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x: (B, T, D) -> x: rotary positions add nothing to the embeddings."""
        return x

    def rotation(self, offset: int, length: int, dtype: torch.dtype) -> Rotation:
        """The (cos, sin) of positions ``offset .. offset + length - 1``, each (length, d_head) in ``dtype``."""
        end = offset + length
        if end > self.cos.size(0):  # shapes only: no device sync
            self._fill(max(end, 2 * self.cos.size(0)), self.cos.device)
        return self.cos[offset:end].to(dtype), self.sin[offset:end].to(dtype)

    def extra_repr(self) -> str:
        return f"d_head={self.d_head}, base={self.base:g}"


def stack_rotation(positions: nn.Module, offset: int, length: int, dtype: torch.dtype) -> Rotation | None:
    """The :data:`Rotation` a stack's self-attentions apply: that of ``positions`` where it is a
    :class:`RotaryPositions`, None (no rotation) for absolute positions."""
    if isinstance(positions, RotaryPositions):
        return positions.rotation(offset, length, dtype)
    return None


__all__ = ["Rotation", "RotaryPositions", "rotary_angles", "rotate", "rotate_half", "stack_rotation"]
