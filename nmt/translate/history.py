"""Step-by-step records of a batched beam search, and backtracking through them.

At step t beam search keeps, for every active sentence b and beam slot k, the chosen token
``token[t, b, k]``, the slot it extends ``parent[t, b, k]`` (a slot of step t-1), its total
log-probability ``score[t, b, k]`` and per-row data computed from the *parent* row (the
attention and the output support that produced the token). Finished sentences leave the
batch, so a step is stored for the active sentences only, with their original indices;
``materialize`` scatters everything back to the full batch once, at the end.
"""
from __future__ import annotations

import torch
from torch import Tensor


class SearchHistory:
    """Records of every decoding step, for a batch of ``batch_size`` sentences.

    Fields are appended as (B_active, K, ...) tensors together with ``active`` (B_active,)
    long, the original sentence index of each row (``None`` = the whole batch, in order).
    ``fills`` gives the value of each field for sentences that were not active.
    """

    def __init__(self, batch_size: int, fills: dict[str, float | int | bool]) -> None:
        self.batch_size = batch_size
        self.fills = fills
        self._segments: list[tuple[Tensor | None, dict[str, list[Tensor]]]] = []
        self.steps = 0

    def append(self, active: Tensor | None, fields: dict[str, Tensor]) -> None:
        """Store one step; ``active`` must be the same object while the batch is unchanged."""
        if not self._segments or self._segments[-1][0] is not active:
            self._segments.append((active, {name: [] for name in self.fills}))
        records = self._segments[-1][1]
        for name in self.fills:
            records[name].append(fields[name])
        self.steps += 1

    def keep_steps(self, steps: int) -> None:
        """Forget every step after the first ``steps`` (the static search's idle tail)."""
        drop = self.steps - steps
        while drop > 0:
            active, records = self._segments[-1]
            n = len(next(iter(records.values())))
            if n <= drop:
                self._segments.pop()
                drop -= n
            else:
                for name in records:
                    del records[name][n - drop:]
                drop = 0
        self.steps = min(self.steps, steps)

    def materialize(self) -> dict[str, Tensor]:
        """All steps as full-batch tensors: field -> (T, batch_size, K, ...)."""
        out: dict[str, list[Tensor]] = {name: [] for name in self.fills}
        for active, records in self._segments:
            for name, steps in records.items():
                block = torch.stack(steps, dim=0)
                if active is not None:
                    full = block.new_full((block.size(0), self.batch_size) + block.shape[2:], self.fills[name])
                    block = full.index_copy_(1, active, block)
                out[name].append(block)
        return {name: torch.cat(blocks, dim=0) for name, blocks in out.items()}


def backtrack(
    records: dict[str, Tensor], end_step: Tensor, slot: Tensor, pad: int, per_row: tuple[str, ...] = ()
) -> dict[str, Tensor]:
    """Rebuild hypotheses that end at ``(end_step, slot)``.

    records: field -> (T, B, K, ...) as from ``SearchHistory.materialize`` (needs "token"
    and "parent"); end_step, slot: (B, n) long (end_step = -1 gives an empty hypothesis).
    Returns ``"tokens"`` (B, n, T) padded with ``pad`` after ``end_step``, and for every name
    in ``per_row`` a (B, n, T, ...) tensor read from the parent row of each step (zeros
    after ``end_step``).
    """
    token, parent = records["token"], records["parent"]
    if token.size(2) == 1:  # one slot (greedy): every parent is slot 0, no chain to follow
        return _backtrack_one_slot(records, end_step, pad, per_row)
    steps = token.size(0)
    tokens = torch.full(end_step.shape + (steps,), pad, dtype=token.dtype, device=token.device)
    rows: dict[str, list[Tensor]] = {name: [] for name in per_row}
    cur = slot
    for t in range(steps - 1, -1, -1):
        on = end_step >= t
        tok_t = token[t].gather(1, cur)
        par_t = parent[t].gather(1, cur)
        tokens[:, :, t] = torch.where(on, tok_t, torch.full_like(tok_t, pad))
        for name in per_row:
            data = records[name][t]  # (B, K, ...)
            extra = data.shape[2:]
            index = par_t.view(par_t.shape + (1,) * len(extra)).expand(par_t.shape + extra)
            picked = data.gather(1, index)
            mask = on.view(on.shape + (1,) * len(extra))
            rows[name].append(torch.where(mask, picked, torch.zeros_like(picked)))
        cur = torch.where(on, par_t, cur)
    out = {"tokens": tokens}
    for name in per_row:
        out[name] = torch.stack(rows[name][::-1], dim=2)
    return out


def _backtrack_one_slot(records: dict[str, Tensor], end_step: Tensor, pad: int,
                        per_row: tuple[str, ...]) -> dict[str, Tensor]:
    """:func:`backtrack` of a search with one slot (K = 1): the hypotheses are the records
    themselves, cut at ``end_step``; a few whole-tensor operations instead of a few per step."""
    token = records["token"]  # (T, B, 1)
    steps = token.size(0)
    on = torch.arange(steps, device=token.device) <= end_step.unsqueeze(-1)  # (B, n, T)
    sequence = token[:, :, 0].t().unsqueeze(1)  # (B, 1, T)
    out = {"tokens": torch.where(on, sequence, torch.full_like(sequence, pad))}  # (B, n, T)
    for name in per_row:
        data = records[name][:, :, 0].movedim(0, 1).unsqueeze(1)  # (B, 1, T, ...)
        mask = on.view(on.shape + (1,) * (data.dim() - 3))
        out[name] = torch.where(mask, data, torch.zeros_like(data))  # (B, n, T, ...)
    return out


__all__ = ["SearchHistory", "backtrack"]
