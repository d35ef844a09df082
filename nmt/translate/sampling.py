"""Sampling instead of search: ``n_best`` independent samples per sentence (``SearchOptions.sample``).

Ancestral sampling, one token per step, from the distribution of
:mod:`nmt.translate.sample_distribution` (temperature before the output mapping, then top-k /
top-p). Each token is drawn by Gumbel-max: ``argmax_v (log q_v + G_v)`` with ``G`` Gumbel noise from
:mod:`nmt.translate.counter_noise`, a pure function of (seed, the sentence's index in the input, the
sample's number, the step, the token). So a sentence's samples do not depend on its batch, its
place in the batch or the device (the noise bits are the same everywhere; the model's own
log-probabilities may differ in the last bits between devices, which changes a sample only where
two perturbed scores are that close), and a token of probability zero (``log q = -inf``, e.g.
outside a sparsemax or 1.5-entmax support) can never be drawn, without any truncation.

A sample's score is its log-probability under the model (temperature 1, no truncation: what beam
search and scoring give the same sequence; ``-inf`` where a temperature above 1 drew a token
outside the model's own support). Its length limits are beam search's: EOS is forbidden before
``min_length``; at ``max_length`` (or the sentence's ``max_length_ratio`` limit) the sample ends
with EOS where EOS has nonzero probability under the model (its log-probability added), else it
is cut there (returned without EOS, ``complete`` False). A sample whose sampling distribution has no
token of nonzero probability (only EOS, forbidden before ``min_length``; or NaN scores) has no
hypothesis (length 0). With ``block_ngram_repeat`` N, a token that would repeat an N-gram of the sample
(and, with ``ban_unk_token``, ``<unk>``) gets probability 0 in the sampling distribution before
truncation (:mod:`nmt.translate.ngram_block`):
the draw renormalises what is left (a sample's score stays its model log-probability). With forced
target prefixes (:mod:`nmt.translate.target_prefix`) the prefix's tokens are drawn with probability 1
where the model gives them a nonzero one (a sample whose prefix has probability 0 has no hypothesis).

Shapes: B sentences, N = ``n_best`` samples each, R = B x N rows (the N samples of a sentence are
consecutive), V target vocabulary, L source length, T steps. The first step runs B rows (every
sample starts from BOS) and its distribution is repeated for the N samples. The loop keeps every
shape fixed and makes no host sync in a step (:func:`sample_step`); it reads one stop flag, "no
sample is still going", every ``stop_every`` steps, as the static beam search does.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from nmt.models.protocol import State, StepDecoder, required_attention, select_state, shares_encoder_out, tile_state
from nmt.translate.row_compaction import rows_to_keep
from nmt.translate.search_result import SearchResult
from nmt.translate.certificate import SAMPLED
from nmt.translate.counter_noise import gumbel, row_keys, token_keys, uniform_bits
from nmt.translate.history import SearchHistory
from nmt.translate.ngram_block import block_repeats, extend_history, start_history
from nmt.translate.sample_distribution import sampling_log_probs, tempered_step
from nmt.translate.search_options import SearchOptions
from nmt.translate.search_step import Specials, banned_unk, require_unk, search_limits, support_size
from nmt.translate.target_prefix import check_prefix, force_prefix
from nmt.utils.device import host_to_device
from nmt.utils.packed_linear import frozen_weights
from nmt.utils.precision import float32_if_half

NEG_INF = float("-inf")


@dataclass
class SampleRows:
    """The state of R samples between steps.

    alive: (R,) bool still drawing tokens; score: (R,) float log-probability under the model so far;
    length: (R,) long tokens drawn (EOS included); cut: (R,) bool ended without EOS by a length
    limit (EOS had probability 0 there); missing: (R,) bool ended with no token of nonzero
    sampling probability (no hypothesis).
    """

    alive: Tensor
    score: Tensor
    length: Tensor
    cut: Tensor
    missing: Tensor

    @classmethod
    def start(cls, rows: int, device: torch.device) -> "SampleRows":
        """R samples at BOS."""
        no = torch.zeros(rows, dtype=torch.bool, device=device)
        return cls(~no, torch.zeros(rows, device=device), torch.zeros(rows, dtype=torch.long, device=device),
                   no, no)

    def select(self, index: Tensor) -> "SampleRows":
        """Rows ``index`` (R',) of every field."""
        return SampleRows(*(x.index_select(0, index) for x in (self.alive, self.score, self.length, self.cut,
                                                              self.missing)))

    def put(self, index: Tensor, other: "SampleRows") -> "SampleRows":
        """These rows with rows ``index`` (R',) replaced by ``other``'s R' rows (new tensors, of the
        promoted dtype: a float64 model's scores stay float64)."""
        return SampleRows(*(_put(mine, index, theirs) for mine, theirs in
                            ((self.alive, other.alive), (self.score, other.score), (self.length, other.length),
                             (self.cut, other.cut), (self.missing, other.missing))))


def _put(mine: Tensor, index: Tensor, theirs: Tensor) -> Tensor:
    dtype = torch.promote_types(mine.dtype, theirs.dtype)
    return mine.to(dtype).index_copy(0, index, theirs.to(dtype))


@dataclass
class SampleStep:
    """What one step drew: ``token`` (R,) long (PAD for rows that drew nothing), the updated
    ``rows``, and ``record``: field -> (R, ...) the per-row records the options ask for
    ("token"; "attention" (R, L); "support_size" (R,) int32; "support_tokens" / "support_probs"
    (R, m)), zero / PAD for rows already ended before the step."""

    token: Tensor
    rows: SampleRows
    record: dict[str, Tensor]


def sample_step(log_probs: Tensor, tempered: Tensor, attention: Tensor | None, rows: SampleRows, keys: Tensor,
                tokens: Tensor, t: int, options: SearchOptions, special: Specials,
                final: Tensor | None) -> SampleStep:
    """Draw the token of step ``t`` of every row; no host sync.

    log_probs: (R, V) the model's log-probabilities (the score); tempered: (R, V) those sampled
    from (:func:`~nmt.translate.sample_distribution.tempered_step`), truncated here by
    ``sample_topk`` / ``sample_topp`` with EOS forbidden before ``min_length``; attention: (R, L) or
    None; keys: (R,) the rows' noise keys (:func:`~nmt.translate.counter_noise.row_keys`); tokens:
    (V,) the token hashes (:func:`~nmt.translate.counter_noise.token_keys`); final: (R,) bool rows
    at their last step (only EOS may follow), or None.
    """
    log_probs = float32_if_half(log_probs)
    eos, pad = special.eos, special.pad
    scores = sampling_log_probs(tempered.to(log_probs.dtype), options.sample_topk, options.sample_topp,
                                eos if t < options.min_length else None)  # (R, V)
    noise = gumbel(uniform_bits(keys, t, tokens), log_probs.dtype)  # (R, V)
    best, choice = (scores + noise).max(dim=-1)  # (R,), (R,)
    has = best > NEG_INF  # (R,) some token of nonzero sampling probability
    ended = rows.cut
    if final is not None:  # only EOS may follow: it ends the sample where the model gives it nonzero probability
        eos_ok = torch.isfinite(log_probs[:, eos])  # (R,)
        choice = torch.where(final, eos, choice)
        has = torch.where(final, eos_ok, has)
        ended = ended | (rows.alive & final & ~eos_ok)
    take = rows.alive & has  # (R,)
    token = torch.where(take, choice, pad)  # (R,)
    gained = log_probs.gather(1, choice.unsqueeze(1)).squeeze(1)  # (R,)
    missing = rows.missing | (rows.alive & ~has & ~ended)
    new = SampleRows(take & (token != eos), rows.score + torch.where(take, gained, 0.0),
                     rows.length + take.long(), ended, missing)
    return SampleStep(token, new, _records(token, log_probs, attention, rows.alive, options, pad))


def _records(token: Tensor, log_probs: Tensor, attention: Tensor | None, alive: Tensor, options: SearchOptions,
             pad: int) -> dict[str, Tensor]:
    """The step's records (see ``SampleStep``); ``alive`` (R,): the rows that drew at this step."""
    record = {"token": token}
    gone = ~alive
    if options.return_attention:
        record["attention"] = required_attention(attention).to(log_probs.dtype).masked_fill(gone.unsqueeze(1), 0.0)  # (R, L)
    if options.support_stats or options.return_support:
        record["support_size"] = support_size(log_probs).masked_fill(gone, 0)  # (R,)
    if options.return_support:
        known = log_probs.nan_to_num(nan=NEG_INF, posinf=NEG_INF, neginf=NEG_INF)
        top_lp, top_tok = known.topk(min(options.support_topk, known.size(-1)), dim=-1)  # (R, m)
        record["support_tokens"] = top_tok.masked_fill(gone.unsqueeze(1), pad)
        record["support_probs"] = top_lp.exp().masked_fill(gone.unsqueeze(1), 0.0)
    return record


def sample_search(model: StepDecoder, src: Tensor, src_lengths: Tensor, special: Specials, options: SearchOptions,
                  sentence_ids: Tensor | None = None, prefix: Tensor | None = None) -> SearchResult:
    """Draw ``options.n_best`` samples of each sentence of src (B, L), src_lengths (B,).

    ``sentence_ids``: (B,) long, each sentence's index in the whole input (on any device; default
    0..B-1): the noise is keyed by it, so pass it wherever a sentence's batch is not the input.
    Returns a :class:`~nmt.translate.beam_search.SearchResult` whose n-best lists are the samples in
    sample order (``tokens`` (B, N, T), ``lengths``, ``scores`` = ``ranking_scores`` the model's
    log-probabilities, ``complete`` False for cut samples), ``exact`` all False, ``reason``
    "sampled" (``SAMPLED``), ``n_nonzero`` 0 and ``mass`` 0 (they describe a search); attention and
    support records per sample as the options ask (the support of the model's own distribution).
    ``prefix`` (B, P): forced target prefixes (as :func:`~nmt.translate.beam_search.beam_search`
    takes them): every sample of sentence b starts with its prefix, drawn with probability 1 where
    the model gives it a nonzero one (its score is the model's log-probability of the whole sample).
    """
    if prefix is not None:
        check_prefix(prefix, src.size(0), options.max_length)
    require_unk(options, special)
    with torch.no_grad(), frozen_weights():
        return _sample(model, src, src_lengths, special, options, sentence_ids, prefix)


def _sample(model: StepDecoder, src: Tensor, src_lengths: Tensor, special: Specials, options: SearchOptions,
            sentence_ids: Tensor | None, prefix: Tensor | None) -> SearchResult:
    """Run the loop of ``options.resolved_mode`` (static on CUDA, dynamic elsewhere); the same samples."""
    device = src.device
    ids = (torch.arange(src.size(0), device=device) if sentence_ids is None
           else host_to_device(sentence_ids.long(), device))  # (B,)
    if options.resolved_mode(device) == "static":
        return _static_loop(model, src, src_lengths, special, options, ids, prefix)
    return _dynamic_loop(model, src, src_lengths, special, options, ids, prefix)


def _row_prefix(prefix: Tensor | None, n: int, device: torch.device) -> Tensor | None:
    """(R, P) the forced prefix of each of the N samples of every sentence (``prefix`` (B, P)), on
    ``device`` (copied without a sync), or None."""
    return None if prefix is None else host_to_device(prefix, device).repeat_interleave(n, dim=0)


def _row_keys(options: SearchOptions, ids: Tensor) -> Tensor:
    """(R,) the noise keys of the N samples of each sentence ``ids`` (B,), N consecutive rows each."""
    n = options.n_best
    return row_keys(options.seed, ids.repeat_interleave(n), torch.arange(n, device=ids.device).repeat(ids.size(0)))


def _first_step_rows(log_probs: Tensor, tempered: Tensor, attention: Tensor | None, state: State, n: int,
                     ) -> tuple[Tensor, Tensor, Tensor | None, State]:
    """The first step's B rows (one BOS row per sentence) repeated for the sentence's N samples:
    log_probs, tempered (R, V), attention (R, L) or None, state R rows."""
    if n == 1:
        return log_probs, tempered, attention, state
    same = tempered is log_probs
    log_probs = log_probs.repeat_interleave(n, dim=0)  # (R, V)
    tempered = log_probs if same else tempered.repeat_interleave(n, dim=0)  # (R, V)
    attention = None if attention is None else attention.repeat_interleave(n, dim=0)  # (R, L)
    return log_probs, tempered, attention, tile_state(state, n)


def _final_rows(t: int, max_length: int, row_limit: Tensor | None, limit_steps: set[int] | None,
                rows: int, device: torch.device) -> Tensor | None:
    """(R,) bool the rows at their last step (only EOS may follow), or None where no row is: every
    row at ``max_length``, else the rows whose own limit ``row_limit`` (R,) is ``t`` (only read at the
    steps in ``limit_steps`` where those are known on the host; None: unknown, read every step)."""
    if t == max_length:
        return torch.ones(rows, dtype=torch.bool, device=device)
    if row_limit is not None and (limit_steps is None or t in limit_steps):
        return row_limit == t
    return None


def _draw(model: StepDecoder, tokens: Tensor, state: State, encoder_out: State, rows: SampleRows, keys: Tensor,
          token_hashes: Tensor | None, t: int, options: SearchOptions, special: Specials, row_limit: Tensor | None,
          limit_steps: set[int] | None, ngrams: Tensor | None, tile_encoder: bool, prefix: Tensor | None = None,
          ) -> tuple[SampleStep, State, State, Tensor]:
    """Step ``t`` of either loop over its R' stepped rows: the model's step at the temperature, at
    ``t = 0`` its B BOS rows repeated for the N samples of each sentence (``encoder_out`` tiled with
    them where ``tile_encoder``: a model that does not share it), the rows at their last step
    (:func:`_final_rows`), the n-gram blocking of ``ngrams`` (R', max_length) or None, the forced
    target prefixes ``prefix`` (R', P) or None, then the draw
    (:func:`sample_step`). tokens: (B,) at ``t = 0``, else (R',); keys: (R',); token_hashes: (V,), or
    None before the first step (made here). Returns ``(step, state, encoder_out, token_hashes)``."""
    n = options.n_best
    log_probs, tempered, attention, state = tempered_step(model, tokens, state, encoder_out,
                                                          options.temperature, options.return_attention)
    if t == 0:  # one BOS row per sentence, repeated for its N samples
        log_probs, tempered, attention, state = _first_step_rows(log_probs, tempered, attention, state, n)
        if n > 1 and tile_encoder:
            encoder_out = tile_state(encoder_out, n)
    if token_hashes is None:
        token_hashes = token_keys(log_probs.size(-1), rows.alive.device)  # (V,)
    count = rows.alive.size(0)
    final = _final_rows(t, options.max_length, row_limit, limit_steps, count, rows.alive.device)  # (R',) or None
    # (R', V) tokens that would repeat an N-gram at -inf (the draw renormalises what is left)
    tempered = block_repeats(tempered, ngrams, options.block_ngram_repeat, t)
    tempered = force_prefix(tempered, prefix, t)  # (R', V) a forced prefix's token drawn with probability 1
    tempered = banned_unk(tempered, options, special)  # (R', V) <unk> never drawn with ban_unk_token
    step = sample_step(log_probs, tempered, attention, rows, keys, token_hashes, t, options, special, final)
    return step, state, encoder_out, token_hashes


def _static_loop(model: StepDecoder, src: Tensor, src_lengths: Tensor, special: Specials, options: SearchOptions,
                 ids: Tensor, prefix: Tensor | None = None) -> SearchResult:
    """Fixed (R, ...) shapes, stopped samples masked: no host sync in a step, the stop flag read
    every ``stop_every`` steps (the accelerator loop)."""
    n, max_length, every = options.n_best, options.max_length, options.stop_every
    device = src.device
    batch = src.size(0)
    count = batch * n
    keys = _row_keys(options, ids)  # (R,)
    limits = search_limits(options, src_lengths, prefix)  # (B,) on the lengths' device, or None
    row_prefix = _row_prefix(prefix, n, device)  # (R, P) or None
    # the steps where a row may end, known without a sync where the lengths are on the host
    limit_steps = set(limits.tolist()) if limits is not None and limits.device.type == "cpu" else None
    row_limit = None if limits is None else host_to_device(limits, device).repeat_interleave(n)  # (R,)
    encoder_out, state = model.encode(src, src_lengths)
    encoded = encoder_out  # as encode returned it
    rows = SampleRows.start(count, device)
    tokens = torch.full((batch,), special.bos, dtype=torch.long, device=device)  # (B,) then (R,)
    token_hashes: Tensor | None = None
    records: dict[str, list[Tensor]] = {}
    # (R, max_length) each sample's tokens, right-aligned (nmt.translate.ngram_block); None: no blocking
    ngrams = start_history(count, None, max_length, device) if options.block_ngram_repeat else None
    tile_encoder = not shares_encoder_out(model)
    for t in range(max_length + 1):
        step, state, encoder_out, token_hashes = _draw(model, tokens, state, encoder_out, rows, keys, token_hashes,
                                                       t, options, special, row_limit, limit_steps, ngrams,
                                                       tile_encoder, row_prefix)
        rows, tokens = step.rows, step.token
        if ngrams is not None and t < max_length:
            ngrams = extend_history(ngrams, None, tokens, max_length)
        for name, value in step.record.items():
            records.setdefault(name, []).append(value)
        if t == max_length:
            break
        if (t + 1) % every == 0 and not bool(rows.alive.any()):  # the one host sync per stop_every steps
            break
    stacked = {name: torch.stack(values, dim=1) for name, values in records.items()}  # (R, T, ...)
    return _result(stacked, rows, batch, n, special.pad, encoded)


RECORD_FILLS = {"token": None, "attention": 0.0, "support_size": 0, "support_tokens": None, "support_probs": 0.0}
"""The record of a row that has left the dynamic loop, per field (None: the PAD id), as the static
loop records a stopped row (``sample_step``)."""


def _dynamic_loop(model: StepDecoder, src: Tensor, src_lengths: Tensor, special: Specials, options: SearchOptions,
                  ids: Tensor, prefix: Tensor | None = None) -> SearchResult:
    """Stopped samples leave the batch (the CPU loop): one host sync per step (which rows are still
    going), and once the live rows fit a smaller size among 1, 2, 3, 4, 6, 8, 12, ...
    (:func:`~nmt.translate.row_compaction.bucket_size`) the rows, their noise keys, limits, n-gram
    histories, the model's state and the encoder output are reindexed to them, as beam search's
    dynamic loop does (:func:`~nmt.translate.row_compaction.rows_to_keep`). R rows, R' still
    stepped (``active``: their indices among the R). The same samples as the static loop: a row's
    noise and distribution do not depend on the other rows."""
    n, max_length = options.n_best, options.max_length
    device = src.device
    batch = src.size(0)
    count = batch * n
    keys = _row_keys(options, ids)  # (R',)
    limits = search_limits(options, src_lengths, prefix)  # (B,) or None
    row_prefix = _row_prefix(prefix, n, device)  # (R', P) or None
    limit_steps = None if limits is None else set(limits.tolist())
    row_limit = None if limits is None else host_to_device(limits, device).repeat_interleave(n)  # (R',)
    encoder_out, state = model.encode(src, src_lengths)
    encoded = encoder_out  # as encode returned it (rows leaving select new dicts)
    # a model that shares encoder_out takes one row per sentence while every sentence has its N rows;
    # once rows leave, encoder_out holds one row per stepped row (such a model takes that too)
    per_sentence = shares_encoder_out(model)
    rows = SampleRows.start(count, device)  # (R',) the stepped rows
    done = SampleRows.start(count, device)  # (R,) the rows that left, at their indices
    active: Tensor | None = None  # (R',) indices of the stepped rows among the R; None: all, in order
    tokens = torch.full((batch,), special.bos, dtype=torch.long, device=device)  # (B,) then (R',)
    token_hashes: Tensor | None = None
    history: SearchHistory | None = None
    # (R', max_length) or None
    ngrams = start_history(count, None, max_length, device) if options.block_ngram_repeat else None
    for t in range(max_length + 1):
        step, state, encoder_out, token_hashes = _draw(model, tokens, state, encoder_out, rows, keys, token_hashes,
                                                       t, options, special, row_limit, limit_steps, ngrams,
                                                       not per_sentence, row_prefix)
        rows, tokens = step.rows, step.token
        if history is None:
            history = SearchHistory(count, {name: special.pad if RECORD_FILLS[name] is None else RECORD_FILLS[name]
                                            for name in step.record})
        history.append(active, step.record)
        if t == max_length:
            break
        alive = rows.alive.tolist()  # the one host sync of the step
        if not any(alive):
            break
        if ngrams is not None:
            ngrams = extend_history(ngrams, None, tokens, max_length)
        compaction = rows_to_keep([not a for a in alive])
        if compaction is None:
            continue
        keep = torch.tensor(compaction[0], device=device)  # (R'',)
        gone = torch.tensor(compaction[1], device=device)
        original = torch.arange(count, device=device) if active is None else active  # (R',)
        done = done.put(original.index_select(0, gone), rows.select(gone))
        active = original.index_select(0, keep)  # (R'',)
        rows, keys, tokens = rows.select(keep), keys.index_select(0, keep), tokens.index_select(0, keep)
        row_limit = None if row_limit is None else row_limit.index_select(0, keep)
        ngrams = None if ngrams is None else ngrams.index_select(0, keep)
        row_prefix = None if row_prefix is None else row_prefix.index_select(0, keep)
        state = select_state(state, keep)
        encoder_out = select_state(encoder_out, active // n if per_sentence else keep)
        per_sentence = False
    assert history is not None  # max_length >= 0: at least one step
    done = rows if active is None else done.put(active, rows)
    stacked = {name: value.movedim(0, 1) for name, value in history.materialize().items()}  # (R, T, ...)
    return _result(stacked, done, batch, n, special.pad, encoded)


def _result(stacked: dict[str, Tensor], rows: SampleRows, batch: int, n: int, pad: int,
            encoder_out: State | None = None) -> SearchResult:
    """The samples as a ``SearchResult`` (B sentences, N samples, T steps); ``stacked``: field ->
    (R, T, ...) the step records (:class:`SampleStep`), ``rows`` the R rows' final state."""
    steps = stacked["token"].size(1)

    def per_sample(x: Tensor) -> Tensor:  # (R, ...) -> (B, N, ...)
        return x.reshape((batch, n) + x.shape[1:])

    lengths = torch.where(rows.missing, 0, rows.length)  # (R,) 0: no hypothesis
    found = lengths > 0
    tokens = stacked["token"]  # (R, T), PAD after EOS or the cut
    scores = rows.score.masked_fill(~found, NEG_INF)  # (R,)
    device = tokens.device
    return SearchResult(
        tokens=per_sample(tokens),
        lengths=per_sample(lengths),
        scores=per_sample(scores),
        ranking_scores=per_sample(scores),
        complete=per_sample(found & ~rows.cut),
        attention=per_sample(stacked["attention"]) if "attention" in stacked else None,
        exact=torch.zeros(batch, dtype=torch.bool, device=device),
        n_nonzero=torch.zeros(batch, dtype=torch.long, device=device),
        mass=torch.zeros(batch, dtype=scores.dtype, device=device),
        reason=torch.full((batch,), SAMPLED, dtype=torch.long, device=device),
        support_size=per_sample(stacked["support_size"]) if "support_size" in stacked else None,
        support_tokens=per_sample(stacked["support_tokens"]) if "support_tokens" in stacked else None,
        support_probs=per_sample(stacked["support_probs"]) if "support_probs" in stacked else None,
        steps=steps,
        encoder_out=encoder_out,
    )


__all__ = ["SampleRows", "SampleStep", "sample_search", "sample_step"]
