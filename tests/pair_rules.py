"""The training-pair rules of ``nmt.data.pair_filter`` written again from the README, for the tests
of the filter (tests/data) and of training runs that apply it (tests/train): the independent truth."""
from __future__ import annotations

from fractions import Fraction


def brute_force(n_src: int, n_tgt: int, max_src, max_tgt, min_src: int, min_tgt: int, ratio) -> str | None:
    """The rule a pair breaks first, as the README states the rules: empty, too long, too short,
    then the longer side over R times the shorter (exact fractions; R read as the decimal written)."""
    if n_src == 0 or n_tgt == 0:
        return "empty"
    if (max_src is not None and n_src > max_src) or (max_tgt is not None and n_tgt > max_tgt):
        return "too_long"
    if n_src < min_src or n_tgt < min_tgt:
        return "too_short"
    if ratio and Fraction(max(n_src, n_tgt), min(n_src, n_tgt)) > Fraction(str(ratio)):
        return "ratio"
    return None


__all__ = ["brute_force"]
