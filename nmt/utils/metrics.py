"""Corpus-level evaluation metrics on detokenized strings: exact match, BLEU, chrF, TER."""
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


def ter(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus TER (sacrebleu defaults: tercom tokenization, case-insensitive), 0-100+ (lower is
    better; above 100 when the hypotheses need more edits than the references have words)."""
    return ter_with_signature(hypotheses, references)[0]


def _scored(metric, hypotheses: Sequence[str], references: Sequence[str]) -> tuple[float, str]:
    _check_lengths(hypotheses, references)
    score = float(metric.corpus_score(list(hypotheses), [list(references)]).score)
    return score, str(metric.get_signature())


def bleu_with_signature(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[float, str]:
    """``(bleu, signature)``: the score and sacrebleu's signature of its settings, e.g.
    ``nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0``."""
    from sacrebleu.metrics import BLEU

    return _scored(BLEU(), hypotheses, references)


def chrf_with_signature(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[float, str]:
    """``(chrf, signature)`` as ``bleu_with_signature``."""
    from sacrebleu.metrics import CHRF

    return _scored(CHRF(), hypotheses, references)


def ter_with_signature(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[float, str]:
    """``(ter, signature)`` as ``bleu_with_signature``, e.g.
    ``nrefs:1|case:lc|tok:tercom|norm:no|punct:yes|asian:no|version:2.6.0``."""
    from sacrebleu.metrics import TER

    return _scored(TER(), hypotheses, references)


def metrics_line(hypotheses: Sequence[str], references: Sequence[str]) -> str:
    """One line: BLEU, chrF and TER, each with its sacrebleu signature, and exact-match accuracy."""
    if not hypotheses and not references:  # sacrebleu refuses an empty corpus
        return "BLEU n/a; chrF n/a; TER n/a; exact match n/a (no sentences)"
    bleu_score, bleu_sig = bleu_with_signature(hypotheses, references)
    chrf_score, chrf_sig = chrf_with_signature(hypotheses, references)
    ter_score, ter_sig = ter_with_signature(hypotheses, references)
    return (f"BLEU {bleu_score:.2f} ({bleu_sig}); chrF {chrf_score:.2f} ({chrf_sig}); TER {ter_score:.2f} ({ter_sig}); "
            f"exact match {exact_match(hypotheses, references):.2f}%")


__all__ = ["exact_match", "bleu", "bleu_with_signature", "chrf", "chrf_with_signature", "metrics_line", "ter",
           "ter_with_signature"]
