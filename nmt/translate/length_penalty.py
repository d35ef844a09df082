"""Length penalties used to rank finished hypotheses.

A finished hypothesis with total log-probability ``s`` and length ``n`` (tokens generated,
EOS included) is ranked by ``s / lp(n)``:

- ``"none"``:    lp(n) = 1 (rank by the sequence probability itself)
- ``"average"``: lp(n) = n (mean log-probability per token)
- ``"gnmt"``:    lp(n) = ((5 + n) / 6) ** alpha (Wu et al. 2016)

Every lp is positive and non-decreasing in n, so for a live hypothesis with score s <= 0
no continuation can rank above ``s / lp(n_max)``: beam search uses that bound to stop.
"""
from __future__ import annotations

import torch
from torch import Tensor

LENGTH_PENALTIES = ("none", "average", "gnmt")


def check_length_penalty(name: str, alpha: float) -> None:
    """Raise ValueError for an unknown penalty name or a negative GNMT alpha."""
    if name not in LENGTH_PENALTIES:
        raise ValueError(
            f"unknown length_penalty {name!r}; valid: {', '.join(LENGTH_PENALTIES)}"
        )
    if name == "gnmt" and alpha < 0:
        raise ValueError(f"length_alpha must be >= 0 for gnmt, got {alpha}")


def length_penalty(
    name: str, lengths: Tensor | int | float, alpha: float = 0.6, dtype: torch.dtype = torch.float32
) -> Tensor | float:
    """lp(n) for ``lengths`` (tensor of any shape, computed in ``dtype``, or a number)."""
    check_length_penalty(name, alpha)
    if name == "none":
        return torch.ones_like(lengths, dtype=dtype) if isinstance(lengths, Tensor) else 1.0
    if isinstance(lengths, Tensor):
        lengths = lengths.to(dtype)
    if name == "average":
        return lengths
    return ((5.0 + lengths) / 6.0) ** alpha


__all__ = ["LENGTH_PENALTIES", "check_length_penalty", "length_penalty"]
