"""Static-shape beam search loop, for accelerators (``SearchOptions(mode="static")``).

Same search, same outputs and certificates as the dynamic loop of ``beam_search``, but every
tensor keeps its shape from the second step on: (B, K) scores, (B*K, ...) model state, where
the dynamic loop removes finished sentences from the batch. A sentence that may stop is
*masked*: its live scores become -inf (so it proposes no candidate, is never pruned nor cut
again), its certificate is frozen and its later step records are the history's fill values,
exactly what the dynamic loop records for a sentence that left the batch.

Host synchronisation: ``static_step`` (model step, selection, masking, reordering) makes none.
The loop reads one flag, "every sentence has stopped", every ``stop_every`` steps, and reads
once at the end the step at which that happened (to drop the idle tail of at most
``stop_every - 1`` steps, so that results equal the dynamic loop's, ``steps`` included): at most
``ceil(T / stop_every) + 1`` host syncs for a result of T steps, besides the model's own (an RNN
encoder copies device lengths to the host once; a mapping's CPU path may sync). Per-sentence
limits (``max_length_ratio``) computed from host-side lengths (as nmt-translate keeps them) tell
the loop on the host at which steps some row may end, and go to the device with the search's state
(no sync); computed from lengths on a device, every step tests them there.
The first step runs one row per sentence (B rows) like the dynamic loop; every later step
runs B*K rows, so a compiled or captured step sees one shape.

Launches: besides the model's and the step's (two Triton kernels on CUDA, see ``search_step``),
the masking of stopped sentences is one more (:mod:`nmt.translate.triton_static_mask`) and the
loop itself launches nothing per step (it keeps each step's (B,) flags and finds the step where
all had stopped once, at the end).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from nmt.models.protocol import State, StepDecoder, attention_request, select_state, shares_encoder_out, tile_state
from nmt.translate.constraint_automaton import ConstraintTables
from nmt.translate.coverage_penalty import start_coverage
from nmt.translate.history import SearchHistory
from nmt.translate.search_options import SearchOptions
from nmt.translate.search_step import (
    NEG_INF,
    RowState,
    SearchEnd,
    Specials,
    Truncations,
    flat_parents,
    history_fills,
    ngram_width,
    search_limits,
    select_step,
)
from nmt.translate.triton_static_mask import StoppedMask
from nmt.translate.triton_static_mask import mask_stopped as triton_mask_stopped


def static_step(model: StepDecoder, tokens: Tensor, state: State, encoder_out: State, rows: RowState,
                stopped: Tensor, t: int, options: SearchOptions, special: Specials, limit_due: bool = True,
                ) -> tuple[dict[str, Tensor], Tensor, State, RowState, Tensor, Tensor | None]:
    """One static-shape step; no host sync.

    tokens: (B*S,) last tokens (S = 1 at t = 0, else K); state: the model's (B*S, ...) state;
    rows: ``RowState`` of B rows; stopped: (B,) bool sentences already masked; ``limit_due``: False
    where the caller knows on the host that no row's own limit is ``t`` (see ``select_step``).
    Returns ``(record, tokens, state, rows, stopped, truncated)``: the step record (B, K, ...)
    with fill values for sentences stopped before this step, the (B*K,) next tokens, the
    reordered (B*K, ...) state, the updated rows (stopped ones masked), the updated ``stopped``
    and the (B, K) hypotheses cut by a length limit: at the final step (t = max_length), and
    at a step where some row's own limit may be ``t`` (else None). The masking
    (:func:`mask_stopped`) is one Triton launch on an accelerator in eager mode.
    """
    log_probs, attention, state = model.step(tokens, state, encoder_out, **attention_request(
        model, options.return_attention or options.coverage))  # (B*S, V), (B*S, L): the attention only where used
    slots = rows.scores.size(1)
    step = select_step(log_probs, attention, rows, t, options, special, limit_due)
    truncated = None if step.truncated is None else step.truncated & ~stopped.unsqueeze(1)  # (B, K)
    fills = history_fills(options, special.pad)
    new = step.rows
    if step.done is None:  # the final step: records and the certificate (a stopped sentence keeps its own)
        record = {name: _masked(value, stopped, fills[name]) for name, value in step.record.items()}
        exact = torch.where(stopped, rows.exact, new.exact)  # (B,)
        reason = torch.where(stopped, rows.reason, new.reason)  # (B,)
        return record, tokens, state, RowState(new.scores, exact, reason, new.best_finished, new.top_finished,
                                               new.limit, new.ngrams, new.prefix, new.coverage, new.constraints), stopped, truncated
    support = step.record.get("support_size")
    args = (stopped, step.done, step.record["token"], step.record["parent"], step.record["score"], support,
            new.scores, new.exact, new.reason, rows.exact, rows.reason)
    one_launch = _masking(new.scores.device)
    masked = None if one_launch is None else one_launch(*args, slots=slots, pad=special.pad)
    if masked is None:
        masked = mask_stopped(*args, slots=slots if options.beam_size > 1 else None, pad=special.pad)
    record = {name: _masked(value, stopped, fills[name]) for name, value in step.record.items()
              if name not in _MASKED}  # what the options add (attention, support lists)
    record.update(token=masked.token, parent=masked.parent, score=masked.score)
    if masked.support is not None:
        record["support_size"] = masked.support
    rows = RowState(masked.live, masked.exact, masked.reason, new.best_finished, new.top_finished, new.limit,
                    new.ngrams, new.prefix, new.coverage, new.constraints)  # a stopped sentence's coverage
    # and constraint states: never read again
    if options.beam_size > 1:  # greedy: one slot whose parent is itself, the state stays in order
        state = select_state(state, masked.flat_parent)  # (B*K, ...)
    return record, step.chosen.reshape(-1), state, rows, masked.stopped, truncated


_MASKED = ("token", "parent", "score", "support_size")
"""The records :func:`mask_stopped` masks."""


def mask_stopped(stopped: Tensor, done: Tensor, token: Tensor, parent: Tensor, score: Tensor,
                 support: Tensor | None, live: Tensor, exact: Tensor, reason: Tensor, old_exact: Tensor,
                 old_reason: Tensor, *, slots: int | None, pad: int) -> StoppedMask:
    """A static step's records and rows with its stopped sentences masked (B sentences, K slots):
    ``stopped`` (B,) bool the sentences stopped before the step, ``done`` (B,) bool those that may
    stop now; ``token``, ``parent``, ``score``, ``support`` (or None) (B, K) the step's records
    (history fill values where the sentence had stopped: PAD, 0, -inf, 0); ``live`` (B, K) the live
    prefixes after it (-inf where the sentence has stopped, before or now); ``exact``, ``reason``
    (B,) the certificate after the step (``old_exact``, ``old_reason``: before it, kept where the
    sentence had stopped); ``slots``: the previous step's slots per sentence, for the flat parent
    rows that gather the state (None: not needed, greedy). Torch's operations, no host sync: the
    reference of :func:`nmt.translate.triton_static_mask.mask_stopped`, the one launch that serves
    accelerators."""
    was = stopped.unsqueeze(1)  # (B, 1)
    now = stopped | done  # (B,)
    return StoppedMask(token.masked_fill(was, pad), parent.masked_fill(was, 0), score.masked_fill(was, NEG_INF),
                       None if support is None else support.masked_fill(was, 0),
                       live.masked_fill(now.unsqueeze(1), NEG_INF), torch.where(stopped, old_exact, exact),
                       torch.where(stopped, old_reason, reason), now,
                       None if slots is None else flat_parents(parent, slots).view(-1))


def _masking(device: torch.device) -> Callable[..., StoppedMask | None] | None:
    """The one-launch masking where it serves (accelerators in eager mode:
    :func:`nmt.translate.triton_static_mask.mask_stopped`, which declines what it does not take),
    else None: torch's operations (the CPU; a compiled step, whose graph fuses them)."""
    return None if device.type == "cpu" or torch.compiler.is_compiling() else triton_mask_stopped


def static_loop(model: StepDecoder, src: Tensor, src_lengths: Tensor, special: Specials,
                options: SearchOptions, prefix: Tensor | None = None,
                constraints: ConstraintTables | None = None) -> tuple[SearchHistory, SearchEnd]:
    """Run the static-shape search on src (B, L), src_lengths (B,) (``prefix`` (B, P): forced
    target prefixes, or None; ``constraints``: the sentences' constraint automata, or None); returns the history and end state for ``beam_search``'s collection
    of the n-best lists."""
    k, max_length, every = options.beam_size, options.max_length, options.stop_every
    device = src.device
    batch = src.size(0)
    encoder_out, state = model.encode(src, src_lengths)
    encoded = encoder_out  # as encode returned it (tiling makes a new dict)
    tokens = torch.full((batch,), special.bos, dtype=torch.long, device=device)  # (B*S,)
    limits = search_limits(options, src_lengths, prefix, constraints)  # (B,) on the lengths' device, or None
    # the steps where a row may end, known without a sync where the lengths are on the host (as
    # nmt-translate keeps them); else every step tests the limits on the device
    limit_steps = set(limits.tolist()) if limits is not None and limits.device.type == "cpu" else None
    rows = RowState.start(batch, options.n_best, options.certify, device, limits, ngram_width(options, static=True),
                          prefix, start_coverage(src_lengths, src.size(1)) if options.coverage else None,
                          constraints)
    stopped = torch.zeros(batch, dtype=torch.bool, device=device)  # (B,)
    stopped_after: list[Tensor] = []  # (B,) stopped after each step: kept, not reduced (no launch a step)
    history = SearchHistory(batch, history_fills(options, special.pad))
    cuts = Truncations.start(batch, k, device)

    for t in range(max_length + 1):
        record, tokens, state, rows, stopped, truncated = static_step(
            model, tokens, state, encoder_out, rows, stopped, t, options, special,
            limit_due=limit_steps is None or t in limit_steps)
        history.append(None, record)
        if truncated is not None:
            cuts.add(None, truncated, t)
        if t == max_length:
            break
        stopped_after.append(stopped)
        if t == 0 and k > 1 and not shares_encoder_out(model):
            encoder_out = tile_state(encoder_out, k)
        if (t + 1) % every == 0 and bool(stopped.all()):  # the one host sync per stop_every steps
            break

    first = _first_all_stopped(stopped_after)  # one host sync: where the dynamic loop would have stopped
    if 0 <= first < history.steps - 1:  # idle steps (no cut there: every sentence had stopped)
        history.keep_steps(first + 1)
    return history, SearchEnd(cuts, rows.exact, rows.reason, encoded)


def _first_all_stopped(stopped_after: list[Tensor]) -> int:
    """The first step after which every sentence had stopped (-1: none), from the (B,) flags of
    each step: three launches and one host sync for the whole search."""
    if not stopped_after:
        return -1
    every = torch.stack(stopped_after).all(1)  # (T,)
    return int(torch.where(every.any(), every.to(torch.uint8).argmax(), -1))


def _masked(value: Tensor, stopped: Tensor, fill: float | int | bool) -> Tensor:
    """``value`` (B, K, ...) with the rows of stopped sentences set to ``fill``."""
    mask = stopped.view((-1,) + (1,) * (value.dim() - 1))
    return value.masked_fill(mask, fill)


__all__ = ["static_loop", "static_step"]
