"""The distribution sampling draws from: temperature before the output mapping, then top-k / top-p.

Temperature divides the model's raw output scores (the logits, before the output mapping):
``q = mapping(z / T)``, so a sparse mapping stays sparse (1.5-entmax at ``T`` is ``entmax15(z / T)``,
whose support shrinks as ``T`` falls and grows as it rises), and a learned alpha keeps its value.
An :class:`~nmt.translate.ensemble.Ensemble` tempers each member and averages the members'
probabilities (its own ``tempered_step``). Truncation acts on that distribution: ``top_k`` keeps
the k most probable tokens (ties with the k-th kept), then ``top_p`` keeps the smallest set of most
probable tokens whose mass reaches p of what is left (ties with its least probable token kept);
what is kept is renormalised implicitly (Gumbel-max sampling needs only log-probabilities up to
a constant). Every function is tensor code without host syncs.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from nmt.models.protocol import State, StepDecoder, attention_request
from nmt.sparse import is_softmax
from nmt.utils.precision import float32_if_half

NEG_INF = float("-inf")


def tempered_step(model: StepDecoder, tokens: Tensor, state: State, encoder_out: State, temperature: float,
                  need_attention: bool, normalized: bool = False) -> tuple[Tensor, Tensor, Tensor | None, State]:
    """One decoder step with the distribution at ``temperature``.

    Returns ``(log_probs (N, V), tempered (N, V), attention (N, L) or None, state)``: the model's
    own log-probabilities (``T = 1``: what a sample's score adds up) and those of
    ``mapping(logits / T)`` (the same tensor at ``T = 1``), the latter up to a per-row constant
    (all Gumbel-max and :func:`sampling_log_probs` need): for a softmax output
    (:func:`softmax_output`) ``z / T - max(z / T)``, which is ``log softmax(z / T) + lse`` without
    the mapping's exponentials and the same for rows holding NaN or ``+inf`` (NaN throughout, as
    the mapping gives); ``normalized=True`` (an ensemble's members, whose probabilities are
    averaged) asks for the log-probabilities themselves. A model with ``tempered_step`` (an ensemble) answers itself, a
    copying one (``copies``) with ``copy_tempered_step``; another needs
    ``step_with_scores`` and ``log_probs`` (as ``Seq2Seq`` and ``TransformerSeq2Seq`` have) unless
    ``T = 1``: ValueError naming its type otherwise.

    Two mappings per step remain for a sparse output at ``T != 1``: the model's step returns its
    ``T = 1`` log-probabilities with the logits (``step_with_scores``), and those are needed
    anyway: a sample's score, the support statistics and the last step's EOS test read them, and a
    sparse mapping's ``T = 1`` threshold (its support) is not a function of the ``T`` threshold;
    the threshold is most of a sparse mapping's cost (the native long-row passes write the
    probabilities while finding it), so the drawn token's log-probability alone would save little.
    Skipping the ``T = 1`` mapping for softmax would need a model step without its mapping (a
    change of the ``StepDecoder`` protocol); the second one is what this function saves."""
    own = getattr(model, "tempered_step", None)
    if own is not None:
        return own(tokens, state, encoder_out, temperature, need_attention)
    ask: dict[str, Any] = attention_request(model, need_attention)
    if temperature == 1.0:
        log_probs, attention, state = model.step(tokens, state, encoder_out, **ask)
        return log_probs, log_probs, attention, state
    if getattr(model, "copies", False):  # the copies tempered with the vocabulary (model.output.copy)
        return model.copy_tempered_step(tokens, state, encoder_out, temperature, need_attention)
    with_scores = getattr(model, "step_with_scores", None)
    log_probs_of = getattr(model, "log_probs", None)
    if with_scores is None or log_probs_of is None:
        raise ValueError(f"temperature {temperature} needs the model's output scores before its mapping "
                         f"(step_with_scores and log_probs); {type(model).__name__} has none")
    logits, log_probs, attention, state = with_scores(tokens, state, encoder_out, **ask)
    scaled = float32_if_half(logits) / temperature  # (N, V)
    if softmax_output(model) and not normalized:  # log softmax(z / T) up to a per-row constant: no second mapping
        return log_probs, scaled - scaled.amax(dim=-1, keepdim=True), attention, state
    return log_probs, log_probs_of(scaled), attention, state


def softmax_output(model: StepDecoder) -> bool:
    """Whether ``model``'s output mapping is softmax (its ``generator.mapping_name``, as nmt's
    models have; False where it has none): then :func:`tempered_step` skips the mapping at ``T``."""
    name = getattr(getattr(model, "generator", None), "mapping_name", None)
    return isinstance(name, str) and is_softmax(name)


def top_k(log_probs: Tensor, k: int) -> Tensor:
    """``log_probs`` (R, V) with every token less probable than the row's k-th most probable set to
    ``-inf`` (ties with the k-th are kept); unchanged for ``k = 0`` or ``k >= V``."""
    if k <= 0 or k >= log_probs.size(-1):
        return log_probs
    kth = log_probs.topk(k, dim=-1).values[:, k - 1 : k]  # (R, 1)
    return log_probs.masked_fill(log_probs < kth, NEG_INF)


def top_p(log_probs: Tensor, p: float) -> Tensor:
    """``log_probs`` (R, V) restricted to each row's nucleus: the most probable tokens, in order of
    probability, until their mass (of the row's total) reaches ``p``; the token that crosses ``p``
    is kept, and so are those tied with it. Unchanged for ``p >= 1``. A row without any finite entry
    stays as it is."""
    if p >= 1.0:
        return log_probs
    ordered = log_probs.sort(dim=-1, descending=True).values  # (R, V)
    probs = torch.softmax(ordered, dim=-1).nan_to_num(nan=0.0)  # (R, V) renormalised; 0 for a row of -inf
    before = torch.cumsum(probs, dim=-1) - probs  # (R, V) mass strictly before each sorted entry
    kept = (before < p).sum(-1, keepdim=True).clamp(min=1)  # (R, 1) the nucleus size (>= 1)
    smallest = ordered.gather(-1, kept - 1)  # (R, 1) the least probable kept log-probability
    return log_probs.masked_fill(log_probs < smallest, NEG_INF)


def sampling_log_probs(tempered: Tensor, k: int, p: float, forbid: int | None = None) -> Tensor:
    """What Gumbel-max sampling perturbs: ``tempered`` (R, V) with NaN / ``+inf`` (unknown) and the
    ``forbid`` column (EOS before ``min_length``; None: none) at ``-inf``, then :func:`top_k` and
    :func:`top_p`. Log-probabilities up to a per-row constant (the truncated rows are not
    renormalised: their argmax under the same noise does not change)."""
    scores = tempered.nan_to_num(nan=NEG_INF, posinf=NEG_INF, neginf=NEG_INF)  # (R, V)
    if forbid is not None:
        column = torch.arange(scores.size(-1), device=scores.device) == forbid  # (V,)
        scores = scores.masked_fill(column, NEG_INF)
    return top_p(top_k(scores, k), p)


__all__ = ["sampling_log_probs", "softmax_output", "tempered_step", "top_k", "top_p"]
