"""Exactness certificates of beam search: reason codes and the per-sentence statistics.

A sentence is *exact* when no candidate of nonzero probability was ever pruned (not kept
among the ``beam_size`` best at a step), no live hypothesis of nonzero probability was
cut by ``max_length``, the model gave no live hypothesis a NaN or ``+inf`` log-probability
(an unknown probability is never taken for an exact zero), and at least one finished
hypothesis has a finite, nonzero probability (an empty search certifies nothing). The set of finished hypotheses is then the whole support of the
model's sequence distribution (under the ``min_length`` constraint), so the first
hypothesis is the true argmax of the ranking score (log-probability divided by the length
penalty, when one is used, plus the coverage penalty, when one is used: each finished hypothesis
carries its own exact penalty, so the ranking does not change what the certificate claims).

``reason`` holds the FIRST violation met while decoding a sentence (an int code; see
``REASONS`` for the decoding table). Sampling (``SearchOptions.sample``) certifies nothing: a
certificate is about a search, and every sampled sentence has the reason ``"sampled"``.
"""
from __future__ import annotations

import torch
from torch import Tensor

EXACT = 0
PRUNED = 1
MAX_LENGTH = 2
NOT_CERTIFIED = 3
NONFINITE = 4
NO_HYPOTHESIS = 5
SAMPLED = 6

REASONS: dict[int, str | None] = {
    EXACT: None,
    PRUNED: "pruned",
    MAX_LENGTH: "max_length",
    NOT_CERTIFIED: "not_certified",
    NONFINITE: "nonfinite_scores",
    NO_HYPOTHESIS: "no_hypothesis",
    SAMPLED: "sampled",
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


def unknown_slots(log_probs: Tensor) -> Tensor:
    """(R, S) bool: the row of a slot holds a NaN or ``+inf`` log-probability (a probability the
    model did not give). log_probs: (R, S, V). One float reduction: the row maximum is NaN when
    the row holds a NaN (max reductions propagate NaN) and ``+inf`` when it holds ``+inf``; a
    per-entry test and a bool reduction cost 10x as much on the CPU at beam x vocabulary size."""
    row_max = log_probs.amax(dim=-1)  # (R, S)
    return torch.isnan(row_max) | (row_max == float("inf"))


def nonfinite_scores(unknown: Tensor, live: Tensor) -> Tensor:
    """(R,) bool: some live slot has an unknown score. unknown: (R, S) from :func:`unknown_slots`;
    live: (R, S) bool, slots whose prefix has nonzero probability."""
    return (unknown & live).any(-1)


def require_hypothesis(exact: Tensor, reason: Tensor, n_nonzero: Tensor) -> tuple[Tensor, Tensor]:
    """The last certificate condition: a sentence is exact only with >= 1 complete finished
    hypothesis of finite, nonzero probability (``n_nonzero`` (B,) long); else NO_HYPOTHESIS."""
    return record_violation(exact, reason, n_nonzero == 0, NO_HYPOTHESIS)


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
    "NONFINITE",
    "NO_HYPOTHESIS",
    "SAMPLED",
    "nonfinite_scores",
    "require_hypothesis",
    "unknown_slots",
    "REASONS",
    "reason_name",
    "record_violation",
    "support_statistics",
]
