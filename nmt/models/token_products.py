"""A layer's input products per token, for inputs that are rows of a table (embeddings).

Where a layer's input is ``table[ids]`` (embeddings in eval mode), ``table[ids] @ W^T + b`` takes
one product per *position*, while sentences repeat their tokens: the 16,120 source positions of
test_2016_flickr's batches hold 2,111 distinct tokens. :class:`TokenProducts` computes the
products of each token once, when it first arrives, keeps them, and gathers a row per position.
Kept in a :func:`~nmt.utils.packed_linear.frozen_weights` region's cache
(:func:`~nmt.utils.packed_linear.frozen_cached`), the products serve every batch of a translation.

Each product row is the same function of its token as the product of the position's row, up to
the rounding of the product kernel (which may sum in another order for another number of rows).
CPU only: the ids are read on the host (which tokens are new).
"""
from __future__ import annotations

import torch
from torch import Tensor


MAX_BYTES = 1 << 28
"""The largest products buffer (P x V x O float32 entries: 256 MiB) that :func:`fits`; a larger
vocabulary or layer keeps its products per position."""


def fits(table: Tensor, widths: list[int]) -> bool:
    """Whether products of ``table`` (V, I) with weights of ``widths`` output columns (one per
    part) stay within :data:`MAX_BYTES`."""
    return table.size(0) * sum(widths) * table.element_size() <= MAX_BYTES


class TokenProducts:
    """``table[v] @ weights[p] + biases[p]`` for every token ``v`` seen so far and every part ``p``.

    table: (V, I); weights: per part (I, O); biases: per part (O,) or None. The products live in
    a (P, V, O) buffer filled as tokens arrive (``known`` (V,) bool on the host): reserved whole,
    its memory is touched (made resident) only for the tokens seen, P * O floats each."""

    def __init__(self, table: Tensor, weights: list[Tensor], biases: list[Tensor | None]) -> None:
        self.table, self.weights, self.biases = table.detach(), weights, biases
        self.products = table.new_empty(len(weights), table.size(0), weights[0].size(1))  # (P, V, O)
        self.known = torch.zeros(table.size(0), dtype=torch.bool)  # (V,)

    def ensure(self, ids: Tensor) -> None:
        """Compute the products of the tokens of ``ids`` (any shape, long) not seen before."""
        if bool(self.known[ids].all()):
            return
        distinct = torch.unique(ids)
        missing = distinct[~self.known[distinct]]
        rows = self.table.index_select(0, missing)  # (m, I)
        for part, (weight, bias) in enumerate(zip(self.weights, self.biases)):
            product = torch.mm(rows, weight) if bias is None else torch.addmm(bias, rows, weight)
            self.products[part].index_copy_(0, missing, product)
        self.known[missing] = True

    def gather(self, ids: Tensor, part: int = 0, out: Tensor | None = None) -> Tensor:
        """The products (N, O) of part ``part`` for ``ids`` (N,) long, all :meth:`ensure`-d;
        written into ``out`` (N, O) where given."""
        if out is None:
            return self.products[part].index_select(0, ids)
        return torch.index_select(self.products[part], 0, ids, out=out)


__all__ = ["MAX_BYTES", "TokenProducts", "fits"]
