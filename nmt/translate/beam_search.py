"""Batched beam search over batch x beam with exactness certificates.

All state lives in tensors on the model's device: no per-hypothesis Python objects, and one
host synchronisation per step (the stop test, ``done.tolist()``), which also tells which
sentences leave the batch. Greedy decoding is ``beam_size=1``.

At step t every live hypothesis (a slot of the beam) is extended by every token; a candidate
scores its total log-probability (log 0 = -inf: such candidates are never kept, counted nor
expanded). The ``beam_size`` best candidates are kept; kept candidates ending in EOS become
finished hypotheses (their slot is free at the next step), the others stay live. Finished
hypotheses are never discarded: all of them are recovered from the step history at the end,
ranked by log-probability / length penalty.

Certificate (``certify=True``): a sentence is exact iff no finite candidate was left outside
the beam at any step, no live hypothesis with a finite non-EOS continuation was cut by
``max_length``, no live hypothesis got a NaN / +inf score (a NaN is never an exact zero: a
model with NaN weights certifies nothing) and at least one finished hypothesis has a finite,
nonzero probability. Then the finished hypotheses are exactly the sequences of nonzero probability
(with at least ``min_length`` tokens before EOS), ``n_nonzero`` counts them, ``mass`` sums
their probabilities, and the first hypothesis is the true argmax of the ranking score. A
sentence stays in the search while it is exact and has live hypotheses (so that the whole
support is enumerated); once not exact, it stops as soon as it has ``n_best`` finished
hypotheses and either the best candidate of a step was a finished one (OpenNMT's rule) or no
live hypothesis can still rank above the ``n_best``-th finished one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from nmt.models.protocol import StepDecoder, select_state, tile_state
from nmt.translate.certificate import (
    MAX_LENGTH,
    NONFINITE,
    NOT_CERTIFIED,
    PRUNED,
    nonfinite_scores,
    reason_name,
    record_violation,
    require_hypothesis,
    support_statistics,
    unknown_scores,
)
from nmt.translate.history import SearchHistory, backtrack
from nmt.translate.length_penalty import length_penalty
from nmt.translate.search_options import SearchOptions

NEG_INF = float("-inf")


@dataclass
class SearchResult:
    """Output of ``beam_search`` for a batch of B sentences (n = n_best, T = steps run).

    tokens: (B, n, T) long, EOS included, padded with ``pad`` after it.
    lengths: (B, n) long, tokens generated including EOS (0 = no hypothesis in that slot).
    scores: (B, n) float, total log-probabilities (-inf = no hypothesis in that slot).
    ranking_scores: (B, n) float, scores / length penalty (the order of the n-best list).
    complete: (B, n) bool, hypothesis ends with EOS (False: cut at max_length or missing).
    attention: (B, n, T, L) float source attention per generated token, or None.
    exact: (B,) bool certificate; n_nonzero: (B,) long number of complete finished
    hypotheses (all of nonzero probability); mass: (B,) float their total probability;
    reason: (B,) long code, decoded by ``reason_names`` (None when exact).
    support_size: (B, n, T) int32 number of nonzero-probability tokens at each step, or None.
    support_tokens / support_probs: (B, n, T, m) the m most probable tokens at each step and
    their probabilities (0 beyond the support), only with ``return_support``.
    """

    tokens: Tensor
    lengths: Tensor
    scores: Tensor
    ranking_scores: Tensor
    complete: Tensor
    attention: Tensor | None
    exact: Tensor
    n_nonzero: Tensor
    mass: Tensor
    reason: Tensor
    support_size: Tensor | None = None
    support_tokens: Tensor | None = None
    support_probs: Tensor | None = None
    steps: int = 0

    @property
    def certified(self) -> Tensor:
        """(B,) bool, the certificate (the same tensor as ``exact``, its older name)."""
        return self.exact

    def reason_names(self) -> list[str | None]:
        """Per sentence: None when exact, else "pruned", "max_length", "not_certified",
        "nonfinite_scores" or "no_hypothesis"."""
        return [reason_name(code) for code in self.reason.tolist()]


class Specials(NamedTuple):
    """Target token ids the search needs: BOS starts, EOS ends, PAD fills."""

    bos: int
    eos: int
    pad: int


@dataclass
class _SearchEnd:
    """State of the search when it stops, for ``_collect`` (B sentences, K = beam size).

    truncated: (B_active, K) bool live hypotheses cut by max_length (EOS of probability 0),
    or None when the last step was not reached; active: (B_active,) long original index of
    the rows still searched at the end (None: all, in order); exact, reason: (B,) per sentence.
    """

    truncated: Tensor | None
    active: Tensor | None
    exact: Tensor
    reason: Tensor


def beam_search(
    model: StepDecoder,
    src: Tensor,
    src_lengths: Tensor,
    *,
    bos: int,
    eos: int,
    pad: int = 0,
    options: SearchOptions | None = None,
    **overrides: Any,
) -> SearchResult:
    """Decode a batch: src (B, L) long, src_lengths (B,) long, on the model's device.

    ``options`` (default ``SearchOptions()``) holds beam size, n-best, lengths, length
    penalty, certificate and what to return; keyword ``overrides`` (``beam_size=4``, ...,
    any ``SearchOptions`` field) replace fields of it, so ``beam_search(m, s, l, bos=.., eos=..,
    beam_size=4)`` equals ``beam_search(m, s, l, bos=.., eos=.., options=SearchOptions(beam_size=4))``.
    Invalid options raise ValueError naming the field. At most ``max_length`` tokens are
    generated before EOS; EOS is forbidden before ``min_length`` tokens. ``certify=False``
    skips the certificate (and its extra search of exact sentences): every ``reason`` is then
    "not_certified". ``support_stats=False`` skips counting the nonzero-probability tokens of
    every row at every step (``support_size`` is then None unless ``return_support``).
    One host sync per step (the stop test). Returns a ``SearchResult``.
    """
    options = (options or SearchOptions()).updated(**overrides)
    with torch.no_grad():  # not inference_mode: models may cache tensors reused in training
        return _search(model, src, src_lengths, Specials(bos, eos, pad), options)


def greedy_search(model: StepDecoder, src: Tensor, src_lengths: Tensor, **kwargs: Any) -> SearchResult:
    """``beam_search`` with ``beam_size=1``: the most probable token at every step."""
    return beam_search(model, src, src_lengths, **{**kwargs, "beam_size": 1})


def _search(model: StepDecoder, src: Tensor, src_lengths: Tensor, special: Specials,
            options: SearchOptions) -> SearchResult:
    """The search loop; shapes: B sentences, R rows still searched, S slots per row (1 at the
    first step, then K = beam size), V target vocabulary, L source length, T steps."""
    bos, eos, pad = special
    k, n_best, max_length, min_length = options.beam_size, options.n_best, options.max_length, options.min_length
    penalty, alpha, certify = options.length_penalty, options.length_alpha, options.certify
    return_support, return_attention = options.return_support, options.return_attention
    device = src.device
    batch = src.size(0)
    encoder_out, state = model.encode(src, src_lengths)
    # The first step runs one row per sentence (all k slots would hold the same BOS prefix);
    # the state is tiled to k slots by the first reordering.
    scores = torch.zeros((batch, 1), device=device)  # (R, S) log-probability of each live prefix
    tokens = torch.full((batch,), bos, dtype=torch.long, device=device)  # (R*S,) last token
    exact = torch.full((batch,), certify, dtype=torch.bool, device=device)  # (R,)
    reason = torch.full((batch,), 0 if certify else NOT_CERTIFIED, dtype=torch.long, device=device)  # (R,)
    best_finished = torch.full((batch, n_best), NEG_INF, device=device)  # (R, n_best) ranking scores
    top_finished = torch.zeros(batch, dtype=torch.bool, device=device)  # (R,)
    active: Tensor | None = None  # (R,) original index of each row; None = all, in order
    out_exact, out_reason = exact.clone(), reason.clone()  # (B,), (B,)

    count_support = options.support_stats or return_support
    fills: dict[str, float | int | bool] = {"token": pad, "parent": 0, "score": NEG_INF}
    if return_attention:
        fills["attention"] = 0.0
    if count_support:
        fills["support_size"] = 0
    if return_support:
        fills["support_tokens"] = pad
        fills["support_probs"] = 0.0
    history = SearchHistory(batch, fills)
    truncated: Tensor | None = None  # (R, K) bool, set at the last step
    bound_penalty = length_penalty(penalty, max_length + 1, alpha)
    eos_index = torch.tensor([eos], device=device)  # (1,)

    for t in range(max_length + 1):
        log_probs, attention, state = model.step(tokens, state, encoder_out)  # (R*S, V), (R*S, L)
        rows, slots = scores.shape  # slots: 1 at the first step, then k
        vocab = log_probs.size(-1)
        if t == 0:  # half precision is upcast; float32/float64 kept
            dtype = torch.float32 if log_probs.dtype in (torch.float16, torch.bfloat16) else log_probs.dtype
            scores, best_finished = scores.to(dtype), best_finished.to(dtype)
        log_probs = log_probs.to(scores.dtype).view(rows, slots, vocab)  # (R, S, V)
        # NaN / +inf is an unknown probability: it breaks the certificate of a live slot and is
        # never an exact zero there; it never enters the beam either (not even from a dead slot,
        # where it would push finite candidates out unnoticed)
        unknown = unknown_scores(log_probs)  # (R, S, V)
        if certify:
            exact, reason = record_violation(exact, reason, nonfinite_scores(unknown, torch.isfinite(scores)),
                                             NONFINITE)
        log_probs = log_probs.masked_fill(unknown, NEG_INF)  # (R, S, V)
        if t < min_length:
            log_probs = log_probs.index_fill(-1, eos_index, NEG_INF)
        cand = scores.unsqueeze(-1) + log_probs  # (R, S, V)
        record: dict[str, Tensor] = {}
        if count_support:
            record["support_size"] = _support_size(log_probs)  # (R, S), per parent row
        if return_support:
            top_lp, top_tok = log_probs.topk(min(options.support_topk, vocab), dim=-1)  # (R, S, m)
            record["support_tokens"] = top_tok
            record["support_probs"] = top_lp.exp()
        if return_attention:
            record["attention"] = attention.to(scores.dtype).view(rows, slots, -1)  # (R, S, L)

        if t == max_length:  # only EOS may follow: the final step
            top_scores = cand[..., eos]  # (R, S)
            parent = torch.arange(slots, device=device).expand(rows, slots)  # (R, S)
            chosen = torch.full_like(parent, eos)  # (R, S)
            live_before = torch.isfinite(scores)  # (R, S)
            truncated = _pad_slots(live_before & ~torch.isfinite(top_scores), k, False)  # (R, K)
            if certify:
                eos_ok = torch.isfinite(log_probs[..., eos]).int()  # (R, S)
                support = record["support_size"] if count_support else _support_size(log_probs)  # (R, S)
                cut = (live_before & (support - eos_ok > 0)).any(1)  # (R,)
                exact, reason = record_violation(exact, reason, cut, MAX_LENGTH)
        else:
            width = min(k + 1 if certify else k, slots * vocab)
            top_scores, top_index = cand.view(rows, slots * vocab).topk(width, dim=1)  # (R, width)
            if certify and width > k:
                pruned = torch.isfinite(top_scores[:, k])  # (R,) a finite candidate left out
                exact, reason = record_violation(exact, reason, pruned, PRUNED)
                top_scores, top_index = top_scores[:, :k], top_index[:, :k]  # (R, K)
            parent = torch.div(top_index, vocab, rounding_mode="floor")  # (R, K) slot extended
            chosen = top_index - parent * vocab  # (R, K) token appended
        # every step is recorded with k slots (fewer only at the first step, or when k > V)
        top_scores = _pad_slots(top_scores, k, NEG_INF)  # (R, K)
        parent, chosen = _pad_slots(parent, k, 0), _pad_slots(chosen, k, pad)  # (R, K), (R, K)
        if slots < k:  # per-row records: only row 0 exists, and every parent is 0
            record = {name: value.expand((rows, k) + value.shape[2:]) for name, value in record.items()}
        record.update(token=chosen, parent=parent, score=top_scores)
        history.append(active, record)
        if t == max_length:
            break

        is_eos = chosen == eos  # (R, K)
        finished = is_eos & torch.isfinite(top_scores)  # (R, K)
        scores = top_scores.masked_fill(is_eos, NEG_INF)  # (R, K) live prefixes only
        new_ranked = torch.where(finished, top_scores / length_penalty(penalty, t + 1, alpha), NEG_INF)  # (R, K)
        best_finished = torch.cat([best_finished, new_ranked], dim=1).topk(n_best, dim=1).values  # (R, n_best)
        top_finished = top_finished | finished[:, 0]  # (R,)
        live = torch.isfinite(scores).any(1)  # (R,)
        worst_kept = best_finished[:, -1]  # (R,)
        settled = torch.isfinite(worst_kept) & (
            top_finished | (worst_kept >= scores.max(1).values / bound_penalty)
        )  # (R,)
        if certify:
            settled = settled & ~exact
        done = ~live | settled  # (R,)
        done_host = done.tolist()  # the one host sync of the step
        if all(done_host):
            break

        parent_rows = parent + (torch.arange(rows, device=device) * slots).unsqueeze(1)  # (R, K) into R*S
        tokens = chosen  # (R, K)
        if any(done_host):  # drop finished sentences from the batch
            keep = torch.tensor([i for i, d in enumerate(done_host) if not d], device=device)  # (R',)
            gone = torch.tensor([i for i, d in enumerate(done_host) if d], device=device)  # (R - R',)
            original = torch.arange(batch, device=device) if active is None else active  # (R,)
            out_exact.index_copy_(0, original.index_select(0, gone), exact.index_select(0, gone))
            out_reason.index_copy_(0, original.index_select(0, gone), reason.index_select(0, gone))
            active = original.index_select(0, keep)  # (R',)
            encoder_out = select_state(encoder_out, keep if slots == 1 else
                                       (keep.unsqueeze(1) * k + torch.arange(k, device=device)).view(-1))
            parent_rows = parent_rows.index_select(0, keep)  # (R', K)
            scores, tokens = scores.index_select(0, keep), tokens.index_select(0, keep)  # (R', K), (R', K)
            exact, reason = exact.index_select(0, keep), reason.index_select(0, keep)  # (R',), (R',)
            best_finished = best_finished.index_select(0, keep)  # (R', n_best)
            top_finished = top_finished.index_select(0, keep)  # (R',)
        state = select_state(state, parent_rows.view(-1))
        if slots == 1 and k > 1:
            encoder_out = tile_state(encoder_out, k)
        tokens = tokens.reshape(-1)  # (R*K,)

    if active is None:
        out_exact, out_reason = exact, reason
    else:
        out_exact.index_copy_(0, active, exact)
        out_reason.index_copy_(0, active, reason)
    return _collect(history, _SearchEnd(truncated, active, out_exact, out_reason), eos, pad, options)


def _support_size(log_probs: Tensor) -> Tensor:
    """Number of finite entries (nonzero probabilities) along the last dim, as int32."""
    return (log_probs > NEG_INF).sum(-1, dtype=torch.int32)


def _pad_slots(x: Tensor, k: int, value: float | int | bool) -> Tensor:
    """Extend dim 1 of ``x`` (rows, s) to k slots with ``value``."""
    if x.size(1) >= k:
        return x
    return torch.cat([x, x.new_full((x.size(0), k - x.size(1)), value)], dim=1)


def _collect(history: SearchHistory, end: _SearchEnd, eos: int, pad: int, options: SearchOptions) -> SearchResult:
    """Rank every finished hypothesis of the history and rebuild the n best.

    Shapes: T steps, B sentences, K = beam size, E = T*K (+K) entries per sentence.
    """
    k, n_best, max_length = options.beam_size, options.n_best, options.max_length
    penalty, alpha = options.length_penalty, options.length_alpha
    truncated, active = end.truncated, end.active
    records = history.materialize()
    token, score = records["token"], records["score"]  # (T, B, K)
    steps, batch = token.size(0), token.size(1)
    device = token.device
    complete = (token == eos) & torch.isfinite(score)  # (T, B, K)
    step_index = torch.arange(steps, device=device).view(steps, 1, 1).expand_as(score)  # (T, B, K)
    slot_index = torch.arange(k, device=device).view(1, 1, k).expand_as(score)  # (T, B, K)
    ranking = score / length_penalty(penalty, step_index + 1, alpha, score.dtype)  # (T, B, K)

    def flat(x: Tensor) -> Tensor:  # (T, B, K) -> (B, T*K)
        return x.permute(1, 0, 2).reshape(batch, steps * k)

    entry_score, entry_rank, entry_complete = flat(score), flat(ranking), flat(complete)  # (B, E) each
    entry_step, entry_slot = flat(step_index), flat(slot_index)  # (B, E)
    entry_valid = entry_complete  # (B, E)
    if truncated is not None and max_length > 0:
        # live hypotheses whose EOS had probability 0 at the last step: returned without EOS
        trunc = torch.zeros(batch, k, dtype=torch.bool, device=device)  # (B, K)
        trunc = trunc.index_copy_(0, active, truncated) if active is not None else truncated
        last = score[max_length - 1]  # (B, K)
        entry_score = torch.cat([entry_score, last], dim=1)
        entry_rank = torch.cat([entry_rank, last / length_penalty(penalty, max_length, alpha)], dim=1)
        entry_complete = torch.cat([entry_complete, torch.zeros_like(trunc)], dim=1)
        entry_valid = torch.cat([entry_valid, trunc], dim=1)
        entry_step = torch.cat([entry_step, torch.full_like(trunc, max_length - 1, dtype=torch.long)], dim=1)
        entry_slot = torch.cat([entry_slot, torch.arange(k, device=device).expand(batch, k)], dim=1)

    n_nonzero, mass = support_statistics(entry_score, entry_complete)  # (B,), (B,)
    exact, reason = require_hypothesis(end.exact, end.reason, n_nonzero)  # (B,), (B,)
    # order: complete before truncated before missing, then by ranking score (stable sorts)
    key = entry_rank.masked_fill(~entry_valid, NEG_INF)  # (B, E)
    order = key.sort(dim=1, descending=True, stable=True).indices  # (B, E)
    category = (~entry_complete).long() + (~entry_valid).long()  # (B, E) 0 complete, 1 cut, 2 none
    order = order.gather(1, category.gather(1, order).sort(dim=1, stable=True).indices)  # (B, E)
    take = order[:, :n_best] if order.size(1) >= n_best else order  # (B, n)
    valid = entry_valid.gather(1, take)  # (B, n)
    end_step = torch.where(valid, entry_step.gather(1, take), torch.full_like(take, -1))  # (B, n)
    slot = torch.where(valid, entry_slot.gather(1, take), torch.zeros_like(take))  # (B, n)
    per_row = tuple(name for name in ("attention", "support_size", "support_tokens", "support_probs")
                    if name in records)
    rebuilt = backtrack(records, end_step, slot, pad, per_row)
    result = SearchResult(
        tokens=rebuilt["tokens"],
        lengths=end_step + 1,
        scores=entry_score.gather(1, take).masked_fill(~valid, NEG_INF),
        ranking_scores=key.gather(1, take),
        complete=entry_complete.gather(1, take) & valid,
        attention=rebuilt.get("attention"),
        exact=exact,
        n_nonzero=n_nonzero,
        mass=mass,
        reason=reason,
        support_size=rebuilt.get("support_size"),
        support_tokens=rebuilt.get("support_tokens"),
        support_probs=rebuilt.get("support_probs"),
        steps=steps,
    )
    if take.size(1) < n_best:
        result = _pad_nbest(result, n_best, pad)
    return result


def _pad_nbest(result: SearchResult, n_best: int, pad: int) -> SearchResult:
    """Extend the n-best dimension (dim 1) to ``n_best`` with empty hypotheses."""
    fill_values = {
        "tokens": pad, "lengths": 0, "scores": NEG_INF, "ranking_scores": NEG_INF, "complete": False,
        "attention": 0.0, "support_size": 0, "support_tokens": pad, "support_probs": 0.0,
    }
    for name, value in fill_values.items():
        x = getattr(result, name)
        if x is None:
            continue
        extra = x.new_full((x.size(0), n_best - x.size(1)) + x.shape[2:], value)
        setattr(result, name, torch.cat([x, extra], dim=1))
    return result


__all__ = ["SearchOptions", "SearchResult", "Specials", "beam_search", "greedy_search"]
