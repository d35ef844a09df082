"""Counting the ``<unk>`` tokens of an encoded dataset, for its log line.

A run whose vocabulary was not counted over its own training data (a fine-tuned run keeps its
parent's; ``data.<side>.vocab_file``; ``min_freq`` / ``max_size``) encodes the tokens outside it as
``<unk>``: fairseq-preprocess says how many ("replaced by <unk>"), and so does nmt's data line.
"""
from __future__ import annotations

from nmt.data.pair_filter import describe_skipped

SIDES = ("src", "tgt")
SIDE_NAMES = {"src": "source", "tgt": "target"}

UnkCounts = dict[str, tuple[int, int]]
"""Side (``"src"``, ``"tgt"``) -> ``(unk tokens, all tokens)`` over the kept pairs (no BOS/EOS)."""


def count_unk(sentences: list[list[int]], unk_index: int) -> tuple[int, int]:
    """``(number of unk_index ids, number of ids)`` over ``sentences`` (lists of token ids)."""
    return sum(ids.count(unk_index) for ids in sentences), sum(len(ids) for ids in sentences)


def unk_shares(counts: UnkCounts | None) -> str:
    """The sides that have ``<unk>`` tokens, e.g. ``target 4047 of 27000 tokens (15.0%)``; '' when
    none has (or the counts are unknown: None)."""
    return ", ".join(f"{SIDE_NAMES[side]} {unk} of {total} tokens ({100.0 * unk / total:.1f}%)"
                     for side in SIDES if side in (counts or {}) for unk, total in [counts[side]] if unk)


def describe_unk(counts: UnkCounts | None) -> str:
    """The data line's clause, e.g. ``; <unk>: target 4047 of 27000 tokens (15.0%)``; '' when no
    side has an ``<unk>`` token (or the counts are unknown: None)."""
    shares = unk_shares(counts)
    return f"; <unk>: {shares}" if shares else ""


def kept_pairs_line(kept: int, n_input: int, skipped: dict[str, int], counts: UnkCounts | None) -> str:
    """A dataset's log line, e.g. ``kept 5990 of 6000 pairs (skipped 2 empty, 8 too long)``, followed
    by :func:`describe_unk`'s clause (``; <unk>: target 40 of 27000 tokens (0.1%)``) where a side has
    tokens outside its vocabulary. ``skipped`` holds the count of each rule the data was filtered by
    (:data:`nmt.data.pair_filter.RULES`: ``"empty"`` and ``"too_long"`` always, ``"too_short"`` and
    ``"ratio"`` where on: ``..., 3 too short, 4 over the length ratio``)."""
    return f"kept {kept} of {n_input} pairs (skipped {describe_skipped(skipped)}){describe_unk(counts)}"


__all__ = ["UnkCounts", "count_unk", "describe_unk", "kept_pairs_line", "unk_shares"]
