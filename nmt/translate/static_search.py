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
"""
from __future__ import annotations

import torch
from torch import Tensor

from nmt.models.protocol import State, StepDecoder, attention_request, select_state, shares_encoder_out, tile_state
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
    select_step,
)


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
    at a step where some row's own limit may be ``t`` (else None).
    """
    log_probs, attention, state = model.step(tokens, state, encoder_out, **attention_request(
        model, options.return_attention))  # (B*S, V), (B*S, L): the attention only where it is recorded
    slots = rows.scores.size(1)
    step = select_step(log_probs, attention, rows, t, options, special, limit_due)
    truncated = None if step.truncated is None else step.truncated & ~stopped.unsqueeze(1)  # (B, K)
    fills = history_fills(options, special.pad)
    record = {name: _masked(value, stopped, fills[name]) for name, value in step.record.items()}
    # a stopped sentence keeps the certificate it had when it stopped
    new = step.rows
    exact = torch.where(stopped, rows.exact, new.exact)  # (B,)
    reason = torch.where(stopped, rows.reason, new.reason)  # (B,)
    if step.done is None:  # the final step
        return record, tokens, state, RowState(new.scores, exact, reason, new.best_finished, new.top_finished,
                                               new.limit), stopped, truncated
    stopped = stopped | step.done  # (B,)
    scores = new.scores.masked_fill(stopped.unsqueeze(1), NEG_INF)  # (B, K) masked, not removed
    rows = RowState(scores, exact, reason, new.best_finished, new.top_finished, new.limit)
    if options.beam_size > 1:  # greedy: one slot whose parent is itself, the state stays in order
        state = select_state(state, flat_parents(step.parent, slots).view(-1))  # (B*K, ...)
    return record, step.chosen.reshape(-1), state, rows, stopped, truncated


def static_loop(model: StepDecoder, src: Tensor, src_lengths: Tensor, special: Specials,
                options: SearchOptions) -> tuple[SearchHistory, SearchEnd]:
    """Run the static-shape search on src (B, L), src_lengths (B,); returns the history and end
    state for ``beam_search``'s collection of the n-best lists."""
    k, max_length, every = options.beam_size, options.max_length, options.stop_every
    device = src.device
    batch = src.size(0)
    encoder_out, state = model.encode(src, src_lengths)
    tokens = torch.full((batch,), special.bos, dtype=torch.long, device=device)  # (B*S,)
    limits = options.length_limits(src_lengths)  # (B,) on the lengths' device, or None
    # the steps where a row may end, known without a sync where the lengths are on the host (as
    # nmt-translate keeps them); else every step tests the limits on the device
    limit_steps = set(limits.tolist()) if limits is not None and limits.device.type == "cpu" else None
    rows = RowState.start(batch, options.n_best, options.certify, device, limits)
    stopped = torch.zeros(batch, dtype=torch.bool, device=device)  # (B,)
    all_stopped_at = torch.full((), -1, dtype=torch.long, device=device)  # step when all had stopped
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
        all_stopped_at = torch.where((all_stopped_at < 0) & stopped.all(), t, all_stopped_at)
        if t == 0 and k > 1 and not shares_encoder_out(model):
            encoder_out = tile_state(encoder_out, k)
        if (t + 1) % every == 0 and bool(stopped.all()):  # the one host sync per stop_every steps
            break

    first = int(all_stopped_at)  # one host sync: where the dynamic loop would have stopped
    if 0 <= first < history.steps - 1:  # idle steps (no cut there: every sentence had stopped)
        history.keep_steps(first + 1)
    return history, SearchEnd(cuts, rows.exact, rows.reason)


def _masked(value: Tensor, stopped: Tensor, fill: float | int | bool) -> Tensor:
    """``value`` (B, K, ...) with the rows of stopped sentences set to ``fill``."""
    mask = stopped.view((-1,) + (1,) * (value.dim() - 1))
    return value.masked_fill(mask, fill)


__all__ = ["static_loop", "static_step"]
