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
the beam at any step and no live hypothesis with a finite non-EOS continuation was cut by
``max_length``. Then the finished hypotheses are exactly the sequences of nonzero probability
(with at least ``min_length`` tokens before EOS), ``n_nonzero`` counts them, ``mass`` sums
their probabilities, and the first hypothesis is the true argmax of the ranking score. A
sentence stays in the search while it is exact and has live hypotheses (so that the whole
support is enumerated); once not exact, it stops as soon as it has ``n_best`` finished
hypotheses and either the best candidate of a step was a finished one (OpenNMT's rule) or no
live hypothesis can still rank above the ``n_best``-th finished one.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from nmt.models.protocol import StepDecoder, select_state, tile_state
from nmt.translate.certificate import (
    MAX_LENGTH,
    NOT_CERTIFIED,
    PRUNED,
    reason_name,
    record_violation,
    support_statistics,
)
from nmt.translate.history import SearchHistory, backtrack
from nmt.translate.length_penalty import check_length_penalty, length_penalty

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

    def reason_names(self) -> list[str | None]:
        """Per sentence: None when exact, else "pruned", "max_length" or "not_certified"."""
        return [reason_name(code) for code in self.reason.tolist()]


def _check_arguments(beam_size: int, n_best: int, max_length: int, min_length: int, support_topk: int) -> None:
    if beam_size < 1:
        raise ValueError(f"beam_size must be >= 1, got {beam_size}")
    if n_best < 1:
        raise ValueError(f"n_best must be >= 1, got {n_best}")
    if max_length < 0:
        raise ValueError(f"max_length must be >= 0, got {max_length}")
    if not 0 <= min_length <= max_length:
        raise ValueError(f"min_length must be in [0, max_length={max_length}], got {min_length}")
    if support_topk < 1:
        raise ValueError(f"support_topk must be >= 1, got {support_topk}")


def beam_search(
    model: StepDecoder,
    src: Tensor,
    src_lengths: Tensor,
    *,
    bos: int,
    eos: int,
    pad: int = 0,
    beam_size: int = 5,
    n_best: int = 1,
    max_length: int = 100,
    min_length: int = 0,
    length_penalty: str = "none",
    length_alpha: float = 0.6,
    return_support: bool = False,
    support_topk: int = 20,
    return_attention: bool = True,
    certify: bool = True,
    support_stats: bool = True,
) -> SearchResult:
    """Decode a batch: src (B, L) long, src_lengths (B,) long, on the model's device.

    At most ``max_length`` tokens are generated before EOS; EOS is forbidden before
    ``min_length`` tokens. ``length_penalty`` is "none", "average" or "gnmt" (with
    ``length_alpha``). ``certify=False`` skips the certificate (and its extra search of
    exact sentences): every ``reason`` is then "not_certified". ``support_stats=False`` skips
    counting the nonzero-probability tokens of every row at every step (``support_size`` is
    then None unless ``return_support``). Returns a ``SearchResult``.
    """
    _check_arguments(beam_size, n_best, max_length, min_length, support_topk)
    check_length_penalty(length_penalty, length_alpha)
    with torch.no_grad():  # not inference_mode: models may cache tensors reused in training
        return _search(
            model, src, src_lengths, bos, eos, pad, beam_size, n_best, max_length, min_length,
            length_penalty, length_alpha, return_support, support_topk, return_attention, certify,
            support_stats,
        )


def greedy_search(model: StepDecoder, src: Tensor, src_lengths: Tensor, **kwargs) -> SearchResult:
    """``beam_search`` with ``beam_size=1``: the most probable token at every step."""
    return beam_search(model, src, src_lengths, beam_size=1, **kwargs)


def _search(
    model: StepDecoder, src: Tensor, src_lengths: Tensor, bos: int, eos: int, pad: int, k: int,
    n_best: int, max_length: int, min_length: int, penalty: str, alpha: float,
    return_support: bool, support_topk: int, return_attention: bool, certify: bool, support_stats: bool,
) -> SearchResult:
    device = src.device
    batch = src.size(0)
    encoder_out, state = model.encode(src, src_lengths)
    # The first step runs one row per sentence (all k slots would hold the same BOS prefix);
    # the state is tiled to k slots by the first reordering.
    scores = torch.zeros((batch, 1), device=device)
    tokens = torch.full((batch,), bos, dtype=torch.long, device=device)
    exact = torch.full((batch,), certify, dtype=torch.bool, device=device)
    reason = torch.full((batch,), 0 if certify else NOT_CERTIFIED, dtype=torch.long, device=device)
    best_finished = torch.full((batch, n_best), NEG_INF, device=device)  # ranking scores
    top_finished = torch.zeros(batch, dtype=torch.bool, device=device)
    active: Tensor | None = None  # original index of each row; None = all, in order
    out_exact, out_reason = exact.clone(), reason.clone()

    count_support = support_stats or return_support
    fills: dict[str, float | int | bool] = {"token": pad, "parent": 0, "score": NEG_INF}
    if return_attention:
        fills["attention"] = 0.0
    if count_support:
        fills["support_size"] = 0
    if return_support:
        fills["support_tokens"] = pad
        fills["support_probs"] = 0.0
    history = SearchHistory(batch, fills)
    truncated: Tensor | None = None
    bound_penalty = length_penalty(penalty, max_length + 1, alpha)
    eos_index = torch.tensor([eos], device=device)

    for t in range(max_length + 1):
        log_probs, attention, state = model.step(tokens, state, encoder_out)
        rows, slots = scores.shape  # slots: 1 at the first step, then k
        vocab = log_probs.size(-1)
        if t == 0:  # half precision is upcast; float32/float64 kept
            dtype = torch.float32 if log_probs.dtype in (torch.float16, torch.bfloat16) else log_probs.dtype
            scores, best_finished = scores.to(dtype), best_finished.to(dtype)
        log_probs = log_probs.to(scores.dtype).view(rows, slots, vocab)
        if t < min_length:
            log_probs = log_probs.index_fill(-1, eos_index, NEG_INF)
        cand = scores.unsqueeze(-1) + log_probs  # (rows, k, V)
        record: dict[str, Tensor] = {}
        if count_support:
            record["support_size"] = _support_size(log_probs)  # (rows, slots), per parent row
        if return_support:
            top_lp, top_tok = log_probs.topk(min(support_topk, vocab), dim=-1)
            record["support_tokens"] = top_tok
            record["support_probs"] = top_lp.exp()
        if return_attention:
            record["attention"] = attention.to(scores.dtype).view(rows, slots, -1)

        if t == max_length:  # only EOS may follow: the final step
            top_scores = cand[..., eos]
            parent = torch.arange(slots, device=device).expand(rows, slots)
            chosen = torch.full_like(parent, eos)
            live_before = torch.isfinite(scores)
            truncated = _pad_slots(live_before & ~torch.isfinite(top_scores), k, False)
            if certify:
                eos_ok = torch.isfinite(log_probs[..., eos]).int()
                support = record["support_size"] if count_support else _support_size(log_probs)
                cut = (live_before & (support - eos_ok > 0)).any(1)
                exact, reason = record_violation(exact, reason, cut, MAX_LENGTH)
        else:
            width = min(k + 1 if certify else k, slots * vocab)
            top_scores, top_index = cand.view(rows, slots * vocab).topk(width, dim=1)
            if certify and width > k:
                pruned = torch.isfinite(top_scores[:, k])
                exact, reason = record_violation(exact, reason, pruned, PRUNED)
                top_scores, top_index = top_scores[:, :k], top_index[:, :k]
            parent = torch.div(top_index, vocab, rounding_mode="floor")
            chosen = top_index - parent * vocab
        # every step is recorded with k slots (fewer only at the first step, or when k > V)
        top_scores = _pad_slots(top_scores, k, NEG_INF)
        parent, chosen = _pad_slots(parent, k, 0), _pad_slots(chosen, k, pad)
        if slots < k:  # per-row records: only row 0 exists, and every parent is 0
            record = {name: value.expand((rows, k) + value.shape[2:]) for name, value in record.items()}
        record.update(token=chosen, parent=parent, score=top_scores)
        history.append(active, record)
        if t == max_length:
            break

        is_eos = chosen == eos
        finished = is_eos & torch.isfinite(top_scores)
        scores = top_scores.masked_fill(is_eos, NEG_INF)
        new_ranked = torch.where(finished, top_scores / length_penalty(penalty, t + 1, alpha), NEG_INF)
        best_finished = torch.cat([best_finished, new_ranked], dim=1).topk(n_best, dim=1).values
        top_finished = top_finished | finished[:, 0]
        live = torch.isfinite(scores).any(1)
        worst_kept = best_finished[:, -1]
        settled = torch.isfinite(worst_kept) & (
            top_finished | (worst_kept >= scores.max(1).values / bound_penalty)
        )
        if certify:
            settled = settled & ~exact
        done = ~live | settled
        done_host = done.tolist()  # the one host sync of the step
        if all(done_host):
            break

        parent_rows = parent + (torch.arange(rows, device=device) * slots).unsqueeze(1)
        tokens = chosen
        if any(done_host):  # drop finished sentences from the batch
            keep = torch.tensor([i for i, d in enumerate(done_host) if not d], device=device)
            gone = torch.tensor([i for i, d in enumerate(done_host) if d], device=device)
            original = torch.arange(batch, device=device) if active is None else active
            out_exact.index_copy_(0, original.index_select(0, gone), exact.index_select(0, gone))
            out_reason.index_copy_(0, original.index_select(0, gone), reason.index_select(0, gone))
            active = original.index_select(0, keep)
            encoder_out = select_state(encoder_out, keep if slots == 1 else
                                       (keep.unsqueeze(1) * k + torch.arange(k, device=device)).view(-1))
            parent_rows = parent_rows.index_select(0, keep)
            scores, tokens = scores.index_select(0, keep), tokens.index_select(0, keep)
            exact, reason = exact.index_select(0, keep), reason.index_select(0, keep)
            best_finished = best_finished.index_select(0, keep)
            top_finished = top_finished.index_select(0, keep)
        state = select_state(state, parent_rows.view(-1))
        if slots == 1 and k > 1:
            encoder_out = tile_state(encoder_out, k)
        tokens = tokens.reshape(-1)

    if active is None:
        out_exact, out_reason = exact, reason
    else:
        out_exact.index_copy_(0, active, exact)
        out_reason.index_copy_(0, active, reason)
    return _collect(history, truncated, active, out_exact, out_reason, eos, pad, k, n_best,
                    max_length, penalty, alpha, return_attention, count_support, return_support)


def _support_size(log_probs: Tensor) -> Tensor:
    """Number of finite entries (nonzero probabilities) along the last dim, as int32."""
    return (log_probs > NEG_INF).sum(-1, dtype=torch.int32)


def _pad_slots(x: Tensor, k: int, value: float | int | bool) -> Tensor:
    """Extend dim 1 of ``x`` (rows, s) to k slots with ``value``."""
    if x.size(1) >= k:
        return x
    return torch.cat([x, x.new_full((x.size(0), k - x.size(1)), value)], dim=1)


def _collect(
    history: SearchHistory, truncated: Tensor | None, active: Tensor | None, exact: Tensor,
    reason: Tensor, eos: int, pad: int, k: int, n_best: int, max_length: int, penalty: str,
    alpha: float, return_attention: bool, count_support: bool, return_support: bool,
) -> SearchResult:
    """Rank every finished hypothesis of the history and rebuild the n best."""
    records = history.materialize()
    token, score = records["token"], records["score"]  # (T, B, K)
    steps, batch = token.size(0), token.size(1)
    device = token.device
    complete = (token == eos) & torch.isfinite(score)
    step_index = torch.arange(steps, device=device).view(steps, 1, 1).expand_as(score)
    slot_index = torch.arange(k, device=device).view(1, 1, k).expand_as(score)
    ranking = score / length_penalty(penalty, step_index + 1, alpha, score.dtype)

    def flat(x: Tensor) -> Tensor:  # (T, B, K) -> (B, T*K)
        return x.permute(1, 0, 2).reshape(batch, steps * k)

    entry_score, entry_rank, entry_complete = flat(score), flat(ranking), flat(complete)
    entry_step, entry_slot = flat(step_index), flat(slot_index)
    entry_valid = entry_complete
    if truncated is not None and max_length > 0:
        # live hypotheses whose EOS had probability 0 at the last step: returned without EOS
        trunc = torch.zeros(batch, k, dtype=torch.bool, device=device)
        trunc = trunc.index_copy_(0, active, truncated) if active is not None else truncated
        last = score[max_length - 1]
        entry_score = torch.cat([entry_score, last], dim=1)
        entry_rank = torch.cat([entry_rank, last / length_penalty(penalty, max_length, alpha)], dim=1)
        entry_complete = torch.cat([entry_complete, torch.zeros_like(trunc)], dim=1)
        entry_valid = torch.cat([entry_valid, trunc], dim=1)
        entry_step = torch.cat([entry_step, torch.full_like(trunc, max_length - 1, dtype=torch.long)], dim=1)
        entry_slot = torch.cat([entry_slot, torch.arange(k, device=device).expand(batch, k)], dim=1)

    n_nonzero, mass = support_statistics(entry_score, entry_complete)
    # order: complete before truncated before missing, then by ranking score (stable sorts)
    key = entry_rank.masked_fill(~entry_valid, NEG_INF)
    order = key.sort(dim=1, descending=True, stable=True).indices
    category = (~entry_complete).long() + (~entry_valid).long()
    order = order.gather(1, category.gather(1, order).sort(dim=1, stable=True).indices)
    take = order[:, :n_best] if order.size(1) >= n_best else order
    valid = entry_valid.gather(1, take)
    end_step = torch.where(valid, entry_step.gather(1, take), torch.full_like(take, -1))
    slot = torch.where(valid, entry_slot.gather(1, take), torch.zeros_like(take))
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


__all__ = ["SearchResult", "beam_search", "greedy_search"]
