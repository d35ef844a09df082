"""Score text pairs (source, reference) with a model: batching, detokenised records, a summary."""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch

from nmt.data.batching import collate, make_batches, shard_batches
from nmt.data.field import Field
from nmt.models.protocol import StepDecoder, check_lengths, position_limits
from nmt.translate.alignment import AlignOptions, Pair, align, pharaoh
from nmt.translate.full_context_alignment import full_context_alignment, hypothesis_alignment
from nmt.translate.scoring import BatchScores, score_batch
from nmt.translate.translator import check_batch_size, check_word_ids
from nmt.utils.device import checked_device
from nmt.utils.json_safe import json_number
from nmt.utils.packed_linear import frozen_weights
from nmt.utils.precision import check_inference_device, check_precision, inference_precision

EMPTY_SOURCE = "empty_source"
"""``reason`` of a pair whose source line is empty: it is not scored."""
NONFINITE_SCORES = "nonfinite_scores"
"""``reason`` of a pair whose model scores held NaN: it has no log-probability (the search's name)."""


@dataclass
class PairScore:
    """The score of one (source, reference) pair (``index``: 0-based line number).

    logprob: total log-probability of the reference and EOS (``-inf``: probability 0; None:
    not scored or NaN, see ``reason``: ``"empty_source"`` or ``"nonfinite_scores"``); tokens / token_logprobs: the reference tokens (EOS included)
    and their log-probabilities; zero_probability: the model gives the reference probability
    exactly 0; first_zero: where it first leaves the support, ``{"position", "token", "rank",
    "support_size", "rank_by"}`` (None when the probability is not 0).
    alignment: the reference's ``(source, target)`` pairs from the teacher-forced attention (word
    indices of the source and reference lines, or token indices; see ``nmt.translate.alignment``);
    None unless asked for (``Scorer(align=...)``) or not scored.
    decoding: the settings of the alignment (``AlignOptions.report_settings``: ``align_mode``,
    ``align_level``, ``align_threshold`` of "support"), on every pair of a run that asked for
    alignments, scored or not, as ``-report`` records them, and the ``src_tag`` put before every
    source (``Scorer(src_tag=...)``) (None: neither).
    """

    index: int
    logprob: float | None
    tokens: list[str]
    token_logprobs: list[float]
    zero_probability: bool
    first_zero: dict[str, Any] | None = None
    reason: str | None = None
    alignment: list[Pair] | None = None
    decoding: dict[str, Any] | None = None

    @property
    def n_tokens(self) -> int:
        """Reference tokens scored, EOS included."""
        return len(self.tokens)

    def report(self) -> dict[str, Any]:
        """The JSON-lines record (``-inf`` written as null: JSON has no infinity)."""
        record = {
            "id": self.index,
            "logprob": json_number(self.logprob),
            "n_tokens": self.n_tokens,
            "logprob_per_token": json_number(self.logprob / self.n_tokens) if self.logprob is not None
            and self.n_tokens else None,
            "zero_probability": self.zero_probability,
            "first_zero": self.first_zero,
            "tokens": self.tokens,
            "token_logprobs": [json_number(x) for x in self.token_logprobs],
            "reason": self.reason,
        }
        if self.alignment is not None:  # asked for: the Pharaoh pairs of the reference
            record["alignment"] = pharaoh(self.alignment)
        if self.decoding is not None:  # the settings that made the alignment
            record["decoding"] = dict(self.decoding)
        return record


class _PairIds:
    """Token ids of the scored pairs, in the layout ``make_batches``/``collate`` read."""

    def __init__(self, src: list[list[int]], tgt: list[list[int]]) -> None:
        self.src, self.tgt = src, tgt
        self.src_lengths = [len(x) for x in src]
        self.tgt_lengths = [len(x) for x in tgt]

    def __len__(self) -> int:
        return len(self.src)


class Scorer:
    """Batched teacher-forced scoring with one model or an ``Ensemble`` (``score_batch``).

    ``precision`` "bf16" or "fp16" runs the model under autocast, as ``Translator`` does, so that
    a reference scores the log-probability a search at that precision gives it (the
    log-probabilities are still accumulated in float32); "fp32" scores in IEEE float32 on a GPU too
    (:func:`nmt.utils.precision.ieee_float32`), as the search runs. ``align`` (an ``AlignOptions``;
    None: off): each scored pair also gets the alignment of its reference from the attention of the
    teacher-forced steps (``PairScore.alignment``); without it no attention is computed."""

    def __init__(self, model: StepDecoder, src_field: Field, tgt_field: Field, *, batch_size: int = 64,
                 device: str | torch.device = "cpu", precision: str = "fp32", align: AlignOptions | None = None,
                 src_tag: str | None = None) -> None:
        check_batch_size(batch_size)
        # a tag the model lacks: one line listing its tags; no tag asks nothing of the field
        self.src_prefix = [] if src_tag is None else src_field.tag_ids(src_tag)
        self.src_tag = src_tag
        if align is not None and not isinstance(align, AlignOptions):
            raise TypeError(f"align must be an AlignOptions or None, got {type(align).__name__}")
        if align is not None and align.level == "word":
            for side, field_ in (("source", src_field), ("target", tgt_field)):
                check_word_ids(field_, side)
        self.align = align
        self.model, self.src_field, self.tgt_field = model, src_field, tgt_field
        self.batch_size, self.precision = batch_size, check_precision(precision, inference=True)
        self.device = checked_device(device, "Scorer device")  # one line, not an error at the first batch
        check_inference_device(self.precision, self.device)
        self.seconds = 0.0

    def score(self, sources: Sequence[str], references: Sequence[str],
              progress: Callable[[int], None] | None = None, shard: tuple[int, int] | None = None
              ) -> list[PairScore]:
        """Scores of the pairs in input order; ``progress(n)`` after each batch of n pairs.
        ``shard``: ``(rank, ranks)``, one of several processes scoring the pairs (``nmt-translate``
        under ``torchrun``): every process cuts the same batches and scores batches ``rank, rank +
        ranks, ...`` only (pairs with an empty source: every process), the others' entries None.
        ``InputTooLong`` (before any is scored) for a pair longer than the model's learned
        positions hold (:func:`nmt.models.protocol.position_limits`)."""
        if len(sources) != len(references):
            raise ValueError(f"{len(sources)} sources but {len(references)} references")
        start = time.perf_counter()
        src = [self.src_field.encode(s) if s.strip() else [] for s in sources]
        if self.src_prefix:  # the source tag before every source with a token
            src = [self.src_prefix + ids if ids else ids for ids in src]
        # a reference is its tokens (a char tokenizer makes spaces tokens; none: the empty output)
        tgt = [self.tgt_field.encode(t) for t in references]
        source_limit, target_limit = position_limits(self.model)  # learned positions: pairs that fit, checked first
        if source_limit is not None or target_limit is not None:
            for i in (i for i, ids in enumerate(src) if ids):  # the first pair that does not fit, either side
                check_lengths({i: len(src[i])}, "source", source_limit)
                check_lengths({i: len(tgt[i])}, "target", target_limit)
        data = _PairIds(src, tgt)
        results: list[PairScore | None] = [None] * len(sources)
        for i, ids in enumerate(src):
            if not ids:
                results[i] = PairScore(i, None, [], [], False, reason=EMPTY_SOURCE)
                if progress is not None:
                    progress(1)
        vocab = self.tgt_field.vocab
        full_context = self.align is not None and full_context_alignment(self.model)
        nonempty = [i for i, ids in enumerate(src) if ids]
        # int8: the products of the packed path, which a frozen region opens, once for all batches (its
        # weights quantized once, as the translator's); fp32 scores as before, without a region
        with frozen_weights() if self.precision == "int8" else contextlib.nullcontext():
            for indices in shard_batches(make_batches(data, self.batch_size, shuffle=False, indices=nonempty),
                                         shard):
                batch = collate(data, indices, vocab.pad_index, vocab.bos_index, vocab.eos_index)
                on_device = batch.to(self.device, lengths_on_host=True)  # source lengths read on the host
                with inference_precision(self.device, self.precision):
                    scores = score_batch(self.model, on_device.src, on_device.src_lengths, on_device.tgt_in,
                                         on_device.tgt_out, on_device.tgt_lengths,
                                         need_attention=self.align is not None and not full_context)
                    if full_context:  # the references' alignments from a pass without the future mask
                        attention = hypothesis_alignment(self.model, on_device.src, on_device.src_lengths,
                                                         on_device.tgt_out.unsqueeze(1),
                                                         on_device.tgt_lengths.unsqueeze(1), vocab.bos_index)
                        scores = replace(scores, attention=attention[:, 0])
                scores = scores.cpu()
                tgt_out = batch.tgt_out.tolist()
                for row, i in enumerate(batch.indices):
                    results[i] = self._unpack(scores, row, i, tgt_out[row])
                    if self.align is not None and results[i].logprob is not None:
                        results[i].alignment = self._alignment(scores, row, sources[i], references[i], len(src[i]))
                if progress is not None:
                    progress(len(batch))
        if self.align is not None or self.src_tag is not None:  # every record says how its alignment was
            settings = dict(self.align.report_settings()) if self.align is not None else {}  # made, and its tag
            if self.src_tag is not None:
                settings["src_tag"] = self.src_tag
            for result in results:
                if result is not None:  # (another process's pair of a shard)
                    result.decoding = settings
        self.seconds += time.perf_counter() - start
        return results  # type: ignore[return-value]

    def _alignment(self, scores: BatchScores, row: int, source: str, reference: str, n_src: int) -> list[Pair]:
        """The reference's alignment pairs from its teacher-forced attention (row t: reference
        token t; the EOS row left out): word indices of the source and reference lines' pieces.
        A source tag's column is attention like any other, as the translator reads it (a piece whose
        argmax is the tag aligns to nothing; ``align``'s ``src_offset``)."""
        assert self.align is not None and scores.attention is not None
        n_tgt = int(scores.lengths[row]) - 1  # the reference's tokens, without EOS
        attention = scores.attention[row, :n_tgt, :n_src].numpy()  # the tag's column included
        tag = len(self.src_prefix)
        src_words = tgt_words = None
        if self.align.level == "word":  # the tag's place: in no word
            src_words = [None] * tag + self.src_field.tokenizer.word_ids(self.src_field.tokenize(source))
            tgt_words = self.tgt_field.tokenizer.word_ids(self.tgt_field.tokenize(reference))
        return align(attention, list(range(n_tgt)), self.align, src_words, tgt_words, src_offset=tag)

    def _unpack(self, scores: BatchScores, row: int, index: int, tgt_out: list[int]) -> PairScore:
        n = int(scores.lengths[row])
        tokens = self.tgt_field.vocab.tokens(tgt_out[:n])
        first_zero = None
        zero = bool(scores.zero[row])
        if zero:
            position = int(scores.first_zero[row])
            first_zero = {"position": position, "token": tokens[position], "rank": int(scores.zero_rank[row]),
                          "support_size": int(scores.zero_support[row]), "rank_by": scores.rank_by}
        total = float(scores.total[row])
        if math.isnan(total):  # NaN scores (a diverged model): not a probability, not -inf
            return PairScore(index, None, tokens, scores.token_logprobs[row, :n].tolist(), False,
                             reason=NONFINITE_SCORES)
        return PairScore(index, total, tokens, scores.token_logprobs[row, :n].tolist(), zero, first_zero)


@dataclass
class ScoreSummary:
    """Corpus statistics of a list of pair scores (pairs with an empty source or NaN scores are not
    scored)."""

    pairs: int
    scored: int
    zero_percent: float
    mean_logprob: float | None
    mean_token_logprob: float | None

    @classmethod
    def of(cls, scores: Sequence[PairScore]) -> "ScoreSummary":
        scored = [s for s in scores if s.logprob is not None]
        finite = [s for s in scored if not s.zero_probability]
        tokens = sum(s.n_tokens for s in finite)
        return cls(
            pairs=len(scores),
            scored=len(scored),
            zero_percent=100.0 * sum(s.zero_probability for s in scored) / max(len(scored), 1),
            mean_logprob=sum(s.logprob for s in finite) / len(finite) if finite else None,  # type: ignore[misc]
            mean_token_logprob=sum(s.logprob for s in finite) / tokens if tokens else None,  # type: ignore[misc]
        )

    def line(self) -> str:
        """One human-readable line, e.g. ``8 pairs; zero probability 12.5%; mean log-prob ...``."""
        skipped = (f" ({self.pairs - self.scored} not scored: an empty source or NaN scores)"
                   if self.pairs > self.scored else "")
        if self.mean_logprob is None:
            mean = "mean log-prob n/a (no reference of nonzero probability)"
        else:
            mean = (f"mean log-prob {self.mean_logprob:.4f} per sentence, {self.mean_token_logprob:.4f} per token "
                    f"(over references of nonzero probability)")
        return f"{self.pairs} pairs{skipped}; zero probability {self.zero_percent:.1f}%; {mean}"


__all__ = ["EMPTY_SOURCE", "NONFINITE_SCORES", "PairScore", "ScoreSummary", "Scorer"]
