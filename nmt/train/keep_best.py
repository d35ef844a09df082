"""``training.keep_best: N``: the N best validated checkpoints of a run, by ``validation.metric``.

The kept set is a ranking of ``(step, value)`` pairs, best first, recorded in every checkpoint
(``trainer.keep_best``: the metric and the pairs); the files are ``best_step_<step>.pt`` in the run
directory (named by step, so a file never changes its name while the set changes around it), each
the checkpoint saved right after that validation (:func:`nmt.train.checkpoint.save_run_checkpoint`
writes it before ``last.pt`` and deletes dropped ones after it).

The order is early stopping's (:meth:`nmt.train.early_stopping.EarlyStopping.is_better`, the rule
``best.pt`` follows): lower loss, higher accuracy / exact_match / bleu / chrf, lower ter; a value that is no
better than the one kept already leaves the earlier step in front (ties: the earlier step wins, as
for ``best.pt``), and a value that could never be ``best.pt`` (NaN, or the worst bound itself) is
never kept.

On resume :func:`restore_kept` makes the files match the resumed checkpoint's record: a named file
that is missing or damaged is copied back from an intact checkpoint of its step (the resumed file,
``step_N.pt`` or ``best.pt``), files no record names (the one a crash left before its eviction,
those of validations after a resumed older checkpoint) are deleted.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Callable

import torch

from nmt.train.checkpoint import (CheckpointError, _atomic_copy, archive_check, holds_step, kept_best_checkpoints,
                                  kept_best_path, set_aside_damaged)

Ranking = list[tuple[int, float]]


class KeptBest:
    """The ``size`` best ``(step, value)`` pairs of one validation metric, best first.

    is_better(value, than): the metric's strict order (early stopping's); higher_is_better: its
    direction (the worst bound, -inf or +inf, is never kept).
    """

    def __init__(self, size: int, metric: str, is_better: Callable[[float, float], bool],
                 higher_is_better: bool) -> None:
        self.size, self.metric, self.is_better = size, metric, is_better
        self.bound = -math.inf if higher_is_better else math.inf
        self.entries: Ranking = []
        self.foreign = False  # whether the loaded record ranked another metric (validation.metric changed)

    @property
    def steps(self) -> list[int]:
        """The kept steps, best first."""
        return [step for step, _ in self.entries]

    def offer(self, step: int, value: float) -> bool:
        """Rank the validation of ``step`` (replacing an earlier record of the same step); returns
        whether it is kept. It goes behind every kept value it does not beat (ties: earlier first)."""
        self.entries = [(s, v) for s, v in self.entries if s != step]
        if self.size > 0 and self.is_better(value, self.bound):
            at = next((i for i, (_, v) in enumerate(self.entries) if self.is_better(value, v)), len(self.entries))
            self.entries.insert(at, (step, float(value)))
            del self.entries[self.size:]
        return step in self.steps

    def state_dict(self) -> dict:
        return {"metric": self.metric, "entries": [[step, value] for step, value in self.entries]}

    def load_state_dict(self, state: dict | None) -> None:
        """A checkpoint's record (None or absent entries: empty), cut to ``size``; a record of another
        metric is left to :func:`restore_kept` (:attr:`foreign`)."""
        state = state or {}
        self.foreign = state.get("metric", self.metric) != self.metric
        self.entries = [] if self.foreign else [(int(s), float(v)) for s, v in state.get("entries", [])]
        del self.entries[self.size:]


def recorded_value(path: str | os.PathLike, metric: str) -> float | None:
    """The ``valid_<metric>`` a checkpoint file records for the validation it was saved after
    (None when the file cannot be read or records none); loads lazily (mmap)."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        value = payload["metrics"][f"valid_{metric}"]
    except Exception:  # unreadable, or no such record: the caller drops the file from the set
        return None
    return float(value) if isinstance(value, (int, float)) else None


def restore_kept(save_dir: str | os.PathLike, kept: KeptBest, resumed_step: int,
                 source: str | os.PathLike) -> list[str]:
    """Make the kept-best files of ``save_dir`` those ``kept`` (the resumed checkpoint's record) names.

    A named file that does not hold its step (:func:`holds_step`: missing, or damaged, then set
    aside as ``NAME.damaged``) is copied from ``source`` (the resumed file) where it is that step,
    else from ``step_N.pt`` / ``best.pt`` where one holds it; when none does it leaves the set (a
    warning: it was lost outside a save). A record of another metric (``kept.foreign``) is rebuilt
    from the values the kept files record for the new one. Then every ``best_step_N.pt`` the set
    does not name is deleted. Returns one line per thing done that a user should hear about.
    """
    save_dir = Path(save_dir)
    lines: list[str] = []
    files = kept_best_checkpoints(save_dir)
    if kept.foreign:
        for step, path in files.items():
            value = recorded_value(path, kept.metric) if step <= resumed_step else None
            if value is not None:
                kept.offer(step, value)
        lines.append(f"{save_dir}: validation.metric is now {kept.metric}: the kept best checkpoints are ranked "
                     f"again by the {kept.metric} each records (kept: steps {kept.steps})")
        kept.foreign = False
    for step in list(kept.steps):
        target = kept_best_path(save_dir, step)
        if target.is_file():
            problem, found = archive_check(target)
            if problem is None and found == step:
                continue
            if problem is not None:
                lines.append(f"{target}: {problem}; moved aside to {set_aside_damaged(target).name} (damaged)")
        origins = ([Path(source)] if step == resumed_step else []) + [save_dir / f"step_{step}.pt",
                                                                       save_dir / "best.pt"]
        origin = next((o for o in origins if o.is_file() and (o == Path(source) or holds_step(o, step))), None)
        if origin is None:
            kept.entries = [(s, v) for s, v in kept.entries if s != step]
            lines.append(f"{target}: missing or damaged, and no checkpoint of step {step} remains to restore it "
                         f"from; it leaves the kept best checkpoints (training.keep_best)")
            continue
        _atomic_copy(origin, target)
        lines.append(f"{target} restored from {origin.name} (a kept best checkpoint that was missing or damaged)")
    for step, path in kept_best_checkpoints(save_dir).items():
        if step not in kept.steps:
            path.unlink(missing_ok=True)
            lines.append(f"{path}: removed, not among the kept best checkpoints of the resumed {Path(source).name} "
                         "(dropped by a save a crash interrupted, or of a validation after it)")
    return lines


def kept_record(save_dir: str | os.PathLike) -> tuple[str, Ranking]:
    """The metric and ranking (best first) that ``save_dir/last.pt`` records; one-line CheckpointError
    naming the file when it is missing, damaged or records no kept set."""
    last = Path(save_dir) / "last.pt"
    if not last.is_file():
        raise CheckpointError(f"{last}: missing (not a run directory, or its run never saved)")
    problem, _ = archive_check(last)
    if problem is not None:
        raise CheckpointError(f"{last}: damaged: {problem}; resume the run (nmt-train repairs its run directory) "
                              "or name the files with -models")
    try:
        payload = torch.load(last, map_location="cpu", weights_only=True, mmap=True)
        record = (payload.get("trainer") or {}).get("keep_best") or {}
    except Exception as exc:
        raise CheckpointError(f"{last}: cannot be read ({type(exc).__name__})") from None
    return record.get("metric", "?"), [(int(s), float(v)) for s, v in record.get("entries", [])]


def best_kept_checkpoints(save_dir: str | os.PathLike, n: int) -> list[Path]:
    """The ``n`` best kept checkpoints of a run directory (``training.keep_best``), as its
    ``last.pt`` ranks them, in step order (oldest first); one-line CheckpointError when fewer are
    kept, or a named file does not hold its step (a save in progress, or a damaged file)."""
    save_dir = Path(save_dir)
    if n < 1:
        raise CheckpointError(f"-best must be >= 1, got {n}")
    if not save_dir.is_dir():
        raise CheckpointError(f"{save_dir}: no such run directory")
    metric, ranking = kept_record(save_dir)
    if len(ranking) < n:
        what = (f"keeps {len(ranking)} best checkpoint(s) (by validation {metric})" if ranking
                else "keeps no best checkpoints")
        raise CheckpointError(f"{save_dir}: {what}, {n} asked; keep more with training.keep_best")
    chosen = sorted(step for step, _ in ranking[:n])
    paths = [kept_best_path(save_dir, step) for step in chosen]
    for step, path in zip(chosen, paths):
        if not holds_step(path, step):
            state = "damaged" if path.is_file() else "missing"
            raise CheckpointError(f"{path}: {state}, though {save_dir / 'last.pt'} keeps it (a save in progress, or "
                                  "the file was damaged: resume the run to repair it, or retry)")
    return paths


__all__ = ["KeptBest", "restore_kept", "recorded_value", "kept_record", "best_kept_checkpoints"]
