"""``SearchOptions``: every option of beam search, its default and its checks, in one place.

``beam_search``, ``Translator``, ``nmt-translate`` (its flag defaults are these defaults),
validation during training and ``tools/bench_translate.py`` all pass a ``SearchOptions``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import Tensor

from nmt.translate.coverage_penalty import COVERAGE_EPSILON, COVERAGE_PENALTIES
from nmt.translate.length_penalty import LENGTH_PENALTIES
from nmt.translate.mbr import check_mbr

SEARCH_MODES = ("auto", "dynamic", "static")


@dataclass(frozen=True)
class SearchOptions:
    """Options of one beam search (checked on construction: ValueError naming the field).

    beam_size: hypotheses kept per step (1 = greedy).
    n_best: hypotheses returned per sentence; may exceed ``beam_size``, since finished
        hypotheses are never discarded (an exact search returns its whole support).
    max_length / min_length: at most / at least this many tokens before EOS.
    max_length_ratio / max_length_offset: with a ratio > 0, sentence b also stops at
        ``floor(max_length_ratio * src_length_b) + max_length_offset`` tokens before EOS (kept
        within [min_length, max_length]; src_length_b counts the source's tokens, which carry no
        BOS/EOS): OpenNMT-py's ``-max_length_ratio`` (default 1.25 there, with an offset of 5
        on the batch's longest source), per sentence here so that a sentence's output never
        depends on its batch. Hypotheses cut by that limit count as cut by ``max_length`` (the
        certificate's reason "max_length"). 0 (the default): ``max_length`` alone.
    length_penalty / length_alpha: ranking of finished hypotheses ("none", "average" or
        "gnmt" with ``length_alpha``), see ``nmt.translate.length_penalty``.
    coverage_penalty / beta / coverage_epsilon / stepwise_penalty: OpenNMT-py's
        ``-coverage_penalty {none,wu,summary} -beta B -stepwise_penalty``
        (``nmt.translate.coverage_penalty``): a finished hypothesis ranks by
        ``score / lp(n) + cp``, cp <= 0 the penalty of its attention's coverage of the source
        (beta >= 0 scales it; 0: no effect); ``coverage_epsilon`` in (0, 1] floors wu's coverage,
        so that a source token sparse attention never looked at costs ``beta * log(epsilon)``
        instead of -inf. ``stepwise_penalty``: the beam also keeps, at every step t, the
        candidates of best ``log p(prefix) / lp(t + 1) + cp(prefix's coverage)`` (the ranking
        they would have if they ended there) instead of the best log-probabilities; the final
        ranking is the same. Certificates stay exact (a certified sentence's whole support is
        enumerated, and each output is ranked by its own exact penalty). Refused with ``sample``
        (samples are not ranked); needs the model's attention.
    certify: compute the exactness certificate (and keep searching exact sentences until
        their support is enumerated); False: every ``reason`` is "not_certified".
    support_stats: count the nonzero-probability tokens of every step (``support_size``).
    return_support / support_topk: also return, per step, the ``support_topk`` most probable
        tokens and their probabilities.
    return_attention: also return the source attention of every generated token.
    mode: "dynamic" (finished sentences leave the batch; one host sync per step, the stop
        test), "static" (fixed (B, K) shapes, finished sentences are masked; the step never
        syncs and the stop flag is read every ``stop_every`` steps, for GPUs and compiled
        steps) or "auto" (static on CUDA, dynamic elsewhere). Same outputs and certificates.
    stop_every: static mode reads its stop flag every this many steps (>= 1).
    sample: draw ``n_best`` independent samples per sentence from the model's distribution
        instead of searching (``nmt.translate.sampling``): ancestral sampling, one token per
        step by Gumbel-max over counter-based noise, so a sentence's samples depend only on
        (``seed``, its index in the input, the sample's number), never on its batch or device.
        ``beam_size`` and ``certify`` are not used (samples are returned in sample order, not
        ranked; the reason of every sentence is "sampled"); ``length_penalty`` other than "none"
        is refused (samples are not ranked). ``mode`` picks the loop as for beam search: dynamic
        (stopped samples leave the batch) or static (masked, no host sync in a step); the same
        samples.
    temperature: sample from ``mapping(logits / temperature)`` (> 0; 1 = the model's own
        distribution), the scores divided before the output mapping, so a sparse mapping stays
        sparse. sample_topk: keep only the k most probable tokens (ties kept; 0 = all).
        sample_topp: then keep the smallest set of most probable tokens whose mass reaches p
        (in (0, 1]; 1 = all). All three only with ``sample``.
    seed: the seed of the samples (an integer in [0, 2^64)).
    block_ngram_repeat: N > 0 forbids an output to hold any N-gram (N consecutive generated tokens)
        twice (OpenNMT-py's ``-block_ngram_repeat``, fairseq's ``--no-repeat-ngram-size``; N = 1: no
        token twice): a token that would complete an N-gram already in the hypothesis gets
        probability 0 at that step (``nmt.translate.ngram_block``), in beam search, greedy and
        sampling alike. BOS and padding never take part; EOS ends a hypothesis, so it is never
        blocked. The certificate then speaks of the constrained problem: a certified sentence's
        first hypothesis is the argmax among the outputs without a repeated N-gram, and
        ``n_nonzero`` / ``mass`` count those outputs of nonzero probability. Samples are drawn from
        each step's distribution without the blocked tokens, renormalised (before top-k / top-p).
        0 (the default): off, no extra operation.
    ban_unk_token: the unknown-word token ``<unk>`` gets probability 0 at every step (OpenNMT-py's
        ``-ban_unk_token``), in beam search, greedy and sampling alike (the search needs the
        vocabulary's unk id: ``beam_search(..., unk=...)``; ``Translator`` passes it). A hard
        constraint like n-gram blocking: the certificate then speaks of the outputs without
        ``<unk>``; samples are drawn from each step's distribution without it, renormalised.
    mbr: minimum Bayes risk decoding (``nmt.translate.mbr``): "chrf", "bleu" or "exact_match" ranks
        each sentence's candidates by their expected utility under the model (the ``Translator``
        does, on the detokenized texts), "none" (the default) does not. The candidates are every
        finished hypothesis of the beam (the search stops an uncertified sentence as it would with
        ``n_best = beam_size``, whatever ``n_best`` is, and ``beam_search`` returns every finished hypothesis,
        not only the ``n_best`` first; a certified sentence's are its whole support) or, with
        ``sample``, the ``n_best`` samples. Needs several candidates: ``beam_size`` >= 2, or
        ``n_best`` >= 2 samples.
    """

    beam_size: int = 5
    n_best: int = 1
    max_length: int = 100
    min_length: int = 0
    max_length_ratio: float = 0.0
    max_length_offset: int = 5
    length_penalty: str = "none"
    length_alpha: float = 0.6
    coverage_penalty: str = "none"
    beta: float = 0.0
    coverage_epsilon: float = COVERAGE_EPSILON
    stepwise_penalty: bool = False
    certify: bool = True
    support_stats: bool = True
    return_support: bool = False
    support_topk: int = 20
    return_attention: bool = False
    mode: str = "auto"
    stop_every: int = 4
    sample: bool = False
    temperature: float = 1.0
    sample_topk: int = 0
    sample_topp: float = 1.0
    seed: int = 0
    block_ngram_repeat: int = 0
    ban_unk_token: bool = False
    mbr: str = "none"

    def __post_init__(self) -> None:
        for name in ("beam_size", "n_best", "max_length", "min_length", "max_length_offset", "support_topk",
                     "stop_every", "sample_topk", "seed", "block_ngram_repeat"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        for name in ("certify", "support_stats", "return_support", "return_attention", "sample", "ban_unk_token",
                     "stepwise_penalty"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        for name in ("beam_size", "n_best", "support_topk", "stop_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_length < 0:
            raise ValueError(f"max_length must be >= 0, got {self.max_length}")
        if not 0 <= self.min_length <= self.max_length:
            raise ValueError(f"min_length must be in [0, max_length={self.max_length}], got {self.min_length}")
        if self.length_penalty not in LENGTH_PENALTIES:
            raise ValueError(f"length_penalty must be one of {', '.join(LENGTH_PENALTIES)}, "
                             f"got {self.length_penalty!r}")
        self._check_coverage()
        if self.mode not in SEARCH_MODES:
            raise ValueError(f"mode must be one of {', '.join(SEARCH_MODES)}, got {self.mode!r}")
        for name in ("length_alpha", "max_length_ratio"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.max_length_offset < 0:
            raise ValueError(f"max_length_offset must be >= 0, got {self.max_length_offset}")
        if self.block_ngram_repeat < 0:
            raise ValueError(f"block_ngram_repeat must be >= 0 (0: off), got {self.block_ngram_repeat}")
        self._check_sampling()
        self._check_mbr()

    def _check_mbr(self) -> None:
        """The checks of ``mbr`` (ValueError naming the field): a known utility, several candidates."""
        check_mbr(self.mbr)
        if self.mbr == "none":
            return
        if self.sample and self.n_best < 2:
            raise ValueError(f"mbr {self.mbr} with sample=True needs n_best >= 2 samples to choose among "
                             f"(they are its candidates and pseudo-references), got n_best {self.n_best}")
        if not self.sample and self.beam_size < 2:
            raise ValueError(f"mbr {self.mbr} needs beam_size >= 2 (greedy search finds one candidate), got "
                             f"beam_size {self.beam_size}")

    @property
    def search_n_best(self) -> int:
        """The ``n_best`` the search runs with: ``beam_size`` with ``mbr`` (an uncertified sentence's
        candidates are at least a beam's worth of finished hypotheses, whatever number of them is
        written), else ``n_best``."""
        return self.beam_size if self.mbr != "none" and not self.sample else self.n_best

    def _check_coverage(self) -> None:
        """The checks of the coverage penalty and its options (ValueError naming the field)."""
        if self.coverage_penalty not in COVERAGE_PENALTIES:
            raise ValueError(f"coverage_penalty must be one of {', '.join(COVERAGE_PENALTIES)}, "
                             f"got {self.coverage_penalty!r}")
        for name, low in (("beta", "a finite number >= 0"), ("coverage_epsilon", "in (0, 1]")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or (
                    value < 0 if name == "beta" else not 0 < value <= 1):
                raise ValueError(f"{name} must be {low}, got {value!r}")
        if self.coverage_penalty == "none":
            for name, value, off in (("beta", self.beta, 0.0), ("stepwise_penalty", self.stepwise_penalty, False)):
                if value != off:
                    raise ValueError(f"{name} applies to coverage_penalty wu or summary, got {value!r} with "
                                     "coverage_penalty none")
        if self.coverage_epsilon != COVERAGE_EPSILON and self.coverage_penalty != "wu":
            raise ValueError(f"coverage_epsilon applies to coverage_penalty wu (summary needs no floor), got "
                             f"{self.coverage_epsilon!r} with coverage_penalty {self.coverage_penalty}")
        if self.sample and self.coverage_penalty != "none":
            raise ValueError(f"coverage_penalty must be none with sample=True (samples are not ranked), "
                             f"got {self.coverage_penalty!r}")

    @property
    def coverage(self) -> bool:
        """Whether the search tracks coverage (``coverage_penalty`` other than none)."""
        return self.coverage_penalty != "none"

    def _check_sampling(self) -> None:
        """The checks of ``sample`` and its options (ValueError naming the field)."""
        for name, hint in (("temperature", " (sampling at temperature 0 would be greedy decoding: beam "
                                           "search with beam size 1, without sampling)"),
                           ("sample_topp", "")):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                limits = "in (0, 1]" if name == "sample_topp" else "a finite number > 0"
                raise ValueError(f"{name} must be {limits}{hint}, got {value!r}")
        if self.sample_topp > 1:
            raise ValueError(f"sample_topp must be in (0, 1], got {self.sample_topp}")
        if self.sample_topk < 0:
            raise ValueError(f"sample_topk must be >= 0 (0: no truncation), got {self.sample_topk}")
        if not 0 <= self.seed < 1 << 64:
            raise ValueError(f"seed must be in [0, 2^64), got {self.seed}")
        if not self.sample:
            for name, off in (("temperature", 1.0), ("sample_topk", 0), ("sample_topp", 1.0)):
                if getattr(self, name) != off:
                    raise ValueError(f"{name} applies to sampling only (sample=True), got {getattr(self, name)}")
            return
        if self.length_penalty != "none":
            raise ValueError(f"length_penalty must be none with sample=True (samples are not ranked), "
                             f"got {self.length_penalty!r}")

    def report_settings(self) -> dict[str, Any] | None:
        """The settings that change what a sentence's certificate or samples mean, for the
        ``-report`` records (``Translation.decoding``): ``block_ngram_repeat`` where > 0 (a
        certificate is then about the outputs without a repeated N-gram), ``ban_unk_token`` where
        on (about the outputs without ``<unk>``); with ``sample``, ``sample``, ``seed``,
        ``temperature``, ``sample_topk`` and ``sample_topp`` (with the sentence's line and the
        sample's number they fix each sample). None where none is on."""
        settings: dict[str, Any] = {}
        if self.sample:
            settings.update(sample=True, seed=self.seed, temperature=float(self.temperature),
                            sample_topk=self.sample_topk, sample_topp=float(self.sample_topp))
        if self.block_ngram_repeat:
            settings["block_ngram_repeat"] = self.block_ngram_repeat
        if self.ban_unk_token:
            settings["ban_unk_token"] = True
        if self.coverage:
            settings.update(coverage_penalty=self.coverage_penalty, beta=float(self.beta),
                            stepwise_penalty=self.stepwise_penalty)
            if self.coverage_penalty == "wu":
                settings["coverage_epsilon"] = float(self.coverage_epsilon)
        return settings or None

    def resolved_mode(self, device: torch.device | str) -> str:
        """"static" or "dynamic": ``mode``, with "auto" = static on CUDA, dynamic elsewhere."""
        if self.mode != "auto":
            return self.mode
        return "static" if torch.device(device).type == "cuda" else "dynamic"

    def length_limits(self, src_lengths: Tensor) -> Tensor | None:
        """(B,) long: each sentence's own maximum number of tokens before EOS, from the source
        lengths (B,) (see ``max_length_ratio``); None without a ratio. Computed on the lengths'
        device, no host sync; the floor of the float64 product, as Python's ``int(ratio * length)``."""
        if self.max_length_ratio == 0:
            return None
        limit = torch.floor(src_lengths.to(torch.float64) * self.max_length_ratio).long() + self.max_length_offset
        return limit.clamp(self.min_length, self.max_length)

    def updated(self, **overrides: Any) -> "SearchOptions":
        """A copy with ``overrides`` applied (checked again); an unknown name is a TypeError."""
        if not overrides:
            return self
        unknown = sorted(set(overrides) - {f.name for f in fields(self)})
        if unknown:
            raise TypeError(f"unknown search option(s) {', '.join(unknown)}; valid: "
                             f"{', '.join(f.name for f in fields(self))}")
        return replace(self, **overrides)


__all__ = ["SEARCH_MODES", "SearchOptions"]
