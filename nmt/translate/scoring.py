"""Teacher-forced scoring of given targets, with the first token outside the model's support.

``score_batch`` runs any ``StepDecoder`` (one model or an ``Ensemble``) step by step on the
reference, exactly as beam search would extend that hypothesis: step t feeds token t-1 of
``BOS y`` and reads the log-probability of token t of ``y EOS``. The total is therefore the
log-probability beam search gives the same sequence (with ``min_length=0``; beam search
forbids EOS before ``min_length``, scoring never changes the model's distribution and applies
no length limit: ``nmt-translate`` refuses ``-min_length`` and ``-max_length_ratio`` with scoring).

With a sparse output mapping a reference can have probability exactly 0: the total is then
``-inf`` and ``first_zero`` says at which target position it first left the support, which
token it was, its rank at that step and the support size there. The rank counts the tokens
of strictly higher probability (+1), so every token outside the support shares rank
``support_size + 1``; a model that also exposes its pre-mapping scores
(``step_with_scores``, as ``Seq2Seq`` does) is ranked by scores instead, which orders the
tokens outside the support too (the mappings are monotone, so both ranks agree inside it).

Host synchronisation: none inside the step loop (its length is the padded target width,
known from the batch shape); the caller copies the ``BatchScores`` tensors once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from nmt.models.protocol import State, StepDecoder, attention_request, required_attention

NEG_INF = float("-inf")


@runtime_checkable
class ScoredStepDecoder(Protocol):
    """Optional extension of ``StepDecoder``: a step that also returns the raw output scores."""

    def step_with_scores(self, tokens: Tensor, state: State,
                         encoder_out: State) -> tuple[Tensor, Tensor, Tensor, State]:
        """Like ``step``; returns ``(scores (N, V), log_probs (N, V), attention (N, L), state)``."""
        ...


@dataclass
class BatchScores:
    """Scores of B references (T = padded target width including EOS).

    token_logprobs: (B, T) log-probability of each reference token (EOS included), 0 beyond
        ``lengths``, ``-inf`` where the probability is exactly 0.
    lengths: (B,) long, reference tokens including EOS.
    total: (B,) sum of ``token_logprobs`` (``-inf`` when any token has probability 0).
    zero: (B,) bool, the reference has probability 0.
    first_zero: (B,) long, position of the first zero-probability token (-1: none).
    zero_token / zero_rank / zero_support: (B,) long, at ``first_zero``: the token id, its rank
        among the model's tokens (1 = most preferred) and the number of tokens of nonzero
        probability (all -1 when ``zero`` is False).
    rank_by: "score" or "probability" (see the module docstring).
    attention: (B, T, L) source attention of each step (row t: the step that reads reference token
        t), float32; None unless asked for (``need_attention``).
    """

    token_logprobs: Tensor
    lengths: Tensor
    total: Tensor
    zero: Tensor
    first_zero: Tensor
    zero_token: Tensor
    zero_rank: Tensor
    zero_support: Tensor
    rank_by: str
    attention: Tensor | None = None

    def cpu(self) -> "BatchScores":
        """A copy on the host (one transfer per field)."""
        return BatchScores(**{name: value.cpu() if isinstance(value, Tensor) else value
                              for name, value in vars(self).items()})


def _step(model: StepDecoder, tokens: Tensor, state: State, encoder_out: State,
          by_score: bool, need_attention: bool = False) -> tuple[Tensor, Tensor, Tensor | None, State]:
    """(preference (N, V), log_probs (N, V), attention (N, L) or None, state): preference is what
    ranks are taken over; the attention only with ``need_attention``."""
    ask = attention_request(model, need_attention)  # the attention only where it is read
    if by_score:
        step_with_scores = model.step_with_scores  # type: ignore[attr-defined]
        scores, log_probs, attention, state = step_with_scores(tokens, state, encoder_out, **ask)
    else:
        log_probs, attention, state = model.step(tokens, state, encoder_out, **ask)
        scores = log_probs
    return scores, log_probs, required_attention(attention) if need_attention else None, state


@torch.no_grad()
def score_batch(model: StepDecoder, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, tgt_out: Tensor,
                tgt_lengths: Tensor, need_attention: bool = False) -> BatchScores:
    """Score references under ``model`` by teacher forcing, on the tensors' device.

    src: (B, L) long, src_lengths: (B,) long (every length >= 1); tgt_in: (B, T) ``BOS y``
    padded; tgt_out: (B, T) ``y EOS`` padded; tgt_lengths: (B,) long = len(y) + 1 (the layout of
    ``nmt.data.batching.Batch``). Log-probabilities are accumulated in float32 at least (float64
    kept). ``need_attention``: also the source attention of every step (``BatchScores.attention``;
    ``NoAttention`` where the model returns none). No host synchronisation.
    """
    by_score = isinstance(model, ScoredStepDecoder)
    batch, width = tgt_in.shape
    device = tgt_in.device
    encoder_out, state = model.encode(src, src_lengths)
    positions = torch.arange(width, device=device)  # (T,)
    valid = positions.unsqueeze(0) < tgt_lengths.unsqueeze(1)  # (B, T)
    token_lp, ranks, supports, attentions = [], [], [], []
    for t in range(width):  # the padded width: a shape, not a data-dependent count
        preference, log_probs, attention, state = _step(model, tgt_in[:, t], state, encoder_out, by_score,
                                                        need_attention)  # (B, V) each, (B, L) or None
        if attention is not None:
            attentions.append(attention.float())
        target = tgt_out[:, t : t + 1]  # (B, 1)
        lp = log_probs.gather(1, target).squeeze(1)  # (B,)
        ref_pref = preference.gather(1, target)  # (B, 1)
        ranks.append((preference > ref_pref).sum(1) + 1)  # (B,)
        supports.append(torch.isfinite(log_probs).sum(1))  # (B,)
        token_lp.append(lp)
    dtype = torch.float64 if token_lp[0].dtype == torch.float64 else torch.float32
    token_logprobs = torch.stack(token_lp, 1).to(dtype).masked_fill(~valid, 0.0)  # (B, T)
    rank = torch.stack(ranks, 1)  # (B, T)
    support = torch.stack(supports, 1)  # (B, T)
    is_zero = torch.isneginf(token_logprobs) & valid  # (B, T)
    zero = is_zero.any(1)  # (B,)
    first = is_zero.int().argmax(1, keepdim=True)  # (B, 1) first True (0 when none)
    none = torch.full_like(first.squeeze(1), -1)  # (B,)

    def at_first(x: Tensor) -> Tensor:
        return torch.where(zero, x.gather(1, first).squeeze(1).long(), none)

    return BatchScores(
        token_logprobs=token_logprobs,
        lengths=tgt_lengths.long(),
        total=token_logprobs.sum(1),
        zero=zero,
        first_zero=torch.where(zero, first.squeeze(1), none),
        zero_token=at_first(tgt_out),
        zero_rank=at_first(rank),
        zero_support=at_first(support),
        rank_by="score" if by_score else "probability",
        attention=torch.stack(attentions, 1) if need_attention else None,  # (B, T, L)
    )


__all__ = ["BatchScores", "ScoredStepDecoder", "score_batch"]
