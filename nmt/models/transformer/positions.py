"""Position encodings of the Transformer: fixed sinusoids, a learned table, rotary, relative or ALiBi.

Sinusoids and the learned table map ``(x (B, T, D), offset)`` to ``x + P[offset : offset + T]`` (broadcast over the
batch). ``offset`` is a Python int: during incremental decoding it is the length of the
self-attention cache, a shape, so reading it never synchronises with the device. Rotary positions
(:mod:`nmt.models.transformer.rotary`) add nothing there: they rotate the self-attentions'
queries and keys instead; nor do relative positions (:mod:`nmt.models.transformer.relative`),
whose tables the self-attentions hold, nor ALiBi (:mod:`nmt.models.transformer.alibi`), whose
fixed biases the self-attentions add to their scores: those two stacks' ``positions`` is one
identity module, :class:`ScoreBiasPositions`.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from nmt.models.transformer.alibi import alibi_slopes
from nmt.models.transformer.rotary import RotaryPositions

POSITIONS = ("sinusoidal", "learned", "rotary", "relative", "alibi")


def sinusoid_table(length: int, dim: int) -> Tensor:
    """(length, dim) float32: ``sin(p / 10000^(2i/dim))`` at even, ``cos`` at odd columns (Vaswani et al. 2017)."""
    position = torch.arange(length, dtype=torch.float64).unsqueeze(1)
    frequency = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency[: dim // 2])
    return table.float()


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal encodings, computed for any length (the table grows on demand, outside autograd)."""

    def __init__(self, dim: int, initial_length: int = 256) -> None:
        super().__init__()
        self.dim = dim
        self.register_buffer("table", sinusoid_table(initial_length, dim), persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x: (B, T, D) -> x + P[offset:offset+T] in x's dtype."""
        end = offset + x.size(1)
        if end > self.table.size(0):  # shapes only: no device sync
            self.table = sinusoid_table(max(end, 2 * self.table.size(0)), self.dim).to(self.table.device)
        return x + self.table[offset:end].to(x.dtype)


class LearnedPositions(nn.Module):
    """A learned (max_positions, D) table; longer inputs raise ValueError."""

    def __init__(self, dim: int, max_positions: int) -> None:
        super().__init__()
        if max_positions < 1:
            raise ValueError(f"learned positions need max_positions >= 1, got {max_positions}")
        self.max_positions = max_positions
        self.table = nn.Embedding(max_positions, dim)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x: (B, T, D) -> x + P[offset:offset+T]."""
        end = offset + x.size(1)
        if end > self.max_positions:
            raise ValueError(f"a sequence of {end} positions exceeds model.transformer.max_positions="
                             f"{self.max_positions} (learned positions)")
        return x + self.table.weight[offset:end].to(x.dtype)


class ScoreBiasPositions(nn.Module):
    """The ``positions`` module of a stack whose positions live in the self-attentions' scores, not in
    the embeddings: ``kind`` ``"relative"`` (each self-attention holds its table,
    :class:`~nmt.models.transformer.relative.RelativeTable`) or ``"alibi"`` (each adds its fixed
    biases, :class:`~nmt.models.transformer.alibi.AlibiBias`). ``forward`` is the identity; ``settings``
    (``max_relative=K`` / ``heads=n``) are for the record (``repr``). No parameters, no buffers."""

    def __init__(self, kind: str, **settings: int) -> None:
        super().__init__()
        self.kind = kind
        self.settings = dict(settings)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x: (B, T, D) -> x: these positions add nothing to the embeddings."""
        return x

    def extra_repr(self) -> str:
        return ", ".join([f"kind={self.kind}", *(f"{name}={value}" for name, value in self.settings.items())])


def position_limit(positions: nn.Module) -> int | None:
    """The positions ``positions`` hold: ``max_positions`` of a learned table, None (any) for sinusoids,
    rotary, relative (offsets beyond K share the clipped vector) and ALiBi positions."""
    return positions.max_positions if isinstance(positions, LearnedPositions) else None


def build_positions(kind: str, dim: int, max_positions: int, heads: int = 1,
                    rotary_base: float = 10000.0, max_relative: int = 20) -> nn.Module:
    """``"sinusoidal"`` or ``"learned"`` position encodings of size ``dim``, ``"rotary"`` positions
    of the heads' size ``dim // heads`` with base ``rotary_base``, or ``"relative"`` ones clipped at
    ``max_relative``, or ``"alibi"`` for ``heads`` heads (the last three: ``max_positions`` unused)."""
    if kind == "sinusoidal":
        return SinusoidalPositions(dim, max_positions)
    if kind == "learned":
        return LearnedPositions(dim, max_positions)
    if kind == "rotary":
        return RotaryPositions(dim // heads, rotary_base)
    if kind == "relative":
        if max_relative < 1:
            raise ValueError(f"relative positions need max_relative_positions >= 1, got {max_relative}")
        return ScoreBiasPositions(kind, max_relative=max_relative)
    if kind == "alibi":
        alibi_slopes(heads)  # checks the count
        return ScoreBiasPositions(kind, heads=heads)
    raise ValueError(f"unknown positions {kind!r}; valid: {', '.join(POSITIONS)}")


__all__ = ["POSITIONS", "LearnedPositions", "ScoreBiasPositions", "SinusoidalPositions", "build_positions",
           "position_limit", "sinusoid_table"]
