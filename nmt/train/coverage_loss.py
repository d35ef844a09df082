"""The coverage loss (``training.coverage_loss``; See et al. 2017, OpenNMT-py's ``-lambda_coverage``).

At target step t the coverage of source position j is the attention it received before,
``c_tj = sum_{s < t} a_sj``; the loss ``sum_t sum_j min(a_tj, c_tj)`` over the real target steps
penalises attending again where the attention has been (repetition), and is 0 for an attention
that never returns to a position. It reads the attention a teacher-forced pass returns (the LSTM's
one attention, a Transformer's alignment heads averaged), with or without ``model.attention.coverage``
(which lets the attention see its coverage). Element-wise and a cumulative sum: no host sync.
"""
from __future__ import annotations

import torch
from torch import Tensor

from nmt.utils.precision import float32_if_half


def coverage_loss(attention: Tensor, tgt_out: Tensor, pad_index: int) -> Tensor:
    """``sum_{t, j} min(a_tj, c_tj)`` over the target steps whose ``tgt_out`` (B, T) is not
    ``pad_index``, of ``attention`` (B, T, L) (probabilities); 0-d, float32 or wider. Its gradient
    reaches the attention through both arguments of the min (the earlier steps' through c)."""
    a = float32_if_half(attention)
    coverage = torch.cat([torch.zeros_like(a[:, :1]), torch.cumsum(a, dim=1)[:, :-1]], dim=1)  # (B, T, L): steps before
    per_step = torch.minimum(a, coverage).sum(-1)  # (B, T)
    return torch.where(tgt_out != pad_index, per_step, 0).sum()


__all__ = ["coverage_loss"]
