"""Transformer encoder and decoder layers, pre-norm (default) or post-norm.

Pre-norm (Wang et al. 2019; Xiong et al. 2020): ``x + dropout(f(LayerNorm(x)))``; the
stack ends with a final LayerNorm. Post-norm (Vaswani et al. 2017):
``LayerNorm(x + dropout(f(x)))``. ``dropout`` is the residual dropout.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from nmt.models.dropout import Dropout, applied
from nmt.models.transformer.feed_forward import FeedForward
from nmt.models.transformer.multihead_attention import MultiHeadAttention
from nmt.models.transformer.packed_rows import PackedRows
from nmt.models.transformer.rotary import Rotation

NORMS = ("pre", "post")
LAYER_NORMS = ("layer", "rms")
"""``model.transformer.layer_norm``: LayerNorm (Ba et al. 2016: mean and variance, gain and bias) or
RMSNorm (Zhang & Sennrich 2019: ``x / sqrt(mean(x^2) + eps) * g``, no centring, no bias)."""
RMS_EPS = 1e-6
"""RMSNorm's ``eps`` (OpenNMT-py's and T5's)."""


def layer_norm(kind: str, d_model: int) -> nn.Module:
    """A normalisation of ``d_model`` features: ``nn.LayerNorm`` (``"layer"``) or ``nn.RMSNorm``
    (``"rms"``, eps :data:`RMS_EPS`)."""
    if kind == "layer":
        return nn.LayerNorm(d_model)
    if kind == "rms":
        return nn.RMSNorm(d_model, eps=RMS_EPS)
    raise ValueError(f"unknown layer_norm {kind!r}; valid: {', '.join(LAYER_NORMS)}")


@dataclass
class LayerSpec:
    """Sizes, dropouts and normalisation shared by every layer of a stack."""

    d_model: int
    heads: int
    d_ff: int
    norm: str = "pre"
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation: str = "relu"
    max_relative: int = 0
    """Relative positions' clipping distance K of every self-attention (0: none)."""
    alibi: bool = False
    """Whether every self-attention adds ALiBi's linear biases (:mod:`nmt.models.transformer.alibi`)."""
    alibi_encoder: str = "symmetric"
    """With ``alibi``: the encoder self-attentions' form, ``symmetric`` or ``split``
    (:data:`~nmt.models.transformer.alibi.ALIBI_ENCODER_FORMS`); the decoder's stay symmetric, which
    its causal mask turns into the paper's form."""
    layer_norm: str = "layer"
    """Which normalisation every sub-layer and the final one use (:data:`LAYER_NORMS`)."""
    kv_heads: int = 0
    """Key/value heads of every attention (grouped-query attention; 0: as many as ``heads``)."""

    def __post_init__(self) -> None:
        if self.norm not in NORMS:
            raise ValueError(f"unknown norm {self.norm!r}; valid: {', '.join(NORMS)}")
        if self.layer_norm not in LAYER_NORMS:
            raise ValueError(f"unknown layer_norm {self.layer_norm!r}; valid: {', '.join(LAYER_NORMS)}")


@dataclass
class AttentionSpec:
    """A mapping name and its parameters (``{"alpha": "learned"}`` for a learned entmax_bisect alpha),
    and for cross-attention optional continuous combined attention (``ContinuousAttention`` kwargs)."""

    mapping: str = "softmax"
    params: dict[str, Any] = field(default_factory=dict)
    continuous: dict[str, Any] | None = None


def causal_mask(queries: int, offset: int, device: torch.device) -> Tensor:
    """(queries, offset + queries) bool: query i (at position offset + i) may see keys 0..offset + i."""
    keys = torch.arange(offset + queries, device=device)
    return keys.unsqueeze(0) <= (offset + torch.arange(queries, device=device)).unsqueeze(1)


class _Residual(nn.Module):
    """One residual sub-layer's LayerNorm placement and dropout."""

    def __init__(self, d_model: int, pre_norm: bool, dropout: float, kind: str = "layer") -> None:
        super().__init__()
        self.norm = layer_norm(kind, d_model)
        self.pre_norm = pre_norm
        self.dropout = Dropout(dropout)

    def inputs(self, x: Tensor) -> Tensor:
        """What the sub-layer reads: LayerNorm(x) in pre-norm, x in post-norm."""
        return self.norm(x) if self.pre_norm else x

    def add(self, x: Tensor, y: Tensor) -> Tensor:
        """Residual connection of the sub-layer output ``y`` to its input ``x``."""
        out = x + applied(self.dropout, y)
        return out if self.pre_norm else self.norm(out)


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward, each in a residual block."""

    def __init__(self, spec: LayerSpec, attention: AttentionSpec) -> None:
        super().__init__()
        pre = spec.norm == "pre"
        self.self_attn = MultiHeadAttention(spec.d_model, spec.heads, attention.mapping, attention.params,
                                            spec.attention_dropout, max_relative=spec.max_relative,
                                            alibi=spec.alibi, alibi_form=spec.alibi_encoder, kv_heads=spec.kv_heads)
        self.attn_block = _Residual(spec.d_model, pre, spec.dropout, spec.layer_norm)
        self.feed_forward = FeedForward(spec.d_model, spec.d_ff, spec.activation, spec.activation_dropout)
        self.ff_block = _Residual(spec.d_model, pre, spec.dropout, spec.layer_norm)

    def forward(self, x: Tensor, key_mask: Tensor, need_probs: bool = True,
                rotation: Rotation | None = None, rows: PackedRows | None = None) -> tuple[Tensor, Tensor | None]:
        """x: (B, L, D); key_mask: (B, 1, 1, L) bool; rotation: rotary positions 0..L-1 of the
        self-attention (None: absolute positions, added to the embeddings). Returns x (B, L, D) and
        probs (B, heads, L, L) (None where ``need_probs`` is False and a fused kernel served the heads).
        ``rows``: x is (N, D), the packed real tokens of the (B, L) grid, and so is the returned x
        (:mod:`nmt.models.transformer.packed_rows`): only the attention runs in the padded layout."""
        q, keys, values = self.self_attn.self_projections(self.attn_block.inputs(x), rotation, rows)
        out, probs = self.self_attn.attend(q, keys, values, key_mask, need_probs, rows=rows)
        x = self.attn_block.add(x, out)
        x = self.ff_block.add(x, self.feed_forward(self.ff_block.inputs(x)))
        return x, probs


class DecoderLayer(nn.Module):
    """Causal self-attention (with a key/value cache), cross-attention and feed-forward."""

    def __init__(self, spec: LayerSpec, self_attention: AttentionSpec, cross_attention: AttentionSpec) -> None:
        super().__init__()
        pre = spec.norm == "pre"
        self.self_attn = MultiHeadAttention(spec.d_model, spec.heads, self_attention.mapping,
                                            self_attention.params, spec.attention_dropout,
                                            max_relative=spec.max_relative, alibi=spec.alibi, kv_heads=spec.kv_heads)
        self.self_block = _Residual(spec.d_model, pre, spec.dropout, spec.layer_norm)
        self.cross_attn = MultiHeadAttention(spec.d_model, spec.heads, cross_attention.mapping,
                                             cross_attention.params, spec.attention_dropout,
                                             cross_attention.continuous, kv_heads=spec.kv_heads)
        self.cross_block = _Residual(spec.d_model, pre, spec.dropout, spec.layer_norm)
        self.feed_forward = FeedForward(spec.d_model, spec.d_ff, spec.activation, spec.activation_dropout)
        self.ff_block = _Residual(spec.d_model, pre, spec.dropout, spec.layer_norm)

    def forward(self, x: Tensor, cross_kv: tuple[Tensor, Tensor], src_mask: Tensor,
                cache: tuple[Tensor, Tensor] | None = None, need_self_probs: bool = True,
                need_cross_probs: bool = True, rotation: Rotation | None = None, cross_scores: bool = False,
                self_mask: Tensor | None = None) -> tuple[Tensor, Tensor | None, Tensor | None, tuple[Tensor, Tensor]]:
        """x: (B, T, D) the targets at positions t0..t0+T-1, t0 = the cache length (0 without one);
        cross_kv: the cross-attention keys/values (B, heads, L, d_head); src_mask: (B, 1, 1, L);
        cache: self-attention keys/values of the earlier positions (B, heads, t0, d_head);
        rotation: rotary positions t0..t0+T-1 of the self-attention's queries and new keys (None:
        absolute positions), the cache then holding keys rotated by their own positions. Relative
        positions (``spec.max_relative``) and ALiBi (``spec.alibi``) place the queries at t0.. and
        the keys at 0.. themselves.
        One step (T = 1) may also run N = B x S rows, S consecutive rows per source sharing its
        cross keys/values (beam slots): x (N, 1, D) and the cache have N rows, cross_kv and
        src_mask B, and the cross-attention takes each source's S queries together.

        Returns x (B, T, D), self probs (B, heads, T, t0+T), cross probs (B, heads, T, L) and
        the cache extended by these T positions; ``need_self_probs`` / ``need_cross_probs`` False:
        that attention's probabilities may be None (a fused kernel served its heads).
        ``cross_scores``: the cross-attention's scores before its mapping in place of its probs
        (:meth:`MultiHeadAttention.forward`'s ``return_scores``; teacher forcing only).
        ``self_mask``: the self-attention's mask in place of the causal one, e.g. the target's key
        mask (B, 1, 1, T) of a full-context pass (every real position sees the whole target).
        """
        q, keys, values = self.self_attn.self_projections(self.self_block.inputs(x), rotation)
        offset = 0
        if cache is not None:
            offset = cache[0].size(2)
            keys, values = torch.cat([cache[0], keys], dim=2), torch.cat([cache[1], values], dim=2)
        if self_mask is not None:
            mask = self_mask
        else:
            mask = None if x.size(1) == 1 else causal_mask(x.size(1), offset, x.device)  # one query sees all
        out, self_probs = self.self_attn.attend(q, keys, values, mask, need_self_probs, offset)
        x = self.self_block.add(x, out)
        query, sources = self.cross_block.inputs(x), cross_kv[0].size(0)
        if sources != x.size(0):  # a step's S rows per source: (N, 1, D) -> (B, S, D)
            out, cross_probs = self.cross_attn(query.view(sources, -1, query.size(-1)), cross_kv[0], cross_kv[1],
                                               src_mask, need_cross_probs)  # (B, S, D), (B, heads, S, L)
            out = out.view(x.shape)
            if cross_probs is not None:
                cross_probs = cross_probs.transpose(1, 2).reshape(x.size(0), cross_probs.size(1), 1, -1)
        else:
            out, cross_probs = self.cross_attn(query, cross_kv[0], cross_kv[1], src_mask, need_cross_probs,
                                               cross_scores)
        x = self.cross_block.add(x, out)
        x = self.ff_block.add(x, self.feed_forward(self.ff_block.inputs(x)))
        return x, self_probs, cross_probs, (keys, values)


__all__ = ["AttentionSpec", "DecoderLayer", "EncoderLayer", "LAYER_NORMS", "LayerSpec", "NORMS", "RMS_EPS", "causal_mask",
           "layer_norm"]
