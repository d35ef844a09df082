"""Which finished sentences leave the batch of a dynamic search loop, and when (beam search's and
sampling's dynamic loops: :func:`rows_to_keep`, over the sizes of :func:`bucket_size`)."""
from __future__ import annotations


def bucket_size(rows: int) -> int:
    """The smallest of 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (2^k and 3 * 2^k) that holds ``rows``:
    the batch sizes the dynamic loop shrinks to (at most 1.5x the live rows; logarithmically many)."""
    if rows <= 2:
        return max(rows, 1)
    power = 1 << (rows - 1).bit_length()  # the smallest power of two >= rows
    return power * 3 // 4 if power * 3 // 4 >= rows else power


def rows_to_keep(done: list[bool]) -> tuple[list[int], list[int]] | None:
    """``(keep, gone)`` row indices when finished sentences should leave the batch, else None.

    The live rows stay, padded with finished ones (already stopped: their prefixes have
    probability 0) up to :func:`bucket_size`: a batch takes a handful of sizes instead of one per
    finishing step, so fewer reorderings are made and the CPU's oneDNN products and RNN kernels
    create a handful of primitives per weight, not one per size (0.3-1.4 ms each), while a long
    tail of a big batch still shrinks to its few live sentences.
    """
    rows = len(done)
    live = [i for i, d in enumerate(done) if not d]
    target = bucket_size(len(live))
    if target >= rows:
        return None
    finished = [i for i, d in enumerate(done) if d]
    keep = sorted(live + finished[: target - len(live)])
    kept = set(keep)
    return keep, [i for i in range(rows) if i not in kept]


__all__ = ["bucket_size", "rows_to_keep"]
