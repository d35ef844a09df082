"""The alignments of a search's outputs from a full-context pass (``model.transformer.full_context_alignment``).

A model that aligns from a decoder pass without the future mask (Garg et al. 2019; OpenNMT-py's
``-full_context_alignment``) cannot give that attention step by step: position ``t`` would see
tokens not yet generated. Once the search is over, every hypothesis is run through the model's
``teacher_forced_alignment`` (decoder inputs BOS + the hypothesis, each position seeing the whole
hypothesis), and that attention takes the place of the steps' for ``-report_align``,
``-replace_unk`` and ``-attention``. The search itself, its scores and certificates are unchanged.
No host synchronisation (shapes only).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def full_context_alignment(model: object) -> bool:
    """Whether ``model`` (a model or an ensemble) takes its alignments from a full-context pass."""
    return bool(getattr(model, "full_context_alignment", False))


@torch.no_grad()
def hypothesis_alignment(model: Any, src: Tensor, src_lengths: Tensor, tokens: Tensor, lengths: Tensor,
                         bos: int, encoder_out: dict[str, Tensor] | None = None) -> Tensor:
    """(B, n, T, L) float32: row ``t`` of hypothesis ``(b, k)`` is the alignment attention of its
    token ``t`` under teacher forcing on the whole hypothesis (the layout of
    :class:`nmt.translate.search_result.SearchResult`'s ``attention``). src: (B, L); src_lengths:
    (B,) (on the host or the device); tokens: (B, n, T) the hypotheses (EOS included, padding
    after); lengths: (B, n) their tokens (0: no hypothesis; its rows mean nothing); ``encoder_out``:
    the search's encoding of ``src`` (:class:`~nmt.translate.search_result.SearchResult`'s), reused."""
    batch, n, width = tokens.shape
    if width == 0:
        return torch.zeros(batch, n, 0, src.size(1), device=tokens.device)
    flat = tokens.reshape(batch * n, width)
    tgt_in = torch.cat([flat.new_full((batch * n, 1), bos), flat[:, :-1]], dim=1)  # BOS + the hypothesis
    positions = torch.arange(width, device=tokens.device)
    tgt_mask = positions.unsqueeze(0) < lengths.reshape(-1, 1).to(tokens.device).clamp(min=1)  # BOS at least
    attention = model.teacher_forced_alignment(src, src_lengths, tgt_in, tgt_mask, repeats=n, encoder_out=encoder_out)
    return attention.float().reshape(batch, n, width, -1)


__all__ = ["full_context_alignment", "hypothesis_alignment"]
