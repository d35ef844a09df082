"""The Transformer encoder stack: scaled embeddings + positions, N self-attention layers."""
from __future__ import annotations

import math

from torch import Tensor, nn

from nmt.models.dropout import Dropout, applied
from nmt.models.transformer.checkpointing import run_layer
from nmt.models.transformer.layers import AttentionSpec, EncoderLayer, LayerSpec, layer_norm
from nmt.models.transformer.packed_rows import PackedMemory, PackedRows, packs
from nmt.models.transformer.rotary import stack_rotation


class TransformerEncoder(nn.Module):
    """emb (B, L, D) -> memory (B, L, D).

    The input is ``dropout(sqrt(D) * emb + positions)`` (rotary positions add nothing: they rotate
    every layer's self-attention queries and keys instead); with pre-norm the output of the last
    layer goes through a final LayerNorm. Padded positions are masked as keys (exact zeros)
    and their own outputs are never attended to downstream.
    """

    def __init__(self, spec: LayerSpec, layers: int, attention: AttentionSpec, positions: nn.Module,
                 dropout: float = 0.0) -> None:
        super().__init__()
        if layers < 1:
            raise ValueError(f"the encoder needs at least one layer, got {layers}")
        self.scale = math.sqrt(spec.d_model)
        self.positions = positions
        self.dropout = Dropout(dropout)
        self.layers = nn.ModuleList(EncoderLayer(spec, attention) for _ in range(layers))
        self.final_norm = layer_norm(spec.layer_norm, spec.d_model) if spec.norm == "pre" else None
        self.checkpoint_activations = False
        """Run each layer under activation checkpointing when autograd records
        (:mod:`nmt.models.transformer.checkpointing`, ``training.checkpoint_activations``)."""

    def forward(self, emb: Tensor, mask: Tensor, need_maps: bool = True) -> tuple[Tensor, list[Tensor | None]]:
        """emb: (B, L, D) unscaled embeddings; mask: (B, L) bool, True = real token.

        On the CPU, batches with padding run their token-wise work on the real tokens alone
        (:mod:`nmt.models.transformer.packed_rows`); the memory's padded positions are then zeros.

        Returns memory (B, L, D) and the self-attention probabilities of each layer,
        (B, heads, L, L) each; ``need_maps=False``: the caller reads none of them, and a layer's
        may be None (a fused kernel served its heads).
        """
        memory, maps, _ = self.encode(emb, mask, need_maps)
        return memory, maps

    def encode(self, emb: Tensor, mask: Tensor, need_maps: bool = True
               ) -> tuple[Tensor, list[Tensor | None], PackedMemory | None]:
        """:meth:`forward`'s memory (B, L, D) and maps, and the memory's packed rows (N, D) where
        the encoder packed (else None): the decoder's cross-attention projects those
        (:meth:`nmt.models.transformer.decoder.TransformerDecoder.cross_keys_values`)."""
        x = applied(self.dropout, self.positions(emb * self.scale))
        key_mask = mask[:, None, None, :]
        rotation = stack_rotation(self.positions, 0, x.size(1), x.dtype)
        rows = PackedRows.of(mask) if packs(mask) else None
        if rows is not None:
            x = rows.pack(x)
        maps = []
        for layer in self.layers:
            x, probs = run_layer(layer, self.checkpoint_activations, x, key_mask, need_maps, rotation, rows)
            maps.append(probs)
        if self.final_norm is not None:
            x = self.final_norm(x)
        if rows is None:
            return x, maps, None
        return rows.unpack(x), maps, PackedMemory(rows, x)


__all__ = ["TransformerEncoder"]
