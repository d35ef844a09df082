"""Corpus-level evaluation metrics on detokenized strings: exact match, BLEU, chrF."""
from __future__ import annotations

from typing import Sequence


def _check_lengths(hypotheses: Sequence[str], references: Sequence[str]) -> None:
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")


def exact_match(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Percentage (0-100) of hypotheses equal to their reference (after stripping outer whitespace)."""
    _check_lengths(hypotheses, references)
    if not references:
        return 0.0
    hits = sum(h.strip() == r.strip() for h, r in zip(hypotheses, references))
    return 100.0 * hits / len(references)


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus BLEU (sacrebleu defaults: 13a tokenization, 4-grams), 0-100."""
    import sacrebleu

    _check_lengths(hypotheses, references)
    return float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score)


def chrf(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus chrF (sacrebleu defaults), 0-100."""
    import sacrebleu

    _check_lengths(hypotheses, references)
    return float(sacrebleu.corpus_chrf(list(hypotheses), [list(references)]).score)


__all__ = ["exact_match", "bleu", "chrf"]
