"""Lexically constrained beam search: the per-step tensor code (``beam_search(..., constraints=)``).

Each hypothesis carries the state of its sentence's constraint automaton
(:mod:`nmt.translate.constraint_automaton`); the sentence's tables travel with the search's rows.
At every step of :func:`nmt.translate.search_step.select_step`:

1. :func:`ban_eos`: EOS gets probability 0 (log-probability ``-inf``) in every slot whose state is
   not accepting, before anything reads the step (so a hypothesis ends only once it meets every
   constraint: hard constraints).
2. :func:`constrained_candidates` replaces the plain top-k. Every candidate (slot, token) has a next
   state; one that could not reach acceptance within its sentence's length limit (``t + 1`` tokens
   plus the state's distance beyond the limit) is dropped, and the sentence's certificate breaks
   with ``max_length`` where it had nonzero probability (the constrained support reaches past the
   limit, as a live hypothesis cut at ``max_length`` does without constraints). The rest compete by
   *dynamic beam allocation* (Post & Vilar 2018, Hu et al. 2019): the pool is, per slot, the ``k + 1``
   best candidates whose token is no phrase token (they share the slot's "other" next state, so one
   bank: a round robin over every candidate takes at most ``k`` of them), its EOS, and every
   candidate whose token is a phrase token (the only ones that advance a constraint), so that the
   beam is exactly the round robin over all candidates; its candidates are banked by the distance of their next state
   (tokens still needed; a finished one: 0), ranked within their bank by score, and the beam takes
   them round robin, rank 0 of every bank (the most advanced bank first), then rank 1, ... (an
   empty bank's share goes to the others). The kept ones are returned by descending score.

Certificate: the pool holds more than ``k`` finite candidates exactly when the step has more than
``k`` (it holds every EOS and phrase-token candidate and each slot's ``k + 1`` best others), so ``pruned`` is the unchanged
rule "a feasible candidate of nonzero probability was not kept"; EOS's ban and the length filter
remove only continuations without a constrained output within the limit (the latter breaking the
certificate where they had nonzero probability). Scores only decrease along a path, so the stop
bound of the unconstrained search holds for the constrained problem. A certified sentence's
finished hypotheses are therefore every output of nonzero probability that meets its constraints,
its first the argmax of the ranking among them.

All shapes come from host integers (the tables' Q and A, the beam): no host sync,
``torch.compile(fullgraph=True)``-able; the fused native / Triton step is not used (this torch code
is). Shapes: R rows, S slots per row, V vocabulary, Q states, A phrase tokens, P = pool size.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from nmt.translate.constraint_automaton import ConstraintTables
from nmt.translate.target_prefix import NO_PREFIX, prefix_lengths
from nmt.utils.device import host_to_device

NEG_INF = float("-inf")


class ConstraintState(NamedTuple):
    """The rows' automata and each slot's state: ``table`` (R, Q, A + 1), ``tokens`` (R, A),
    ``dist`` (R, Q) (:class:`~nmt.translate.constraint_automaton.ConstraintTables`), ``state``
    (R, S) long."""

    table: Tensor
    tokens: Tensor
    dist: Tensor
    state: Tensor

    @classmethod
    def start(cls, tables: ConstraintTables, device: torch.device | str) -> "ConstraintState":
        """Every sentence at its start state, one slot; the tables copied to ``device`` (no sync)."""
        tables = tables.to(device)
        state = torch.zeros(tables.table.size(0), 1, dtype=torch.long, device=tables.table.device)
        return cls(tables.table, tables.tokens, tables.dist, state)

    def select(self, index: Tensor) -> "ConstraintState":
        """Rows ``index`` (R',)."""
        return ConstraintState(*(x.index_select(0, index) for x in self))

    def advanced(self, state: Tensor) -> "ConstraintState":
        """The same automata with the slots' states ``state`` (R, K). Built field by field, not
        with ``_replace``: torch 2.11's dynamo returns ``_replace``'s named tuple empty."""
        return ConstraintState(self.table, self.tokens, self.dist, state)

    def distance(self) -> Tensor:
        """(R, S) long: each slot's tokens still needed (0: its constraints are met)."""
        return self.dist.gather(1, self.state)


def ban_eos(log_probs: Tensor, constraints: ConstraintState | None, eos: int) -> Tensor:
    """``log_probs`` (R, S, V) with EOS at ``-inf`` in the slots whose constraints are not met (a new
    tensor); the same tensor without constraints. An unknown EOS score there becomes -inf too (the
    constraint gives it probability 0)."""
    if constraints is None:
        return log_probs
    unmet = constraints.distance() > 0  # (R, S)
    is_eos = torch.arange(log_probs.size(-1), device=log_probs.device) == eos  # (V,)
    return log_probs.masked_fill(unmet.unsqueeze(-1) & is_eos, NEG_INF)


class Selected(NamedTuple):
    """What :func:`constrained_candidates` keeps (R rows, n <= k kept per row)."""

    scores: Tensor  # (R, n) the kept candidates' values, descending (-inf: none)
    index: Tensor  # (R, n) long s * V + v
    state: Tensor  # (R, n) long each kept candidate's next automaton state
    dropped: Tensor  # (R,) bool a candidate of nonzero probability could not meet the constraints in time
    pruned: Tensor  # (R,) bool more than k feasible candidates: some finite one was left out


def constrained_candidates(cand: Tensor, constraints: ConstraintState, t: int, limit: Tensor | None,
                           max_length: int, k: int, eos: int) -> Selected:
    """The beam's ``k`` candidates at step ``t`` by dynamic beam allocation (see the module).

    cand: (R, S, V) each candidate's value (-inf: probability 0; no NaN), EOS already banned where
    the constraints are unmet; limit: (R,) long each row's own length limit, or None
    (``max_length``). No host sync."""
    rows, slots, vocab = cand.shape
    table, tokens, dist, state = constraints
    states, width = dist.size(1), table.size(2)  # Q, A + 1
    phrase_tokens = width - 1  # A
    device = cand.device
    nxt = table.gather(1, state.unsqueeze(-1).expand(rows, slots, width))  # (R, S, A + 1)
    nxt_dist = dist.gather(1, nxt.view(rows, slots * width)).view(rows, slots, width)  # (R, S, A + 1)
    if limit is None:
        feasible = nxt_dist <= max_length - t - 1  # (R, S, A + 1)
    else:
        feasible = nxt_dist <= (limit - t - 1).view(rows, 1, 1)
    is_eos = torch.arange(vocab, device=device) == eos  # (V,)
    # the phrase tokens' candidates: (R, S, A)
    valid = (tokens >= 0).unsqueeze(1)  # (R, 1, A)
    tok = tokens.clamp(min=0).unsqueeze(1).expand(rows, slots, phrase_tokens)  # (R, S, A)
    phrase_scores = cand.gather(2, tok)  # (R, S, A)
    phrase_live = (phrase_scores > NEG_INF) & valid  # (R, S, A)
    phrase_ok = phrase_live & feasible[..., :phrase_tokens]
    dropped = (phrase_live & ~phrase_ok).flatten(1).any(1)  # (R,)
    phrase_scores = phrase_scores.masked_fill(~phrase_ok, NEG_INF)
    # the other tokens' candidates: the phrase tokens and EOS removed (-inf added once: they are distinct)
    removal = torch.zeros(tok.shape, dtype=cand.dtype, device=device).masked_fill_(valid.expand_as(tok), NEG_INF)
    others = cand.clone(memory_format=torch.contiguous_format).scatter_add_(2, tok, removal)  # (R, S, V)
    others = others.masked_fill_(is_eos, NEG_INF)
    other_bad = ~feasible[..., phrase_tokens]  # (R, S) the "other" transition cannot meet them in time
    dropped = dropped | ((others.amax(-1) > NEG_INF) & other_bad).any(1)
    others = others.masked_fill(other_bad.unsqueeze(-1), NEG_INF)
    # a slot's other tokens share one next state, so one bank: its k + 1 best are all a round robin
    # over every candidate can take from them (and more than k finite ones there is a prune)
    width_o = min(k + 1, vocab)
    top_o, tok_o = others.topk(width_o, dim=2)  # (R, S, W)
    eos_scores = cand[..., eos]  # (R, S) EOS ends the hypothesis (banned where unmet): bank 0, no length test
    # the pool: (R, P), P = S * (W + 1 + A)
    slot_base = (torch.arange(slots, device=device) * vocab).view(1, slots, 1)  # (1, S, 1)
    eos_column = torch.full((rows, slots, 1), eos, dtype=torch.long, device=device)
    pool_scores = torch.cat([top_o, eos_scores.unsqueeze(-1), phrase_scores], dim=2).view(rows, -1)
    pool_index = (slot_base + torch.cat([tok_o, eos_column, tok], dim=2)).view(rows, -1)
    other_state = nxt[..., phrase_tokens:].expand(rows, slots, width_o + 1)  # (R, S, W + 1) EOS's: never read
    pool_state = torch.cat([other_state, nxt[..., :phrase_tokens]], dim=2).reshape(rows, -1)
    other_bank = nxt_dist[..., phrase_tokens:].expand(rows, slots, width_o)  # (R, S, W)
    pool_bank = torch.cat([other_bank, torch.zeros_like(eos_column), nxt_dist[..., :phrase_tokens]],
                          dim=2).reshape(rows, -1)
    pool = pool_scores.size(1)
    live = pool_scores > NEG_INF  # (R, P)
    pruned = live.sum(1) > k  # (R,)
    # round robin over the banks: rank within the bank by descending score (stable: ties by position)
    order = pool_scores.sort(dim=1, descending=True, stable=True).indices  # (R, P)
    bank = pool_bank.gather(1, order)  # (R, P) in score order
    grouped, where = bank.sort(dim=1, stable=True)  # (R, P) by bank, each bank in score order
    position = torch.arange(pool, device=device)  # (P,)
    starts = torch.ones_like(grouped, dtype=torch.bool)
    starts[:, 1:] = grouped[:, 1:] != grouped[:, :-1]  # (R, P) the first entry of its bank
    first = torch.where(starts, position, 0).cummax(dim=1).values  # (R, P) where its bank starts
    rank = torch.empty_like(where).scatter_(1, where, position - first)  # (R, P) earlier entries of its bank
    key = rank * states + bank  # (R, P) unique among the live entries (banks < Q)
    key = torch.where(live.gather(1, order), key, pool * states + position)  # the dead ones last
    take = min(k, pool)
    chosen = key.topk(take, dim=1, largest=False).indices.sort(dim=1).values  # (R, n) positions in score order
    picked = order.gather(1, chosen)  # (R, n) pool entries, by descending score
    return Selected(pool_scores.gather(1, picked), pool_index.gather(1, picked), pool_state.gather(1, picked),
                    dropped, pruned)


def needed_lengths(tables: ConstraintTables, prefix: Tensor | None) -> Tensor:
    """(B,) long: the fewest tokens before EOS of each sentence's outputs that meet its constraints
    and start with its forced prefix ``prefix`` (B, P) (``NO_PREFIX`` after a row's own; None: no
    prefix): the prefix's length plus the distance of the state the prefix leads to (a prefix may
    hold a phrase or start one). On ``prefix``'s device where the tables are on the host (the host
    stays the host: ``nmt-translate``'s loop reads its limits there), else on the tables' device; P
    steps known on the host, no sync."""
    if prefix is None or prefix.size(1) == 0:
        return tables.start_dist
    if tables.table.device != prefix.device:
        if prefix.device.type == "cpu":
            prefix = host_to_device(prefix, tables.table.device)
        else:
            tables = tables.to(prefix.device)
    table, tokens, dist = tables.table, tables.tokens, tables.dist
    phrase_tokens = tokens.size(1)  # A: the "other" column's index
    state = torch.zeros(prefix.size(0), dtype=torch.long, device=prefix.device)  # (B,)
    for j in range(prefix.size(1)):
        tok = prefix[:, j]  # (B,)
        match = (tokens == tok.unsqueeze(1)) & (tokens >= 0)  # (B, A) at most one column
        column = torch.where(match.any(1), match.long().argmax(1), phrase_tokens)  # (B,)
        nxt = table.gather(1, state.view(-1, 1, 1).expand(-1, 1, table.size(2))).squeeze(1)  # (B, A + 1)
        state = torch.where(tok != NO_PREFIX, nxt.gather(1, column.view(-1, 1)).squeeze(1), state)
    return prefix_lengths(prefix) + dist.gather(1, state.view(-1, 1)).squeeze(1)


__all__ = ["ConstraintState", "Selected", "ban_eos", "constrained_candidates", "needed_lengths"]
