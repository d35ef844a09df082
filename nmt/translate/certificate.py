"""Exactness certificates of beam search: reason codes and the per-sentence statistics.

A sentence is *exact* when no candidate of nonzero probability was ever pruned (not kept
among the ``beam_size`` best at a step) and no live hypothesis of nonzero probability was
cut by ``max_length``. The set of finished hypotheses is then the whole support of the
model's sequence distribution (under the ``min_length`` constraint), so the first
hypothesis is the true argmax of the ranking score (log-probability divided by the length
penalty, when one is used).

``reason`` holds the FIRST violation met while decoding a sentence (an int code; see
``REASONS`` for the decoding table).
"""
from __future__ import annotations

import torch
from torch import Tensor

EXACT = 0
PRUNED = 1
MAX_LENGTH = 2
NOT_CERTIFIED = 3

REASONS: dict[int, str | None] = {
    EXACT: None,
    PRUNED: "pruned",
    MAX_LENGTH: "max_length",
    NOT_CERTIFIED: "not_certified",
}
"""Reason code -> name (``None`` for an exact sentence)."""


def reason_name(code: int) -> str | None:
    """Name of a reason code (``None`` = exact); ValueError for an unknown code."""
    try:
        return REASONS[int(code)]
    except KeyError:
        raise ValueError(f"unknown certificate reason code {code}; valid: {sorted(REASONS)}") from None


def record_violation(exact: Tensor, reason: Tensor, violated: Tensor, code: int) -> tuple[Tensor, Tensor]:
    """Mark sentences whose certificate breaks now.

    exact, violated: (B,) bool; reason: (B,) long. Returns the updated ``(exact, reason)``;
    a sentence keeps the first reason it met.
    """
    newly = violated & exact
    return exact & ~violated, torch.where(newly, torch.full_like(reason, code), reason)


def support_statistics(logprobs: Tensor, complete: Tensor) -> tuple[Tensor, Tensor]:
    """Count and total probability of the complete finished hypotheses.

    logprobs: (B, F) total log-probabilities; complete: (B, F) bool (EOS-terminated, finite).
    Returns ``n_nonzero`` (B,) long and ``mass`` (B,) float = sum of exp(logprob), computed
    with a log-sum-exp (0 when there is none).
    """
    masked = logprobs.masked_fill(~complete, float("-inf"))
    return complete.sum(-1), torch.logsumexp(masked, dim=-1).exp()


__all__ = [
    "EXACT",
    "PRUNED",
    "MAX_LENGTH",
    "NOT_CERTIFIED",
    "REASONS",
    "reason_name",
    "record_violation",
    "support_statistics",
]
