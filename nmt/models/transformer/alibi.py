"""ALiBi, attention with linear biases (Press, Smith & Lewis 2022, "Train Short, Test Long"), for the
Transformer's self-attentions, as OpenNMT-py's ``max_relative_positions: -2``.

No vector is added to the embeddings and nothing is learned: every self-attention head h adds a
fixed bias to the score of the query at position i over the key at position j before the mapping:
``-left_h * (i - j)`` for a key on the left (``j <= i``), ``-right_h * (j - i)`` for one on the
right. In the decoder the causal mask keeps only keys ``j <= i``, where that is the paper's
``-m_h * (i - j)``. The paper defines the causal form only; the (bidirectional) encoder takes one of
:data:`ALIBI_ENCODER_FORMS` (``model.transformer.alibi_encoder``, :func:`alibi_direction_slopes`):

- ``symmetric`` (default; OpenNMT-py, MosaicBERT, data2vec 2.0): ``left_h = right_h = m_h``, the
  bias ``-m_h |i - j|``. It sees distances, not directions: a sentence written backwards gets the
  backwards encoder output (mirror-blind).
- ``split``: the heads take turns (the paper's order: the 1st, 3rd, ... heads favour the left,
  the 2nd, 4th, ... the right); a head keeps its slope ``m_h`` on its favoured side and counts the
  other side's distances twice (slope ``2 m_h``). Distinct per-direction slopes are the form of
  x-transformers' bidirectional ALiBi (there learned, per head) and of "BiPE"-style biases; heads
  divided between the two directions follow Press's suggestion for encoders (his directional
  heads see one side only; here the other side is steeper, not cut, so no row is left without
  keys and every key keeps a score). Shift-invariant and without a table, like the symmetric form.

Cross-attention has no bias: its queries and keys lie in different sequences.

The slopes ``m_h`` are the paper's geometric sequence (:func:`alibi_slopes`): for n heads a power
of two ``m_h = 2^(-8h/n)``, h = 1..n; otherwise the n' slopes of the closest lower power of two n',
followed by every other slope (the 1st, 3rd, ...) of 2n' heads, up to n in all (the paper's code,
which OpenNMT-py copies, in its order).

The bias depends on ``i - j`` only, so a sentence's scores are the same wherever it starts, and
there is no table: any length. Positions come from shapes (the query offset is the self-attention
cache's length during incremental decoding), so nothing is read back from the device.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def alibi_slopes(heads: int) -> list[float]:
    """The ``heads`` slopes of the paper's rule (see the module docstring), head 1 first."""
    if heads < 1:
        raise ValueError(f"ALiBi needs at least one head, got {heads}")
    lower = 2 ** int(math.floor(math.log2(heads)))
    slopes = [2.0 ** (-8.0 * h / lower) for h in range(1, lower + 1)]
    if lower == heads:
        return slopes
    extra = [2.0 ** (-8.0 * h / (2 * lower)) for h in range(1, 2 * lower + 1, 2)]  # every other of 2n'
    return slopes + extra[: heads - lower]


ALIBI_ENCODER_FORMS = ("symmetric", "split")
"""The encoder's ALiBi forms (``model.transformer.alibi_encoder``; see the module docstring)."""


def alibi_direction_slopes(heads: int, form: str = "symmetric") -> tuple[list[float], list[float]]:
    """``(left, right)``: each head's slope for keys on the query's left (``j <= i``) and on its right,
    head 1 first. ``symmetric``: both the paper's ``m_h``; ``split``: the 1st, 3rd, ... heads keep
    ``m_h`` on the left and take ``2 m_h`` on the right, the 2nd, 4th, ... the reverse."""
    if form not in ALIBI_ENCODER_FORMS:
        raise ValueError(f"unknown ALiBi encoder form {form!r}; valid: {', '.join(ALIBI_ENCODER_FORMS)}")
    slopes = alibi_slopes(heads)
    if form == "symmetric":
        return slopes, list(slopes)
    left = [m if h % 2 == 0 else 2 * m for h, m in enumerate(slopes)]
    right = [2 * m if h % 2 == 0 else m for h, m in enumerate(slopes)]
    return left, right


class AlibiBias(nn.Module):
    """One self-attention's fixed linear biases, as float64 buffers that are not saved (checkpoints hold
    no ALiBi state; they follow the module's device): ``slopes`` the paper's ``m_h``, ``left`` /
    ``right`` the slopes of keys left / right of the query (:func:`alibi_direction_slopes` of
    ``form``; the decoder's causal mask reads ``left`` only)."""

    def __init__(self, heads: int, form: str = "symmetric") -> None:
        super().__init__()
        left, right = alibi_direction_slopes(heads, form)
        self.form = form
        self.register_buffer("slopes", torch.tensor(alibi_slopes(heads), dtype=torch.float64), persistent=False)
        self.register_buffer("left", torch.tensor(left, dtype=torch.float64), persistent=False)
        self.register_buffer("right", torch.tensor(right, dtype=torch.float64), persistent=False)

    def bias(self, queries: int, keys: int, offset: int, dtype: torch.dtype) -> Tensor:
        """(heads, queries, keys) in ``dtype``: ``-left_h * (i - j)`` where ``j <= i``, ``-right_h * (j - i)``
        where ``j > i``, for the query at position i = offset + row and the key at position j = column
        (symmetric: ``-m_h * |i - j|``; shapes only: no device sync)."""
        device = self.slopes.device
        key_positions = torch.arange(keys, device=device, dtype=self.slopes.dtype)
        query_positions = torch.arange(offset, offset + queries, device=device, dtype=self.slopes.dtype)
        offsets = query_positions.unsqueeze(1) - key_positions.unsqueeze(0)  # (queries, keys): i - j
        left, right = offsets.clamp(min=0), (-offsets).clamp(min=0)  # one of the two is zero
        return -(self.left.view(-1, 1, 1) * left + self.right.view(-1, 1, 1) * right).to(dtype)

    def extra_repr(self) -> str:
        return f"heads={self.slopes.numel()}, form={self.form}"


def biased_mask(bias: Tensor, mask: Tensor | None) -> Tensor:
    """The fused kernel's additive float mask: ``bias`` (heads, T, S) where ``mask`` (bool, broadcastable
    to (B, heads, T, S), True = may attend; None: everything) allows, ``-inf`` elsewhere. Returns
    (heads, T, S) or the broadcast (B, heads, T, S), ``bias``'s dtype."""
    if mask is None:
        return bias
    return torch.where(mask, bias, -math.inf)


__all__ = ["ALIBI_ENCODER_FORMS", "AlibiBias", "alibi_direction_slopes", "alibi_slopes", "biased_mask"]
