"""The Transformer decoder stack, teacher-forced or incremental (per-layer key/value caches)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor, nn

from nmt.models.dropout import Dropout, applied
from nmt.models.transformer.checkpointing import run_layer
from nmt.models.transformer.layers import AttentionSpec, DecoderLayer, LayerSpec
from nmt.models.transformer.packed_rows import PackedMemory
from nmt.models.transformer.rotary import stack_rotation

KV = tuple[Tensor, Tensor]
"""Keys and values, each (B, heads, S, d_head)."""


@dataclass
class DecoderOutput:
    """hidden (B, T, D); per layer: self probs (B, heads, T, t0+T), cross probs (B, heads, T, L)
    (without ``need_maps``, None where a fused kernel served the heads: the last layer's cross
    probs are there unless ``need_attention`` is False too), and the self-attention caches extended
    by the T new positions."""

    hidden: Tensor
    self_maps: list[Tensor | None]
    cross_maps: list[Tensor | None]
    caches: list[KV]


class TransformerDecoder(nn.Module):
    """Target embeddings (B, T, D) -> hidden states (B, T, D) for the generator.

    Input: ``dropout(sqrt(D) * emb + positions[t0:t0+T])``; final LayerNorm with pre-norm. Rotary
    positions add nothing there and rotate the self-attentions' queries and keys by t0..t0+T-1
    (the cache holds rotated keys); the cross-attention is never rotated.
    Called with ``caches`` (one (keys, values) per layer holding positions 0..t0-1) it
    continues from position t0: the step of incremental decoding, the same computation
    as the teacher-forced pass restricted to the new positions.
    """

    def __init__(self, spec: LayerSpec, layers: int, self_attention: AttentionSpec,
                 cross_attention: AttentionSpec, positions: nn.Module, dropout: float = 0.0) -> None:
        super().__init__()
        if layers < 1:
            raise ValueError(f"the decoder needs at least one layer, got {layers}")
        self.scale = math.sqrt(spec.d_model)
        self.positions = positions
        self.dropout = Dropout(dropout)
        self.layers = nn.ModuleList(DecoderLayer(spec, self_attention, cross_attention) for _ in range(layers))
        self.final_norm = nn.LayerNorm(spec.d_model) if spec.norm == "pre" else None
        self.checkpoint_activations = False
        """Run each layer of a teacher-forced pass (no caches) under activation checkpointing
        when autograd records (:mod:`nmt.models.transformer.checkpointing`)."""

    def cross_keys_values(self, memory: Tensor, packed: PackedMemory | None = None) -> list[KV]:
        """memory (B, L, D) -> each layer's cross-attention keys/values (B, heads, L, d_head),
        computed once per source and stored contiguous: as the heads' transposed view of the
        projection they could not be folded into one batch of products, so ``matmul`` copied them
        at every decoding step (7% of a greedy Transformer's decoding time on the CPU).

        ``packed``: the encoder's packed rows of ``memory`` (:meth:`TransformerEncoder.encode
        <nmt.models.transformer.encoder.TransformerEncoder.encode>`, the CPU): the projections run
        on the N real rows alone and are scattered into the padded layout, zeros at the padded
        positions, which the cross-attention masks (the same attention, forward and backward; the
        padding's projections cost 3% of a training step under ``pool_sort: target``)."""
        if packed is not None:
            return [layer.cross_attn.packed_keys_values(packed) for layer in self.layers]
        return [tuple(t.contiguous() for t in layer.cross_attn.keys_values(memory)) for layer in self.layers]

    def forward(self, emb: Tensor, cross_kv: list[KV], src_mask: Tensor,
                caches: list[KV] | None = None, need_maps: bool = True,
                need_attention: bool = True) -> DecoderOutput:
        """emb: (B, T, D) unscaled target embeddings; cross_kv: from :meth:`cross_keys_values`;
        src_mask: (B, L) bool; caches: None (teacher forcing from position 0) or per layer;
        ``need_maps=False``: the caller reads only the last layer's cross probs, and with
        ``need_attention=False`` not even those."""
        offset = 0 if caches is None else caches[0][0].size(2)  # a shape: no device sync
        x = applied(self.dropout, self.positions(emb * self.scale, offset))
        key_mask = src_mask[:, None, None, :]
        rotation = stack_rotation(self.positions, offset, x.size(1), x.dtype)
        self_maps, cross_maps, new_caches = [], [], []
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x, self_probs, cross_probs, cache = run_layer(
                layer, self.checkpoint_activations and caches is None, x, cross_kv[i], key_mask,
                None if caches is None else caches[i], need_maps, need_maps or (need_attention and i == last),
                rotation)
            self_maps.append(self_probs)
            cross_maps.append(cross_probs)
            new_caches.append(cache)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return DecoderOutput(x, self_maps, cross_maps, new_caches)


__all__ = ["DecoderOutput", "TransformerDecoder"]
