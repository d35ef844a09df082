"""The Transformer encoder-decoder: teacher-forced ``forward`` and the ``StepDecoder`` protocol."""
from __future__ import annotations

import torch
from torch import Tensor

from nmt.models.encoder_decoder import EncoderDecoder
from nmt.models.protocol import AlignmentAttention, State
from nmt.models.seq2seq import length_mask
from nmt.models.transformer.decoder import KV, TransformerDecoder
from nmt.models.transformer.encoder import TransformerEncoder
from nmt.models.transformer.positions import position_limit

ATTENTION_KINDS = ("encoder_self", "decoder_self", "cross")

AttentionMaps = dict[str, list[Tensor]]
"""Per attention kind, one (B, heads, T_query, T_key) probability tensor per layer."""


class TransformerSeq2Seq(EncoderDecoder):
    """Transformer encoder-decoder (Vaswani et al. 2017) with a mapping per attention kind.

    Decoding state (flat, batch-first, so ``select_state`` / ``tile_state`` reorder it):
    ``"self.{i}.k"`` / ``"self.{i}.v"`` (N, heads, t, d_head), the self-attention keys and
    values of layer i for the t tokens fed so far (t grows by one per step). ``encoder_out``
    holds ``"memory"`` (B, L, D), ``"src_mask"`` (B, L) and ``"cross.{i}.k"`` / ``"cross.{i}.v"``
    (B, heads, L, d_head), the cross-attention keys/values computed once by :meth:`encode`.

    The attention returned by ``forward`` / ``step`` (for heatmaps, ``attention_matrices``,
    alignments and beam search's ``attention``) is the cross-attention of the decoder's alignment
    layer averaged over its alignment heads (``model.transformer.alignment_layer`` /
    ``alignment_heads``; by default the LAST layer, all heads): rows still sum to one and are zero
    wherever every head is zero (always on padding). ``forward(..., return_maps=True)`` also gives every layer's
    and head's probabilities of every kind. The probabilities nobody reads (the other maps, without
    ``return_maps`` and in ``step``) may come from a fused kernel that returns none (softmax heads
    on CUDA: :func:`nmt.models.transformer.multihead_attention.fused_attention_serves`).
    """

    attention_kinds = ATTENTION_KINDS
    attention_optional = True
    """``step(..., need_attention=False)`` returns no attention (None): the last layer's
    cross-attention may then run fused too (:func:`nmt.models.protocol.attention_optional`)."""
    shares_encoder_out = True
    """``step`` takes an ``encoder_out`` of B rows for N = B x S step rows (S consecutive rows per
    sentence): beam search keeps the cross keys/values once per sentence, not once per slot
    (:func:`nmt.models.protocol.shares_encoder_out`)."""

    encoder: TransformerEncoder
    decoder: TransformerDecoder

    def position_limits(self) -> tuple[int | None, int | None]:
        """``(source tokens, decoder inputs)`` the position encodings hold; None: any length
        (sinusoids). See :func:`nmt.models.protocol.position_limits`."""
        return position_limit(self.encoder.positions), position_limit(self.decoder.positions)

    @property
    def alignment_attention(self) -> AlignmentAttention:
        """The cross-attention heads that give alignments (``-report_align``) and that guided
        alignment training supervises: the first ``alignment_heads`` of decoder layer
        ``alignment_index`` (:class:`~nmt.models.protocol.AlignmentAttention`)."""
        mapping = self.decoder.layers[self.decoder.alignment_index].cross_attn
        return AlignmentAttention(mapping.mapping.name, dict(mapping.mapping.params), self.decoder.alignment_heads,
                                  mapping.continuous is not None, mapping.mapping.learned_alpha)

    @property
    def full_context_alignment(self) -> bool:
        """Alignments come from a pass without the future mask (``model.transformer.full_context_alignment``):
        guided alignment supervises it, and the alignments of a search come from
        :meth:`teacher_forced_alignment` of its outputs, not from its steps' attention."""
        return self.decoder.full_context_alignment

    def teacher_forced_alignment(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor,
                                 tgt_mask: Tensor | None = None, repeats: int = 1,
                                 encoder_out: State | None = None) -> Tensor:
        """(N, T, L) the alignment heads' mean cross-attention under teacher forcing on ``tgt_in``
        (N, T) = BOS + target: with :attr:`full_context_alignment` from the pass without the future
        mask, whose self-attentions see the target positions ``tgt_mask`` (N, T) bool marks (None:
        those that are not padding), else ``forward``'s (:class:`EncoderDecoder`'s). ``repeats``:
        N = B x repeats targets, ``repeats`` consecutive ones per source of ``src`` (B, L) (a
        search's n-best entries: each source encoded once). ``encoder_out``: :meth:`encode`'s output for ``src`` (one row per
        source), reused instead of encoding again (a search's). Rows of positions outside ``tgt_mask``
        are computed but mean nothing."""
        if not self.full_context_alignment:
            return super().teacher_forced_alignment(src, src_lengths, tgt_in, tgt_mask, repeats, encoder_out)
        if encoder_out is not None:
            mask, cross_kv = encoder_out["src_mask"], self._cross(encoder_out)
        else:
            mask = length_mask(src_lengths, src.size(1), src.device)
            memory, _, packed = self.encoder.encode(self.embed_source(src), mask, need_maps=False)
            cross_kv = self.decoder.cross_keys_values(memory, packed)
        if repeats != 1:
            cross_kv = [(k.repeat_interleave(repeats, dim=0), v.repeat_interleave(repeats, dim=0)) for k, v in cross_kv]
            mask = mask.repeat_interleave(repeats, dim=0)
        tgt_mask = tgt_in != self.tgt_embeddings.pad_index if tgt_mask is None else tgt_mask
        cross = self.decoder.full_context_cross(self.embed_target(tgt_in), cross_kv, mask, tgt_mask)
        return self.decoder.alignment_attention(cross)

    def alignment_alpha(self) -> Tensor | None:
        """(alignment_heads,) the learned alphas of the alignment heads (with their gradient: what
        guided alignment's loss takes at a learned alpha), or None where those heads' alpha is fixed."""
        mapping = self.decoder.layers[self.decoder.alignment_index].cross_attn.mapping
        alpha = mapping.alpha()
        return None if alpha is None else alpha[:self.decoder.alignment_heads]

    def learned_alphas(self) -> dict[str, Tensor]:
        """Per attention kind with a learned alpha: (layers, heads) alphas in (1, 2] (detached)."""
        out = {}
        for kind, modules in (("encoder_self", [l.self_attn for l in self.encoder.layers]),
                              ("decoder_self", [l.self_attn for l in self.decoder.layers]),
                              ("cross", [l.cross_attn for l in self.decoder.layers])):
            if modules[0].mapping.learned_alpha:
                out[kind] = torch.stack([m.mapping.alpha().detach() for m in modules])
        return out

    # ---- StepDecoder ------------------------------------------------------------------
    def encode(self, src: Tensor, src_lengths: Tensor) -> tuple[State, State]:
        """src: (B, L) ids; src_lengths: (B,). Returns encoder_out and the empty caches (t = 0)."""
        mask = length_mask(src_lengths, src.size(1), src.device)
        memory, _, packed = self.encoder.encode(self.embed_source(src), mask, need_maps=False)
        encoder_out: State = {"memory": memory, "src_mask": mask, **self.generator.copy_source(memory, src, mask)}
        state: State = {}
        for i, (keys, values) in enumerate(self.decoder.cross_keys_values(memory, packed)):
            encoder_out[f"cross.{i}.k"], encoder_out[f"cross.{i}.v"] = keys, values
            empty = keys.new_zeros(keys.size(0), keys.size(1), 0, keys.size(3))
            state[f"self.{i}.k"], state[f"self.{i}.v"] = empty, empty
        return encoder_out, state

    def _cross(self, encoder_out: State) -> list[KV]:
        return [(encoder_out[f"cross.{i}.k"], encoder_out[f"cross.{i}.v"]) for i in range(len(self.decoder.layers))]

    def step(self, tokens: Tensor, state: State, encoder_out: State,
             need_attention: bool = True) -> tuple[Tensor, Tensor | None, State]:
        """tokens: (N,) previous ids; state: N rows; encoder_out: N rows, or B rows with N = B x S
        (S consecutive step rows per sentence). Returns log_probs (N, V), attention (N, L) (None
        with ``need_attention=False``), the extended caches."""
        _, log_probs, attention, new_state = self.step_with_scores(tokens, state, encoder_out, need_attention)
        return log_probs, attention, new_state

    def step_with_scores(self, tokens: Tensor, state: State, encoder_out: State,
                         need_attention: bool = True) -> tuple[Tensor, Tensor, Tensor | None, State]:
        """``step`` that also returns the raw output scores: (logits (N, V), log_probs (N, V),
        attention (N, L) or None, caches); scoring ranks tokens outside the support by the logits."""
        hidden, attention, new_state = self.step_hidden(tokens, state, encoder_out, need_attention)
        scores, log_probs = self.generator.step_outputs(hidden, encoder_out)
        return scores, log_probs, attention, new_state

    def step_hidden(self, tokens: Tensor, state: State, encoder_out: State,
                    need_attention: bool = True) -> tuple[Tensor, Tensor | None, State]:
        """The decoder's part of a step: (output (N, d_model) the generator reads, attention (N, L)
        or None, the extended caches), shapes as :meth:`step`."""
        caches = [(state[f"self.{i}.k"], state[f"self.{i}.v"]) for i in range(len(self.decoder.layers))]
        out = self.decoder(self.tgt_embeddings(tokens.unsqueeze(1)), self._cross(encoder_out),
                           encoder_out["src_mask"], caches, need_maps=False, need_attention=need_attention)
        new_state: State = {}
        for i, (keys, values) in enumerate(out.caches):
            new_state[f"self.{i}.k"], new_state[f"self.{i}.v"] = keys, values
        attention = self.decoder.alignment_attention(out.cross_maps)[:, 0] if need_attention else None
        return out.hidden[:, 0], attention, new_state

    # ---- teacher forcing --------------------------------------------------------------
    def forward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor, return_maps: bool = False,
                src_mask: Tensor | None = None,
                alignment_scores: bool = False) -> tuple[Tensor, Tensor] | tuple[Tensor, Tensor, AttentionMaps]:
        """Teacher forcing. src: (B, L); src_lengths: (B,); tgt_in: (B, T) = BOS + y; ``src_mask``:
        (B, L) bool, the lengths' :func:`length_mask` where the caller made it (see
        :meth:`nmt.models.seq2seq.Seq2Seq.forward`).

        Returns ``(logits (B, T, V), attention (B, T, L))`` -- raw scores before the output
        mapping, and the alignment layer's head-averaged cross-attention (the last layer's, all
        heads, unless ``model.transformer.alignment_layer`` / ``alignment_heads`` say otherwise) --
        plus, with ``return_maps``, the :data:`AttentionMaps` of every kind, layer and head.
        ``alignment_scores`` (not with ``return_maps``): the second value is the scores of the
        alignment heads before their mapping instead, (B, alignment_heads, T, L), ``-inf`` on
        padding (guided alignment training; :attr:`alignment_attention`); with
        :attr:`full_context_alignment` those of a second pass without the future mask.
        """
        mask = length_mask(src_lengths, src.size(1), src.device) if src_mask is None else src_mask
        memory, encoder_maps, packed = self.encoder.encode(self.embed_source(src), mask, need_maps=return_maps)
        if alignment_scores and return_maps:
            raise ValueError("alignment_scores and return_maps are exclusive")
        emb, cross_kv = self.embed_target(tgt_in), self.decoder.cross_keys_values(memory, packed)
        full_context = alignment_scores and self.full_context_alignment
        out = self.decoder(emb, cross_kv, mask, need_maps=return_maps, need_attention=not full_context,
                           alignment_scores=alignment_scores and not full_context)
        logits = self.generator.output_scores(out.hidden, self.generator.copy_source(memory, src, mask))
        if full_context:  # the scores of a second pass without the future mask (its own dropout draws)
            cross = self.decoder.full_context_cross(emb, cross_kv, mask, tgt_in != self.tgt_embeddings.pad_index,
                                                    scores=True)
            return logits, cross[:, :self.decoder.alignment_heads]
        if alignment_scores:
            return logits, out.cross_maps[self.decoder.alignment_index][:, :self.decoder.alignment_heads]
        attention = self.decoder.alignment_attention(out.cross_maps)
        if return_maps:
            return logits, attention, {"encoder_self": encoder_maps, "decoder_self": out.self_maps,
                                       "cross": out.cross_maps}
        return logits, attention


__all__ = ["ATTENTION_KINDS", "AttentionMaps", "TransformerSeq2Seq"]
