"""One step of batched beam search, shared by the dynamic and the static-shape loops.

``select_step`` turns the model's log-probabilities of one step into the kept candidates, the
step record (for ``SearchHistory``), the certificate updates and the per-row stop test. It is
pure tensor code: it never synchronises with the host (no ``.item()``, ``.tolist()``,
``bool(t)``, ``nonzero`` or boolean-mask indexing), so both loops share it unchanged and the
static loop stays sync-free. What a loop does with ``done`` is its own business: the dynamic
loop removes finished sentences from the batch, the static loop masks them.

Shapes: R rows (sentences still in the batch), S slots per row (1 at the first step, then
K = beam size), V target vocabulary, L source length.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import NamedTuple

import torch
from torch import Tensor

from nmt.translate.certificate import (
    MAX_LENGTH,
    NONFINITE,
    NOT_CERTIFIED,
    PRUNED,
    nonfinite_scores,
    record_violation,
    unknown_slots,
)
from nmt.models.protocol import State, required_attention
from nmt.translate.constraint_automaton import ConstraintTables
from nmt.translate.constraint_search import ConstraintState, ban_eos, constrained_candidates, needed_lengths
from nmt.translate.coverage_penalty import coverage_penalty, penalty_bound
from nmt.translate.length_penalty import length_penalty
from nmt.translate.native_step import step_update
from nmt.translate.ngram_block import block_repeats, extend_history, start_history
from nmt.translate.search_options import SearchOptions
from nmt.translate.target_prefix import force_prefix, lengthen_limits, raised_limits
from nmt.translate.triton_step import step_update as triton_step_update
from nmt.sparse._native import step_candidates
from nmt.sparse._triton_candidates import step_candidates as triton_step_candidates
from nmt.utils.device import host_to_device
from nmt.utils.topk import blocked_topk

NEG_INF = float("-inf")


class Specials(NamedTuple):
    """Target token ids the search needs: BOS starts, EOS ends, PAD fills; UNK (None: unknown to
    the search) is banned with ``SearchOptions.ban_unk_token``."""

    bos: int
    eos: int
    pad: int
    unk: int | None = None


@dataclass
class Truncations:
    """Live hypotheses cut by a length limit (``max_length``, or a sentence's own limit of
    ``SearchOptions.max_length_ratio``) because their EOS had probability 0, per sentence
    (B sentences, K slots): ``slots`` (B, K) bool the cut slots, ``length`` (B,) long the tokens
    of their prefixes (the step that cut them); ``recorded``: whether any step was a cutting
    step (known on the host, no sync). A sentence is cut at most once: it stops there."""

    slots: Tensor
    length: Tensor
    recorded: bool = False

    @classmethod
    def start(cls, batch: int, k: int, device: torch.device) -> "Truncations":
        """Nothing cut yet."""
        return cls(torch.zeros(batch, k, dtype=torch.bool, device=device),
                   torch.zeros(batch, dtype=torch.long, device=device))

    def add(self, sentences: Tensor | None, truncated: Tensor, t: int) -> None:
        """Record ``truncated`` (R, K), the slots a step ``t`` cut, of the rows whose original
        sentence indices are ``sentences`` (R,) (None: all B, in order). No host sync."""
        hit = truncated.any(1)  # (R,)
        if sentences is None:
            self.slots = self.slots | truncated
            self.length = torch.where(hit, t, self.length)
        else:
            self.slots.index_copy_(0, sentences, self.slots.index_select(0, sentences) | truncated)
            self.length.index_copy_(0, sentences, torch.where(hit, t, self.length.index_select(0, sentences)))
        self.recorded = True


@dataclass
class SearchEnd:
    """State of the search when it stops, for collecting the n-best (B sentences, K = beam size).

    cuts: the live hypotheses cut by a length limit; exact, reason: (B,) per sentence;
    encoder_out: the model's ``encode`` of the batch as it returned it (one row per sentence).
    """

    cuts: Truncations
    exact: Tensor
    reason: Tensor
    encoder_out: State | None = field(default=None, compare=False, repr=False)



def search_limits(options: SearchOptions, src_lengths: Tensor, prefix: Tensor | None = None,
                  constraints: ConstraintTables | None = None) -> Tensor | None:
    """(B,) each sentence's own length limit (``options.length_limits`` of ``src_lengths``), raised
    to what its outputs need at least: its forced prefix (``prefix`` (B, P), or None) and, with
    ``constraints``, the prefix plus the tokens its phrases still need after it, within
    ``max_length``; None where no sentence has a limit of its own. On ``src_lengths``' device (the
    host stays the host: the loops read the steps where a row may end there), no host sync."""
    limits = options.length_limits(src_lengths)
    if constraints is None:
        return lengthen_limits(limits, prefix)
    # the prefix's length is part of what the constraints need (never above max_length: checked)
    return raised_limits(limits, needed_lengths(constraints, prefix).clamp(max=options.max_length))

@dataclass
class RowState:
    """Per-row search state carried from step to step (R rows, S slots).

    scores: (R, S) log-probability of each live prefix (-inf: no live prefix in that slot);
    exact: (R,) bool certificate so far; reason: (R,) long first violation;
    best_finished: (R, n_best) ranking scores of the best finished hypotheses;
    top_finished: (R,) bool the best candidate of some step was a finished hypothesis;
    limit: (R,) long each row's own maximum of tokens before EOS (``SearchOptions.length_limits``),
    or None (``max_length`` for every row);
    ngrams: (R, S, W) long the tokens of each slot's prefix, right-aligned, -1 before its first
    (``nmt.translate.ngram_block``), with ``block_ngram_repeat``; else None;
    prefix: (R, P) long each row's forced target prefix, ``NO_PREFIX`` after it
    (``nmt.translate.target_prefix``), or None;
    coverage: (R, S, L) each live prefix's coverage of the source (its steps' attention summed;
    1 at padding positions, ``nmt.translate.coverage_penalty``) with a coverage penalty; else None;
    constraints: each row's constraint automaton and each slot's state in it
    (``nmt.translate.constraint_search``), or None.
    """

    scores: Tensor
    exact: Tensor
    reason: Tensor
    best_finished: Tensor
    top_finished: Tensor
    limit: Tensor | None = None
    ngrams: Tensor | None = None
    prefix: Tensor | None = None
    coverage: Tensor | None = None
    constraints: ConstraintState | None = None

    @classmethod
    def start(cls, batch: int, n_best: int, certify: bool, device: torch.device,
              limit: Tensor | None = None, ngram_width: int | None = None,
              prefix: Tensor | None = None, coverage: Tensor | None = None,
              constraints: ConstraintTables | None = None) -> "RowState":
        """The state before the first step: one live (empty) prefix per sentence. ``limit`` (B,)
        may come from the host (limits of host-side source lengths): it is copied to ``device``
        with every other field (from the host to CUDA through pinned memory, without a sync).
        ``ngram_width``: the width of the n-gram history (:func:`ngram_width`; None: no history).
        ``prefix`` (B, P): the forced target prefixes (copied like ``limit``), or None.
        ``coverage`` (B, 1, L): the coverage before the first step
        (:func:`nmt.translate.coverage_penalty.start_coverage`, copied like ``limit``), or None.
        ``constraints``: the rows' constraint automata (B rows of tables, copied like ``limit``), or
        None; every slot starts at their start state."""
        if limit is not None and limit.device != torch.device(device):
            limit = host_to_device(limit, device)
        if prefix is not None and prefix.device != torch.device(device):
            prefix = host_to_device(prefix, device)
        if coverage is not None and coverage.device != torch.device(device):
            coverage = host_to_device(coverage, device)
        return cls(
            scores=torch.zeros((batch, 1), device=device),
            exact=torch.full((batch,), certify, dtype=torch.bool, device=device),
            reason=torch.full((batch,), 0 if certify else NOT_CERTIFIED, dtype=torch.long, device=device),
            best_finished=torch.full((batch, n_best), NEG_INF, device=device),
            top_finished=torch.zeros(batch, dtype=torch.bool, device=device),
            limit=limit,
            ngrams=None if ngram_width is None else start_history(batch, 1, ngram_width, device),
            prefix=prefix,
            coverage=coverage,
            constraints=None if constraints is None else ConstraintState.start(constraints, device),
        )

    def select(self, index: Tensor) -> "RowState":
        """Rows ``index`` (R',) of every field."""
        return RowState(*(None if x is None else x.index_select(0, index) for x in
                          (self.scores, self.exact, self.reason, self.best_finished, self.top_finished,
                           self.limit, self.ngrams, self.prefix, self.coverage)),
                        None if self.constraints is None else self.constraints.select(index))


@dataclass
class StepOutcome:
    """What one step decided (R rows, K slots).

    record: field -> (R, K, ...) for ``SearchHistory`` (token, parent, score, and the per-row
    extras the options ask for); parent: (R, K) slot of the previous step each kept candidate
    extends; chosen: (R, K) token appended; rows: the updated ``RowState`` (scores hold live
    prefixes only); done: (R,) bool the sentence may stop (None at the final step);
    truncated: (R, K) bool live hypotheses cut by a length limit: by max_length at the final
    step, by the rows' own limits at a step where some may end (else None).
    """

    record: dict[str, Tensor]
    parent: Tensor
    chosen: Tensor
    rows: RowState
    done: Tensor | None
    truncated: Tensor | None


def ngram_width(options: SearchOptions, static: bool) -> int | None:
    """The width of the rows' n-gram history at the start (``RowState.ngrams``): None without
    ``block_ngram_repeat``; 0 for the dynamic loop (the history grows by one column a step);
    ``max_length`` for the static loop (fixed: it drops its oldest column as it appends)."""
    if options.block_ngram_repeat == 0:
        return None
    return options.max_length if static else 0


def history_fills(options: SearchOptions, pad: int) -> dict[str, float | int | bool]:
    """The fields a search records at every step, with their value for absent rows."""
    fills: dict[str, float | int | bool] = {"token": pad, "parent": 0, "score": NEG_INF}
    if options.return_attention:
        fills["attention"] = 0.0
    if options.support_stats or options.return_support:
        fills["support_size"] = 0
    if options.return_support:
        fills["support_tokens"] = pad
        fills["support_probs"] = 0.0
    if options.coverage:
        fills["coverage_penalty"] = 0.0
    return fills


def select_step(log_probs: Tensor, attention: Tensor, rows: RowState, t: int, options: SearchOptions,
                special: Specials, limit_due: bool = True) -> StepOutcome:
    """Keep the ``beam_size`` best extensions of the live prefixes at step ``t``.

    log_probs: (R*S, V) from the model (-inf = probability 0); attention: (R*S, L), or None where
    the options record no attention (``return_attention`` off).
    Half-precision log-probabilities are upcast (float32/float64 kept). No host sync.
    Rows with their own ``limit`` equal to ``t`` take their last step (only EOS may follow, as
    for every row at ``t = max_length``); ``limit_due=False`` (a host-side hint of the caller:
    no row's limit is ``t``) skips that test. With ``block_ngram_repeat`` (``rows.ngrams`` set),
    the tokens that would repeat an n-gram of their slot's prefix get log-probability -inf before
    anything reads the step (candidates, support sizes, certificate), and the returned rows carry
    the prefixes extended by the kept tokens. With forced target prefixes (``rows.prefix``), a row
    whose prefix is longer than ``t`` keeps only its forced token's log-probability
    (``nmt.translate.target_prefix``), at the same point; so does ``<unk>`` with ``ban_unk_token``.
    With a coverage penalty (``rows.coverage`` set; ``attention`` required), each slot's coverage
    after the step is its coverage plus its attention; a finished candidate ranks by
    ``score / lp(t + 1) + cp`` (its penalty recorded as ``coverage_penalty``), the stop bound of a live
    prefix adds :func:`nmt.translate.coverage_penalty.penalty_bound` of its penalty, and with
    ``stepwise_penalty`` the candidates compete by ``score + lp(t + 1) * cp`` (their recorded scores
    stay log-probabilities); the fused native / Triton step is not used (the torch code below is).
    With lexical constraints (``rows.constraints`` set), EOS gets log-probability -inf in the slots
    whose constraints are not met (at the same point as the other bans), the candidates are chosen
    by :func:`nmt.translate.constraint_search.constrained_candidates` (dynamic beam allocation; a
    candidate that could not meet them within the row's limit breaks the certificate with
    ``max_length``), and the returned rows carry each kept candidate's automaton state; the torch
    code, not the fused step.
    """
    k, n_best, max_length = options.beam_size, options.n_best, options.max_length
    certify, eos, pad = options.certify, special.eos, special.pad
    count_support = options.support_stats or options.return_support
    scores, best_finished = rows.scores, rows.best_finished
    exact, reason = rows.exact, rows.reason
    device = scores.device
    row_count, slots = scores.shape
    vocab = log_probs.size(-1)
    if t == 0:
        dtype = torch.float32 if log_probs.dtype in (torch.float16, torch.bfloat16) else log_probs.dtype
        scores, best_finished = scores.to(dtype), best_finished.to(dtype)
    log_probs = log_probs.to(scores.dtype).view(row_count, slots, vocab)  # (R, S, V)
    # repeated n-grams: probability 0 before anything reads the step (the same tensor without blocking)
    log_probs = block_repeats(log_probs, rows.ngrams, options.block_ngram_repeat, t)  # (R, S, V)
    log_probs = force_prefix(log_probs, rows.prefix, t)  # (R, S, V): a forced prefix's other tokens at -inf
    log_probs = banned_unk(log_probs, options, special)  # (R, S, V): <unk> at -inf with ban_unk_token
    log_probs = ban_eos(log_probs, rows.constraints, eos)  # (R, S, V): EOS at -inf until the constraints are met
    # a coverage penalty: each slot's coverage after this step (its candidates share it) and its penalty
    step_coverage, slot_penalty, offsets = _slot_coverage(attention, rows, scores, t, options)  # (R, S, L), (R, S)
    # NaN / +inf is an unknown probability: it breaks the certificate of a live slot and is
    # never an exact zero there; it never enters the beam either (not even from a dead slot,
    # where it would push finite candidates out unnoticed). Only (R, S) flags and one in-place
    # pass over the candidates: per-entry bool masks cost 5-10x a float pass on the CPU.
    width = min(k + 1 if certify else k, slots * vocab)  # candidates kept (one more: the certificate)
    ending = None  # (R,) bool rows at the last step of their own limit (before max_length)
    if rows.limit is not None and limit_due and t < max_length:
        ending = rows.limit == t
    constrained = rows.constraints is not None  # the torch code below (the one pass knows no automaton)
    stats = None if ending is not None or constrained else _candidate_stats(log_probs, offsets, t, width, options)
    if stats is not None and not options.coverage:  # the rest in one call (native on the CPU, a Triton
        # launch on CUDA) where it runs; a coverage penalty routes to the torch code below (the kernels
        # know no per-hypothesis ranking term)
        outcome = _fused_outcome(stats, log_probs, attention, rows, scores, best_finished, t, options, special)
        if outcome is not None:
            return outcome
    if certify:
        live = _alive(scores)  # (R, S)
        unknown = unknown_slots(log_probs) if stats is None else stats.unknown
        if slot_penalty is not None:  # an unknown (NaN) attention gives an unknown ranking
            unknown = unknown | ~torch.isfinite(slot_penalty)
        exact, reason = record_violation(exact, reason, nonfinite_scores(unknown, live), NONFINITE)
    if t < options.min_length:
        is_eos_column = torch.arange(vocab, device=device) == eos  # (V,) no host-to-device copy
        log_probs = log_probs.masked_fill(is_eos_column, NEG_INF)
    cand = None
    if stats is None:  # unknown candidates (NaN, +inf, a dead slot's -inf + inf = NaN): -inf, in place
        cand = torch.add(offsets.unsqueeze(-1), log_probs).nan_to_num_(
            nan=NEG_INF, posinf=NEG_INF, neginf=NEG_INF)  # (R, S, V)
    record = _row_records(log_probs, attention, None if stats is None else stats.support, options)

    truncated = None
    if t == max_length or ending is not None:  # only EOS may follow (ending: in some rows)
        assert cand is not None  # the native statistics serve the other steps
        live_before = _alive(scores)  # (R, S)
        eos_scores = cand[..., eos]  # (R, S)
        cut_slots = live_before & ~_alive(eos_scores)  # (R, S) live, but EOS has probability 0
        if constrained:  # a prefix that does not meet its constraints is no output (never live here
            cut_slots = cut_slots & (rows.constraints.distance() == 0)  # after t = 0: they are dropped in time)
        if certify:  # a live slot with a token of nonzero probability besides EOS loses its sequences
            eos_ok = torch.isfinite(log_probs[..., eos]).int()  # (R, S)
            support = record["support_size"] if count_support else support_size(log_probs)  # (R, S)
            cut = (live_before & (support - eos_ok > 0)).any(1)  # (R,)
            exact, reason = record_violation(exact, reason, cut if ending is None else cut & ending, MAX_LENGTH)
        if ending is not None:
            truncated = pad_slots(cut_slots & ending.unsqueeze(1), k, False)  # (R, K)
            is_eos_column = torch.arange(vocab, device=device) == eos  # (V,)
            cand = cand.masked_fill(ending.view(row_count, 1, 1) & ~is_eos_column, NEG_INF)  # (R, S, V)
        else:
            truncated = pad_slots(cut_slots, k, False)  # (R, K)
    if t == max_length:  # the final step
        top_scores = eos_scores if offsets is scores else _raw_scores(  # (R, S) log-probabilities
            eos_scores, scores, log_probs[..., eos])
        parent = torch.arange(slots, device=device).expand(row_count, slots)  # (R, S)
        chosen = torch.full_like(parent, eos)  # (R, S)
    else:
        next_state = None
        if constrained:  # dynamic beam allocation over the feasible candidates (nmt.translate.constraint_search)
            kept = constrained_candidates(cand, rows.constraints, t, rows.limit, max_length, k, eos)
            top_scores, top_index, next_state = kept.scores, kept.index, kept.state  # (R, n) each
            if certify:
                exact, reason = record_violation(exact, reason, kept.dropped, MAX_LENGTH)
                exact, reason = record_violation(exact, reason, kept.pruned, PRUNED)
        elif stats is None:
            top_scores, top_index = blocked_topk(cand.view(row_count, slots * vocab), width)  # (R, width)
        else:  # the same values, found by the one pass (native or Triton)
            top_scores, top_index = stats.top_scores, stats.top_index
        if certify and width > k and not constrained:
            pruned = _alive(top_scores[:, k])  # (R,) a finite candidate left out
            exact, reason = record_violation(exact, reason, pruned, PRUNED)
            top_scores, top_index = top_scores[:, :k], top_index[:, :k]  # (R, K)
        parent = torch.div(top_index, vocab, rounding_mode="floor")  # (R, K) slot extended
        chosen = top_index - parent * vocab  # (R, K) token appended
        if offsets is not scores:  # stepwise penalty: the kept candidates' log-probabilities
            top_scores = _raw_scores(top_scores, scores.gather(1, parent),
                                     log_probs.view(row_count, slots * vocab).gather(1, top_index))
    # every step is recorded with k slots (fewer only at the first step, or when k > V)
    top_scores = pad_slots(top_scores, k, NEG_INF)  # (R, K)
    parent, chosen = pad_slots(parent, k, 0), pad_slots(chosen, k, pad)  # (R, K), (R, K)
    record = _per_slot(record, k)
    record.update(token=chosen, parent=parent, score=top_scores)
    kept_penalty, coverage = None, None
    if slot_penalty is not None:  # (R, K) each kept candidate's penalty, (R, K, L) its coverage
        kept_penalty = slot_penalty.gather(1, parent)
        coverage = step_coverage.gather(1, parent.unsqueeze(-1).expand(-1, -1, step_coverage.size(-1)))
        record["coverage_penalty"] = kept_penalty
    if t == max_length:
        return StepOutcome(record, parent, chosen, replace(rows, exact=exact, reason=reason), None, truncated)

    is_eos = chosen == eos  # (R, K)
    finished = is_eos & _alive(top_scores)  # (R, K)
    scores = top_scores.masked_fill(is_eos, NEG_INF)  # (R, K) live prefixes only
    ranked = divided(top_scores, length_penalty(options.length_penalty, t + 1, options.length_alpha))  # (R, K)
    if kept_penalty is not None:
        ranked = ranked + kept_penalty
    new_ranked = torch.where(finished, ranked, NEG_INF)  # (R, K)
    best_finished = torch.cat([best_finished, new_ranked], dim=1).topk(n_best, dim=1).values  # (R, n_best)
    top_finished = rows.top_finished | finished[:, 0]  # (R,)
    live = _alive(scores).any(1)  # (R,)
    worst_kept = best_finished[:, -1]  # (R,)
    bound_penalty = length_penalty(options.length_penalty, max_length + 1, options.length_alpha)
    bound = divided(scores, bound_penalty)  # (R, K) no extension of a live prefix ranks above it ...
    if kept_penalty is not None:  # ... plus a bound on its coverage penalty (<= 0)
        bound = torch.where(_alive(scores), bound + penalty_bound(options.coverage_penalty, kept_penalty), NEG_INF)
    settled = _alive(worst_kept) & (top_finished | (worst_kept >= bound.max(1).values))  # (R,)
    if certify:
        settled = settled & ~exact
    done = ~live | settled  # (R,)
    constraints = None if not constrained else rows.constraints.advanced(pad_slots(next_state, k, 0))
    rows = RowState(scores, exact, reason, best_finished, top_finished, rows.limit,
                    _extended(rows.ngrams, parent, chosen, options), rows.prefix, coverage, constraints)
    return StepOutcome(record, parent, chosen, rows, done, truncated)


def _slot_coverage(attention: Tensor | None, rows: RowState, scores: Tensor, t: int,
                   options: SearchOptions) -> tuple[Tensor | None, Tensor | None, Tensor]:
    """With a coverage penalty: ``(coverage, penalty, offsets)``, each slot's coverage (R, S, L)
    after the step (``rows.coverage`` plus the step's ``attention`` (R*S, L)), its penalty (R, S)
    (an unknown one, from a NaN attention, is -inf) and what its candidates add to their
    log-probabilities (R, S): ``scores`` itself, or with ``stepwise_penalty``
    ``scores + lp(t + 1) * penalty`` (the candidates then compare by ``log p / lp(t + 1) + cp``, the
    ranking they would have if they ended at this step). Without: ``(None, None, scores)``."""
    if not options.coverage:
        return None, None, scores
    row_count, slots = scores.shape
    coverage = rows.coverage.to(scores.dtype) + required_attention(attention).to(scores.dtype).view(
        row_count, slots, -1)  # (R, S, L)
    penalty = coverage_penalty(options.coverage_penalty, coverage, options.beta, options.coverage_epsilon)  # (R, S)
    penalty = penalty.nan_to_num(nan=NEG_INF, posinf=NEG_INF)
    if not options.stepwise_penalty:
        return coverage, penalty, scores
    scale = float(length_penalty(options.length_penalty, t + 1, options.length_alpha))
    return coverage, penalty, scores + penalty * scale


def _raw_scores(keys: Tensor, scores: Tensor, log_probs: Tensor) -> Tensor:
    """The log-probabilities (R, n) of candidates chosen by ``keys`` (R, n) (their stepwise
    ranking): ``scores + log_probs`` (both (R, n): the parent's and the token's, the sum the
    candidates without a penalty hold), -inf where the key is -inf."""
    return torch.where(_alive(keys), scores + log_probs, NEG_INF)


def require_unk(options: SearchOptions, special: Specials) -> None:
    """ValueError where ``options.ban_unk_token`` asks for a ban the search cannot apply: no unk id in
    ``special`` (the entry points' check, before any step)."""
    if options.ban_unk_token and special.unk is None:
        raise ValueError("ban_unk_token needs the target vocabulary's unk id: beam_search(..., unk=...), or "
                         "Specials(..., unk=...) for sample_search")


def banned_unk(log_probs: Tensor, options: SearchOptions, special: Specials) -> Tensor:
    """``log_probs`` (..., V) with ``special.unk``'s column at ``-inf`` (a new tensor) where
    ``options.ban_unk_token``; else the same tensor. A comparison with a device ``arange`` and one
    ``masked_fill`` (no host-to-device copy, no sync); an unknown score of ``<unk>`` becomes -inf
    too (the constraint gives it probability 0). The unk id is there (:func:`require_unk`)."""
    if not options.ban_unk_token:
        return log_probs
    is_unk = torch.arange(log_probs.size(-1), device=log_probs.device) == special.unk  # (V,)
    return log_probs.masked_fill(is_unk, NEG_INF)


def _extended(ngrams: Tensor | None, parent: Tensor, chosen: Tensor, options: SearchOptions) -> Tensor | None:
    """The n-gram history (R, S, W) after a step that kept ``chosen`` (R, K) extending ``parent``
    (R, K) (None without one)."""
    return None if ngrams is None else extend_history(ngrams, parent, chosen, options.max_length)


def _row_records(log_probs: Tensor, attention: Tensor, support: Tensor | None,
                 options: SearchOptions) -> dict[str, Tensor]:
    """The per-row records the options ask for, read from the rows that produced the step's
    candidates: ``log_probs`` (R, S, V) (the scores' dtype), ``attention`` (R*S, L), ``support``
    (R, S) int32 from the one pass of the candidates (None: counted here)."""
    record: dict[str, Tensor] = {}
    row_count, slots, vocab = log_probs.shape
    if options.support_stats or options.return_support:
        record["support_size"] = support_size(log_probs) if support is None else support  # (R, S)
    if options.return_support:
        known = log_probs.nan_to_num(nan=NEG_INF, posinf=NEG_INF, neginf=NEG_INF)  # (R, S, V)
        top_lp, top_tok = known.topk(min(options.support_topk, vocab), dim=-1)  # (R, S, m)
        record["support_tokens"] = top_tok
        record["support_probs"] = top_lp.exp()
    if options.return_attention:
        record["attention"] = required_attention(attention).to(log_probs.dtype).view(row_count, slots, -1)  # (R, S, L)
    return record


def _per_slot(record: dict[str, Tensor], k: int) -> dict[str, Tensor]:
    """Per-row records (R, S, ...) as k slots: at the first step (S = 1 < k) only row 0 exists,
    and every parent is 0."""
    return {name: value.expand((value.size(0), k) + value.shape[2:]) if value.size(1) < k else value
            for name, value in record.items()}


def _fused_outcome(stats: _Stats, log_probs: Tensor, attention: Tensor, rows: RowState, scores: Tensor,
                   best_finished: Tensor, t: int, options: SearchOptions, special: Specials) -> StepOutcome | None:
    """The step from the candidates of one pass (``stats``) by one call: on the CPU the native
    one (:func:`nmt.translate.native_step.step_update`), elsewhere one Triton launch
    (:func:`nmt.translate.triton_step.step_update`); the same values as the torch code of
    :func:`select_step`. None where that call is unavailable (no library, no Triton, float64).
    ``scores`` (R, S) and ``best_finished`` are the rows' in the step's dtype."""
    k = options.beam_size
    update = (step_update if log_probs.device.type == "cpu" else triton_step_update)(
        stats.top_scores, stats.top_index, scores, stats.unknown, rows.exact, rows.reason, best_finished,
        rows.top_finished, beam_size=k, vocab=log_probs.size(-1), eos=special.eos, certify=options.certify,
        penalty=length_penalty(options.length_penalty, t + 1, options.length_alpha),
        bound_penalty=length_penalty(options.length_penalty, options.max_length + 1, options.length_alpha),
        nonfinite_code=NONFINITE, pruned_code=PRUNED)
    if update is None:
        return None
    record = _per_slot(_row_records(log_probs, attention, stats.support, options), k)
    record.update(token=update.token, parent=update.parent, score=update.score)
    new_rows = RowState(update.live, update.exact, update.reason, update.best_finished, update.top_finished,
                        rows.limit, _extended(rows.ngrams, update.parent, update.token, options), rows.prefix,
                        rows.coverage, rows.constraints)
    return StepOutcome(record, update.parent, update.token, new_rows, update.done, None)


class _Stats(NamedTuple):
    """What one pass over a step's log-probabilities gives (:func:`_candidate_stats`)."""

    unknown: Tensor  # (R, S) bool: the slot's row holds a NaN or +inf
    support: Tensor  # (R, S) int32: finite entries of the slot's row
    top_scores: Tensor  # (R, width) the best candidates, descending
    top_index: Tensor  # (R, width) long: their indices s * V + v


def _candidate_stats(log_probs: Tensor, scores: Tensor, t: int, width: int,
                     options: SearchOptions) -> _Stats | None:
    """The per-slot flags and support sizes and the ``width`` best candidates of one step in one
    pass over ``log_probs: (R, S, V)`` (``scores: (R, S)``), in eager mode, when the step is
    neither the last nor masks EOS; else None (the torch passes: unknown_slots, the candidates
    with ``nan_to_num_``, support_size and blocked_topk, which give the same values; among equal
    candidates the pass takes the lower index, the torch passes any).

    On the CPU the native pass (:func:`nmt.sparse._native.step_candidates`): measured on 2
    threads (AVX-512), 64 us at (64, 1, 8000) and 287 us at (64, 5, 8000), the whole step 0.21
    and 0.48 ms, against 0.51 and 1.43 ms with the earlier native block maxima and the torch
    top-k of the chosen blocks. On CUDA the Triton kernel
    (:func:`nmt.sparse._triton_candidates.step_candidates`, float32): one launch and one read
    of the candidates where the torch passes launch about a dozen (GPU time unmeasured). No
    host sync on either."""
    rows, slots, vocab = log_probs.shape
    if t == options.max_length or t < options.min_length or torch.compiler.is_compiling():
        return None
    flat, offsets = log_probs.view(rows * slots, vocab), scores.reshape(-1)
    if log_probs.device.type == "cpu":
        found = step_candidates(flat, offsets, slots, width)
    else:
        found = triton_step_candidates(flat, offsets, slots, width)
    if found is None:
        return None
    support, unknown, top_scores, top_index = found
    return _Stats(unknown.view(rows, slots), support.view(rows, slots), top_scores, top_index)


def divided(x: Tensor, value: float) -> Tensor:
    """``x / value`` as IEEE division on every device, the quotient of the CPU and of the search's
    kernels (``_step_update.c``, ``tl.math.div_rn``): CUDA divides a tensor by a host number as a
    product with its reciprocal, up to 1 ulp away, so off the CPU the divisor is a 0-dim tensor on
    ``x``'s device (one fill launch, no host sync)."""
    if x.device.type == "cpu":
        return x / value
    return x / torch.full((), value, dtype=x.dtype, device=x.device)


def _alive(x: Tensor) -> Tensor:
    """``x > -inf``: ``isfinite(x)`` for the search's scores, which are never NaN or ``+inf`` (the
    candidates pass ``nan_to_num`` or the native pass, which make every non-finite one ``-inf``; the
    finished ones divide them by a positive length penalty). One comparison where ``isfinite``
    takes four operations (a fifth of the greedy step's bookkeeping on the CPU)."""
    return x > NEG_INF


def flat_parents(parent: Tensor, slots: int) -> Tensor:
    """Row index (R, K) into the R*S rows of the previous step, from ``parent`` (R, K) slots."""
    return parent + (torch.arange(parent.size(0), device=parent.device) * slots).unsqueeze(1)


def support_size(log_probs: Tensor) -> Tensor:
    """Number of finite entries (nonzero probabilities) along the last dim, as int32 (NaN and
    ``+inf`` are not counted). A float count: ``0 * x + 1`` is 1 for a finite ``x`` and NaN
    otherwise, and ``nansum`` skips NaN (exact below 2^24 entries per row; a comparison and a
    bool sum cost 2-3x as much on the CPU). No host sync."""
    return torch.nansum(torch.mul(log_probs, 0).add_(1), dim=-1).to(torch.int32)


def pad_slots(x: Tensor, k: int, value: float | int | bool) -> Tensor:
    """Extend dim 1 of ``x`` (rows, s) to k slots with ``value``."""
    if x.size(1) >= k:
        return x
    return torch.cat([x, x.new_full((x.size(0), k - x.size(1)), value)], dim=1)


__all__ = ["RowState", "SearchEnd", "Specials", "StepOutcome", "Truncations", "banned_unk", "divided", "require_unk", "flat_parents", "history_fills", "search_limits",
           "ngram_width", "pad_slots", "select_step", "support_size"]
