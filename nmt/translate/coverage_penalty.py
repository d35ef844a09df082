"""Coverage penalties of beam search (OpenNMT-py's ``-coverage_penalty wu|summary -beta B``).

The coverage of a hypothesis y_1..y_n is ``cov_j = sum_i a_ij``: the attention the model put on
source token j at the step that produced y_i, summed over the hypothesis's steps (EOS's step
included). The attention is the one distribution per step the model exposes to the search (the one
``-report_align`` and ``-attention`` read: an RNN's attention; a Transformer's last-layer
cross-attention averaged over its heads; an ensemble's mean). Over the S real source tokens:

- ``"wu"`` (Wu et al. 2016, GNMT): ``cp = beta * sum_j log(min(max(cov_j, epsilon), 1))``
- ``"summary"`` (OpenNMT-py's):    ``cp = -beta * (sum_j max(cov_j, 1) - S)``

Both are <= 0 and are added to a finished hypothesis's ranking score (``score / lp(n) + cp``).

Sparse attention (sparsemax, entmax) puts weight exactly 0 on source tokens, so a hypothesis
that never attends token j has ``cov_j = 0`` and GNMT's ``log min(cov_j, 1)`` is ``-inf``: every
such hypothesis would tie at ``-inf``. Here wu's coverage is floored at ``epsilon``
(``SearchOptions.coverage_epsilon``, default 1e-6): a source token never attended costs
``beta * log(epsilon)`` (about ``-13.8 * beta``), as if it had been attended with total weight
epsilon, and the ranking stays finite and ordered. Summary penalises over-coverage only
(``cov_j > 1``): an unattended token costs nothing, so sparse attention needs no floor there.

Monotonicity (what the search's early stop uses): the attention is nonnegative, so coverage
only grows as a hypothesis is extended. wu is non-decreasing in every ``cov_j``: it moves
toward 0 along a hypothesis, so 0 bounds the penalty of any extension. summary is
non-increasing in every ``cov_j``: it moves away from 0, so the penalty of a live hypothesis's
current coverage bounds the penalty of any of its extensions (:func:`penalty_bound`).

In the search's state, coverage is a (rows, slots, L) tensor whose padding positions (j >= S)
start at 1 (:func:`start_coverage`) and receive no attention: both penalties are then 0 there,
so they are computed over all L positions without a mask (for summary, ``max(1, 1) - 1 = 0``
per padding position). No host sync anywhere.
"""
from __future__ import annotations

import torch
from torch import Tensor

COVERAGE_PENALTIES = ("none", "wu", "summary")
COVERAGE_EPSILON = 1e-6
"""wu's default floor of a source token's coverage (``SearchOptions.coverage_epsilon``)."""


def coverage_penalty(name: str, coverage: Tensor, beta: float, epsilon: float = COVERAGE_EPSILON) -> Tensor:
    """The penalty (...,) of coverages ``coverage`` (..., L) (<= 0; 0 for ``"none"``), summed
    over the last dim; padding positions must hold a coverage of exactly 1 (:func:`start_coverage`),
    or the real ones only be given. ``epsilon`` floors wu's coverage (sparse attention)."""
    if name == "none":
        return coverage.new_zeros(coverage.shape[:-1])
    if name == "wu":
        return torch.log(coverage.clamp(min=epsilon, max=1.0)).sum(-1) * beta
    if name == "summary":
        return (1.0 - coverage.clamp(min=1.0)).sum(-1) * beta
    raise ValueError(f"unknown coverage_penalty {name!r}; valid: {', '.join(COVERAGE_PENALTIES)}")


def penalty_bound(name: str, penalty: Tensor) -> Tensor:
    """An upper bound on the penalty of any extension of hypotheses whose current coverage has
    penalty ``penalty`` (any shape): 0 for wu (it grows toward 0 with coverage), ``penalty``
    itself for summary (it only decreases as coverage grows), 0 for none."""
    if name == "summary":
        return penalty
    return torch.zeros_like(penalty)


def start_coverage(src_lengths: Tensor, length: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """The coverage before the first step, (B, 1, length) on ``src_lengths``' device: 0 at the
    real source positions (j < src_lengths[b]), 1 at the padding ones (where both penalties are
    then 0)."""
    positions = torch.arange(length, device=src_lengths.device)  # (L,)
    return (positions.unsqueeze(0) >= src_lengths.unsqueeze(1)).to(dtype).unsqueeze(1)  # (B, 1, L)


__all__ = ["COVERAGE_EPSILON", "COVERAGE_PENALTIES", "coverage_penalty", "penalty_bound", "start_coverage"]
