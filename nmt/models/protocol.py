"""The contract between models and decoding (beam search, greedy, ensembles).

Every state that travels between decoding steps is a flat ``dict[str, Tensor]`` whose
tensors all have the batch (or batch x beam) dimension FIRST. Beam search therefore
never needs to know a model's internals: it tiles with ``repeat_interleave(k, dim=0)``,
reorders surviving hypotheses with ``index_select(0, index)`` and ensembles keep one
state per member.
"""
from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

from torch import Tensor

State = dict[str, Tensor]
"""Batch-first tensors, e.g. LSTM hidden states stored as (N, layers, H)."""


class AlignmentAttention(NamedTuple):
    """What a model says of the attention it reports alignments from (``-report_align``) and
    guided alignment training supervises: its ``mapping`` name and bound ``params`` (a head
    temperature already applied to the scores it returns), how many ``heads`` (the first ones of
    that layer), whether those heads are continuous combined attention (``continuous``: the
    discrete part's scores are returned) and whether their alpha is learned (``learned_alpha``,
    one per head, not in ``params``)."""

    mapping: str
    params: dict
    heads: int
    continuous: bool = False
    learned_alpha: bool = False


@runtime_checkable
class StepDecoder(Protocol):
    """What beam search needs from a model (single models and ensembles alike)."""

    def encode(self, src: Tensor, src_lengths: Tensor) -> tuple[State, State]:
        """Encode a batch.

        src: (B, L) token ids, padded; src_lengths: (B,).
        Returns ``(encoder_out, decoder_state)``: ``encoder_out`` holds at least
        ``"memory"`` (B, L, H) and ``"src_mask"`` (B, L) bool (True = real token);
        ``decoder_state`` is the initial decoder state. Both are batch-first dicts.
        """
        ...

    def step(self, tokens: Tensor, state: State, encoder_out: State) -> tuple[Tensor, Tensor, State]:
        """One decoding step for N = batch x beam rows.

        tokens: (N,) previous target token ids (BOS at the first step); state: N rows;
        encoder_out: N rows (tiled by the caller), or B rows where the model
        :func:`shares_encoder_out`.
        Returns ``(log_probs, attention, new_state)``: log_probs (N, V) is the log of the
        output mapping's probabilities, ``-inf`` exactly where the probability is 0;
        attention (N, L) the source attention distribution of this step. A model with
        :func:`attention_optional` also takes ``need_attention=False`` and may then return None.
        """
        ...


def attention_optional(model: object) -> bool:
    """Whether ``model.step`` also takes ``need_attention=False`` (the optional attribute
    ``attention_optional``; False where absent) and may then return None for the attention:
    searches ask so where they do not record the attention (``return_attention`` off) and
    scoring always, so that a model whose attention is a by-product (a Transformer's last
    cross-attention, averaged over its heads) need not compute it."""
    return bool(getattr(model, "attention_optional", False))


def attention_request(model: object, needed: bool) -> dict[str, bool]:
    """Keyword arguments for ``model.step`` (and ``step_with_scores``): ``{"need_attention":
    False}`` where the caller does not need the attention and the model takes that
    (:func:`attention_optional`), else none."""
    return {} if needed or not attention_optional(model) else {"need_attention": False}


def shares_encoder_out(model: object) -> bool:
    """Whether ``model.step`` also takes an ``encoder_out`` of B rows for its N = B x S rows, S
    consecutive rows per sentence (the optional attribute ``shares_encoder_out``; False where
    absent): beam search then keeps the encoder output once per sentence instead of tiling it
    to every slot (a model's attention reads each sentence's memory once for its S rows)."""
    return bool(getattr(model, "shares_encoder_out", False))


def position_limits(model: object) -> tuple[int | None, int | None]:
    """``(source tokens, decoder inputs)`` the model's position encodings hold (the optional
    method ``position_limits``; None: any length, as where absent). A Transformer with learned
    positions holds ``model.transformer.max_positions`` of each: a source of that many tokens,
    and BOS plus that many minus one target tokens (``max_length`` of a search at most one less)."""
    limits = getattr(model, "position_limits", None)
    return (None, None) if limits is None else limits()


def too_long(side: str, n: int, limit: int) -> str:
    """The one-line problem of a ``side`` (``"source"`` / ``"target"``) of ``n`` tokens that
    needs more positions than ``limit`` (:func:`position_limits`)."""
    table = f"the learned positions hold (model.transformer.max_positions={limit})"
    if side == "source":
        return f"{n} source tokens, more than {table}"
    return f"{n} target tokens need {n + 1} decoder positions (BOS + tokens), more than {table}"


class InputTooLong(ValueError):
    """Input ``index`` (0-based, in the caller's list) has a ``side`` (``"source"`` / ``"target"``)
    of ``n`` tokens that needs more positions than the model's ``limit``; the message says
    ``input <index + 1>: ...``, and a caller that read the inputs from a file names its line
    with ``problem``."""

    def __init__(self, index: int, side: str, n: int, limit: int) -> None:
        self.index, self.side, self.problem = index, side, too_long(side, n, limit)
        super().__init__(f"input {index + 1}: {self.problem}")


def check_lengths(lengths: dict[int, int], side: str, limit: int | None) -> None:
    """Raise :class:`InputTooLong` for the first index (the smallest) of ``lengths`` (index ->
    tokens) whose ``side`` needs more than ``limit`` positions (a target: its tokens + BOS)."""
    if limit is None:
        return
    need = 1 if side == "target" else 0
    over = [i for i, n in lengths.items() if n + need > limit]
    if over:
        first = min(over)
        raise InputTooLong(first, side, lengths[first], limit)


class NoAttention(ValueError):
    """A search or scoring asked for the source attention (alignments, heatmaps) and the model's
    ``step`` returned None for it: the model records none."""


def required_attention(attention: Tensor | None) -> Tensor:
    """``attention`` itself; :class:`NoAttention` where it is None (a Python test, no host sync)."""
    if attention is None:
        raise NoAttention("the model's step returns no source attention (None), so it has no alignments or heatmaps")
    return attention


def select_state(state: State, index: Tensor) -> State:
    """Pick rows ``index`` (M,) of every batch-first tensor in ``state``."""
    return {k: v.index_select(0, index) for k, v in state.items()}


def tile_state(state: State, times: int) -> State:
    """Repeat each row ``times`` times consecutively: (B, ...) -> (B * times, ...)."""
    return {k: v.repeat_interleave(times, dim=0) for k, v in state.items()}


__all__ = ["AlignmentAttention", "InputTooLong", "NoAttention", "State", "StepDecoder", "attention_optional", "attention_request", "check_lengths",
           "position_limits", "required_attention", "select_state", "shares_encoder_out", "tile_state", "too_long"]
