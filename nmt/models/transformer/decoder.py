"""The Transformer decoder stack, teacher-forced or incremental (per-layer key/value caches)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor, nn

from nmt.models.dropout import Dropout, applied
from nmt.models.transformer.checkpointing import run_layer
from nmt.models.transformer.layers import AttentionSpec, DecoderLayer, LayerSpec, layer_norm
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
                 cross_attention: AttentionSpec, positions: nn.Module, dropout: float = 0.0,
                 alignment_layer: int = -1, alignment_heads: int = 0, full_context_alignment: bool = False) -> None:
        super().__init__()
        if layers < 1:
            raise ValueError(f"the decoder needs at least one layer, got {layers}")
        if not -layers <= alignment_layer < layers:
            raise ValueError(f"alignment_layer {alignment_layer} is not a layer of a {layers}-layer decoder "
                             f"(0 .. {layers - 1}, or -1 .. -{layers} from the last)")
        if not 0 <= alignment_heads <= spec.heads:
            raise ValueError(f"alignment_heads {alignment_heads} must lie in 0 .. {spec.heads} (0: all heads)")
        self.alignment_index = alignment_layer % layers
        """The layer whose cross-attention gives alignments (and is supervised by guided alignment)."""
        self.alignment_heads = alignment_heads or spec.heads
        """How many of its heads (the first ones): their mean is the reported attention."""
        self.full_context_alignment = full_context_alignment
        """Alignments come from :meth:`full_context_cross` (a pass without the future mask), not from the
        causal pass's (or a step's) cross-attention."""
        self.scale = math.sqrt(spec.d_model)
        self.positions = positions
        self.dropout = Dropout(dropout)
        self.layers = nn.ModuleList(DecoderLayer(spec, self_attention, cross_attention) for _ in range(layers))
        self.final_norm = layer_norm(spec.layer_norm, spec.d_model) if spec.norm == "pre" else None
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
                need_attention: bool = True, alignment_scores: bool = False) -> DecoderOutput:
        """emb: (B, T, D) unscaled target embeddings; cross_kv: from :meth:`cross_keys_values`;
        src_mask: (B, L) bool; caches: None (teacher forcing from position 0) or per layer;
        ``need_maps=False``: the caller reads only the alignment layer's cross probs
        (:attr:`alignment_index`), and with ``need_attention=False`` not even those.
        ``alignment_scores``: that layer's entry of ``cross_maps`` holds its cross-attention's scores
        before the mapping instead of its probabilities (all heads; guided alignment training)."""
        offset = 0 if caches is None else caches[0][0].size(2)  # a shape: no device sync
        x = applied(self.dropout, self.positions(emb * self.scale, offset))
        key_mask = src_mask[:, None, None, :]
        rotation = stack_rotation(self.positions, offset, x.size(1), x.dtype)
        self_maps, cross_maps, new_caches = [], [], []
        aligned = self.alignment_index
        for i, layer in enumerate(self.layers):
            x, self_probs, cross_probs, cache = run_layer(
                layer, self.checkpoint_activations and caches is None, x, cross_kv[i], key_mask,
                None if caches is None else caches[i], need_maps, need_maps or (need_attention and i == aligned),
                rotation, alignment_scores and i == aligned)
            self_maps.append(self_probs)
            cross_maps.append(cross_probs)
            new_caches.append(cache)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return DecoderOutput(x, self_maps, cross_maps, new_caches)

    def full_context_cross(self, emb: Tensor, cross_kv: list[KV], src_mask: Tensor, tgt_mask: Tensor,
                           scores: bool = False) -> Tensor:
        """The alignment layer's cross-attention (B, heads, T, L), every head, in a teacher-forced pass
        through layers 0 .. :attr:`alignment_index` whose self-attentions see the whole target (the
        key mask ``tgt_mask`` (B, T) bool in place of the causal mask; Garg et al. 2019's full-context
        alignment): probabilities, or with ``scores`` the scores before the mapping. emb: (B, T, D)
        unscaled target embeddings (BOS + the target); the layers after the alignment layer do not run."""
        x = applied(self.dropout, self.positions(emb * self.scale, 0))
        key_mask, self_mask = src_mask[:, None, None, :], tgt_mask[:, None, None, :]
        rotation = stack_rotation(self.positions, 0, x.size(1), x.dtype)
        aligned = self.alignment_index
        cross = None
        for i, layer in enumerate(self.layers[:aligned + 1]):
            x, _, cross, _ = run_layer(layer, self.checkpoint_activations, x, cross_kv[i], key_mask, None, False,
                                       i == aligned, rotation, scores and i == aligned, self_mask)
        assert cross is not None
        return cross

    def alignment_attention(self, cross_maps: list[Tensor | None] | Tensor) -> Tensor:
        """The reported attention: the mean of the alignment layer's first :attr:`alignment_heads`
        heads, (B, T, L) from ``cross_maps`` (:class:`DecoderOutput`; that layer's probs present), or
        from that layer's probs (B, heads, T, L) themselves (:meth:`full_context_cross`)."""
        probs = cross_maps if isinstance(cross_maps, Tensor) else cross_maps[self.alignment_index]
        if self.alignment_heads != probs.size(1):
            probs = probs[:, :self.alignment_heads]
        return probs.mean(1)


__all__ = ["DecoderOutput", "TransformerDecoder"]
