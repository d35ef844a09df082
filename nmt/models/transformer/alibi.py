"""ALiBi, attention with linear biases (Press, Smith & Lewis 2022, "Train Short, Test Long"), for the
Transformer's self-attentions, as OpenNMT-py's ``max_relative_positions: -2``.

No vector is added to the embeddings and nothing is learned: every self-attention head h adds the
fixed bias ``-m_h * |i - j|`` to the score of the query at position i over the key at position j
before the mapping. In the decoder the causal mask keeps only keys ``j <= i``, where that is the
paper's ``-m_h * (i - j)``; in the (bidirectional) encoder the symmetric ``|i - j|`` is the form
OpenNMT-py and the common bidirectional adaptations use (the paper defines the causal one only).
Cross-attention has no bias: its queries and keys lie in different sequences.

The slopes ``m_h`` are the paper's geometric sequence (:func:`alibi_slopes`): for n heads a power
of two ``m_h = 2^(-8h/n)``, h = 1..n; otherwise the n' slopes of the closest lower power of two n',
followed by every other slope (the 1st, 3rd, ...) of 2n' heads, up to n in all (the paper's code,
which OpenNMT-py copies, in its order).

The bias depends on ``i - j`` only, so a sentence's scores are the same wherever it starts, and
there is no table: any length. Positions come from shapes (the query offset is the self-attention
cache's length during incremental decoding), so nothing is read back from the device.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def alibi_slopes(heads: int) -> list[float]:
    """The ``heads`` slopes of the paper's rule (see the module docstring), head 1 first."""
    if heads < 1:
        raise ValueError(f"ALiBi needs at least one head, got {heads}")
    lower = 2 ** int(math.floor(math.log2(heads)))
    slopes = [2.0 ** (-8.0 * h / lower) for h in range(1, lower + 1)]
    if lower == heads:
        return slopes
    extra = [2.0 ** (-8.0 * h / (2 * lower)) for h in range(1, 2 * lower + 1, 2)]  # every other of 2n'
    return slopes + extra[: heads - lower]


class AlibiBias(nn.Module):
    """One self-attention's fixed linear biases: the slopes of its ``heads`` as a float64 buffer that
    is not saved (checkpoints hold no ALiBi state; it follows the module's device)."""

    def __init__(self, heads: int) -> None:
        super().__init__()
        self.register_buffer("slopes", torch.tensor(alibi_slopes(heads), dtype=torch.float64), persistent=False)

    def bias(self, queries: int, keys: int, offset: int, dtype: torch.dtype) -> Tensor:
        """(heads, queries, keys) in ``dtype``: ``-m_h * |i - j|`` for the query at position
        i = offset + row and the key at position j = column (shapes only: no device sync)."""
        device = self.slopes.device
        key_positions = torch.arange(keys, device=device, dtype=self.slopes.dtype)
        query_positions = torch.arange(offset, offset + queries, device=device, dtype=self.slopes.dtype)
        distance = (query_positions.unsqueeze(1) - key_positions.unsqueeze(0)).abs()  # (queries, keys)
        return (-self.slopes.view(-1, 1, 1) * distance).to(dtype)

    def extra_repr(self) -> str:
        return f"heads={self.slopes.numel()}"


def biased_mask(bias: Tensor, mask: Tensor | None) -> Tensor:
    """The fused kernel's additive float mask: ``bias`` (heads, T, S) where ``mask`` (bool, broadcastable
    to (B, heads, T, S), True = may attend; None: everything) allows, ``-inf`` elsewhere. Returns
    (heads, T, S) or the broadcast (B, heads, T, S), ``bias``'s dtype."""
    if mask is None:
        return bias
    return torch.where(mask, bias, -math.inf)


__all__ = ["AlibiBias", "alibi_slopes", "biased_mask"]
