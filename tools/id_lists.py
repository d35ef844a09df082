"""The minimal dataset the benchmarks' synthetic batches are made from (no nmt import, so a tool
measuring another checkout can use it too)."""
from __future__ import annotations


class IdLists:
    """The minimal dataset ``make_batches`` / ``collate`` read: id lists and their lengths."""

    def __init__(self, src: list[list[int]], tgt: list[list[int]]) -> None:
        self.src, self.tgt = src, tgt
        self.src_lengths, self.tgt_lengths = [len(s) for s in src], [len(t) for t in tgt]

    def __len__(self) -> int:
        return len(self.src)
