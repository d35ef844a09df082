"""Luong/Bahdanau global attention with any registered probability mapping."""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import torch
from torch import Tensor, nn

from nmt.models.recurrent_product import RecurrentWeight
from nmt.sparse import get_mapping

SCORES = ("dot", "general", "mlp")


class Products(NamedTuple):
    """:meth:`GlobalAttention.step_products`: ``scores(query (B, S, K), bias) -> (B, S, L)``
    (None: the score's own computation), ``context(weights (B, S, L)) -> (B, S, Hm)`` and the
    padding as an additive ``bias (B, 1, L)``: 0 on real tokens, ``-inf`` on padding (None: the
    mask goes to the mapping)."""

    scores: Callable[..., Tensor] | None
    context: Callable[[Tensor], Tensor]
    bias: Tensor | None = None


class GlobalAttention(nn.Module):
    """Global attention over a memory bank.

    Scores (``score``): ``dot`` q.m (needs query_size == memory_size), ``general``
    q.(W m) (Luong et al. 2015), ``mlp`` v.tanh(W_q q + W_m m + b) (Bahdanau et al. 2015).
    The scores go through ``get_mapping(mapping, **mapping_params)`` with the padding
    mask, so padded positions get exactly zero weight and sparse mappings give exact
    zeros elsewhere too. With ``continuous`` (a dict of
    ``nmt.models.continuous_attention.ContinuousAttention`` keyword arguments) the
    context is the discrete context plus the continuous one (combined attention).

    Memory-side projections depend only on the source, so they are computed once per
    sentence by :meth:`keys` and passed back to :meth:`forward` at every step.

    ``coverage`` (See et al. 2017; OpenNMT-py's ``-coverage_attn``): each position's key also holds
    its coverage, the attention it received at the steps before, ``k_j + w c_j`` with a learned
    ``w`` (``coverage_weight``, (K,)): for ``dot`` and ``general`` the scores gain
    ``(q . w) c_j``, for ``mlp`` the term enters the tanh. The caller carries the coverage from step
    to step (:meth:`forward`'s ``coverage``).
    """

    def __init__(
        self,
        query_size: int,
        memory_size: int,
        score: str = "general",
        mapping: str = "softmax",
        mapping_params: dict[str, Any] | None = None,
        continuous: dict[str, Any] | None = None,
        coverage: bool = False,
    ) -> None:
        super().__init__()
        if score not in SCORES:
            raise ValueError(f"unknown score {score!r}; valid: {', '.join(SCORES)}")
        if score == "dot" and query_size != memory_size:
            raise ValueError(
                f"score 'dot' needs query_size == memory_size (decoder and encoder hidden_size), "
                f"got {query_size} and {memory_size}; use 'general' or 'mlp'"
            )
        self.score = score
        self.mapping_name = mapping
        self.mapping_params = dict(mapping_params or {})
        self.mapping = get_mapping(mapping, **self.mapping_params)  # the registry checks name and params
        if score == "general":
            self.key_proj = nn.Linear(memory_size, query_size, bias=False)
        elif score == "mlp":
            self.key_proj = nn.Linear(memory_size, query_size, bias=True)
            self.query_proj = nn.Linear(query_size, query_size, bias=False)
            self.v = nn.Linear(query_size, 1, bias=False)
        key_size = memory_size if score == "dot" else query_size
        self.coverage_weight = nn.Parameter(torch.zeros(key_size)) if coverage else None
        self.continuous: nn.Module | None = None
        if continuous is not None:
            from nmt.models.continuous_attention import ContinuousAttention  # only when asked for

            self.continuous = ContinuousAttention(**continuous)

    def step_products(self, memory: Tensor, keys: Tensor, mask: Tensor | None = None) -> Products:
        """What every step of one forward pass shares on the source side: the two batched
        products with the same operand, as :class:`~nmt.models.recurrent_product.RecurrentWeight`
        products, the scores ``q K^T`` (``dot`` and ``general``; None for ``mlp``, whose scores
        are no product) and the context ``p M``; and, given the ``mask`` (B, L), the padding as
        an additive bias made once. Their values are ``torch.bmm``'s; the gradients of ``keys``
        and ``memory`` are one ``bmm`` over all steps after the last (instead of an outer product
        and an addition per step). With the bias a step adds it to its scores (``-inf`` on
        padding: exact zeros from every mapping, whose gradients are zero there) instead of
        inverting the mask and filling the scores, whose backward fills the gradient again: for
        ``dot`` and ``general`` inside the scores' product (``baddbmm``), no operation per step
        instead of three. memory: (B, L, Hm); keys: ``self.keys(memory)``."""
        scores = None if self.score == "mlp" else RecurrentWeight(keys).product
        bias = None
        if mask is not None:
            bias = torch.where(mask, 0.0, float("-inf")).to(keys.dtype).unsqueeze(1)
        return Products(scores, RecurrentWeight(memory.transpose(1, 2)).product, bias)

    def keys(self, memory: Tensor) -> Tensor:
        """Source-side part of the score. memory: (B, L, Hm) -> keys (B, L, K)."""
        return memory if self.score == "dot" else self.key_proj(memory)

    @property
    def coverage(self) -> bool:
        """Whether the keys hold the coverage (``model.attention.coverage``)."""
        return self.coverage_weight is not None

    def scores(self, query: Tensor, keys: Tensor, coverage: Tensor | None = None) -> Tensor:
        """query: (B, T, Hq), keys: (B, L, K) -> raw scores (B, T, L); ``coverage`` (B, T, L): each
        query's coverage (``mlp``: inside the tanh; the other scores add :meth:`coverage_term`)."""
        if self.score == "mlp":
            inner = self.query_proj(query).unsqueeze(2) + keys.unsqueeze(1)  # (B, T, L, K)
            if coverage is not None:
                inner = inner + coverage.unsqueeze(-1) * self.coverage_weight.to(inner.dtype)
            return self.v(torch.tanh(inner)).squeeze(-1)
        return torch.bmm(query, keys.transpose(1, 2))

    def coverage_term(self, query: Tensor, coverage: Tensor) -> Tensor:
        """``(q . w) c_j`` (B, T, L) for ``dot`` / ``general`` scores: the keys ``k_j + w c_j``
        scored against the queries (B, T, Hq), minus ``q . k_j``."""
        return torch.matmul(query, self.coverage_weight.to(query.dtype)).unsqueeze(-1) * coverage.to(query.dtype)

    def forward(
        self, query: Tensor, memory: Tensor, mask: Tensor, keys: Tensor | None = None,
        products: Products | None = None, return_scores: bool = False, coverage: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Attend.

        query: (B, T, Hq), or one step's (N, Hq) with N = B x S: S consecutive query rows per
        memory row (S = 1, or the beam slots of a sentence, whose memory beam search then keeps
        once instead of S times); memory: (B, L, Hm); mask: (B, L) bool, True = real token;
        keys: ``self.keys(memory)`` if already computed; ``products``: this forward pass's
        :meth:`step_products` of ``memory`` and ``keys`` (a step of a teacher-forced loop), or None.
        Returns ``(context, probs)``: context (B, T, Hm) or (N, Hm), probs (B, T, L) or
        (N, L), rows summing to one with exact zeros on padding. A step's S rows per memory row
        are one (S, L) product per sentence, not S products of one row. ``return_scores``: the
        second value is the scores the mapping took instead of its probabilities, ``-inf`` on
        padding (what a Fenchel-Young loss of the attention takes: guided alignment training).
        ``coverage``: with :attr:`coverage`, the queries' coverage, shaped as the probabilities
        ((N, L) for a step; zeros at the first step), which the keys then hold.
        """
        single = query.dim() == 2
        if single:
            query = query.view(memory.size(0), -1, query.size(-1))  # (B, S, Hq)
        if keys is None:
            keys = self.keys(memory)
        if coverage is not None:
            coverage = coverage.view(query.shape[:-1] + coverage.shape[-1:])  # (B, S or T, L)
        bias = None if products is None else products.bias  # the padding, made once per pass
        if products is not None and products.scores is not None:
            scores = products.scores(query, bias)  # q K^T + bias: one product
        else:
            scores = self.scores(query, keys, coverage if self.score == "mlp" else None)
            scores = scores if bias is None else scores + bias
        if coverage is not None and self.score != "mlp":
            scores = scores + self.coverage_term(query, coverage)
        if bias is not None:
            probs = self.mapping(scores, dim=-1)
        else:
            probs = self.mapping(scores, dim=-1, mask=mask.unsqueeze(1).expand_as(scores))
        probs = probs.to(memory.dtype)
        weights = probs
        if self.continuous is not None:  # combined: (p + w) @ memory, one product for both contexts
            weights = probs + self.continuous.source_weights(probs, mask).to(probs.dtype)
        context = products.context(weights) if products is not None else torch.bmm(weights, memory)
        if return_scores:  # the padding as the mapping saw it: -inf (a loss takes no mask)
            probs = scores if bias is not None else scores.masked_fill(~mask.unsqueeze(1), float("-inf"))
        if single:
            return context.view(-1, context.size(-1)), probs.view(-1, probs.size(-1))
        return context, probs
