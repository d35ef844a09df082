"""Output layer: linear projection to the vocabulary plus the output mapping."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.models.linear import Linear
from nmt.sparse import get_mapping, is_softmax, log_probs_of


class Generator(nn.Module):
    """hidden (..., H) -> logits (..., V); probabilities = ``mapping(logits)``.

    The logits are raw scores (the Fenchel-Young loss of the same mapping takes them);
    :meth:`log_probs` gives log-probabilities with ``-inf`` exactly where the mapping
    gives 0 (never for softmax).
    """

    def __init__(
        self, hidden_size: int, vocab_size: int, mapping: str = "softmax", params: dict[str, Any] | None = None
    ) -> None:
        super().__init__()
        self.proj = Linear(hidden_size, vocab_size)
        self.mapping_name = mapping
        self.mapping_params = dict(params or {})
        self.mapping = get_mapping(mapping, **self.mapping_params)  # the registry checks name and params

    def forward(self, hidden: Tensor) -> Tensor:
        """hidden (..., H) -> logits (..., V) (float32 CPU products through oneDNN: :class:`Linear`)."""
        return self.proj(hidden)

    def log_probs(self, logits: Tensor) -> Tensor:
        """logits: (..., V) -> log p (..., V); half/bfloat16 inputs are computed in float32."""
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        if is_softmax(self.mapping_name):
            return F.log_softmax(logits, dim=-1)
        return log_probs_of(self.mapping(logits, dim=-1))
