"""The alignment error rate of a model's alignment attention on reference-aligned validation pairs
(``data.valid.align``; Och & Ney 2003).

Under teacher forcing on the reference, every target word's tokens each take their most attended
source token (the alignment heads' mean, what ``nmt-translate -report_align`` reads); their words
make the predicted pairs ``A``, as ``-align_level word`` groups them. With every reference link sure
(fast_align / eflomal files have no possible links)::

    AER = 1 - 2 |A & S| / (|A| + |S|)     summed over the pairs (S: the reference's word pairs)

0 is perfect. Host work after one teacher-forced forward per batch; run on the validated weights.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn

from nmt.data.batching import collate
from nmt.data.word_alignments import TrainingAlignments, pieces_of
from nmt.train.validation import eval_mode
from nmt.translate.alignment import AlignOptions, align


def alignment_error_rate(predicted: Iterable[set[tuple[int, int]]], reference: Iterable[set[tuple[int, int]]]) -> float:
    """``1 - 2 sum |A & S| / (sum |A| + sum |S|)`` over paired sets of (source, target) word pairs
    (all links sure); NaN when both are empty everywhere."""
    hits = total = 0
    for a, s in zip(predicted, reference):
        hits += len(a & s)
        total += len(a) + len(s)
    return 1.0 - 2.0 * hits / total if total else float("nan")


def predicted_word_pairs(attention: torch.Tensor, src_words: Sequence[int | None],
                         tgt_words: Sequence[int | None]) -> set[tuple[int, int]]:
    """attention: (T, L) rows of the target tokens (T >= len(tgt_words)); each token of a word takes
    its most attended source token, whose word (if any) it is aligned to: ``-report_align``'s
    argmax word pairs (:func:`nmt.translate.alignment.align`)."""
    matrix = attention[: len(tgt_words), : len(src_words)].numpy()
    return set(align(matrix, range(len(tgt_words)), AlignOptions(), src_words, tgt_words))


def validation_aer(model: nn.Module, dataset, alignments: TrainingAlignments, src_field, tgt_field, pad: int,
                   bos: int, eos: int, device: torch.device, batch_size: int = 64) -> float:
    """The AER of ``model`` (the caller's weights, put in eval mode and restored after) on the pairs
    of ``dataset`` (a validation :class:`~nmt.data.dataset.ParallelDataset`) that have a mappable
    reference in ``alignments`` (its ``words``; a pair whose tokenization changes a word count is
    left out)."""
    rows = [k for k, line in enumerate(dataset.line_numbers) if int(line) in alignments.by_line]
    predicted, reference = [], []
    with torch.no_grad(), eval_mode(model):
        for start in range(0, len(rows), batch_size):
            part = rows[start:start + batch_size]
            batch = collate(dataset, part, pad, bos, eos)
            # the attention alignments are read from (a full-context pass where the model aligns from one)
            attention = model.teacher_forced_alignment(batch.src.to(device), batch.src_lengths, batch.tgt_in.to(device))
            attention = attention.float().cpu()
            for b, k in enumerate(part):
                entry = alignments.words[int(dataset.line_numbers[k])]
                # a source tag's positions are no word's
                src = [None] * entry.offset + src_field.tokenizer.word_ids(pieces_of(dataset.src[k][entry.offset:],
                                                                                     src_field))
                tgt = tgt_field.tokenizer.word_ids(pieces_of(dataset.tgt[k], tgt_field))
                predicted.append(predicted_word_pairs(attention[b], src, tgt))
                reference.append(set(entry.pairs))
    return alignment_error_rate(predicted, reference)


__all__ = ["alignment_error_rate", "predicted_word_pairs", "validation_aer"]
