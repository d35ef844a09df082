"""Copying source tokens into the output (``model.output.copy``; OpenNMT-py's ``-copy_attn``).

The output layer scores the V vocabulary entries (the generator's logits) and, besides them,
each of the L source positions: ``c_j = h . (W m_j)`` for the decoder output ``h`` and the
encoder memory ``m_j``. One output mapping normalises the V + L scores jointly (CopyNet's shared
normalisation, Gu et al. 2016, with any mapping: softmax, sparsemax, entmax), and a token's
probability is its vocabulary entry's plus those of the source positions holding it:

    P(y) = p_y + sum_{j : x_j = y} p_{V + j}

A position whose token is not in the target vocabulary copies ``<unk>`` (as an unknown source
word is generated as ``<unk>``; ``-replace_unk`` then puts the source word back); padding and
``<pad> <bos> <eos>`` are never copied. ``P`` is a distribution over the V tokens with exact zeros
where every part of a token is zero, so the search's certificates carry over unchanged. Training
takes the Fenchel-Young loss of the joint scores at the cheapest target on the set of correct
parts (:func:`nmt.sparse.set_target`): for softmax the marginal likelihood ``-log P(y)``, for the
sparse mappings its finite counterpart.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Callable

import torch
from torch import Tensor, nn

from nmt.models.linear import Linear
from nmt.sparse import set_target
from nmt.utils.precision import float32_if_half

NOT_COPIED = -1
"""The target id of a source position that copies nothing (padding, ``<pad> <bos> <eos>``)."""


def source_to_target(src_tokens: Sequence[str], tgt_index: dict[str, int], unk_index: int,
                     never: Sequence[str]) -> Tensor:
    """(len(src_tokens),) long: each source type's target id (``tgt_index``, the target
    vocabulary's string -> id), ``unk_index`` where the target vocabulary lacks it and
    :data:`NOT_COPIED` for the types in ``never`` (the specials that are not words)."""
    skip = set(never)
    return torch.tensor([NOT_COPIED if token in skip else tgt_index.get(token, unk_index) for token in src_tokens],
                        dtype=torch.long)


def onto_tokens(values: Tensor, ids: Tensor, vocab: int, empty: float, reduce: str) -> Tensor:
    """``values`` (..., V + L) of the vocabulary and the source positions -> (..., V): each
    vocabulary entry combined (``reduce``: ``"sum"`` or ``"amax"``) with the positions holding that
    token; ``empty`` stands in for the positions that copy nothing. ids: (B, L), the sentences' target
    ids, for values (B, T, V + L) or a step's (N, V + L) with N = B x S (S consecutive rows per
    sentence: one view, no copy of ``ids`` per row)."""
    rows = values.reshape(ids.size(0), -1, values.size(-1))  # (B, S or T, V + L)
    copied = rows[..., vocab:]
    index = ids.unsqueeze(1).expand_as(copied)
    keep = index >= 0
    out = rows[..., :vocab].scatter_reduce(-1, torch.where(keep, index, 0), torch.where(keep, copied, empty),
                                           reduce=reduce)
    return out.view(values.shape[:-1] + (vocab,))


class CopyAttention(nn.Module):
    """Scores of the source positions for copying, and the joint output distribution.

    hidden_size: the decoder output's size (what the generator reads); memory_size: the
    encoder memory's; src_vocab_size: the source vocabulary's (the buffer
    ``source_to_target`` (src_vocab_size,) maps source ids to target ids; it is part of the
    state dict, so a checkpoint carries it: set it with :meth:`set_vocabularies` when building a
    model for training). No host synchronisation anywhere here.
    """

    def __init__(self, hidden_size: int, memory_size: int, src_vocab_size: int) -> None:
        super().__init__()
        self.keys = Linear(memory_size, hidden_size, bias=False)
        self.register_buffer("source_to_target", torch.full((src_vocab_size,), NOT_COPIED, dtype=torch.long))

    def set_vocabularies(self, table: Tensor) -> None:
        """Set ``source_to_target`` from :func:`source_to_target`'s ``table`` (src_vocab_size,)."""
        if table.shape != self.source_to_target.shape:
            raise ValueError(f"a source-to-target table of {table.numel()} entries for a source vocabulary "
                             f"of {self.source_to_target.numel()} types")
        self.source_to_target.copy_(table)

    def source(self, memory: Tensor, src: Tensor, src_mask: Tensor) -> tuple[Tensor, Tensor]:
        """memory: (B, L, Hm); src: (B, L) source ids; src_mask: (B, L) bool (True = real token).
        Returns ``(keys (B, L, H), ids (B, L) long)``: the positions' copy keys and target ids
        (:data:`NOT_COPIED` on padding and on specials)."""
        return self.keys(memory), self.ids(src, src_mask)

    def ids(self, src: Tensor, src_mask: Tensor) -> Tensor:
        """(B, L) long: the target id each source position copies (:data:`NOT_COPIED` on padding and
        specials) of src (B, L) with src_mask (B, L) bool."""
        return torch.where(src_mask, self.source_to_target[src], NOT_COPIED)

    @staticmethod
    def scores(hidden: Tensor, keys: Tensor, ids: Tensor) -> Tensor:
        """hidden: (B, T, H), or a step's (N, H) with N = B x S (S consecutive rows per
        sentence); keys: (B, L, H); ids: (B, L). Returns the copy scores (B, T, L) or (N, L),
        ``-inf`` at the positions that copy nothing."""
        single = hidden.dim() == 2
        query = hidden.view(keys.size(0), -1, hidden.size(-1)) if single else hidden  # (B, S or T, H)
        scores = torch.bmm(query, keys.to(query.dtype).transpose(1, 2))  # (B, S or T, L)
        scores = scores.masked_fill((ids < 0).unsqueeze(1), float("-inf"))
        return scores.view(-1, scores.size(-1)) if single else scores

    @staticmethod
    def marginal(probs: Tensor, ids: Tensor, vocab: int) -> Tensor:
        """The token distribution (..., V) of the joint ``probs`` (..., V + L): each vocabulary
        entry plus the source positions holding that token (:func:`onto_tokens`)."""
        return onto_tokens(probs, ids, vocab, 0.0, "sum")

    @staticmethod
    def collapsed_scores(joint: Tensor, ids: Tensor, vocab: int) -> Tensor:
        """(..., V): each token's largest joint score (its vocabulary entry's or a copying
        position's; :func:`onto_tokens`): a token has probability > 0 exactly where this is above
        the mapping's threshold (how scoring ranks tokens outside the support)."""
        return onto_tokens(joint, ids, vocab, float("-inf"), "amax")

    @staticmethod
    def loss_target(mapping: Callable[..., Tensor], joint: Tensor, target: Tensor, ids: Tensor) -> Tensor:
        """The training target of the joint scores: the cheapest distribution over the correct
        parts of each target token (:func:`nmt.sparse.set_target`), its vocabulary entry and the
        source positions holding it. joint: (B, T, V + L); target: (B, T) token ids; ids: (B, L).
        Returns (B, T, V + L), detached, in float32 or wider (padding targets: their vocabulary
        entry's, to be ignored by the caller). The mapping runs over 1 + L compact columns."""
        vocab = joint.size(-1) - ids.size(-1)
        z = float32_if_half(joint)
        own = z[..., :vocab].gather(-1, target.unsqueeze(-1))  # (B, T, 1)
        copies = ids.unsqueeze(1) == target.unsqueeze(-1)  # (B, T, L): positions holding the target
        compact = torch.cat([own, z[..., vocab:]], dim=-1)  # (B, T, 1 + L)
        allowed = torch.cat([torch.ones_like(copies[..., :1]), copies], dim=-1)
        q = set_target(mapping, compact, allowed)  # (B, T, 1 + L)
        vocab_part = torch.zeros_like(z[..., :vocab]).scatter_(-1, target.unsqueeze(-1), q[..., :1])
        return torch.cat([vocab_part, q[..., 1:]], dim=-1)


__all__ = ["NOT_COPIED", "CopyAttention", "onto_tokens", "source_to_target"]
