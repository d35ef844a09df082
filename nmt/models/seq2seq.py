"""The attentional encoder-decoder: teacher-forced ``forward`` and the ``StepDecoder`` protocol."""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from nmt.models import packed_decoder_step
from nmt.models.decoder import InputFeedingDecoder
from nmt.models.encoder import RNNEncoder
from nmt.models.encoder_decoder import EncoderDecoder
from nmt.models.protocol import AlignmentAttention, State
from nmt.utils.device import host_to_device


def length_mask(lengths: Tensor, max_len: int, device: torch.device) -> Tensor:
    """lengths: (B,) -> (B, max_len) bool, True at real tokens."""
    return torch.arange(max_len, device=device).unsqueeze(0) < host_to_device(lengths, device).unsqueeze(1)


class Seq2Seq(EncoderDecoder):
    """RNN encoder-decoder with global attention (Luong et al. 2015; Peters et al. 2019).

    ``forward`` runs teacher forcing for training; ``encode`` / ``step`` implement
    :class:`nmt.models.protocol.StepDecoder` for search. Build one with
    :func:`nmt.models.build_model`.
    """

    encoder: RNNEncoder
    decoder: InputFeedingDecoder
    shares_encoder_out = True
    """``step`` takes an ``encoder_out`` of B rows for N = B x S step rows (S consecutive rows per
    sentence): beam search keeps it once per sentence, not once per slot
    (:func:`nmt.models.protocol.shares_encoder_out`)."""

    @property
    def attention_mapping(self) -> Callable[..., Tensor]:
        """The bound attention mapping ``f(scores, dim=-1, mask=None) -> probs``."""
        return self.decoder.attention.mapping

    def encode(self, src: Tensor, src_lengths: Tensor, src_mask: Tensor | None = None) -> tuple[State, State]:
        """src: (B, L) ids; src_lengths: (B,); ``src_mask``: :func:`length_mask` of them when the
        caller made it already (training makes it before a compiled step: see ``forward``).

        Returns ``encoder_out`` = {"memory" (B, L, H), "src_mask" (B, L) bool,
        "keys" (B, L, K) the memory-side attention projection, with ``model.output.copy``
        "copy_keys" (B, L, H) and "copy_ids" (B, L)} and the initial decoder
        state {"h", ["c"] (B, layers, H), ["input_feed"] (B, H), with ``model.attention.coverage``
        "coverage" (B, L) zeros}.
        """
        embeddings = self.src_embeddings
        # in eval mode the embeddings are their table's rows: the encoder may compute per token
        lookup = None if embeddings.training else (src, embeddings.weight)
        memory, final = self.encoder(self.embed_source(src), src_lengths, lookup, src_mask)
        mask = length_mask(src_lengths, src.size(1), src.device) if src_mask is None else src_mask
        encoder_out = {"memory": memory, "src_mask": mask, "keys": self.decoder.attention.keys(memory),
                       **self.generator.copy_source(memory, src, mask)}
        return encoder_out, self.decoder.with_coverage(self.decoder.init_state(final), mask)

    def step(self, tokens: Tensor, state: State, encoder_out: State) -> tuple[Tensor, Tensor, State]:
        """tokens: (N,) previous ids; state: N rows; encoder_out: N rows, or B rows with N = B x S
        (S consecutive step rows per sentence). Returns log_probs (N, V), attention (N, L), new state."""
        _, log_probs, attention, state = self.step_with_scores(tokens, state, encoder_out)
        return log_probs, attention, state

    def step_with_scores(self, tokens: Tensor, state: State,
                         encoder_out: State) -> tuple[Tensor, Tensor, Tensor, State]:
        """``step`` that also returns the raw output scores: (logits (N, V), log_probs (N, V),
        attention (N, L), new state); scoring ranks tokens outside the support by the logits (with
        copying: each token's largest joint score)."""
        served = packed_decoder_step.model_step(self, tokens, state, encoder_out)  # CPU inference, LSTM
        if served is not None:
            return served
        out, attention, state = self.step_hidden(tokens, state, encoder_out)
        scores, log_probs = self.generator.step_outputs(out, encoder_out)
        return scores, log_probs, attention, state

    def step_hidden(self, tokens: Tensor, state: State, encoder_out: State,
                    need_attention: bool = True) -> tuple[Tensor, Tensor, State]:
        """The decoder's part of a step: (output (N, H) the generator reads, attention (N, L), new
        state), shapes as :meth:`step` (``need_attention``: for the protocol; the LSTM's attention
        is always computed)."""
        return self.decoder.step(
            self.tgt_embeddings(tokens), state, encoder_out["memory"], encoder_out["src_mask"], encoder_out["keys"]
        )

    @property
    def alignment_attention(self) -> AlignmentAttention:
        """The attention whose probabilities give alignments (``-report_align``) and that guided
        alignment training supervises: the decoder's one attention (one head)."""
        attention = self.decoder.attention
        return AlignmentAttention(attention.mapping_name, dict(attention.mapping_params), 1,
                                  attention.continuous is not None)

    def forward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor,
                src_mask: Tensor | None = None, alignment_scores: bool = False) -> tuple[Tensor, Tensor]:
        """Teacher forcing. src: (B, L); src_lengths: (B,); tgt_in: (B, T) = BOS + y;
        ``src_mask``: (B, L) bool, :func:`length_mask` of the lengths, where the caller made it
        (training does, outside its compiled step: with host lengths a graph would copy them to
        the device itself, with a sync, and a graph with a host input is not captured).

        Returns ``(logits (B, T, V), attention (B, T, L))``; the logits are raw scores
        before the output mapping (what the Fenchel-Young loss takes; with ``model.output.copy``
        the joint scores (B, T, V + L) of :meth:`nmt.models.generator.Generator.output_scores`). ``alignment_scores``: the
        second value is the attention's scores before its mapping instead, (B, 1, T, L), ``-inf``
        on padding (:attr:`alignment_attention`'s one head; guided alignment training).
        """
        encoder_out, state = self.encode(src, src_lengths, src_mask)
        out, attention = self.decoder(
            self.embed_target(tgt_in), state, encoder_out["memory"], encoder_out["src_mask"], encoder_out["keys"],
            alignment_scores,
        )
        scores = self.generator.output_scores(out, encoder_out)
        return scores, attention.unsqueeze(1) if alignment_scores else attention
