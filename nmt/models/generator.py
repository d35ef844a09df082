"""Output layer: linear projection to the vocabulary plus the output mapping (and, with
``model.output.copy``, the scores of copying each source position: :mod:`nmt.models.copy_attention`)."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.models.copy_attention import CopyAttention
from nmt.models.linear import Linear
from nmt.sparse import get_mapping, is_softmax, log_probs_of
from nmt.utils.precision import float32_if_half


class Generator(nn.Module):
    """hidden (..., H) -> logits (..., V); probabilities = ``mapping(logits)``.

    The logits are raw scores (the Fenchel-Young loss of the same mapping takes them);
    :meth:`log_probs` gives log-probabilities with ``-inf`` exactly where the mapping
    gives 0 (never for softmax).

    ``copy``: a :class:`~nmt.models.copy_attention.CopyAttention` (``model.output.copy``): the
    scores of a teacher-forced pass (:meth:`output_scores`) are then the joint (..., V + L) of the
    vocabulary and the L source positions, and a step's log-probabilities (:meth:`step_outputs`)
    those of the tokens' marginal distribution; ``copy_source`` is the encoder output's part for it.
    """

    def __init__(
        self, hidden_size: int, vocab_size: int, mapping: str = "softmax", params: dict[str, Any] | None = None,
        copy: CopyAttention | None = None,
    ) -> None:
        super().__init__()
        self.proj = Linear(hidden_size, vocab_size)
        self.mapping_name = mapping
        self.mapping_params = dict(params or {})
        self.mapping = get_mapping(mapping, **self.mapping_params)  # the registry checks name and params
        self.copy = copy

    def forward(self, hidden: Tensor) -> Tensor:
        """hidden (..., H) -> logits (..., V) (float32 CPU products through oneDNN: :class:`Linear`)."""
        return self.proj(hidden)

    def copy_source(self, memory: Tensor, src: Tensor, src_mask: Tensor) -> dict[str, Tensor]:
        """The encoder output's entries for copying (none without ``copy``): ``"copy_keys"`` (B,
        L, H) and ``"copy_ids"`` (B, L) (:meth:`CopyAttention.source`)."""
        if self.copy is None:
            return {}
        keys, ids = self.copy.source(memory, src, src_mask)
        return {"copy_keys": keys, "copy_ids": ids}

    def output_scores(self, hidden: Tensor, source: dict[str, Tensor]) -> Tensor:
        """hidden (..., H) -> the scores the output mapping and its loss take: the logits (..., V),
        or with ``copy`` the joint scores (..., V + L) (``source``: :meth:`copy_source`'s entries,
        hidden (B, T, H) or a step's (N, H), N = B x S)."""
        logits = self(hidden)
        if self.copy is None:
            return logits
        copied = self.copy.scores(hidden, source["copy_keys"], source["copy_ids"])
        return torch.cat([logits, copied.to(logits.dtype)], dim=-1)

    def output_probs(self, scores: Tensor, source: dict[str, Tensor]) -> Tensor:
        """The token distribution (..., V) of :meth:`output_scores`' ``scores`` (float32 for half
        scores): the mapping's, with ``copy`` the marginal of the joint one (``source``'s
        ``"copy_ids"`` (B, L) for scores (B, T, V + L) or a step's (N, V + L), N = B x S)."""
        probs = self.mapping(float32_if_half(scores), dim=-1)
        return probs if self.copy is None else self.copy.marginal(probs, source["copy_ids"], self.proj.out_features)

    def output_target(self, scores: Tensor, target: Tensor, source: dict[str, Tensor]) -> Tensor:
        """What the loss of teacher-forced ``scores`` (B, T, V or V + L) takes at ``target`` (B, T):
        ``target`` itself, or with ``copy`` the distribution (B, T, V + L) of
        :meth:`CopyAttention.loss_target` (padding rows to be ignored by the caller)."""
        if self.copy is None:
            return target
        return self.copy.loss_target(self.mapping, scores, target, source["copy_ids"])

    def step_outputs(self, hidden: Tensor, source: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """A step's ``(scores (N, V), log_probs (N, V))`` from its output ``hidden`` (N, H): the
        logits and :meth:`log_probs`; with ``copy`` each token's largest joint score
        (:meth:`CopyAttention.collapsed_scores`) and the log of the marginal, ``-inf`` exactly
        where it is 0."""
        if self.copy is None:
            logits = self(hidden)
            return logits, self.log_probs(logits)
        joint = self.output_scores(hidden, source)
        return (self.copy.collapsed_scores(joint, source["copy_ids"], self.proj.out_features),
                log_probs_of(self.output_probs(joint, source)))

    def copy_log_probs(self, hidden: Tensor, source: dict[str, Tensor], temperature: float) -> tuple[Tensor, Tensor]:
        """A copying step's ``(log_probs (N, V), tempered (N, V))`` from one pass of the output layer
        over ``hidden`` (N, H): the marginal's log-probabilities, and those of the joint scores
        divided by ``temperature`` (the copies tempered with the vocabulary), ``-inf`` at zeros."""
        joint = self.output_scores(hidden, source)
        return (log_probs_of(self.output_probs(joint, source)),
                log_probs_of(self.output_probs(float32_if_half(joint) / temperature, source)))

    def log_probs(self, logits: Tensor) -> Tensor:
        """logits: (..., V) -> log p (..., V); half/bfloat16 inputs are computed in float32."""
        logits = float32_if_half(logits)
        if is_softmax(self.mapping_name):
            return F.log_softmax(logits, dim=-1)
        return log_probs_of(self.mapping(logits, dim=-1))
