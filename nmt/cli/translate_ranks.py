"""``nmt-translate`` in several processes: ``torchrun --nproc_per_node=N -m nmt.cli.translate ...``.

Every process (rank) reads and checks the whole input, cuts the same length-sorted batches and
decodes every N-th of them (``Translator.translate(shard=...)``, ``Scorer.score(shard=...)``) on its
own device: ``cuda:LOCAL_RANK`` where the requested device is a GPU (``auto`` on a GPU machine,
``cuda``, ``cuda:K``), else the CPU. Rank 0 gathers the others' results over Gloo (host objects: no
GPU collective), merges them in input order and alone writes the outputs, the report, the heatmaps
and the summary; the outputs are then one process's (the same batches: the same hypotheses and
certificates; translation scores equal up to float32 rounding, since a process's cached per-token
products round with the tokens first met alongside them; score mode byte for byte). Files only: a
stream (``-src -``) is one process's.
"""
from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

logger = logging.getLogger("nmt")


@dataclass
class Ranks:
    """This process's place among the translating processes (one process: ``ranks == 1``)."""

    rank: int = 0
    ranks: int = 1
    context: Any = field(default=None, repr=False)

    @property
    def shard(self) -> tuple[int, int] | None:
        """``(rank, ranks)`` for ``translate`` / ``score`` (None in one process)."""
        return (self.rank, self.ranks) if self.ranks > 1 else None

    @property
    def writes(self) -> bool:
        """Whether this process writes the outputs and the summary (rank 0)."""
        return self.rank == 0

    def merged(self, entries: Sequence[Any | None], seconds: float) -> tuple[list[Any] | None, float]:
        """Every rank's ``entries`` (its own non-None, the others' None) merged in input order on rank
        0, with the slowest rank's search ``seconds``; ``(None, seconds)`` on the other ranks."""
        if self.ranks == 1:
            return list(entries), seconds
        own = [(i, entry) for i, entry in enumerate(entries) if entry is not None]
        parts = self.context.gather((own, seconds))
        if parts is None:
            return None, seconds
        merged: list[Any | None] = [None] * len(entries)
        for part, _ in parts:
            for i, entry in part:
                if merged[i] is None:  # (an empty source's entry: every rank makes one)
                    merged[i] = entry
        missing = sum(entry is None for entry in merged)
        if missing:
            raise RuntimeError(f"{missing} inputs were translated by no process (the ranks cut different batches)")
        return merged, max(s for _, s in parts)

    def share(self, total: int) -> int | None:
        """A progress bar's total: ``total`` in one process; None (a count without an end) in several,
        where this one decodes a share of the batches."""
        return total if self.ranks == 1 else None

    def label(self) -> str:
        """What a progress bar's name adds: `` (rank 0 of N)`` in several processes."""
        return f" (rank {self.rank} of {self.ranks})" if self.ranks > 1 else ""

    def suffix(self) -> str:
        """What the summary line adds in several processes ("" in one)."""
        return f" ({self.ranks} processes; search time: the slowest's)" if self.ranks > 1 else ""

    def close(self) -> None:
        """Leave the process group (nothing in one process)."""
        if self.context is not None:
            self.context.close()


def join(args: argparse.Namespace, mode: str) -> Ranks:
    """Join the ``torchrun`` job the environment describes, if several processes (else ``Ranks()``):
    ``args.device`` becomes this rank's GPU where it asks for one. ValueError (one line) for a
    stream, or more GPU processes than GPUs on a node."""
    from nmt.train.distributed import init_distributed, several_processes

    if not several_processes():
        return Ranks()
    if mode == "stream" or args.src == "-":
        raise ValueError("-src -: standard input is translated by one process; under torchrun name an input "
                         "file (every process decodes its share of it)")
    context = init_distributed("cpu")  # Gloo: the results are host objects
    if str(args.device) != "cpu":
        import torch

        from nmt.train.distributed import rank_cuda_index

        if str(args.device) != "auto" or torch.cuda.is_available():
            if not torch.cuda.is_available():
                raise ValueError(f"-device {args.device}: CUDA is not available on this machine")
            index = rank_cuda_index(context.local_rank, torch.cuda.device_count())
            if str(args.device) not in ("auto", "cuda", f"cuda:{index}"):
                logger.warning("-device %s: under torchrun each process takes its own GPU (cuda:%d here)",
                               args.device, index)
            args.device = f"cuda:{index}"
    if context.rank > 0:
        args.quiet = True  # one progress bar and summary: rank 0's
    return Ranks(context.rank, context.world_size, context)


__all__ = ["Ranks", "join"]
