"""Relative position representations (Shaw, Uszkoreit & Vaswani 2018) as OpenNMT-py implements them
(``max_relative_positions: K``, ``onmt.modules.multi_headed_attn``).

Every self-attention module holds a learned table ``A`` of ``2K + 1`` vectors of size ``d_head``
(shared by its heads), one per clipped offset ``clip(n - m, -K, K)`` of a key at position n from a
query at position m. The scores gain ``q_m . A[n - m]`` and the context gains
``sum_n p_mn A[n - m]``: OpenNMT-py reads the same table for the keys' and the values' relations
(Shaw et al. learn one table for each). No vector is added to the embeddings (OpenNMT-py adds no
sinusoids in that mode either), and cross-attention has no relations (its queries and keys lie in
different sequences). Offsets come from shapes (the query offset is the self-attention cache's
length during incremental decoding), so nothing is read back from the device. The stack's ``positions``
module is the identity :class:`~nmt.models.transformer.positions.ScoreBiasPositions`.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn


def relative_buckets(queries: int, keys: int, offset: int, max_relative: int, device: torch.device) -> Tensor:
    """(queries, keys) long: ``clip(n - m, -K, K) + K`` for the query at position m = offset + i
    (row i) and the key at position n (column n), K = ``max_relative``."""
    key_positions = torch.arange(keys, device=device)
    query_positions = torch.arange(offset, offset + queries, device=device)
    offsets = key_positions.unsqueeze(0) - query_positions.unsqueeze(1)
    return offsets.clamp(-max_relative, max_relative) + max_relative


class RelativeTable(nn.Module):
    """One self-attention's learned relations: ``2K + 1`` vectors of size ``d_head``, N(0, 1) as
    OpenNMT-py's ``nn.Embedding``."""

    def __init__(self, max_relative: int, d_head: int) -> None:
        super().__init__()
        if max_relative < 1:
            raise ValueError(f"relative positions need max_relative_positions >= 1, got {max_relative}")
        self.max_relative = max_relative
        self.embeddings = nn.Embedding(2 * max_relative + 1, d_head)

    def relations(self, queries: int, keys: int, offset: int, dtype: torch.dtype) -> Tensor:
        """(queries, keys, d_head): ``A[clip(n - m)]`` for the queries at offset .. offset + queries - 1
        and the keys at 0 .. keys - 1, in ``dtype``."""
        weight = self.embeddings.weight
        buckets = relative_buckets(queries, keys, offset, self.max_relative, weight.device)
        return weight[buckets].to(dtype)

    def extra_repr(self) -> str:
        return f"max_relative={self.max_relative}"


def relative_scores(q: Tensor, relations: Tensor) -> Tensor:
    """q (B, heads, T, d_head), relations (T, S, d_head) -> (B, heads, T, S): ``q_m . A[n - m]``."""
    return torch.einsum("bhtd,tsd->bhts", q, relations)


def relative_context(weights: Tensor, relations: Tensor) -> Tensor:
    """weights (B, heads, T, S), relations (T, S, d_head) -> (B, heads, T, d_head): ``sum_n p_mn A[n - m]``."""
    return torch.einsum("bhts,tsd->bhtd", weights, relations)


__all__ = ["RelativeTable", "relative_buckets", "relative_context", "relative_scores"]
