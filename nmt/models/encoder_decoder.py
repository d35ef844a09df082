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

    @property
    def copies(self) -> bool:
        """Whether the output copies source tokens (``model.output.copy``): teacher-forced scores
        are then (..., V + L) and the loss takes :meth:`output_target`."""
        return self.generator.copy is not None

    def copy_ids(self, src: Tensor, src_mask: Tensor) -> dict[str, Tensor]:
        """``{"copy_ids": (B, L)}`` of the source ids ``src`` (B, L) and their mask (B, L) where the
        output copies (:meth:`CopyAttention.ids`), else ``{}``."""
        copy = self.generator.copy
        return {} if copy is None else {"copy_ids": copy.ids(src, src_mask)}

    def output_probs(self, scores: Tensor, src: Tensor, src_mask: Tensor) -> Tensor:
        """The token distribution (B, T, V) of teacher-forced ``scores`` (``forward``'s first value):
        the output mapping's, or the marginal of the joint one where the output copies."""
        return self.generator.output_probs(scores, self.copy_ids(src, src_mask))

    def output_target(self, scores: Tensor, target: Tensor, src: Tensor, src_mask: Tensor) -> Tensor:
        """The target the Fenchel-Young loss of teacher-forced ``scores`` takes: ``target`` (B, T)
        itself, or where the output copies a distribution (B, T, V + L) over the target tokens'
        correct parts (:meth:`nmt.models.generator.Generator.output_target`; padding rows are the
        caller's to ignore)."""
        return self.generator.output_target(scores, target, self.copy_ids(src, src_mask))

    def copy_tempered_step(self, tokens: Tensor, state: dict[str, Tensor], encoder_out: dict[str, Tensor],
                           temperature: float, need_attention: bool = True
                           ) -> tuple[Tensor, Tensor, Tensor | None, dict[str, Tensor]]:
        """A step of a copying model for sampling at ``temperature`` T (what
        :func:`nmt.translate.sample_distribution.tempered_step` asks of one): ``(log_probs (N, V),
        tempered (N, V), attention, state)``, the marginal's log-probabilities at T = 1 and of the
        joint scores divided by T (the copies tempered with the vocabulary: tokens' largest scores
        divided alone would not give the marginal's)."""
        hidden, attention, state = self.step_hidden(tokens, state, encoder_out, need_attention)
        log_probs, tempered = self.generator.copy_log_probs(hidden, encoder_out, temperature)
        return log_probs, tempered, attention, state

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
