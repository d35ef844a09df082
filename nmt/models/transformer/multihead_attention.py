"""Multi-head scaled dot-product attention with any registered probability mapping per module."""
from __future__ import annotations

import math
import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.models.dropout import Dropout, applied
from nmt.models.linear import Linear
from nmt.models.transformer.alibi import AlibiBias, biased_mask
from nmt.models.transformer.head_mapping import HeadMapping
from nmt.models.transformer.packed_rows import PackedMemory, PackedRows
from nmt.models.transformer.relative import RelativeTable, relative_context, relative_scores
from nmt.models.transformer.rotary import Rotation, rotate
from nmt.utils.packed_linear import frozen_linear

FUSED_ATTENTION = os.environ.get("NMT_FUSED_ATTENTION", "1") != "0"
"""Whether softmax heads whose probabilities nobody reads may run as torch's fused
``scaled_dot_product_attention`` on CUDA (``NMT_FUSED_ATTENTION=0``: never; see
:func:`fused_attention_serves`)."""


def fused_attention_serves(x: Tensor) -> bool:
    """Whether the fused attention serves the tensors of ``x``'s device: CUDA (one kernel where the
    step's products, mask, softmax and products launch eight; flash or memory-efficient attention
    in training), while :data:`FUSED_ATTENTION` allows it. Not on the CPU, where it was measured
    no faster: decoding steps slower from 64 rows (up to 1.7x), the Transformer's training step
    within the noise (2 threads)."""
    return FUSED_ATTENTION and x.device.type == "cuda"


class MultiHeadAttention(nn.Module):
    """``heads`` parallel attentions of size ``d_model // heads`` (Vaswani et al. 2017).

    scores = (q W_q)(k W_k)^T / sqrt(d_head) per head; probabilities = ``HeadMapping`` of the
    scores (softmax, sparsemax, entmax15, entmax_bisect -- fixed or learned alpha per head --,
    fusedmax, oscarmax); masked positions get exact zeros; dropout on the probabilities (it
    keeps zeros zero); output = concat_heads(p v) W_o.

    Keys and values are projected by :meth:`keys_values` so that callers can cache them
    (the decoder's self-attention cache, the cross-attention keys computed once per source);
    :meth:`self_projections` gives a self-attention's queries, keys and values together.

    In a :func:`~nmt.utils.packed_linear.frozen_weights` region without gradients (decoding,
    validation; any device) the query scale is folded into a copy of the query projection (exact
    where ``d_head`` is a power of 4, the scale then being a power of two) and a self-attention's
    three projections run as one product on the concatenated weights: on the CPU each product of
    a decoder step costs about 25 us of calls beyond its arithmetic; on a GPU, a launch.

    Softmax heads whose probabilities the caller does not need (``need_probs=False``: training's
    self-attentions, every cross-attention but the last layer's, a decoding step's self-attentions)
    run on CUDA as torch's ``scaled_dot_product_attention`` (:func:`fused_attention_serves`): the
    same function up to rounding, rows with every key masked give zeros as here in float32 (not in
    bfloat16 / float16, where the kernel returns other values: measured on an H200; nmt's masks never
    mask every key of a row: sources hold a token, the causal mask keeps the diagonal), and
    ``attention_dropout`` becomes the kernel's own dropout (another random stream).

    ``continuous`` (cross-attention; ``ContinuousAttention`` keyword arguments): combined attention
    (Martins et al. 2020) per head, ``output = concat_heads((p + w) v) W_o`` where ``w`` are the
    source weights of the continuous density matched to that head's ``p`` (its mean and variance
    over the source positions); ``probs`` stay the discrete ones.

    ``max_relative`` K > 0 (self-attention; :mod:`nmt.models.transformer.relative`): Shaw et al.'s
    relative positions as OpenNMT-py's ``max_relative_positions``, one learned table of 2K + 1
    vectors: ``scores += q_m . A[clip(n - m)]`` and ``context += sum_n p_mn A[clip(n - m)]``, the
    queries at positions ``query_offset ..`` (:meth:`attend`) and the keys at ``0 ..``. Those heads
    never take the fused kernel (it returns no probabilities for the values' relations).

    ``alibi`` (self-attention; :mod:`nmt.models.transformer.alibi`): Press et al.'s fixed linear
    biases, ``scores += -m_h |i - j|`` per head h before the mapping (every mapping receives the
    biased scores), the queries at ``query_offset ..`` and the keys at ``0 ..``; ``alibi_form``
    ``"split"`` (an encoder's, ``model.transformer.alibi_encoder``): the heads favour the left and
    the right in turn, the other side's slope doubled. Softmax heads still
    take the fused kernel: the bias (divided by the temperature, as the kernel scales only
    ``q . k``) goes in as its additive float mask, ``-inf`` where ``mask`` forbids a key.

    ``kv_heads`` G (a divisor of ``heads``; 0: ``heads``): grouped-query attention (Ainslie et al.
    2023; G = 1: multi-query attention, Shazeer 2019): keys and values are projected into G heads
    of size ``d_head`` and query head h attends with key/value head ``h // (heads / G)`` (consecutive
    query heads share one, as a ``repeat_interleave`` of the key/value heads would have them): the
    same function as full multi-head attention whose key/value projections repeat each of the G
    heads' weights heads / G times, with heads / G times fewer key/value parameters, and caches
    (the decoder's self-attention keys and values, the cross-attention's) of G heads: (B, G, S,
    d_head). The products take the groups by a view, without copying keys or values.
    """

    def __init__(self, d_model: int, heads: int, mapping: str = "softmax",
                 params: dict[str, Any] | None = None, dropout: float = 0.0,
                 continuous: dict[str, Any] | None = None, max_relative: int = 0, alibi: bool = False,
                 alibi_form: str = "symmetric", kv_heads: int = 0) -> None:
        super().__init__()
        if heads < 1 or d_model % heads:
            raise ValueError(f"d_model ({d_model}) must be a positive multiple of heads ({heads})")
        kv_heads = kv_heads or heads
        if kv_heads < 1 or heads % kv_heads:
            raise ValueError(f"heads ({heads}) must be a positive multiple of kv_heads ({kv_heads})")
        self.d_model, self.heads, self.d_head = d_model, heads, d_model // heads
        self.kv_heads, self.d_kv = kv_heads, kv_heads * (d_model // heads)
        self.q_proj = Linear(d_model, d_model)
        self.k_proj = Linear(d_model, self.d_kv)
        self.v_proj = Linear(d_model, self.d_kv)
        self.out_proj = Linear(d_model, d_model)
        self.mapping = HeadMapping(heads, mapping, params)
        self.dropout = Dropout(dropout)
        self.relative = RelativeTable(max_relative, self.d_head) if max_relative else None
        self.alibi = AlibiBias(heads, alibi_form) if alibi else None
        # the fused kernel's own softmax, where no one needs the probabilities
        self.fusable = mapping == "softmax" and continuous is None and self.relative is None
        self.continuous: nn.Module | None = None
        if continuous is not None:
            from nmt.models.continuous_attention import ContinuousAttention  # only when asked for

            self.continuous = ContinuousAttention(**continuous)
        for linear in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(linear.weight)
            nn.init.zeros_(linear.bias)

    def _split(self, x: Tensor) -> Tensor:
        """(B, T, n d_head) -> (B, n, T, d_head): the queries' heads, or the keys' or values' kv_heads."""
        return x.view(x.size(0), x.size(1), -1, self.d_head).transpose(1, 2)

    def keys_values(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x: (B, S, D) -> keys, values: each (B, kv_heads, S, d_head)."""
        return self._split(self.k_proj(x)), self._split(self.v_proj(x))

    def packed_keys_values(self, memory: PackedMemory) -> tuple[Tensor, Tensor]:
        """The :meth:`keys_values` of ``memory.rows.unpack(memory.x)`` at the real positions, projected
        from the N packed rows alone: keys, values each (B, kv_heads, L, d_head), contiguous, zeros at
        the padded positions (:meth:`keys_values` gives the bias there: any value does, the
        cross-attention masks padded keys)."""
        rows, heads = memory.rows, self.kv_heads
        return rows.unpack_heads(self.k_proj(memory.x), heads), rows.unpack_heads(self.v_proj(memory.x), heads)

    def _projection_params(self) -> list[Tensor]:
        return [self.q_proj.weight, self.q_proj.bias, self.k_proj.weight, self.k_proj.bias,
                self.v_proj.weight, self.v_proj.bias]

    def queries(self, x: Tensor) -> Tensor:
        """x: (B, T, D) -> the scaled queries ``(x W_q + b_q) / sqrt(d_head)``: (B, heads, T, d_head)."""
        return self._split(self._scaled_queries(x))

    def _scaled_queries(self, x: Tensor) -> Tensor:
        """x: (..., D) -> ``(x W_q + b_q) / sqrt(d_head)``, (..., D)."""
        scale = 1.0 / math.sqrt(self.d_head)
        q = frozen_linear("scaled_query", x, self._projection_params()[:2], lambda: (
            self.q_proj.weight.detach() * scale, self.q_proj.bias.detach() * scale))
        return q if q is not None else self.q_proj(x) * scale

    def self_projections(self, x: Tensor, rotation: Rotation | None = None,
                         rows: PackedRows | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """x: (B, T, D) -> (scaled queries, keys, values) of a self-attention, (B, heads, T, d_head) and
        the keys and values (B, kv_heads, T, d_head):
        :meth:`queries` and :meth:`keys_values` of ``x``, in a frozen region one product. ``rotation``
        (rotary positions of the T inputs, :mod:`nmt.models.transformer.rotary`): the queries and
        keys come rotated by their positions (values are not rotated). ``rows``: x is (N, D), the
        packed real tokens of a (B, T) grid (:mod:`nmt.models.transformer.packed_rows`); the
        projections run on those rows and come back in the padded layout, zeros at padding."""
        q, k, v = self._self_projections(x, rows)
        if rotation is not None:
            q, k = rotate(q, rotation), rotate(k, rotation)
        return q, k, v

    def _self_projections(self, x: Tensor, rows: PackedRows | None = None) -> tuple[Tensor, Tensor, Tensor]:
        params = self._projection_params()

        def build() -> tuple[Tensor, Tensor]:
            scale = 1.0 / math.sqrt(self.d_head)
            return (torch.cat([params[0].detach() * scale, params[2].detach(), params[4].detach()]),
                    torch.cat([params[1].detach() * scale, params[3].detach(), params[5].detach()]))

        qkv = frozen_linear("scaled_qkv", x, params, build)
        if qkv is None:
            parts = (self._scaled_queries(x), self.k_proj(x), self.v_proj(x))
            if rows is not None:
                parts = tuple(rows.unpack(part) for part in parts)
        else:
            parts = (rows.unpack(qkv) if rows is not None else qkv).split((self.d_model, self.d_kv, self.d_kv), dim=-1)
        return tuple(self._split(part) for part in parts)  # type: ignore[return-value]

    def forward(self, query: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None = None,
                need_probs: bool = True, return_scores: bool = False) -> tuple[Tensor, Tensor | None]:
        """query: (B, T, D); keys, values: (B, kv_heads, S, d_head) from :meth:`keys_values`;
        mask: bool broadcastable to (B, heads, T, S), True = may attend (None: everything).

        With ``continuous`` the mask must be the source key mask (B, 1, 1, S), right-padded.

        Returns ``(output (B, T, D), probs (B, heads, T, S))``; each row of ``probs`` sums to
        one with exact zeros at masked positions (and wherever a sparse mapping puts them).
        ``need_probs=False``: the caller reads no probabilities, which lets a fused kernel serve
        softmax heads (see the class docstring); ``probs`` is then None where it did.
        ``return_scores``: the second value is the scores the heads' mapping takes instead of its
        probabilities (B, heads, T, S): divided by the temperature, ``-inf`` where ``mask`` forbids a
        key (what a Fenchel-Young loss of the attention takes: guided alignment training).
        """
        return self.attend(self.queries(query), keys, values, mask, need_probs, return_scores=return_scores)

    def attend(self, q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None = None,
               need_probs: bool = True, query_offset: int = 0,
               rows: PackedRows | None = None, return_scores: bool = False) -> tuple[Tensor, Tensor | None]:
        """:meth:`forward` from the scaled queries q (B, heads, T, d_head) of :meth:`queries` or
        :meth:`self_projections`; ``query_offset``: the position of the first query (relative
        positions and ALiBi only; the keys are at 0 .. S-1). ``rows``: the output is (N, D), the packed rows
        of the real queries (the output projection runs on those alone)."""
        bias = None if self.alibi is None else self.alibi.bias(q.size(2), keys.size(2), query_offset, q.dtype)
        if not need_probs and not return_scores and self.fusable and fused_attention_serves(q):
            attn_mask = mask
            if bias is not None:  # (heads, T, S) or (B, heads, T, S): added to scale * q.k
                temperature = self.mapping.temperature
                attn_mask = biased_mask(bias if temperature == 1.0 else bias / temperature, mask)
            grouped = {"enable_gqa": True} if self.kv_heads != self.heads else {}
            context = F.scaled_dot_product_attention(
                q, keys, values, attn_mask=attn_mask, dropout_p=self.dropout.p if self.training else 0.0,
                scale=1.0 / self.mapping.temperature, **grouped)  # q holds the 1 / sqrt(d_head) already
            context = context.transpose(1, 2).reshape(q.size(0), q.size(2), self.d_model)
            return self.out_proj(context if rows is None else rows.pack(context)), None
        if self.kv_heads != self.heads:  # (B, kv_heads, heads / kv_heads, T, S) -> (B, heads, T, S)
            scores = (self._grouped(q) @ keys.unsqueeze(2).transpose(-1, -2)).flatten(1, 2)
        else:
            scores = q @ keys.transpose(-1, -2)
        if bias is not None:
            scores = scores + bias.to(scores.dtype)  # (B, heads, T, S) + (heads, T, S)
        relations = None
        if self.relative is not None:
            relations = self.relative.relations(q.size(2), keys.size(2), query_offset, q.dtype)  # (T, S, d_head)
            scores = scores + relative_scores(q, relations)
        probs = self.mapping(scores, mask).to(values.dtype)
        weights = applied(self.dropout, probs)
        if self.continuous is not None:
            weights = weights + self._continuous_weights(probs, mask)
        if self.kv_heads != self.heads:
            context = (self._grouped(weights) @ values.unsqueeze(2)).flatten(1, 2)
        else:
            context = weights @ values  # (B, heads, T, d_head)
        if relations is not None:
            context = context + relative_context(weights, relations.to(weights.dtype))
        context = context.transpose(1, 2).reshape(q.size(0), q.size(2), self.d_model)
        if return_scores:  # what the mapping took: temperature applied, -inf where the mask forbids a key
            temperature = self.mapping.temperature
            scores = scores if temperature == 1.0 else scores / temperature
            probs = scores if mask is None else scores.masked_fill(~mask, float("-inf"))
        return self.out_proj(context if rows is None else rows.pack(context)), probs

    def _grouped(self, x: Tensor) -> Tensor:
        """(B, heads, T, F) -> (B, kv_heads, heads / kv_heads, T, F), a view: each key/value head's
        query heads (consecutive ones) together, for products with (B, kv_heads, 1, S, d_head)."""
        return x.view(x.size(0), self.kv_heads, self.heads // self.kv_heads, x.size(2), x.size(3))

    def _continuous_weights(self, probs: Tensor, mask: Tensor | None) -> Tensor:
        """Source weights (B, heads, T, S) of each head's continuous density (see the class docstring)."""
        batch, heads, queries, width = probs.shape
        if mask is None or mask.dim() != 4 or mask.shape[1:3] != (1, 1) or mask.size(0) != batch:
            raise ValueError("continuous attention needs the source key mask of shape (B, 1, 1, S) "
                             f"(cross-attention), got {None if mask is None else tuple(mask.shape)}")
        source = mask.reshape(batch, 1, width).expand(batch, heads, width).reshape(batch * heads, width)
        weights = self.continuous.source_weights(probs.reshape(batch * heads, queries, width), source)
        return weights.view(batch, heads, queries, width).to(probs.dtype)


__all__ = ["FUSED_ATTENTION", "MultiHeadAttention", "fused_attention_serves"]
