"""N-gram repeat blocking (``SearchOptions.block_ngram_repeat``): no output holds an N-gram twice.

OpenNMT-py's ``-block_ngram_repeat N`` and fairseq's ``--no-repeat-ngram-size N``: at every step,
a token that would complete an N-gram (N consecutive tokens) already present in the hypothesis
gets probability 0 (log-probability ``-inf``) before the candidates are chosen. The hypothesis is
its generated tokens only: BOS and padding never take part, and EOS, which ends a hypothesis,
never repeats (so it is never blocked). N = 1 forbids any repeated token.

Every decoding path applies the same two functions of this module to the same per-hypothesis
history: beam search (:func:`nmt.translate.search_step.select_step`, so the dynamic and the static
loops, greedy, the native and the Triton bookkeeping all see the blocked log-probabilities) and
sampling (:mod:`nmt.translate.sampling`, before top-k / top-p). The history is a ``(..., W)`` long
tensor of each hypothesis's tokens, right-aligned (its last token in the last column), ``-1`` in the
columns before its first token: :func:`start_history` makes it, :func:`extend_history` appends
each step's tokens (gathered by parent slot in a beam), :func:`block_repeats` sets the step's
log-probabilities of the tokens that would repeat an N-gram to ``-inf``. All three are tensor code with shapes fixed by the caller's host
integers (no host sync, ``torch.compile(fullgraph=True)``-able): the dynamic loop lets ``W`` grow
with the step (``W = t``, no ``-1`` column), the static loop and sampling keep ``W = max_length``
from the start and drop the oldest column as they append.

Exactness: a blocked continuation scores ``-inf`` at its step exactly like a token of probability
0, and scores only decrease along a path (log-probabilities are <= 0), so beam search's
certificate argument holds for the constrained problem unchanged: a certified sentence's finished
hypotheses are every output of nonzero probability *without a repeated N-gram*, its first one is
the argmax of the ranking among them, and ``n_nonzero`` / ``mass`` count that set (the unblocked
probabilities of the model, not renormalised). Sampling draws each token from the step's
distribution with the blocked tokens removed and the rest renormalised.
"""
from __future__ import annotations

import torch
from torch import Tensor

NEG_INF = float("-inf")
NO_TOKEN = -1
"""History entry of a column before the hypothesis's first token (never equal to a token id)."""


def start_history(rows: int, slots: int | None, width: int, device: torch.device | str) -> Tensor:
    """The history before the first step: ``(rows, slots, width)`` (``(rows, width)`` for
    ``slots=None``) long, all :data:`NO_TOKEN` (``width`` 0 for a history that grows)."""
    shape = (rows, width) if slots is None else (rows, slots, width)
    return torch.full(shape, NO_TOKEN, dtype=torch.long, device=device)


def extend_history(history: Tensor, parent: Tensor | None, token: Tensor, capacity: int) -> Tensor:
    """The history after a step: ``history`` (R, S, W) gathered by ``parent`` (R, K) (the slot each
    new hypothesis extends) with ``token`` (R, K) appended: (R, K, W + 1), or (R, K, W) without its
    oldest column once ``W`` has reached ``capacity`` (the static width). ``parent=None``: one
    hypothesis per row, ``history`` (R, W) and ``token`` (R,). No host sync."""
    if parent is not None:
        history = history.gather(1, parent.unsqueeze(-1).expand(parent.shape + history.shape[-1:]))
    if history.size(-1) >= capacity:
        history = history[..., 1:]
    return torch.cat([history, token.unsqueeze(-1)], dim=-1)


def repeat_followers(history: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """The tokens that would repeat an ``n``-gram of each hypothesis of ``history`` (..., W)
    (right-aligned, :data:`NO_TOKEN` before its first token), as ``(followers, hit)``, both (..., M)
    with M = max(W - n + 1, 0): ``followers`` the last token of each n-gram of the hypothesis (0 in
    place of :data:`NO_TOKEN`, so always a valid index), ``hit`` whether that n-gram's first n-1
    tokens equal the hypothesis's last n-1 tokens (its last token is then blocked).

    Window j (columns j .. j+n-2) followed by column j+n-1 is an n-gram; every window is compared
    with the query (``unfold``, O(W n) per hypothesis): no ``nonzero``, no boolean indexing, shapes
    from ``W`` and ``n`` only. A window whose follower is :data:`NO_TOKEN` never hits, nor does a
    query that holds one (fewer than n-1 tokens)."""
    width = history.size(-1)
    followers = history[..., n - 1:]  # (..., M) the last token of each n-gram
    hit = followers >= 0  # (..., M)
    if n > 1 and width >= n:
        query = history[..., width - n + 1:]  # (..., n - 1) the hypothesis's last n-1 tokens
        windows = history[..., : width - 1].unfold(-1, n - 1, 1)  # (..., M, n - 1)
        hit = hit & (windows == query.unsqueeze(-2)).all(-1) & (query >= 0).all(-1, keepdim=True)
    return followers.clamp(min=0), hit


def blocked_tokens(history: Tensor, n: int, vocab: int) -> Tensor:
    """``(..., vocab)`` bool: the tokens that would complete an ``n``-gram already in each hypothesis
    of ``history`` (..., W) (:func:`repeat_followers` scattered into a mask; misses go to a spare
    column that is dropped). For inspection and tests: the search adds the blocks to its
    log-probabilities directly (:func:`block_repeats`)."""
    followers, hit = repeat_followers(history, n)
    mask = torch.zeros(history.shape[:-1] + (vocab + 1,), dtype=torch.bool, device=history.device)
    return mask.scatter_(-1, torch.where(hit, followers, vocab), True)[..., :vocab]


def block_repeats(log_probs: Tensor, history: Tensor | None, n: int, t: int) -> Tensor:
    """``log_probs`` (..., V) with the tokens that would repeat an ``n``-gram of ``history`` (...,
    W) at ``-inf`` (a new tensor); unchanged (the same tensor) where nothing can repeat: ``n = 0``,
    no history, or step ``t < n`` (a hypothesis of t tokens holds an n-gram and a second one's
    prefix only from t = n on).

    One copy of ``log_probs`` and a scatter-add of ``-inf`` at the hits and 0 at the misses
    (``(..., W - n + 1)`` entries): a token hit several times stays ``-inf``, and an unknown score
    stays unknown (NaN + ``-inf`` is NaN, ``+inf - inf`` NaN), so the certificate still sees a NaN
    row. The sums are exact whatever the order (0 or ``-inf``), so atomics on a GPU give the same."""
    if n == 0 or history is None or t < n:
        return log_probs
    followers, hit = repeat_followers(history, n)
    penalty = torch.zeros(hit.shape, dtype=log_probs.dtype, device=log_probs.device).masked_fill_(hit, NEG_INF)
    return log_probs.clone(memory_format=torch.contiguous_format).scatter_add_(-1, followers, penalty)


__all__ = ["NO_TOKEN", "block_repeats", "blocked_tokens", "extend_history", "repeat_followers", "start_history"]
