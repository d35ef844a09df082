"""Batched beam search over batch x beam with exactness certificates.

All state lives in tensors on the model's device: no per-hypothesis Python objects. Two loops
run the same step (``nmt.translate.search_step``) and give the same results: the dynamic loop
(here) makes one host synchronisation per step (the stop test, ``done.tolist()``), which also
tells which sentences stop (their prefixes get probability 0) and when they leave the batch
(once the live ones fit a smaller size among 1, 2, 3, 4, 6, 8, 12, ...: ``bucket_size``); the
static-shape loop (``nmt.translate.static_search``, ``mode="static"``, the default on CUDA)
masks finished sentences instead and reads a stop flag every ``stop_every`` steps. Greedy
decoding is ``beam_size=1``.

At step t every live hypothesis (a slot of the beam) is extended by every token; a candidate
scores its total log-probability (log 0 = -inf: such candidates are never kept, counted nor
expanded). The ``beam_size`` best candidates are kept; kept candidates ending in EOS become
finished hypotheses (their slot is free at the next step), the others stay live. Finished
hypotheses are never discarded: all of them are recovered from the step history at the end,
ranked by log-probability / length penalty (+ the coverage penalty of their attention with
``coverage_penalty``, ``nmt.translate.coverage_penalty``).

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
live hypothesis can still rank above the ``n_best``-th finished one (its log-probability over the
largest length penalty, plus an upper bound on the coverage penalty of its extensions: 0 for wu,
its current penalty for summary). A coverage penalty leaves the certificate as it is: it is
about enumerating the support, and each finished hypothesis is ranked with its own exact penalty.

With ``block_ngram_repeat`` N, every step first sets the log-probability of each token that would
repeat an N-gram of its hypothesis to -inf (``nmt.translate.ngram_block``; the hypotheses' tokens
travel with the rows, ``RowState.ngrams``): a hard constraint, so all of the above holds for the
constrained problem, the outputs of nonzero probability without a repeated N-gram. Forced target
prefixes (``prefix``, ``nmt.translate.target_prefix``) are the same kind of constraint: at a step
below a sentence's prefix length every token but the forced one gets -inf, so a certificate is about
the outputs of nonzero probability that start with the prefix.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from nmt.models.protocol import StepDecoder, attention_request, select_state, shares_encoder_out, tile_state
from nmt.translate.certificate import require_hypothesis, support_statistics
from nmt.translate.constraint_automaton import ConstraintTables, check_phrase_tokens
from nmt.translate.coverage_penalty import start_coverage
from nmt.translate.history import SearchHistory, backtrack
from nmt.translate.row_compaction import bucket_size, rows_to_keep
from nmt.translate.search_result import SearchResult
from nmt.translate.length_penalty import length_penalty
from nmt.translate.search_options import SearchOptions
from nmt.translate.search_step import (
    RowState,
    SearchEnd,
    Specials,
    Truncations,
    flat_parents,
    history_fills,
    ngram_width,
    require_unk,
    search_limits,
    select_step,
)
from nmt.translate.static_search import static_loop
from nmt.translate.target_prefix import check_prefix
from nmt.utils.packed_linear import frozen_weights

NEG_INF = float("-inf")


def beam_search(
    model: StepDecoder,
    src: Tensor,
    src_lengths: Tensor,
    *,
    bos: int,
    eos: int,
    pad: int = 0,
    unk: int | None = None,
    options: SearchOptions | None = None,
    prefix: Tensor | None = None,
    constraints: ConstraintTables | None = None,
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
    ``mode`` picks the loop ("auto": static on CUDA, dynamic elsewhere): dynamic makes one host
    sync per step; static at most one per ``stop_every`` steps, plus one at the end.
    ``prefix`` (B, P) long: forced target prefixes, each row's token ids left-aligned and ``-1``
    (``nmt.translate.target_prefix.NO_PREFIX``) after them (on the host or the model's device; see
    :func:`nmt.translate.target_prefix.prefix_tensor`): every output of sentence b starts with its
    prefix (no BOS, EOS or padding in it), and a certificate is about the outputs that do; a
    sentence's own length limit is raised to its prefix's length; P > ``max_length`` is a ValueError.
    ``unk``: the target vocabulary's unknown-word id, needed by ``ban_unk_token``.
    ``constraints``: lexical constraints, the B sentences' automata
    (:func:`nmt.translate.constraint_automaton.batch_tables` of
    :func:`~nmt.translate.constraint_automaton.build_automaton`, on the host or the model's device):
    every output of sentence b meets its constraints (EOS is banned until it does), the beam is
    allocated dynamically (:mod:`nmt.translate.constraint_search`), and a certificate is about the
    outputs that meet them; a sentence's own length limit is raised to the fewest tokens that can.
    Not with ``sample`` (ValueError). A phrase holding ``bos``, ``eos`` or ``pad`` is a
    ``ConstraintError`` (ValueError) naming its sentence and phrase (checked on the automata's host
    copy of the phrases, :func:`~nmt.translate.constraint_automaton.check_phrase_tokens`); ``unk``
    may be in one (met by generating it; with ``ban_unk_token`` no output meets it).
    With ``mbr`` (a utility other than "none") an uncertified sentence stops as with
    ``n_best = beam_size`` and the n-best lists hold every finished hypothesis (cut ones
    after the complete ones; the n-best dimension is then the history's T*K entries, or more), the
    candidates that the ``Translator`` ranks by expected utility (``nmt.translate.mbr``).
    Returns a ``SearchResult``. With ``sample=True`` the result holds ``n_best`` samples of each
    sentence instead (:func:`nmt.translate.sampling.sample_search`, keyed by the sentences' positions
    0..B-1 in this batch; call it with ``sentence_ids`` for samples independent of the batching).
    """
    options = (options or SearchOptions()).updated(**overrides)
    special = Specials(bos, eos, pad, unk)
    if constraints is not None:
        check_constraints(constraints, src.size(0), options, special)
    if options.sample:  # it checks the prefixes and the unk id itself
        from nmt.translate.sampling import sample_search  # it builds on this module

        return sample_search(model, src, src_lengths, special, options, prefix=prefix)
    if prefix is not None:
        check_prefix(prefix, src.size(0), options.max_length)
    require_unk(options, special)
    if options.mbr != "none":  # MBR's candidates: at least a beam's worth of finished hypotheses, all returned
        options = options.updated(n_best=options.search_n_best)
    # not inference_mode: models may cache tensors reused in training; the weights stay fixed
    with torch.no_grad(), frozen_weights():
        return _search(model, src, src_lengths, special, options, prefix, constraints)


def refuse_sampling(options: SearchOptions) -> None:
    """ValueError where ``options`` sample: lexical constraints apply to beam search (a sample cannot
    be made to hold a phrase without changing what it is a sample of)."""
    if options.sample:
        raise ValueError("lexical constraints apply to beam search, not to sampling (a sample forced to hold a "
                         "phrase is no longer a sample of the model's distribution)")


def check_constraints(constraints: ConstraintTables, batch: int, options: SearchOptions,
                      special: Specials | None = None) -> None:
    """ValueError unless ``constraints`` has ``batch`` rows and the search is no sampling
    (:func:`refuse_sampling`); a ``ConstraintError`` (ValueError) naming the sentence and phrase where
    a phrase holds ``special``'s BOS, EOS or PAD id (read from the tables' host copy of the
    phrases; tables without one are not checked). Shapes and host lists only: no sync."""
    refuse_sampling(options)
    if constraints.table.dim() != 3 or constraints.table.size(0) != batch or constraints.dist.size(0) != batch:
        raise ValueError(f"constraints must hold one automaton per sentence ({batch}), got tables of shape "
                         f"{tuple(constraints.table.shape)}")
    if special is not None and constraints.phrases is not None:
        reserved = {special.pad: "<pad>", special.bos: "<bos>", special.eos: "<eos>"}
        for index, phrases in enumerate(constraints.phrases):
            check_phrase_tokens(phrases, reserved, index)


def greedy_search(model: StepDecoder, src: Tensor, src_lengths: Tensor, **kwargs: Any) -> SearchResult:
    """``beam_search`` with ``beam_size=1``: the most probable token at every step."""
    return beam_search(model, src, src_lengths, **{**kwargs, "beam_size": 1})


def _search(model: StepDecoder, src: Tensor, src_lengths: Tensor, special: Specials,
            options: SearchOptions, prefix: Tensor | None = None,
            constraints: ConstraintTables | None = None) -> SearchResult:
    """Run the loop of the resolved mode, then collect the n-best lists."""
    if options.resolved_mode(src.device) == "static":
        history, end = static_loop(model, src, src_lengths, special, options, prefix, constraints)
    else:
        history, end = _dynamic_loop(model, src, src_lengths, special, options, prefix, constraints)
    return _collect(history, end, special.eos, special.pad, options)


def _dynamic_loop(model: StepDecoder, src: Tensor, src_lengths: Tensor, special: Specials,
                  options: SearchOptions, prefix: Tensor | None = None,
                  constraints: ConstraintTables | None = None) -> tuple[SearchHistory, SearchEnd]:
    """The dynamic loop: finished sentences leave the batch. Shapes: B sentences, R rows still
    searched, S slots per row (1 at the first step, then K = beam size), T steps."""
    k, max_length = options.beam_size, options.max_length
    device = src.device
    batch = src.size(0)
    encoder_out, state = model.encode(src, src_lengths)
    encoded = encoder_out  # as encode returned it (the loop selects and tiles new dicts)
    shared = shares_encoder_out(model)  # encoder_out stays one row per sentence (R rows), else R*S
    # The first step runs one row per sentence (all k slots would hold the same BOS prefix);
    # the state is tiled to k slots by the first reordering.
    tokens = torch.full((batch,), special.bos, dtype=torch.long, device=device)  # (R*S,) last token
    limits = search_limits(options, src_lengths, prefix, constraints)  # (B,) each sentence's own limit, or None
    limit_steps = set() if limits is None else set(limits.tolist())  # the steps where a row may end
    rows = RowState.start(batch, options.n_best, options.certify, device, limits, ngram_width(options, static=False),
                          prefix, start_coverage(src_lengths, src.size(1)) if options.coverage else None,
                          constraints)
    active: Tensor | None = None  # (R,) original index of each row; None = all, in order
    out_exact, out_reason = rows.exact.clone(), rows.reason.clone()  # (B,), (B,)
    history = SearchHistory(batch, history_fills(options, special.pad))
    cuts = Truncations.start(batch, k, device)

    ask = attention_request(model, options.return_attention or options.coverage)  # attention only where used
    for t in range(max_length + 1):
        log_probs, attention, state = model.step(tokens, state, encoder_out, **ask)  # (R*S, V), (R*S, L)
        slots = rows.scores.size(1)  # 1 at the first step, then k
        step = select_step(log_probs, attention, rows, t, options, special, limit_due=t in limit_steps)
        rows = step.rows
        history.append(active, step.record)
        if step.truncated is not None:
            cuts.add(active, step.truncated, t)
        if step.done is None:  # the final step
            break
        done_host = step.done.tolist()  # the one host sync of the step
        if all(done_host):
            break

        # (R, K) rows of R*S that the kept candidates extend (greedy: each row its own)
        flat_rows = flat_parents(step.parent, slots) if k > 1 else None
        tokens = step.chosen  # (R, K)
        keep, compaction = None, None
        if any(done_host):
            # finished sentences stop: their prefixes get probability 0 (nothing is extended,
            # recorded as finished or counted against the certificate any more) ...
            rows = replace(rows, scores=rows.scores.masked_fill(step.done.unsqueeze(1), NEG_INF))
            compaction = rows_to_keep(done_host)
        if compaction is not None:  # ... and leave the batch once the live ones fit a smaller bucket
            keep_rows, gone_rows = compaction
            keep = torch.tensor(keep_rows, device=device)  # (R',)
            gone = torch.tensor(gone_rows, device=device)  # (R - R',)
            original = torch.arange(batch, device=device) if active is None else active  # (R,)
            out_exact.index_copy_(0, original.index_select(0, gone), rows.exact.index_select(0, gone))
            out_reason.index_copy_(0, original.index_select(0, gone), rows.reason.index_select(0, gone))
            active = original.index_select(0, keep)  # (R',)
            encoder_out = select_state(encoder_out, keep if slots == 1 or shared else
                                       (keep.unsqueeze(1) * k + torch.arange(k, device=device)).view(-1))
            flat_rows = None if flat_rows is None else flat_rows.index_select(0, keep)  # (R', K)
            tokens = tokens.index_select(0, keep)  # (R', K)
            rows = rows.select(keep)
        if flat_rows is not None:
            state = select_state(state, flat_rows.view(-1))
        elif keep is not None:  # greedy: each row extends its only slot; reorder when rows leave
            state = select_state(state, keep)
        if slots == 1 and k > 1 and not shared:
            encoder_out = tile_state(encoder_out, k)
        tokens = tokens.reshape(-1)  # (R*K,)

    if active is None:
        out_exact, out_reason = rows.exact, rows.reason
    else:
        out_exact.index_copy_(0, active, rows.exact)
        out_reason.index_copy_(0, active, rows.reason)
    return history, SearchEnd(cuts, out_exact, out_reason, encoded)


def _collect(history: SearchHistory, end: SearchEnd, eos: int, pad: int, options: SearchOptions) -> SearchResult:
    """Rank every finished hypothesis of the history and rebuild the n best.

    Shapes: T steps, B sentences, K = beam size, E = T*K (+K) entries per sentence.
    """
    k, n_best = options.beam_size, options.n_best
    penalty, alpha = options.length_penalty, options.length_alpha
    cuts = end.cuts
    records = history.materialize()
    token, score = records["token"], records["score"]  # (T, B, K)
    steps, batch = token.size(0), token.size(1)
    device = token.device
    complete = (token == eos) & torch.isfinite(score)  # (T, B, K)
    step_index = torch.arange(steps, device=device).view(steps, 1, 1).expand_as(score)  # (T, B, K)
    slot_index = torch.arange(k, device=device).view(1, 1, k).expand_as(score)  # (T, B, K)
    ranking = score / length_penalty(penalty, step_index + 1, alpha, score.dtype)  # (T, B, K)
    cover = records.get("coverage_penalty")  # (T, B, K) each entry's coverage penalty, or None
    if cover is not None:
        ranking = ranking + cover

    def flat(x: Tensor) -> Tensor:  # (T, B, K) -> (B, T*K)
        return x.permute(1, 0, 2).reshape(batch, steps * k)

    entry_score, entry_rank, entry_complete = flat(score), flat(ranking), flat(complete)  # (B, E) each
    entry_step, entry_slot = flat(step_index), flat(slot_index)  # (B, E)
    entry_cover = None if cover is None else flat(cover)  # (B, E)
    entry_valid = entry_complete  # (B, E)
    if cuts.recorded:
        # live hypotheses whose EOS had probability 0 at their sentence's last step: returned
        # without EOS (their prefixes, recorded at the step before; none when cut at step 0)
        trunc = cuts.slots & (cuts.length > 0).unsqueeze(1)  # (B, K)
        prefix_step = (cuts.length - 1).clamp(min=0)  # (B,)
        at_prefix_step = prefix_step.view(1, batch, 1).expand(1, batch, k)  # (1, B, K) index into (T, B, K)
        last = score.gather(0, at_prefix_step).squeeze(0)  # (B, K)
        lengths = cuts.length.clamp(min=1).unsqueeze(1)  # (B, 1)
        last_rank = last / length_penalty(penalty, lengths, alpha, score.dtype)  # (B, K)
        if cover is not None:  # the penalty of the prefix's coverage
            last_cover = cover.gather(0, at_prefix_step).squeeze(0)  # (B, K)
            last_rank = last_rank + last_cover
            entry_cover = torch.cat([entry_cover, last_cover], dim=1)
        entry_score = torch.cat([entry_score, last], dim=1)
        entry_rank = torch.cat([entry_rank, last_rank], dim=1)
        entry_complete = torch.cat([entry_complete, torch.zeros_like(trunc)], dim=1)
        entry_valid = torch.cat([entry_valid, trunc], dim=1)
        entry_step = torch.cat([entry_step, prefix_step.unsqueeze(1).expand(batch, k)], dim=1)
        entry_slot = torch.cat([entry_slot, torch.arange(k, device=device).expand(batch, k)], dim=1)

    n_nonzero, mass = support_statistics(entry_score, entry_complete)  # (B,), (B,)
    exact, reason = require_hypothesis(end.exact, end.reason, n_nonzero)  # (B,), (B,)
    # order: complete before truncated before missing, then by ranking score (stable sorts)
    key = entry_rank.masked_fill(~entry_valid, NEG_INF)  # (B, E)
    order = key.sort(dim=1, descending=True, stable=True).indices  # (B, E)
    category = (~entry_complete).long() + (~entry_valid).long()  # (B, E) 0 complete, 1 cut, 2 none
    order = order.gather(1, category.gather(1, order).sort(dim=1, stable=True).indices)  # (B, E)
    # (B, n): the n best; with mbr every entry (E), the finished hypotheses first: its candidates
    take = order[:, :n_best] if order.size(1) >= n_best and options.mbr == "none" else order
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
        coverage_penalty=None if entry_cover is None else entry_cover.gather(1, take).masked_fill(~valid, 0.0),
        encoder_out=end.encoder_out,
    )
    if take.size(1) < n_best:
        result = _pad_nbest(result, n_best, pad)
    return result


def _pad_nbest(result: SearchResult, n_best: int, pad: int) -> SearchResult:
    """Extend the n-best dimension (dim 1) to ``n_best`` with empty hypotheses."""
    fill_values = {
        "tokens": pad, "lengths": 0, "scores": NEG_INF, "ranking_scores": NEG_INF, "complete": False,
        "attention": 0.0, "support_size": 0, "support_tokens": pad, "support_probs": 0.0, "coverage_penalty": 0.0,
    }
    for name, value in fill_values.items():
        x = getattr(result, name)
        if x is None:
            continue
        extra = x.new_full((x.size(0), n_best - x.size(1)) + x.shape[2:], value)
        setattr(result, name, torch.cat([x, extra], dim=1))
    return result


__all__ = ["SearchOptions", "SearchResult", "Specials", "beam_search", "bucket_size", "greedy_search", "refuse_sampling", "rows_to_keep"]
