"""What every encoder-decoder model holds: its embeddings, encoder, decoder and generator, and the
output mapping's probabilities (the RNN ``Seq2Seq`` and the ``TransformerSeq2Seq`` share it)."""
from __future__ import annotations

from typing import Callable

from torch import Tensor, nn

from nmt.models.embeddings import Embeddings
from nmt.models.generator import Generator


class EncoderDecoder(nn.Module):
    """The parts of an encoder-decoder; subclasses add ``encode`` / ``step`` / ``forward``."""

    def __init__(self, src_embeddings: Embeddings, tgt_embeddings: Embeddings, encoder: nn.Module,
                 decoder: nn.Module, generator: Generator) -> None:
        super().__init__()
        self.src_embeddings = src_embeddings
        self.tgt_embeddings = tgt_embeddings
        self.encoder = encoder
        self.decoder = decoder
        self.generator = generator

    @property
    def output_mapping(self) -> Callable[..., Tensor]:
        """The bound output mapping ``f(logits, dim=-1, mask=None) -> probs``."""
        return self.generator.mapping

    def log_probs(self, logits: Tensor) -> Tensor:
        """logits (..., V) -> log of the output mapping's probabilities (-inf at exact zeros)."""
        return self.generator.log_probs(logits)


__all__ = ["EncoderDecoder"]
