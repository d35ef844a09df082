"""Forced target prefixes: outputs that begin with given tokens (``nmt-translate -tgt_prefix``).

OpenNMT-py's ``-tgt_prefix`` and fairseq's ``--prefix-size``: each sentence may come with a prefix,
target tokens its output must start with (a post-editor's first words, a language tag, a forced
morphological stem). At step ``t`` below the prefix's length every token but the prefix's ``t``-th
gets log-probability ``-inf`` (probability 0) before anything reads the step (candidates, support
sizes, certificate); from the prefix's end on the search is unconstrained.

The prefixes of a batch travel as one ``(B, P)`` long tensor, each row's prefix left-aligned and
:data:`NO_PREFIX` after it (a sentence without a prefix: a row of them), so one batch mixes
sentences with and without prefixes. :func:`force_prefix` is tensor code whose only branch is on
host integers (``t`` against ``P``): no host sync, ``torch.compile(fullgraph=True)``-able, the
same in the dynamic and the static loop, greedy, the native and the Triton bookkeeping, and
sampling.

Exactness: a forced-out token scores ``-inf`` exactly like a token of probability 0, so beam
search's certificate holds for the constrained problem unchanged: a certified sentence's finished
hypotheses are every output of nonzero probability *that starts with its prefix*, its first is the
argmax of the ranking among them, and ``n_nonzero`` / ``mass`` count that set (the model's
probabilities, not renormalised: ``mass`` is the prefix's own probability times the rest's). Scores
are the model's log-probabilities of the whole output, prefix included (what scoring the output by
teacher forcing gives). A prefix the model gives probability 0 leaves no output (``no_hypothesis``).
An unknown score (NaN, ``+inf``) of the forced token stays unknown, so the certificate still sees it.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from nmt.models.protocol import InputTooLong
from nmt.utils.device import host_to_device

NEG_INF = float("-inf")
NO_PREFIX = -1
"""Entry of a prefix tensor after the row's own prefix (never equal to a token id)."""


class PrefixTooLong(InputTooLong):
    """Input ``index`` (0-based) has a target prefix of ``n`` tokens, more than ``max_length``; the
    message says ``input <index + 1>: ...``, and ``nmt-translate`` names the prefix file's line with
    ``problem`` (``side`` is ``"prefix"``)."""

    def __init__(self, index: int, n: int, max_length: int) -> None:  # noqa: D107 (the class says it)
        self.index, self.side = index, "prefix"
        self.problem = (f"a target prefix of {n} tokens, more than max_length {max_length} (only EOS may follow "
                        "the max_length-th token)")
        ValueError.__init__(self, f"input {index + 1}: {self.problem}")


def check_prefix_lengths(prefixes: Sequence[Sequence[int]], max_length: int) -> None:
    """:class:`PrefixTooLong` for the first of ``prefixes`` (token-id lists, on the host) longer
    than ``max_length``."""
    for index, ids in enumerate(prefixes):
        if len(ids) > max_length:
            raise PrefixTooLong(index, len(ids), max_length)


def prefix_tensor(prefixes: Sequence[Sequence[int]]) -> Tensor:
    """``(B, P)`` long on the host from B token-id lists (P: the longest; 0 columns where every
    list is empty), :data:`NO_PREFIX` after each list."""
    width = max((len(p) for p in prefixes), default=0)
    out = torch.full((len(prefixes), width), NO_PREFIX, dtype=torch.long)
    for row, ids in enumerate(prefixes):
        if ids:
            out[row, : len(ids)] = torch.as_tensor(list(ids), dtype=torch.long)
    return out


def prefix_lengths(prefix: Tensor) -> Tensor:
    """``(B,)`` long: the tokens of each row's prefix (entries before its first :data:`NO_PREFIX`),
    on ``prefix``'s device, no host sync."""
    return (prefix != NO_PREFIX).long().cumprod(1).sum(1)


def force_prefix(log_probs: Tensor, prefix: Tensor | None, t: int) -> Tensor:
    """``log_probs`` (R, S, V) or (R, V) at step ``t`` with every token but each row's forced one at
    ``-inf`` (a new tensor) in the rows whose prefix (R, P) is longer than ``t``; unchanged (the same
    tensor) where nothing is forced: no prefix, or ``t >= P``. The forced entry keeps its value (an
    unknown one stays unknown). One comparison and one ``masked_fill``; no host sync."""
    if prefix is None or t >= prefix.size(1):
        return log_probs
    forced = prefix[:, t]  # (R,) the token to force, NO_PREFIX: none
    vocab = torch.arange(log_probs.size(-1), device=log_probs.device)  # (V,)
    barred = (vocab != forced.unsqueeze(1)) & (forced.unsqueeze(1) != NO_PREFIX)  # (R, V)
    if log_probs.dim() == 3:
        barred = barred.unsqueeze(1)  # (R, 1, V): every slot of the row
    return log_probs.masked_fill(barred, NEG_INF)


def check_prefix(prefix: Tensor, batch: int, max_length: int) -> None:
    """ValueError unless ``prefix`` is (batch, P) long with P <= ``max_length`` (a prefix must fit
    before the last step, where only EOS may follow). Reads shapes only: no host sync."""
    if prefix.dim() != 2 or prefix.size(0) != batch:
        raise ValueError(f"prefix must be (batch, P) = ({batch}, P), got shape {tuple(prefix.shape)}")
    if prefix.dtype != torch.long:
        raise ValueError(f"prefix must hold token ids (torch.long), got {prefix.dtype}")
    if prefix.size(1) > max_length:
        raise ValueError(f"a target prefix of {prefix.size(1)} tokens does not fit max_length {max_length} "
                         "(only EOS may follow the max_length-th token)")


def lengthen_limits(limits: Tensor | None, prefix: Tensor | None) -> Tensor | None:
    """Each sentence's own length limit (``SearchOptions.length_limits``, (B,) or None) raised to
    its prefix's length, so that a prefix always fits; ``limits`` itself without a prefix. Where
    one of the two is on the host and the other on a device, the host one is copied there (no host
    sync); both on the host (``nmt-translate``): the result too, so the steps where a row may end
    stay known to the loop without a sync."""
    if limits is None or prefix is None:
        return limits
    return raised_limits(limits, prefix_lengths(prefix))


def raised_limits(limits: Tensor | None, lengths: Tensor | None) -> Tensor | None:
    """``limits`` (B,) raised to ``lengths`` (B,) long (what a sentence's outputs need at least: a
    prefix, the tokens of its constraints); None limits stay None, None lengths change nothing. The
    host / device placement of :func:`lengthen_limits` (no host sync)."""
    if limits is None or lengths is None:
        return limits
    if lengths.device != limits.device:
        if lengths.device.type == "cpu":
            lengths = host_to_device(lengths, limits.device)
        else:
            limits = host_to_device(limits, lengths.device)
    return torch.maximum(limits, lengths)


__all__ = ["NO_PREFIX", "PrefixTooLong", "check_prefix", "check_prefix_lengths", "force_prefix", "lengthen_limits", "prefix_lengths", "prefix_tensor", "raised_limits"]
