"""The probability mapping of the heads of one multi-head attention module.

Any mapping of the ``nmt.sparse`` registry, with its parameters bound, or -- for
``entmax_bisect`` with ``alpha: learned`` -- one trainable alpha per head (Correia, Niculae
& Martins 2019, "Adaptively Sparse Transformers"): ``alpha = max(1 + sigmoid(a), 1.01)``,
in [1.01, 2] (the paper's clamp: near 1 the exponent 1/(alpha - 1) of alpha-entmax
overflows, and ``sigmoid`` underflows to 0 for very negative ``a``), starting at 1.5
(``a = 0``, the paper's choice) or at ``alpha_init`` in [1.01, 2) (``a = logit(alpha_init - 1)``;
near 1 the heads start close to softmax). The gradient reaches ``a`` through the alpha-gradient
of :func:`nmt.sparse.entmax_bisect` (zero while clamped at 1.01).

``temperature`` (any mapping, default 1): the heads map ``scores / temperature``. Near a
uniform row of ``n`` keys alpha-entmax reacts ``n^(alpha - 1)`` times more strongly to a score
difference than softmax (Jacobians ``n^(alpha - 2) (I - 11^T / n)`` and ``n^-1 (I - 11^T / n)``):
with softmax's ``1 / sqrt(d_head)`` scaling, 1.5-entmax heads start about ``sqrt(n)`` times
"colder", sparse from the first update, and keys outside the support get no gradient. A
temperature above 1 starts them closer to softmax's regime.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from nmt.sparse import get_mapping
from nmt.sparse.entmax import entmax_bisect_above_one

LEARNED = "learned"
ALPHA_INIT = "alpha_init"
"""Parameter of a learned alpha: its starting value (default 1.5)."""
ALPHA_MIN = 1.01
"""Lower clamp of a learned alpha (Correia et al. 2019)."""
TEMPERATURE = "temperature"
"""Parameter of any head mapping: the scores are divided by it (default 1)."""


def head_temperature(params: dict[str, Any]) -> float:
    """The ``temperature`` of head-mapping ``params`` (1 when absent); ValueError unless a positive number."""
    value = params.get(TEMPERATURE, 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ValueError(f"temperature must be a positive number, got {value!r}")
    return float(value)


class HeadMapping(nn.Module):
    """scores (B, heads, T, S) -> probabilities over S, exact zeros where ``mask`` is False.

    ``params`` are the mapping's keyword parameters (checked against the registry: unknown
    names raise ValueError); ``{"alpha": "learned"}`` is accepted for ``entmax_bisect`` only,
    with an optional ``alpha_init`` in [1.01, 2) (default 1.5); ``temperature`` (any mapping)
    divides the scores.
    With a learned alpha, ``entmax_bisect`` reads the tiny alpha tensor on the host (its check
    and the choice of the softmax rows) only on the CPU's eager path; on an accelerator and in
    compiled graphs the alphas stay on the device (no host synchronisation).
    """

    def __init__(self, heads: int, mapping: str = "softmax", params: dict[str, Any] | None = None) -> None:
        super().__init__()
        params = dict(params or {})
        self.name = mapping
        self.heads = heads
        self.temperature = head_temperature(params)
        params.pop(TEMPERATURE, None)
        self.learned_alpha = params.get("alpha") == LEARNED
        if self.learned_alpha:
            if mapping != "entmax_bisect":
                raise ValueError(f"alpha: 'learned' needs mapping entmax_bisect, got {mapping!r}")
            del params["alpha"]
            start = float(params.pop(ALPHA_INIT, 1.5))
            if not ALPHA_MIN <= start < 2:
                raise ValueError(f"alpha_init must lie in [{ALPHA_MIN}, 2), got {start}")
            self.alpha_logit = nn.Parameter(torch.full((heads,), math.log((start - 1) / (2 - start))))
        elif ALPHA_INIT in params:
            raise ValueError("alpha_init needs alpha: learned")
        self.params = params
        self.function = get_mapping(mapping, **params)  # validates the name and parameters
        # alpha >= ALPHA_MIN > 1: no softmax rows to select (entmax_bisect, off the CPU, computes a
        # softmax of every row to select those with alpha = 1)
        self._bisect = entmax_bisect_above_one if self.learned_alpha else None

    def alpha(self) -> Tensor | None:
        """(heads,) the learned alphas ``max(1 + sigmoid(a), 1.01)`` in [1.01, 2], or None without one."""
        if not self.learned_alpha:
            return None
        return (1 + torch.sigmoid(self.alpha_logit)).clamp(min=ALPHA_MIN)

    def forward(self, scores: Tensor, mask: Tensor | None = None) -> Tensor:
        """scores: (B, heads, T, S); mask: bool broadcastable to it (True = keep) or None."""
        if self.temperature != 1.0:
            scores = scores / self.temperature
        if self._bisect is not None:
            # not cast to half scores' dtype: entmax_bisect takes alpha in its compute dtype (float32
            # for half scores); bfloat16 would round it to steps of 2^-7 (1.01 -> 1.0078)
            alpha = self.alpha().view(1, self.heads, 1, 1)
            return self._bisect(scores, alpha=alpha, dim=-1, mask=mask, **self.params)
        return self.function(scores, dim=-1, mask=mask)

    def extra_repr(self) -> str:
        temperature = f", temperature={self.temperature:g}" if self.temperature != 1.0 else ""
        return f"{self.name}, heads={self.heads}{', alpha=learned' if self.learned_alpha else ''}{temperature}"


__all__ = ["ALPHA_INIT", "ALPHA_MIN", "HeadMapping", "LEARNED", "TEMPERATURE", "head_temperature"]
