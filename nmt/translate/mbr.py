"""Minimum Bayes risk (MBR) decoding: rank a sentence's candidates by their expected utility.

The candidates of a sentence are the outputs its search found (``SearchOptions.mbr``): with beam
search every finished hypothesis that ends with EOS (``beam_search`` then returns all of them, not
only the ``n_best`` first) where the search is certified, else the first ``beam_size`` of them in
the search's order (:func:`candidate_mask`), with ``sample`` its samples. The expected utility of candidate h is

    E[u(h)] = sum_r w(r) u(h, r)

over the candidates r, where u is a sentence-level utility of the detokenized texts (sacrebleu's
chrF or BLEU, scaled to [0, 1], or exact match) and w(r) a weight: for beam search the model's
probability of r (``exp`` of its log-probability, no length or coverage penalty), renormalised over
the candidates; for samples 1/N each (Eikema & Aziz, 2020: the samples are the pseudo-references of
an unbiased Monte Carlo estimate, a sample drawn twice counts twice). The MBR decision is the
candidate of highest expected utility (ties: the search's order, or the sample order).

Hypotheses cut by the length limit (no EOS) and samples without a hypothesis are no candidates:
they are not outputs of the model, only prefixes of them; the probability of their continuations is
not in the candidates' mass, so such a sentence is never exact.

A sentence's MBR decision is **exact** (the MBR decision of the model's own distribution, with no
sampling or truncation error) when its search is certified (every output of nonzero probability is
a finished hypothesis, none was cut) and the candidates' mass is 1 up to rounding
(:data:`MASS_TOLERANCE`): hard constraints (``min_length``, ``block_ngram_repeat``,
``ban_unk_token``, a forced prefix, lexical constraints) certify the support of the constrained
problem, and where they removed outputs of nonzero probability the mass falls short of 1: the
decision is then the exact MBR decision of the model's distribution conditioned on the constraints,
not of the model's own, and is not called exact.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Sequence

MBR_UTILITIES = ("chrf", "bleu", "exact_match")
"""The utilities of ``SearchOptions.mbr`` (``"none"``: no MBR)."""
MBR_CHOICES = ("none",) + MBR_UTILITIES
MASS_TOLERANCE = 1e-4
"""A certified sentence's candidates cover the distribution when their mass is within this of 1
(the float32 rounding of a sum of products of per-step probabilities)."""

Utility = Callable[[str, str], float]


def candidate_mask(cut: Sequence[bool], missing: Sequence[bool], certified: bool, limit: int) -> list[bool]:
    """Which of a sentence's hypotheses (in the search's order) are MBR candidates: those neither
    cut by the length limit nor missing; where the search is not ``certified`` only the first
    ``limit`` of them (``beam_size``: the n-best list that MBR reranks, as in Marian's and fairseq
    users' n-best MBR; not ``n_best``, so the candidates do not depend on how many lines are written). An uncertified search returns every finished hypothesis of its
    history, up to (T + 1) x K of them (with a softmax output EOS has nonzero probability at every
    step), and the utilities cost O(n^2) sentence scores: hundreds of candidates would take seconds
    a sentence, for a decision that is not exact anyway. A certified sentence keeps them all (its
    exactness needs the whole support); samples are certified here (all kept)."""
    usable = [not c and not m for c, m in zip(cut, missing)]
    if certified:
        return usable
    kept = 0
    for n, ok in enumerate(usable):
        if ok:
            usable[n] = kept < limit
            kept += 1
    return usable


def check_mbr(value: Any) -> None:
    """ValueError (one line, the valid names) unless ``value`` is one of :data:`MBR_CHOICES`."""
    if value not in MBR_CHOICES:
        raise ValueError(f"mbr must be one of {', '.join(MBR_CHOICES)}, got {value!r}")


@lru_cache(maxsize=None)
def utility_function(name: str) -> Utility:
    """The utility ``u(hypothesis, reference)`` in [0, 1] of ``name``: sacrebleu's sentence chrF
    (``CHRF().sentence_score``) or BLEU (``BLEU(effective_order=True).sentence_score``, as
    ``sacrebleu.sentence_bleu``) divided by 100, or exact match (1.0 for equal texts, else 0.0).
    One function per name, made once (its metric object is reused)."""
    if name == "exact_match":
        return lambda hyp, ref: float(hyp == ref)
    if name not in MBR_UTILITIES:
        raise ValueError(f"mbr utility must be one of {', '.join(MBR_UTILITIES)}, got {name!r}")
    from sacrebleu.metrics import BLEU, CHRF  # heavy: imported when used

    metric = CHRF() if name == "chrf" else BLEU(effective_order=True)
    return lambda hyp, ref: metric.sentence_score(hyp, [ref]).score / 100.0


def utility_matrix(texts: Sequence[str], utility: Utility) -> list[list[float]]:
    """(n, n) nested lists: entry [h][r] = ``utility(texts[h], texts[r])``, computed once per
    distinct pair of texts (n^2 calls at most)."""
    distinct = list(dict.fromkeys(texts))
    where = {text: i for i, text in enumerate(distinct)}
    table = [[utility(h, r) for r in distinct] for h in distinct]
    return [[table[where[h]][where[r]] for r in texts] for h in texts]


def candidate_weights(logprobs: Sequence[float], sampled: bool) -> list[float]:
    """The weight of each candidate as a pseudo-reference: 1/n for samples; else its probability
    ``exp(logprob)`` renormalised over the candidates (a log-sum-exp in float64)."""
    n = len(logprobs)
    if sampled:
        return [1.0 / n] * n
    top = max(logprobs)
    total = sum(math.exp(lp - top) for lp in logprobs)
    return [math.exp(lp - top) / total for lp in logprobs]


def expected_utilities(texts: Sequence[str], weights: Sequence[float], utility: Utility) -> list[float]:
    """Per candidate h, ``sum_r weights[r] * utility(texts[h], texts[r])`` (r over the candidates)."""
    matrix = utility_matrix(texts, utility)
    return [math.fsum(w * u for w, u in zip(weights, row)) for row in matrix]


@dataclass(frozen=True)
class MbrDecision:
    """The MBR decision of one sentence.

    utility: "chrf", "bleu" or "exact_match"; expected: the expected utility of the chosen output
    (None: no candidate, the output is the search's); exact: the decision is the model's exact
    MBR decision (see the module); candidates: how many outputs it chose among; mass: the
    candidates' total probability (None for samples)."""

    utility: str
    expected: float | None
    exact: bool
    candidates: int
    mass: float | None = None

    def report(self) -> dict[str, Any]:
        """The ``"mbr"`` object of the ``-report`` record."""
        return {"utility": self.utility, "expected": self.expected, "exact": self.exact,
                "candidates": self.candidates}


def mbr_order(texts: Sequence[str], logprobs: Sequence[float], usable: Sequence[bool], utility: str,
              sampled: bool) -> tuple[list[int], list[float | None]]:
    """The MBR ranking of one sentence's entries (hypotheses or samples, in the search's order).

    ``usable[i]``: entry i is a candidate (finished with EOS: not cut, not missing). Returns the
    entries' indices in their new order (the candidates by expected utility, highest first, ties
    in the given order; then the other entries in the given order) and, per entry in that new
    order, its expected utility (None for an entry that is no candidate)."""
    candidates = [i for i, ok in enumerate(usable) if ok]
    others = [i for i, ok in enumerate(usable) if not ok]
    if not candidates:
        return others, [None] * len(others)
    weights = candidate_weights([logprobs[i] for i in candidates], sampled)
    expected = expected_utilities([texts[i] for i in candidates], weights, utility_function(utility))
    ranked = sorted(range(len(candidates)), key=lambda j: -expected[j])  # stable: ties keep the order
    return ([candidates[j] for j in ranked] + others,
            [expected[j] for j in ranked] + [None] * len(others))


def mbr_ranking(texts: Sequence[str], logprobs: Sequence[float], cut: Sequence[bool], missing: Sequence[bool],
                certified: bool, limit: int, utility: str, sampled: bool) -> tuple[list[int], list[float | None], int]:
    """A sentence's entries (in the search's order) in MBR order: :func:`candidate_mask`'s candidates
    (``cut`` / ``missing`` per entry, ``certified``, ``limit``) ranked by :func:`mbr_order`. Returns
    ``(order, expected utilities in that order, how many candidates)``; what ``nmt-translate -mbr``
    and the validation decode (``validation.mbr``) both choose by."""
    usable = candidate_mask(cut, missing, certified, limit)
    order, expected = mbr_order(texts, logprobs, usable, utility, sampled)
    return order, expected, sum(usable)


def is_exact(certified: bool, mass: float, candidates: int, n_nonzero: int) -> bool:
    """A sentence's MBR decision is the model's exact one: its search is certified, every
    nonzero-probability output found is a candidate, and their mass is 1 up to
    :data:`MASS_TOLERANCE`."""
    return bool(certified and candidates == n_nonzero > 0 and abs(mass - 1.0) <= MASS_TOLERANCE)


__all__ = ["MASS_TOLERANCE", "MBR_CHOICES", "MBR_UTILITIES", "MbrDecision", "candidate_mask", "candidate_weights", "check_mbr",
           "expected_utilities", "is_exact", "mbr_order", "mbr_ranking", "utility_function", "utility_matrix"]
