"""``SearchResult``: what a beam search (or sampling) returns for a batch of sentences."""
from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from nmt.translate.certificate import reason_name


@dataclass
class SearchResult:
    """Output of ``beam_search`` for a batch of B sentences (n = n_best, T = steps run).

    tokens: (B, n, T) long, EOS included, padded with ``pad`` after it.
    lengths: (B, n) long, tokens generated including EOS (0 = no hypothesis in that slot).
    scores: (B, n) float, total log-probabilities (-inf = no hypothesis in that slot).
    ranking_scores: (B, n) float, scores / length penalty (+ coverage penalty: the order of the n-best list).
    complete: (B, n) bool, hypothesis ends with EOS (False: cut at max_length or missing).
    attention: (B, n, T, L) float source attention per generated token, or None.
    exact: (B,) bool certificate; n_nonzero: (B,) long number of complete finished
    hypotheses (all of nonzero probability); mass: (B,) float their total probability;
    reason: (B,) long code, decoded by ``reason_names`` (None when exact).
    support_size: (B, n, T) int32 number of nonzero-probability tokens at each step, or None.
    support_tokens / support_probs: (B, n, T, m) the m most probable tokens at each step and
    their probabilities (0 beyond the support), only with ``return_support``.
    coverage_penalty: (B, n) float, each hypothesis's coverage penalty (<= 0; included in
    ``ranking_scores``; 0 where no hypothesis), only with ``SearchOptions.coverage_penalty``.
    encoder_out: the model's ``encode`` of the batch (one row per sentence), for a pass over the
    outputs that needs it again (full-context alignments); None where a search did not keep it.
    """

    tokens: Tensor
    lengths: Tensor
    scores: Tensor
    ranking_scores: Tensor
    complete: Tensor
    attention: Tensor | None
    exact: Tensor
    n_nonzero: Tensor
    mass: Tensor
    reason: Tensor
    support_size: Tensor | None = None
    support_tokens: Tensor | None = None
    support_probs: Tensor | None = None
    steps: int = 0
    coverage_penalty: Tensor | None = None
    encoder_out: dict[str, Tensor] | None = field(default=None, compare=False, repr=False)

    @property
    def certified(self) -> Tensor:
        """(B,) bool, the certificate (the same tensor as ``exact``, its older name)."""
        return self.exact

    def reason_names(self) -> list[str | None]:
        """Per sentence: None when exact, else "pruned", "max_length", "not_certified",
        "nonfinite_scores", "no_hypothesis" or "sampled" (``sample=True``)."""
        return [reason_name(code) for code in self.reason.tolist()]


__all__ = ["SearchResult"]
