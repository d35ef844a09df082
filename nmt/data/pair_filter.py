"""Which training pairs are kept: the cleaning rules of ``data.<side>.max_length``,
``data.<side>.min_length`` and ``data.max_length_ratio`` (Moses ``clean-corpus-n.perl``).

Lengths are counted in the run's tokens (after the tokenizer: characters, words, BPE or
sentencepiece pieces; with subword sampling, that epoch's segmentation), without BOS/EOS. A pair
is skipped by the first rule it breaks, in this order, and counted under that rule only:

1. ``empty``: a side has no token (a blank line; Moses drops these too);
2. ``too_long``: a side has more tokens than its ``max_length``;
3. ``too_short``: a side has fewer tokens than its ``min_length`` (default 1, which an empty side
   already breaks: the rule is off, and the data is what it was before the option);
4. ``ratio``: the longer side has more than ``max_length_ratio`` times the tokens of the shorter,
   i.e. ``max(n_src, n_tgt) / min(n_src, n_tgt) > R`` (Moses' ``-ratio``, both directions;
   a ratio of exactly ``R`` is kept; the quotient is a correctly rounded float, so ``23 / 20`` and
   ``R = 1.15`` compare equal).

Validation data is never filtered (only empty pairs are left out).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from nmt.data.errors import DataError

RULES = ("empty", "too_long", "too_short", "ratio")
"""Every skip rule, in the order a pair is tested (a pair counts under the first it breaks)."""

RULE_NAMES = {"empty": "empty", "too_long": "too long", "too_short": "too short", "ratio": "over the length ratio"}
"""How the data log names each rule's count (``skipped 2 empty, 8 too long, 1 over the length ratio``)."""


@dataclass(frozen=True)
class PairFilter:
    """The training pairs' length rules (see the module's docstring).

    max_src_length / max_tgt_length: at most this many tokens (None: no limit); min_src_length /
    min_tgt_length: at least this many (>= 1; 1: only empty sides are skipped); max_length_ratio:
    the longer side at most this many times the shorter (None or 0: off; else >= 1).
    Raises a one-line ``DataError`` naming the config key of a bad value.
    """

    max_src_length: int | None = None
    max_tgt_length: int | None = None
    min_src_length: int = 1
    min_tgt_length: int = 1
    max_length_ratio: float | None = None

    def __post_init__(self) -> None:
        for key, limit in (("data.src.max_length", self.max_src_length), ("data.tgt.max_length", self.max_tgt_length)):
            if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
                raise DataError(f"{key}: expected a positive integer or null, got {limit!r}")
        for key, limit in (("data.src.min_length", self.min_src_length), ("data.tgt.min_length", self.min_tgt_length)):
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise DataError(f"{key}: expected a positive integer, got {limit!r}")
        for key, low, high in (("data.src", self.min_src_length, self.max_src_length),
                               ("data.tgt", self.min_tgt_length, self.max_tgt_length)):
            if high is not None and low > high:
                raise DataError(f"{key}.min_length: {low} is above {key}.max_length ({high}): no pair could be kept")
        ratio = self.max_length_ratio
        if ratio is not None:
            if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or math.isnan(ratio) or \
                    (ratio != 0 and ratio < 1):
                raise DataError(f"data.max_length_ratio: expected null, 0 (off) or a number >= 1, got {ratio!r}")
            object.__setattr__(self, "max_length_ratio", None if ratio == 0 else float(ratio))

    @classmethod
    def from_config(cls, data_cfg: dict) -> "PairFilter":
        """The filter of a resolved ``data`` section (its ``src`` / ``tgt`` ``max_length`` and
        ``min_length``, and ``max_length_ratio``; keys an older config lacks take their defaults)."""
        src, tgt = data_cfg["src"], data_cfg["tgt"]
        return cls(src.get("max_length"), tgt.get("max_length"), src.get("min_length", 1), tgt.get("min_length", 1),
                   data_cfg.get("max_length_ratio"))

    @property
    def has_minimum(self) -> bool:
        """Whether a minimum length is above 1 (at 1 only empty sides break it: the rule is off)."""
        return max(self.min_src_length, self.min_tgt_length) > 1

    @property
    def rules(self) -> tuple[str, ...]:
        """The rules this filter applies (``empty`` and ``too_long`` always, as before the others
        existed; ``too_short`` with a minimum above 1; ``ratio`` with a ratio): the keys of a dataset's
        ``skipped`` counts."""
        on = {"empty": True, "too_long": True, "too_short": self.has_minimum,
              "ratio": self.max_length_ratio is not None}
        return tuple(rule for rule in RULES if on[rule])

    def reason(self, n_src: int, n_tgt: int) -> str | None:
        """The rule a pair of ``n_src`` source and ``n_tgt`` target tokens breaks first (a key of
        :data:`RULES`), None when it is kept."""
        if n_src == 0 or n_tgt == 0:
            return "empty"
        if (self.max_src_length is not None and n_src > self.max_src_length) or \
                (self.max_tgt_length is not None and n_tgt > self.max_tgt_length):
            return "too_long"
        if n_src < self.min_src_length or n_tgt < self.min_tgt_length:
            return "too_short"
        if self.max_length_ratio is not None and max(n_src, n_tgt) / min(n_src, n_tgt) > self.max_length_ratio:
            return "ratio"
        return None

    def cache_settings(self) -> dict:
        """The settings a token-id cache is keyed by: the length limits as always (so caches
        built before the other rules existed stay valid while those rules are off), and each
        other rule only where it is on."""
        settings: dict = {"max": [self.max_src_length, self.max_tgt_length]}
        if self.has_minimum:
            settings["min"] = [self.min_src_length, self.min_tgt_length]
        if self.max_length_ratio is not None:
            settings["ratio"] = self.max_length_ratio
        return settings

    def describe(self) -> str:
        """The settings for an error message, e.g. ``data.src.max_length=50, data.tgt.max_length=50,
        data.max_length_ratio=1.5`` (the minimums and the ratio only where on)."""
        parts = [f"data.src.max_length={self.max_src_length}", f"data.tgt.max_length={self.max_tgt_length}"]
        if self.has_minimum:
            parts += [f"data.src.min_length={self.min_src_length}", f"data.tgt.min_length={self.min_tgt_length}"]
        if self.max_length_ratio is not None:
            parts.append(f"data.max_length_ratio={self.max_length_ratio:g}")
        return ", ".join(parts)


def length_rules(max_src_length: int | None, max_tgt_length: int | None,
                 pair_filter: PairFilter | None) -> PairFilter:
    """``pair_filter``, or without one the filter of the two length limits alone (the datasets'
    older arguments); both given is a ``ValueError``. Bad limits: ``DataError`` naming the key."""
    if pair_filter is None:
        return PairFilter(max_src_length, max_tgt_length)
    if max_src_length is not None or max_tgt_length is not None:
        raise ValueError("give the length limits in pair_filter or as max_src_length / max_tgt_length, not both")
    return pair_filter


def skipped_counts(rules: tuple[str, ...]) -> dict[str, int]:
    """``rule -> 0`` for each of ``rules``: a dataset's ``skipped`` before counting."""
    return {rule: 0 for rule in rules}


def describe_skipped(skipped: dict[str, int]) -> str:
    """The counts of the rules in ``skipped``, in :data:`RULES`' order, e.g. ``2 empty, 8 too long``."""
    return ", ".join(f"{skipped[rule]} {RULE_NAMES[rule]}" for rule in RULES if rule in skipped)


__all__ = ["PairFilter", "RULES", "RULE_NAMES", "describe_skipped", "length_rules", "skipped_counts"]
