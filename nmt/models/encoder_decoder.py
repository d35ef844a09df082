"""What every encoder-decoder model holds: its embeddings, encoder, decoder and generator, and the
output mapping's probabilities (the RNN ``Seq2Seq`` and the ``TransformerSeq2Seq`` share it)."""
from __future__ import annotations

from typing import Callable

from torch import Tensor, nn

from nmt.models.dropout import WordDropout
from nmt.models.embeddings import Embeddings
from nmt.models.generator import Generator


PARTS = ("src_embeddings", "tgt_embeddings", "encoder", "decoder", "generator")
"""The top-level parts of every encoder-decoder (attribute names, the same in the LSTM and the
Transformer): what ``training.freeze`` may name."""


class EncoderDecoder(nn.Module):
    """The parts of an encoder-decoder; subclasses add ``encode`` / ``step`` / ``forward``.

    ``src_word_dropout`` / ``tgt_word_dropout``: whole-word dropout of each side's embedded tokens in
    training (:class:`~nmt.models.dropout.WordDropout`; ``model.embeddings.src_word_dropout`` /
    ``tgt_word_dropout``), a module of each side also where the two share one table."""

    def __init__(self, src_embeddings: Embeddings, tgt_embeddings: Embeddings, encoder: nn.Module,
                 decoder: nn.Module, generator: Generator, src_word_dropout: float = 0.0,
                 tgt_word_dropout: float = 0.0) -> None:
        super().__init__()
        self.src_embeddings = src_embeddings
        self.tgt_embeddings = tgt_embeddings
        self.encoder = encoder
        self.decoder = decoder
        self.generator = generator
        self.src_word_dropout = WordDropout(src_word_dropout)
        self.tgt_word_dropout = WordDropout(tgt_word_dropout)

    def embed_source(self, src: Tensor) -> Tensor:
        """(B, L) source ids -> (B, L, E) vectors: the embeddings (with their dropout), then whole-word dropout."""
        return self.src_word_dropout(self.src_embeddings(src))

    def embed_target(self, tgt: Tensor) -> Tensor:
        """(B, T) target ids -> (B, T, E) vectors: the embeddings (with their dropout), then whole-word dropout."""
        return self.tgt_word_dropout(self.tgt_embeddings(tgt))

    @property
    def output_mapping(self) -> Callable[..., Tensor]:
        """The bound output mapping ``f(logits, dim=-1, mask=None) -> probs``."""
        return self.generator.mapping

    def log_probs(self, logits: Tensor) -> Tensor:
        """logits (..., V) -> log of the output mapping's probabilities (-inf at exact zeros)."""
        return self.generator.log_probs(logits)

    full_context_alignment = False
    """Alignments come from the attention of the steps (the Transformer may align from a pass
    without the future mask instead: ``model.transformer.full_context_alignment``)."""

    def teacher_forced_alignment(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor,
                                 tgt_mask: Tensor | None = None, repeats: int = 1,
                                 encoder_out: dict[str, Tensor] | None = None) -> Tensor:
        """(N, T, L) the attention alignments are read from, under teacher forcing on ``tgt_in``
        (N, T) = BOS + target: ``forward``'s (what the steps give). ``repeats``: N = B x repeats
        targets, consecutive ones per source of ``src`` (B, L) (a search's n-best entries);
        ``tgt_mask`` and ``encoder_out`` (a search's encoding of ``src``) are for a pass that reads
        them (unused here: the teacher-forced pass encodes, and later positions do not reach earlier ones)."""
        if repeats != 1:
            src, src_lengths = src.repeat_interleave(repeats, dim=0), src_lengths.repeat_interleave(repeats, dim=0)
        return self(src, src_lengths, tgt_in)[1]


__all__ = ["PARTS", "EncoderDecoder"]
